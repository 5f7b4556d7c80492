"""What the SDK checks (`sdk_check.py`, `anthropic_check.py`) share: a fake
OpenAI-compatible upstream's plumbing, a `onejob serve` process on a fresh
SQLite file, an HTTP client that counts what the SDK sends, the checks'
reporting, and the run that ties them together.

The checks import it as `check_support`: Python puts a script's own
directory first on sys.path, so `python3 scripts/sdk_check.py` finds it.
"""

import argparse
import concurrent.futures
import json
import os
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# The SDK's HTTP client library: httpx2 in the pinned SDK, httpx before it.
try:
    import httpx2 as httpx
except ImportError:
    import httpx

# What the fake upstream reports an answer cost.
USAGE = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}


def completion(model, content, usage=USAGE):
    """A chat completion whose answer is `content`."""
    return {
        "id": "chatcmpl-upstream",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content},
            "finish_reason": "stop",
        }],
        "usage": usage,
    }


def chunk(model, delta=None, finish=None, usage=None, created=0):
    """A chat completion chunk: a delta, or with `usage`, the usage alone."""
    document = {"id": "chatcmpl-upstream", "object": "chat.completion.chunk",
                "created": created, "model": model,
                "choices": [] if usage else
                [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage:
        document["usage"] = usage
    return document


def delayed(said):
    """The text of a user message; `slow:<s>:<text>` is `<text>`, after <s>
    seconds."""
    if said.startswith("slow:"):
        _, seconds, text = said.split(":", 2)
        time.sleep(float(seconds))
        return text
    return said


class Handler(BaseHTTPRequestHandler):
    """A request to the fake upstream: checked for its key, counted by its
    last user message, then answered by the upstream's `answer`."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        upstream = self.server.upstream
        length = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.headers.get("Authorization") != f"Bearer {upstream.key}":
            return self.reply(401, {"error": {"message": "bad key"}})
        said = body["messages"][-1]["content"]
        if isinstance(said, list):
            said = "".join(part.get("text", "") for part in said)
        with upstream.lock:
            upstream.calls[said] = upstream.calls.get(said, 0) + 1
        upstream.answer(self, body, said)

    def reply(self, status, document):
        data = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def open_stream(self):
        """Server-sent events follow, until the connection closes."""
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()

    def event(self, document):
        self.wfile.write(f"data: {json.dumps(document)}\n\n".encode())
        self.wfile.flush()

    def done(self):
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


class FakeUpstream:
    """A fake OpenAI-compatible provider on a free local port that accepts
    the bearer `key` and counts every call it receives. A subclass answers
    with `answer(handler, body, said)`."""

    def __init__(self, key):
        self.key = key
        self.lock = threading.Lock()
        self.calls = {}  # the last user message -> calls received
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.upstream = self
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, handler, body, said):
        raise NotImplementedError

    def calls_for(self, said):
        with self.lock:
            return self.calls.get(said, 0)

    def total(self):
        with self.lock:
            return sum(self.calls.values())


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Onejob:
    """A `onejob serve` process on a fresh SQLite file (or on `database`, an
    empty database's URL), with one chat route, `route`, to `upstream`,
    whose key it reads from the variable `key_env`; `extra_config` is more
    of its configuration file (a `[worker]` table, say), `extra_env` more
    of its environment."""

    def __init__(self, binary, workdir, upstream, route, key_env, extra_config="",
                 extra_env=None, database=None):
        self.binary = binary
        self.config = os.path.join(workdir, "onejob.toml")
        self.database = database or os.path.join(workdir, "onejob.db")
        with open(self.config, "w") as f:
            f.write(f"""
[server]
max_wait_seconds = 30

[[providers]]
name = "upstream"
kind = "openai"
base_url = "http://127.0.0.1:{upstream.port}/v1"
model = "upstream-model"
api_key_env = "{key_env}"
timeout_ms = 20000
connect_timeout_ms = 2000

[[tasks]]
name = "{route}"
kind = "chat"
providers = ["upstream"]
{extra_config}""")
        self.env = dict(os.environ, RUST_LOG="warn", **{key_env: upstream.key},
                        **(extra_env or {}))
        # The database first: `users` refuses to create a new SQLite file.
        self.cli("migrate")
        self.token = self.cli("users", "add", "alice").strip().splitlines()[-1]
        self.port = free_port()
        self.log = open(os.path.join(workdir, "server.log"), "w")
        self.process = subprocess.Popen(
            self.command("serve", "--bind", f"127.0.0.1:{self.port}"),
            env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
        )
        self.base = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{self.base}/readyz", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline or self.process.poll() is not None:
                raise SystemExit(f"onejob did not become ready; see {self.log.name}")
            time.sleep(0.1)

    def command(self, *args):
        return [self.binary, "--config", self.config, "--database-url", self.database, *args]

    def cli(self, *args):
        return subprocess.run(self.command(*args), env=self.env, check=True,
                              capture_output=True, text=True).stdout

    def stop(self):
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()


class Counting(httpx.Client):
    """An HTTP client that counts the requests the SDK sends, and the
    Idempotency-Key each carried."""

    def __init__(self, **kwargs):
        self.sent = 0
        self.keys = set()
        self.lock = threading.Lock()
        super().__init__(event_hooks={"request": [self._count]}, **kwargs)

    def _count(self, request):
        with self.lock:
            self.sent += 1
            self.keys.add(request.headers.get("Idempotency-Key"))


def at_once(call, times=20):
    """`times` calls of `call()` at the same time; their results, in order."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=times) as pool:
        return list(pool.map(lambda _: call(), range(times)))


class Checks:
    """A check's reporting: `check(condition, message)` prints `ok:` and the
    message, or exits with `<name> FAILED:` and the message."""

    def __init__(self, name):
        self.name = name

    def __call__(self, condition, message):
        if not condition:
            raise SystemExit(f"{self.name} FAILED: {message}")
        print(f"  ok: {message}")

    def refused(self, refusal, error, call):
        """The `error` that `call()` raises; the check `refusal` fails when
        it raises none."""
        try:
            call()
        except error as raised:
            return raised
        self(False, refusal)


def main(check, sdk, make_upstream, run_checks, route, key_env, extra_config="",
         extra_env=None):
    """Parses `--onejob` (and `--database-url`, an empty database to run on
    instead of a fresh SQLite file: a PostgreSQL or Citus one, migrated or
    not), starts the upstream and a onejob server with a route to it (and
    `extra_config` configuration), runs `run_checks(server, upstream)` and
    prints the figures."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--onejob", default="target/debug/onejob")
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    started = time.time()
    print(f"{check.name}: {sdk.__name__} {sdk.__version__}, httpx {httpx.__version__}")
    upstream = make_upstream()
    with tempfile.TemporaryDirectory() as workdir:
        server = Onejob(os.path.abspath(args.onejob), workdir, upstream, route, key_env,
                        extra_config, extra_env, args.database_url)
        try:
            run_checks(server, upstream)
        finally:
            server.stop()
    print(f"{check.name}: passed in {time.time() - started:.1f} s; "
          f"upstream calls in all: {upstream.total()}")
