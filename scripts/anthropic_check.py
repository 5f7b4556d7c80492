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

import sys
import time

import anthropic

# check_support sits next to this script; keep its bytecode out of the tree.
sys.dont_write_bytecode = True
from check_support import (USAGE, Checks, Counting, FakeUpstream, at_once, chunk, completion,
                           delayed, main)

UPSTREAM_KEY = "sk-upstream-for-the-anthropic-check"
ROUTE = "claude-safe"

check = Checks("anthropic check")


class Upstream(FakeUpstream):
    """A fake OpenAI-compatible provider. A user message `slow:<s>:<text>`
    is answered after <s> seconds; the answer is `echo: <text>`, streamed
    in three pieces when the request asks for a stream."""

    def __init__(self):
        super().__init__(UPSTREAM_KEY)

    def answer(self, handler, body, said):
        echo = f"echo: {delayed(said)}"
        if body.get("stream"):
            return self.stream(handler, body["model"], echo)
        handler.reply(200, completion(body["model"], echo))

    def stream(self, handler, model, answer):
        handler.open_stream()
        handler.event(chunk(model, {"role": "assistant", "content": ""}))
        third = max(1, len(answer) // 3)
        for piece in (answer[:third], answer[third:2 * third], answer[2 * third:]):
            handler.event(chunk(model, {"content": piece}))
            time.sleep(0.05)
        handler.event(chunk(model, {}, "stop"))
        handler.event(chunk(model, usage=USAGE))
        handler.done()


def client(server, api_key=None, **options):
    http = Counting()
    sdk = anthropic.Anthropic(base_url=server.base, api_key=api_key or server.token,
                              http_client=http, **options)
    return sdk, http


def ask(said):
    return [{"role": "user", "content": said}]


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

    messages = at_once(lambda: sdk.messages.create(
        model=ROUTE, max_tokens=64, messages=ask(said),
        extra_headers={"Idempotency-Key": "anthropic-storm"},
    ))
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
    error = check.refused("a reused key raises ConflictError", anthropic.ConflictError,
                          lambda: sdk.messages.create(
                              model=ROUTE, max_tokens=64, messages=ask("another body"),
                              extra_headers={"Idempotency-Key": "anthropic-conflict"}))
    check(error.status_code == 409, "a reused key raises anthropic.ConflictError (409)")
    check(http.sent == 1, "the SDK did not retry the conflict")
    check(upstream.calls_for("another body") == 0, "the conflicting body reached no provider")

    # 5. No key, a bad token, an unknown model.
    sdk, http = client(server, max_retries=2, timeout=30.0)
    error = check.refused("a request without a key is refused", anthropic.BadRequestError,
                          lambda: sdk.messages.create(model=ROUTE, max_tokens=64,
                                                      messages=ask("no key")))
    check("extra_headers" in str(error), "without a key: BadRequestError showing extra_headers")
    check(upstream.calls_for("no key") == 0, "the keyless request reached no provider")
    bad, _ = client(server, api_key="not-a-onejob-token", max_retries=2, timeout=30.0)
    error = check.refused("a bad token is refused", anthropic.AuthenticationError,
                          lambda: bad.messages.create(
                              model=ROUTE, max_tokens=64, messages=ask("bad token"),
                              extra_headers={"Idempotency-Key": "anthropic-bad-token"}))
    check(error.status_code == 401, "a bad token raises anthropic.AuthenticationError (401)")
    check.refused("an unknown model is refused", anthropic.NotFoundError,
                  lambda: sdk.messages.create(
                      model="claude-none", max_tokens=64, messages=ask("x"),
                      extra_headers={"Idempotency-Key": "anthropic-unknown-model"}))
    check(True, "an unknown model raises anthropic.NotFoundError")


if __name__ == "__main__":
    sys.exit(main(check, anthropic, Upstream, run_checks, ROUTE, "ANTHROPIC_CHECK_UPSTREAM_KEY"))
