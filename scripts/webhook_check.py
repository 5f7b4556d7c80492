#!/usr/bin/env python3
"""Completion webhooks, verified by the `standardwebhooks` Python package.

Starts a fake OpenAI-compatible upstream and a webhook receiver (real HTTP
servers in this process), a `onejob serve` process on a fresh SQLite file
with a webhook key and a chat route (the shared harness in
`check_support.py`), registers an endpoint, runs jobs through
/v1/chat/completions, and checks every delivery the receiver got with
`standardwebhooks.Webhook(secret).verify(body, headers)`.

It asserts that:
- each job's `job.succeeded` delivery verifies, and names the job;
- a tampered body, or another secret, fails verification;
- after a rotation, a delivery verifies under the new secret and, during
  the overlap, under the old one too.

Usage: python3 scripts/webhook_check.py --onejob target/debug/onejob
Prints what it verified; exits non-zero on the first failed check.
"""

import json
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import standardwebhooks

# check_support sits next to this script; keep its bytecode out of the tree.
sys.dont_write_bytecode = True
from check_support import Checks, FakeUpstream, completion, main

UPSTREAM_KEY = "sk-upstream-for-the-webhook-check"
WEBHOOK_KEY = "webhook-key-for-the-webhook-check-0123456789abcdef"

check = Checks("webhook check")


class Upstream(FakeUpstream):
    def __init__(self):
        super().__init__(UPSTREAM_KEY)

    def answer(self, handler, body, said):
        handler.reply(200, completion(body["model"], f"echo: {said}"))


class Receiver:
    """A webhook receiver on a free local port: records every request's
    headers and body, answers 204."""

    def __init__(self):
        self.lock = threading.Lock()
        self.received = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                with receiver.lock:
                    receiver.received.append((dict(self.headers.items()), body))
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, n, within=20):
        deadline = time.time() + within
        while time.time() < deadline:
            with self.lock:
                if len(self.received) >= n:
                    return list(self.received)
            time.sleep(0.05)
        raise SystemExit(f"webhook check FAILED: {n} deliveries did not arrive in {within} s")


def call(server, method, path, body=None, headers=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{server.base}{path}", data=data, method=method)
    request.add_header("Authorization", f"Bearer {server.token}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, json.loads(response.read() or b"null")


def run_job(server, key):
    status, answer = call(server, "POST", "/v1/chat/completions",
                          {"model": "chat", "messages": [{"role": "user", "content": key}]},
                          {"Idempotency-Key": key})
    check(status == 200, f"the chat completion under {key!r} answered")
    return answer


def verifies(secret, headers, body):
    try:
        return standardwebhooks.Webhook(secret).verify(body, headers)
    except standardwebhooks.WebhookVerificationError:
        return None


def run_checks(server, upstream):
    receiver = Receiver()
    status, created = call(server, "POST", "/api/v1/webhooks", {
        "url": f"http://127.0.0.1:{receiver.port}/hook",
        "events": ["job.succeeded", "job.failed"],
    })
    check(status == 201 and created["secret"].startswith("whsec_"),
          "an endpoint was registered; its secret is whsec_…")
    secret = created["secret"]
    endpoint = created["webhook"]["id"]

    run_job(server, "webhook-1")
    run_job(server, "webhook-2")
    got = receiver.wait_for(2)
    for headers, body in got:
        payload = verifies(secret, headers, body)
        check(payload is not None and payload["type"] == "job.succeeded",
              f"delivery {headers.get('webhook-id')} verifies with standardwebhooks "
              f"{standardwebhooks.__version__} (job {payload and payload['data']['id']})")
    headers, body = got[0]
    check(verifies(secret, headers, body + b" ") is None, "a tampered body fails verification")
    other = "whsec_" + "A" * 43 + "="
    check(verifies(other, headers, body) is None, "another secret fails verification")

    status, rotated = call(server, "POST", f"/api/v1/webhooks/{endpoint}/rotate-secret")
    new_secret = rotated["secret"]
    check(status == 200 and new_secret != secret, "the secret was rotated")
    run_job(server, "webhook-3")
    headers, body = receiver.wait_for(3)[2]
    check(verifies(new_secret, headers, body) is not None,
          "after the rotation a delivery verifies with the new secret")
    check(verifies(secret, headers, body) is not None,
          "and, during the overlap, with the old one")
    print(f"webhook check: {len(receiver.received)} deliveries verified")


if __name__ == "__main__":
    main(check, standardwebhooks, Upstream, run_checks, "chat", "UPSTREAM_KEY",
         extra_config=f"""
[webhooks]
signing_key_env = "ONEJOB_WEBHOOK_KEY"
allow_private_addresses = true
poll_interval_ms = 50
""", extra_env={"ONEJOB_WEBHOOK_KEY": WEBHOOK_KEY})
