#!/usr/bin/env bash
# The server's instructions per /v1/chat/completions request, counted by
# callgrind: a figure that does not move with the machine's load, to set
# beside the benchmark's latencies (`bench --only overhead`) when two builds
# are compared. One `onejob serve` runs under valgrind against a local
# OpenAI-compatible upstream; counting is on only while N sequential
# requests (each under its own key, each answered 200) are served, after a
# warm-up. With DOOR=jobs it counts `POST /api/v1/jobs` creations instead
# (each answered 201, no worker running: the job's creation alone, one
# commit each), beside the benchmark's CPU per creation. With CLIENTS=C the
# N requests are sent by C clients at once, each on its own connection, so
# that creations queue and are committed in batches, as the benchmark's 32
# creators are.
#
# Usage: [DOOR=chat|jobs] [CLIENTS=C] scripts/door_instructions.sh path/to/onejob sqlite|postgres [N]
# (DOOR_INSTRUCTIONS_KEEP=dir keeps the callgrind files there, for
# callgrind_annotate; LOG=info counts with the server's own default log
# filter, whose request spans the default here, warn, leaves out)
# (PostgreSQL at $ONEJOB_TEST_POSTGRES, default postgres://postgres@127.0.0.1:5432)
set -euo pipefail
onejob=$1; backend=$2; n=${3:-200}
door=${DOOR:-chat}
clients=${CLIENTS:-1}
case "$door" in chat|jobs) ;; *) echo "DOOR is chat or jobs, not $door" >&2; exit 2 ;; esac
pg=${ONEJOB_TEST_POSTGRES:-postgres://postgres@127.0.0.1:5432}
work=$(mktemp -d)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
up=$(free_port); port=$(free_port)
pids=()
db=""
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "$db" ]; then psql -q "$pg/postgres" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

cat > "$work/upstream.py" <<'PY'
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
BODY = json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
  "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
  "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}}).encode()
class Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: without this, the second
    # waits for the first's delayed ACK (40 ms a request).
    disable_nagle_algorithm = True
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)
    def log_message(self, *args):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Upstream).serve_forever()
PY
cat > "$work/client.py" <<'PY'
import http.client, json, sys, threading
port, token, n, tag, door = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
clients = int(sys.argv[6])
path, expected = ("/api/v1/jobs", 201) if door == "jobs" else ("/v1/chat/completions", 200)
failures = []
def send(first):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    for i in range(first, n, clients):
        if door == "jobs":
            body = json.dumps({"task": "summarize", "input": {"text": f"hello {i}"}})
        else:
            body = json.dumps({"model": "chat", "messages": [{"role": "user", "content": f"hello {i}"}]})
        conn.request("POST", path, body, {"Authorization": "Bearer " + token,
                     "Idempotency-Key": f"{tag}-{i}", "Content-Type": "application/json"})
        response = conn.getresponse(); response.read()
        if response.status != expected:
            failures.append(f"request {i} answered {response.status}")
            return
threads = [threading.Thread(target=send, args=(c,)) for c in range(clients)]
for thread in threads: thread.start()
for thread in threads: thread.join()
if failures:
    sys.exit(failures[0])
PY
cat > "$work/onejob.toml" <<TOML
[[providers]]
name = "up"
kind = "openai"
base_url = "http://127.0.0.1:$up/v1"
model = "m"
api_key_env = "DOOR_INSTRUCTIONS_KEY"
timeout_ms = 30000

[[tasks]]
name = "chat"
kind = "chat"
providers = ["up"]

[[tasks]]
name = "summarize"
providers = ["up"]
input_fields = ["text"]
template = "Summarize: {{ text }}"
TOML
if [ "$door" = jobs ]; then
  # No worker: each job stays queued, so only its creation is counted.
  printf '\n[worker]\nconcurrency = 0\n' >> "$work/onejob.toml"
fi
python3 "$work/upstream.py" "$up" & pids+=($!)
if [ "$backend" = sqlite ]; then
  url="$work/onejob.db"
else
  db="door_instructions_$$"
  psql -q "$pg/postgres" -c "CREATE DATABASE $db"
  url="$pg/$db"
fi
export DOOR_INSTRUCTIONS_KEY=key
run() { "$onejob" --config "$work/onejob.toml" --database-url "$url" "$@"; }
run migrate >/dev/null 2>&1
token=$(run users add caller --role admin 2>/dev/null | tail -n 1)
# The allocator's option set here: unset, onejob runs itself again with it
# (`exec`), and valgrind would count only the first program.
MIMALLOC_ARENA_PURGE_MULT=0 RUST_LOG=${LOG:-warn} valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$work/callgrind.out" \
  "$onejob" --config "$work/onejob.toml" --database-url "$url" serve --bind "127.0.0.1:$port" \
  >"$work/server.log" 2>&1 & pids+=($!)
server=$!
for _ in $(seq 1 300); do curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break; sleep 0.5; done
python3 "$work/client.py" "$port" "$token" 30 warm-up "$door" 1
commits() { curl -fsS -H "Authorization: Bearer $token" "http://127.0.0.1:$port/metrics" |
  awk '$1 == "onejob_group_commits" {print $2}'; }
commits_before=$(commits)
callgrind_control -i on "$server" >/dev/null 2>&1
python3 "$work/client.py" "$port" "$token" "$n" counted "$door" "$clients"
callgrind_control -i off "$server" >/dev/null 2>&1
callgrind_control -d "$server" >/dev/null 2>&1
commits_after=$(commits)
sleep 1
if [ -n "${DOOR_INSTRUCTIONS_KEEP:-}" ]; then
  mkdir -p "$DOOR_INSTRUCTIONS_KEEP" && cp "$work"/callgrind.out* "$DOOR_INSTRUCTIONS_KEEP"/
fi
total=$(cat "$work"/callgrind.out* | awk '/^(summary|totals):/ {s += $2} END {print s}')
echo "door instructions: $door on $backend, $n requests by $clients clients: $total instructions, $((total / n)) per request"
echo "group commits while counted: $(python3 -c "print(int(float('$commits_after') - float('$commits_before')))") for $n requests"
