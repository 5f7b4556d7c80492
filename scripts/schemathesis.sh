#!/usr/bin/env bash
# Schemathesis (every check) against a real onejob server and the OpenAPI
# document it serves. Bounded in time; prints its figures.
#
# Usage: scripts/schemathesis.sh [path/to/onejob] [examples per operation]
# Needs `st` (schemathesis, the version pinned in scripts/requirements-ci.txt)
# on PATH or in $ST.
set -euo pipefail
cd "$(dirname "$0")/.."
onejob="${1:-target/debug/onejob}"
examples="${2:-150}"
st="${ST:-st}"

work=$(mktemp -d)
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

cat > "$work/onejob.toml" <<'TOML'
[server]
max_wait_seconds = 2

# Webhooks on, so that their routes are exercised past "not configured";
# nothing is delivered (endpoints Schemathesis registers point anywhere).
[webhooks]
signing_key_env = "ONEJOB_SCHEMATHESIS_WEBHOOK_KEY"
deliver = false

[[providers]]
name = "sim-fast"
kind = "simulated"
latency_ms = 20
timeout_ms = 5000
late_result_ms = 10000

[[tasks]]
name = "summarize"
providers = ["sim-fast"]
input_fields = ["text"]
template = "Summarize: {{ text }}"

[[tasks]]
name = "chat"
kind = "chat"
providers = ["sim-fast"]
TOML

run() { "$onejob" --config "$work/onejob.toml" --database-url "$work/onejob.db" "$@"; }
# The database first: `users` refuses to create a new SQLite file.
run migrate 2>/dev/null
token=$(run users add ada --role admin 2>/dev/null | tail -n 1)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# Started directly, not through `run`: `$!` must be onejob itself, or the
# cleanup would stop a subshell and leave the server running.
ONEJOB_SCHEMATHESIS_WEBHOOK_KEY="$(python3 -c 'import secrets; print(secrets.token_hex(32))')" \
RUST_LOG=warn "$onejob" --config "$work/onejob.toml" --database-url "$work/onejob.db" \
  serve --bind "127.0.0.1:$port" >"$work/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 1 100); do
  curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
  sleep 0.2
done

started=$(date +%s)
# One worker: with two, Schemathesis's threads parse Python source at once
# (Hypothesis describing its filters), and CPython 3.11.7's parser keeps its
# recursion depth in state the threads share: a run on 2026-12-07 ended in
# "SystemError: AST constructor recursion depth mismatch", an error of the
# tool's, not of the server's.
set +e
"$st" run "http://127.0.0.1:$port/api/v1/openapi.json" \
  --checks all \
  --header "Authorization: Bearer $token" \
  --max-examples "$examples" \
  --generation-deterministic \
  --request-timeout 10 \
  --seed 1 \
  --workers 1 \
  --no-color \
  "${@:3}"
status=$?
set -e
echo "schemathesis: finished in $(( $(date +%s) - started )) s with status $status"
if ! kill -0 "$server_pid" 2>/dev/null; then
  echo "schemathesis: the server died during the run:"; tail -n 50 "$work/server.log"; exit 1
fi
# Malformed requests are the client's fault and actix logs them; anything
# else at ERROR, or a panic, fails the run.
errors=$(grep -E "panicked|ERROR" "$work/server.log" | grep -v "actix_http::h1::dispatcher" || true)
if [ -n "$errors" ]; then
  echo "schemathesis: the server logged errors:"; echo "$errors" | head -n 20
  status=1
fi
exit "$status"
