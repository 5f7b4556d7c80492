#!/usr/bin/env bash
# Counts `["member"]` lookups on JSON values in production code (each file
# up to its `#[cfg(test)]` module), per file and in all: the wire formats
# are read through the codecs' serde types (src/chat), not walked by hand.
# Usage: bash scripts/count_lookups.sh [git revision]   (default: the work tree)
set -euo pipefail
cd "$(dirname "$0")/.."
rev="${1:-}"
total=0
while read -r file; do
    if [[ -n "$rev" ]]; then text=$(git show "$rev:$file"); else text=$(cat "$file"); fi
    n=$(printf '%s\n' "$text" | awk '/#\[cfg\(test\)\]/{exit} {print}' |
        grep -oE '\["[A-Za-z_$][A-Za-z0-9_.$-]*"\]' | wc -l || true)
    if (( n > 0 )); then printf '%5d %s\n' "$n" "$file"; fi
    total=$((total + n))
done < <(if [[ -n "$rev" ]]; then git ls-tree -r --name-only "$rev" -- src | grep '\.rs$'; else git ls-files 'src/*.rs'; fi)
echo "total: $total"
