#!/usr/bin/env python3
"""The official Anthropic Python SDK against a real onejob server.

Starts a fake OpenAI-compatible upstream (a real HTTP server in this
process that counts every call it receives and streams when asked to), a
`onejob serve` process on a fresh SQLite file with a chat route to that
upstream, and drives the SDK against onejob's POST /v1/messages the way an
existing client would: only `base_url`, `api_key` and an `Idempotency-Key`
per request change (the SDK sends its `api_key` as `x-api-key`, and resends
a request's `extra_headers` on every retry).

It asserts that:
- the SDK times out and retries, yet the upstream is called once per key
  and the SDK's final message is the upstream's answer;
- twenty concurrent calls with one key make one upstream call and one message;
- `messages.stream(...)` works: `text_stream` yields the answer's text, the
  final message equals the non-streamed answer, and a replay under the same
  key streams it again without another upstream call;
- the same key with another body raises `anthropic.ConflictError` at once,
  a request without a key `anthropic.BadRequestError` saying how to send
  one, a bad token `anthropic.AuthenticationError`, an unknown model
  `anthropic.NotFoundError`.

Usage: python3 scripts/anthropic_check.py --onejob target/debug/onejob
Prints its figures; exits non-zero on the first failed check.
"""

import argparse
import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anthropic

# The SDK's HTTP client library: httpx2 in the pinned SDK, httpx before it.
try:
    import httpx2 as httpx
except ImportError:
    import httpx

UPSTREAM_KEY = "sk-upstream-for-the-anthropic-check"
ROUTE = "claude-safe"


class Upstream:
    """A fake OpenAI-compatible provider. A user message `slow:<s>:<text>`
    is answered after <s> seconds; the answer is `echo: <text>`, streamed
    in three pieces when the request asks for a stream."""

    def __init__(self):
        self.lock = threading.Lock()
        self.calls = {}  # the last user message -> calls received
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.headers.get("Authorization") != f"Bearer {UPSTREAM_KEY}":
                    return self.reply(401, {"error": {"message": "bad key"}})
                said = body["messages"][-1]["content"]
                if isinstance(said, list):
                    said = "".join(part.get("text", "") for part in said)
                with upstream.lock:
                    upstream.calls[said] = upstream.calls.get(said, 0) + 1
                text = said
                if said.startswith("slow:"):
                    _, seconds, text = said.split(":", 2)
                    time.sleep(float(seconds))
                answer = f"echo: {text}"
                usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
                if body.get("stream"):
                    return self.stream(body["model"], answer, usage)
                self.reply(200, {
                    "id": "chatcmpl-upstream",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body["model"],
                    "choices": [{
                        "index": 0,
                        "message": {"role": "assistant", "content": answer},
                        "finish_reason": "stop",
                    }],
                    "usage": usage,
                })

            def stream(self, model, answer, usage):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True

                def chunk(delta, finish=None, **extra):
                    document = {"id": "chatcmpl-upstream", "object": "chat.completion.chunk",
                                "created": 0, "model": model,
                                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
                    document.update(extra)
                    self.wfile.write(f"data: {json.dumps(document)}\n\n".encode())
                    self.wfile.flush()

                chunk({"role": "assistant", "content": ""})
                third = max(1, len(answer) // 3)
                for piece in (answer[:third], answer[third:2 * third], answer[2 * third:]):
                    chunk({"content": piece})
                    time.sleep(0.05)
                chunk({}, "stop")
                self.wfile.write(("data: " + json.dumps({
                    "id": "chatcmpl-upstream", "object": "chat.completion.chunk", "created": 0,
                    "model": model, "choices": [], "usage": usage}) + "\n\n").encode())
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

            def reply(self, status, document):
                data = json.dumps(document).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

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
    """A `onejob serve` process on a fresh SQLite file."""

    def __init__(self, binary, workdir, upstream_port):
        self.binary = binary
        self.config = os.path.join(workdir, "onejob.toml")
        self.database = os.path.join(workdir, "onejob.db")
        with open(self.config, "w") as f:
            f.write(f"""
[server]
max_wait_seconds = 30

[[providers]]
name = "upstream"
kind = "openai"
base_url = "http://127.0.0.1:{upstream_port}/v1"
model = "upstream-model"
api_key_env = "ANTHROPIC_CHECK_UPSTREAM_KEY"
timeout_ms = 20000
connect_timeout_ms = 2000

[[tasks]]
name = "{ROUTE}"
kind = "chat"
providers = ["upstream"]
""")
        self.env = dict(os.environ, ANTHROPIC_CHECK_UPSTREAM_KEY=UPSTREAM_KEY, RUST_LOG="warn")
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


def check(condition, message):
    if not condition:
        raise SystemExit(f"anthropic check FAILED: {message}")
    print(f"  ok: {message}")


def client(server, api_key=None, **options):
    http = Counting()
    sdk = anthropic.Anthropic(base_url=server.base, api_key=api_key or server.token,
                              http_client=http, **options)
    return sdk, http


def ask(said):
    return [{"role": "user", "content": said}]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--onejob", default="target/debug/onejob")
    args = parser.parse_args()
    started = time.time()
    print(f"anthropic check: anthropic {anthropic.__version__}, httpx {httpx.__version__}")
    upstream = Upstream()
    with tempfile.TemporaryDirectory() as workdir:
        server = Onejob(os.path.abspath(args.onejob), workdir, upstream.port)
        try:
            run_checks(server, upstream)
        finally:
            server.stop()
    print(f"anthropic check: passed in {time.time() - started:.1f} s; "
          f"upstream calls in all: {upstream.total()}")


def run_checks(server, upstream):
    # 1. Client timeout shorter than the upstream: the SDK retries with the
    #    same Idempotency-Key, onejob rejoins the job, one upstream call.
    sdk, http = client(server, max_retries=4, timeout=1.0)
    said = "slow:2.5:timeouts and retries"
    t0 = time.time()
    message = sdk.messages.create(
        model=ROUTE, max_tokens=64, messages=ask(said),
        extra_headers={"Idempotency-Key": "anthropic-retry-1"},
    )
    print(f"  retries: the SDK sent {http.sent} requests in {time.time() - t0:.1f} s")
    check(http.sent >= 2, "the SDK timed out and retried")
    check(http.keys == {"anthropic-retry-1"}, "every retry carried the same Idempotency-Key")
    check(upstream.calls_for(said) == 1, "the upstream received exactly one call")
    check(message.content[0].text == "echo: timeouts and retries",
          "the SDK's final message is the upstream's answer")
    check(message.model == ROUTE and message.id.startswith("msg_")
          and message.stop_reason == "end_turn",
          "the message names the route and the job, and how it ended")

    # 2. Twenty concurrent calls with one key.
    sdk, http = client(server, max_retries=2, timeout=30.0)
    said = "slow:1:twenty at once"

    def one_call(_):
        return sdk.messages.create(
            model=ROUTE, max_tokens=64, messages=ask(said),
            extra_headers={"Idempotency-Key": "anthropic-storm"},
        )

    with concurrent.futures.ThreadPoolExecutor(max_workers=20) as pool:
        messages = list(pool.map(one_call, range(20)))
    print(f"  storm: {http.sent} requests, {upstream.calls_for(said)} upstream call(s)")
    check(upstream.calls_for(said) == 1, "twenty concurrent calls, one upstream call")
    check(len({m.id for m in messages}) == 1, "twenty concurrent calls, one message")
    check(all(m.content[0].text == "echo: twenty at once" for m in messages),
          "every caller got the upstream's answer")

    # 3. messages.stream: the text as it comes, a final message equal to
    #    the non-streamed answer, and a replay that streams it again.
    sdk, http = client(server, max_retries=2, timeout=30.0)
    said = "stream me"
    finals = []
    for round_ in ("first", "replay"):
        t0 = time.time()
        with sdk.messages.stream(
            model=ROUTE, max_tokens=64, messages=ask(said),
            extra_headers={"Idempotency-Key": "anthropic-stream"},
        ) as stream:
            pieces = list(stream.text_stream)
            final = stream.get_final_message()
        print(f"  stream ({round_}): {len(pieces)} text deltas in {time.time() - t0:.2f} s")
        check("".join(pieces) == "echo: stream me",
              f"text_stream ({round_}) yields the answer's text")
        check(len(pieces) == 3, f"the text ({round_}) came in the upstream's three pieces")
        finals.append(final)
    check(finals[0].model_dump() == finals[1].model_dump(),
          "a replay streams the same final message")
    check(upstream.calls_for(said) == 1, "the streamed request reached the upstream once")
    whole = sdk.messages.create(
        model=ROUTE, max_tokens=64, messages=ask(said),
        extra_headers={"Idempotency-Key": "anthropic-not-streamed"},
    )
    streamed = finals[0].model_dump(exclude={"id"})
    check(streamed == whole.model_dump(exclude={"id"}),
          "the final streamed message equals the non-streamed answer "
          f"({streamed['content']}, {streamed['stop_reason']}, {dict(streamed['usage'])})")

    # 4. Same key, another body: ConflictError at once.
    sdk, http = client(server, max_retries=3, timeout=30.0)
    sdk.messages.create(model=ROUTE, max_tokens=64, messages=ask("first body"),
                        extra_headers={"Idempotency-Key": "anthropic-conflict"})
    http.sent = 0
    try:
        sdk.messages.create(model=ROUTE, max_tokens=64, messages=ask("another body"),
                            extra_headers={"Idempotency-Key": "anthropic-conflict"})
        check(False, "a reused key raises ConflictError")
    except anthropic.ConflictError as error:
        check(error.status_code == 409, "a reused key raises anthropic.ConflictError (409)")
        check(http.sent == 1, "the SDK did not retry the conflict")
    check(upstream.calls_for("another body") == 0, "the conflicting body reached no provider")

    # 5. No key, a bad token, an unknown model.
    sdk, http = client(server, max_retries=2, timeout=30.0)
    try:
        sdk.messages.create(model=ROUTE, max_tokens=64, messages=ask("no key"))
        check(False, "a request without a key is refused")
    except anthropic.BadRequestError as error:
        check("extra_headers" in str(error), "without a key: BadRequestError showing extra_headers")
    check(upstream.calls_for("no key") == 0, "the keyless request reached no provider")
    bad, _ = client(server, api_key="not-a-onejob-token", max_retries=2, timeout=30.0)
    try:
        bad.messages.create(model=ROUTE, max_tokens=64, messages=ask("bad token"),
                            extra_headers={"Idempotency-Key": "anthropic-bad-token"})
        check(False, "a bad token is refused")
    except anthropic.AuthenticationError as error:
        check(error.status_code == 401, "a bad token raises anthropic.AuthenticationError (401)")
    try:
        sdk.messages.create(model="claude-none", max_tokens=64, messages=ask("x"),
                            extra_headers={"Idempotency-Key": "anthropic-unknown-model"})
        check(False, "an unknown model is refused")
    except anthropic.NotFoundError:
        check(True, "an unknown model raises anthropic.NotFoundError")


if __name__ == "__main__":
    sys.exit(main())
