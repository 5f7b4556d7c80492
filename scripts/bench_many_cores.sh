#!/usr/bin/env bash
# The SQLite figures on a machine with more cores, where no PostgreSQL
# server can be had (docs/benchmarks.md, "Running it"): creation at 32 and
# 128 creators, unpinned, the server on half the cores and the load on the
# other half, the server on two; then the /v1 door on SQLite. Each run is
# bounded; the whole takes about five minutes.
#
# Usage: scripts/bench_many_cores.sh path/to/release [log]
# (path/to/release holds `onejob` and `examples/bench`, stripped release
# builds; the log, default bench-many-cores.log, gets every run's output)
set -uo pipefail
release=$1; log=${2:-bench-many-cores.log}
bench="$release/examples/bench"
cpus=$(nproc)
half=$((cpus / 2))
echo "cpus $cpus; $(grep -m1 'model name' /proc/cpuinfo)" | tee "$log"
step() {
  echo "=== bench $*" | tee -a "$log"
  timeout 150 "$bench" "$@" 2>&1 | grep -v '^  (sending again' | tee -a "$log"
}
step --only sqlite
step --only sqlite --server-cpus "0-$((half - 1))" --load-cpus "$half-$((cpus - 1))"
step --only sqlite --server-cpus 0-1 --load-cpus "2-$((cpus - 1))"
step --only sqlite
step --only sqlite --server-cpus "0-$((half - 1))" --load-cpus "$half-$((cpus - 1))"
step --only sqlite --concurrency 128
step --only overhead --backends sqlite
step --only overhead --backends sqlite --server-cpus "0-$((half - 1))" --load-cpus "$half-$((cpus - 1))"
