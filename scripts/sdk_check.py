#!/usr/bin/env python3
"""The official OpenAI Python SDK against a real onejob server.

Starts a fake OpenAI-compatible upstream (a real HTTP server in this
process that counts every call it receives), a `onejob serve` process on a
fresh SQLite file with a chat route to that upstream, and drives the SDK
against onejob's /v1 the way an existing client would: only `base_url`,
`api_key` and an `Idempotency-Key` per request change.

It asserts that:
- the SDK times out and retries, yet the upstream is called once per key
  and the SDK's final answer is the upstream's;
- twenty concurrent calls with one key make one upstream call and one answer;
- the same key with different messages raises `openai.ConflictError` at
  once (no retries);
- streaming works through the SDK, and a replay streams the same answer;
- a streamed completion whose client drops the connection after three
  chunks, while the upstream is still generating, is streamed again under
  the same Idempotency-Key from its first chunk: the whole answer, from one
  upstream call; with `Last-Event-ID` it resumes after the chunk it names;
- a request without a key raises `openai.BadRequestError` saying how to
  send one; `models.list()` lists the chat route.

Usage: python3 scripts/sdk_check.py --onejob target/debug/onejob
Prints its figures; exits non-zero on the first failed check.
"""

import sys
import time

import openai

# check_support sits next to this script; keep its bytecode out of the tree.
sys.dont_write_bytecode = True
from check_support import (Checks, Counting, FakeUpstream, at_once, chunk, completion, delayed,
                           main)

UPSTREAM_KEY = "sk-upstream-for-the-sdk-check"

check = Checks("sdk check")


def streamed_pieces(count, text):
    """The chunks a `stream:<count>:<s>:<text>` message is answered with."""
    return [f"{text}{i} " for i in range(count)]


class Upstream(FakeUpstream):
    """A fake OpenAI-compatible provider. A user message `slow:<s>:<text>`
    is answered after <s> seconds; the answer is `echo: <text>`. A request
    with `stream: true` whose message is `stream:<n>:<s>:<text>` is answered
    as server-sent events: n chunks (`<text>0 `, `<text>1 `, ...), <s>
    seconds apart."""

    def __init__(self):
        super().__init__(UPSTREAM_KEY)
        self.finished = set()  # streamed messages whose stream has ended

    def answer(self, handler, body, said):
        if body.get("stream") and said.startswith("stream:"):
            _, count, seconds, text = said.split(":", 3)
            return self.stream(handler, body, said, streamed_pieces(int(count), text),
                               float(seconds))
        handler.reply(200, completion(body["model"], f"echo: {delayed(said)}"))

    def stream(self, handler, body, said, pieces, seconds):
        handler.open_stream()

        def event(delta, finish=None, usage=None):
            handler.event(chunk(body["model"], delta, finish, usage, created=int(time.time())))

        try:
            event({"role": "assistant", "content": ""})
            for piece in pieces:
                time.sleep(seconds)
                event({"content": piece})
            event({}, finish="stop")
            if body.get("stream_options", {}).get("include_usage"):
                event(None, usage={"prompt_tokens": 5, "completion_tokens": len(pieces),
                                   "total_tokens": 5 + len(pieces)})
            handler.done()
        finally:
            with self.lock:
                self.finished.add(said)

    def has_finished(self, said):
        with self.lock:
            return said in self.finished


def client(server, **options):
    http = Counting()
    sdk = openai.OpenAI(base_url=f"{server.base}/v1", api_key=server.token,
                        http_client=http, **options)
    return sdk, http


def run_checks(server, upstream):
    # 1. Client timeout shorter than the upstream: the SDK retries, onejob
    #    rejoins the job, the upstream is called once.
    sdk, http = client(server, max_retries=4, timeout=1.0)
    said = "slow:2.5:timeouts and retries"
    t0 = time.time()
    answer = sdk.chat.completions.create(
        model="gpt-safe", messages=[{"role": "user", "content": said}],
        extra_headers={"Idempotency-Key": "sdk-retry-1"},
    )
    print(f"  retries: the SDK sent {http.sent} requests in {time.time() - t0:.1f} s")
    check(http.sent >= 2, "the SDK timed out and retried")
    check(upstream.calls_for(said) == 1, "the upstream received exactly one call")
    check(answer.choices[0].message.content == "echo: timeouts and retries",
          "the SDK's final answer is the upstream's")
    check(answer.model == "gpt-safe" and answer.id.startswith("chatcmpl-"),
          "the answer names the route and the job")

    # 2. Twenty concurrent calls with one key.
    sdk, http = client(server, max_retries=2, timeout=30.0)
    said = "slow:1:twenty at once"

    answers = at_once(lambda: sdk.chat.completions.create(
        model="gpt-safe", messages=[{"role": "user", "content": said}],
        extra_headers={"Idempotency-Key": "sdk-storm"},
    ))
    print(f"  storm: {http.sent} requests, {upstream.calls_for(said)} upstream call(s)")
    check(upstream.calls_for(said) == 1, "twenty concurrent calls, one upstream call")
    check(len({a.id for a in answers}) == 1, "twenty concurrent calls, one answer")
    check(all(a.choices[0].message.content == "echo: twenty at once" for a in answers),
          "every caller got the upstream's answer")

    # 3. Same key, different messages: ConflictError at once.
    sdk, http = client(server, max_retries=3, timeout=30.0)
    sdk.chat.completions.create(
        model="gpt-safe", messages=[{"role": "user", "content": "first body"}],
        extra_headers={"Idempotency-Key": "sdk-conflict"},
    )
    http.sent = 0
    error = check.refused("a reused key raises ConflictError", openai.ConflictError,
                          lambda: sdk.chat.completions.create(
                              model="gpt-safe",
                              messages=[{"role": "user", "content": "another body"}],
                              extra_headers={"Idempotency-Key": "sdk-conflict"},
                          ))
    check(error.status_code == 409, "a reused key raises openai.ConflictError (409)")
    check(http.sent == 1, "the SDK did not retry the conflict")
    check(upstream.calls_for("another body") == 0, "the conflicting body reached no provider")

    # 4. Streaming, and a replay that streams too.
    sdk, http = client(server, max_retries=2, timeout=30.0)
    for round_ in ("first", "replay"):
        stream = sdk.chat.completions.create(
            model="gpt-safe", messages=[{"role": "user", "content": "stream me"}],
            stream=True, stream_options={"include_usage": True},
            extra_headers={"Idempotency-Key": "sdk-stream"},
        )
        text, usage, finish = "", None, None
        for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage:
                usage = chunk.usage
        check(text == "echo: stream me" and finish == "stop",
              f"streaming through the SDK ({round_}) gives the answer")
        check(usage is not None and usage.total_tokens == 7,
              f"the stream ({round_}) ends with the usage")
    check(upstream.calls_for("stream me") == 1, "the streamed request reached the upstream once")

    # 5. A stream whose client drops the connection after three chunks,
    #    while the upstream is still generating, then streams again under
    #    the same key: the whole answer, from the one upstream call.
    sdk, http = client(server, max_retries=2, timeout=30.0)
    pieces = streamed_pieces(10, "tok")
    said = "stream:10:0.2:tok"
    whole = "".join(pieces)

    def stream_of(extra=None):
        headers = {"Idempotency-Key": "sdk-stream-reconnect", **(extra or {})}
        return sdk.chat.completions.create(
            model="gpt-safe", messages=[{"role": "user", "content": said}],
            stream=True, extra_headers=headers,
        )

    t0 = time.time()
    stream = stream_of()
    seen, first_at = [], None
    for chunk in stream:
        piece = chunk.choices[0].delta.content if chunk.choices else None
        if piece:
            first_at = first_at if first_at is not None else time.time() - t0
            seen.append(piece)
            if len(seen) == 3:
                break
    stream.close()
    dropped_at = time.time() - t0
    still_generating = not upstream.has_finished(said)
    print(f"  reconnect: first chunk after {first_at:.2f} s; hung up after {len(seen)} "
          f"chunks at {dropped_at:.2f} s (the upstream takes about {10 * 0.2:.1f} s)")
    check(seen == pieces[:3], "the first stream delivered the first three chunks")
    check(still_generating, "the client hung up while the upstream was still generating")
    stream = stream_of()
    again, finish = [], None
    for chunk in stream:
        if chunk.choices:
            if chunk.choices[0].delta.content:
                again.append(chunk.choices[0].delta.content)
            finish = chunk.choices[0].finish_reason or finish
    print(f"  reconnect: the second stream got {len(again)} chunks in "
          f"{time.time() - t0 - dropped_at:.2f} s; upstream calls: {upstream.calls_for(said)}")
    check("".join(again) == whole and finish == "stop",
          "the reconnect under the same key streams the whole answer, from its first chunk")
    check(upstream.calls_for(said) == 1, "the upstream was called once for both streams")
    # Event 0 is the role chunk, 1..10 the answer's chunks: after 3, the rest.
    resumed = "".join(c.choices[0].delta.content or "" for c in stream_of({"Last-Event-ID": "3"})
                      if c.choices)
    check(resumed == "".join(pieces[3:]), "Last-Event-ID: 3 resumes after the third chunk")
    check(upstream.calls_for(said) == 1, "resuming called no upstream")

    # 6. No key: a 400 that says how to send one.
    sdk, http = client(server, max_retries=2, timeout=30.0)
    error = check.refused("a request without a key is refused", openai.BadRequestError,
                          lambda: sdk.chat.completions.create(
                              model="gpt-safe", messages=[{"role": "user", "content": "no key"}]))
    check("extra_headers" in str(error), "without a key: BadRequestError showing extra_headers")
    check(upstream.calls_for("no key") == 0, "the keyless request reached no provider")

    # 7. Models, and an unknown model.
    models = [m.id for m in sdk.models.list()]
    check(models == ["gpt-safe"], "models.list() lists the chat route")
    check.refused("an unknown model is refused", openai.NotFoundError,
                  lambda: sdk.chat.completions.create(
                      model="gpt-none", messages=[{"role": "user", "content": "x"}],
                      extra_headers={"Idempotency-Key": "sdk-unknown-model"}))
    check(True, "an unknown model raises openai.NotFoundError")


if __name__ == "__main__":
    sys.exit(main(check, openai, Upstream, run_checks, "gpt-safe", "SDK_CHECK_UPSTREAM_KEY"))
