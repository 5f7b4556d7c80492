#!/usr/bin/env python3
"""The official OpenAI Python SDK's Responses API against a real onejob server.

Starts the shared fake OpenAI-compatible upstream (a real HTTP server in
this process that counts every call it receives) and a `onejob serve`
process with one worker slot and a chat route to it (`check_support`), and
drives `client.responses` against onejob's /v1 as an existing client
would: only `base_url`, `api_key` and an `Idempotency-Key` change.

It asserts that:
- `responses.create(background=True)` answers at once, and
  `responses.retrieve` polls it until it has completed, from exactly one
  upstream call;
- the SDK's own timeout and retries of a create under one key (a short
  `timeout`, `max_retries=2`, while the upstream holds) give one job and
  one upstream call;
- `responses.cancel` of a response still queued (the one worker slot is
  busy) stops it before any upstream call, and cancelling it again answers
  the same;
- `stream=True` delivers the Responses events in order (the SDK's typed
  events), with consecutive sequence numbers, and the deltas are the text.

Usage: python3 scripts/responses_check.py --onejob target/debug/onejob
Prints what it checked; exits non-zero on the first failed check.
"""

import sys
import threading
import time

import openai

# check_support sits next to this script; keep its bytecode out of the tree.
sys.dont_write_bytecode = True
from check_support import Checks, Counting, FakeUpstream, completion, delayed, main

UPSTREAM_KEY = "sk-upstream-for-the-responses-check"

check = Checks("responses check")


class Upstream(FakeUpstream):
    """A fake OpenAI-compatible provider. The answer is `echo: <text>`; a
    user message `slow:<s>:<text>` is answered after <s> seconds, and
    `hold:<text>` once `release()` is called."""

    def __init__(self):
        super().__init__(UPSTREAM_KEY)
        self.released = threading.Event()

    def answer(self, handler, body, said):
        if said.startswith("hold:"):
            self.released.wait(60)
            said = said[len("hold:"):]
        text = f"echo: {delayed(said)}"
        if body.get("stream"):
            handler.open_stream()
            handler.event({"id": "c", "object": "chat.completion.chunk", "created": 0,
                           "model": body["model"], "choices": [
                               {"index": 0, "delta": {"role": "assistant", "content": ""},
                                "finish_reason": None}]})
            for piece in ["echo: ", said[:3], said[3:]]:
                handler.event({"id": "c", "object": "chat.completion.chunk", "created": 0,
                               "model": body["model"], "choices": [
                                   {"index": 0, "delta": {"content": piece},
                                    "finish_reason": None}]})
            handler.event({"id": "c", "object": "chat.completion.chunk", "created": 0,
                           "model": body["model"], "choices": [
                               {"index": 0, "delta": {}, "finish_reason": "stop"}]})
            return handler.done()
        handler.reply(200, completion(body["model"], text))


def client(server, **options):
    http = Counting()
    sdk = openai.OpenAI(base_url=f"{server.base}/v1", api_key=server.token,
                        http_client=http, **options)
    return sdk, http


def until(what, done, within=30):
    deadline = time.time() + within
    while True:
        value = done()
        if value:
            return value
        if time.time() > deadline:
            raise SystemExit(f"{check.name} FAILED: {what} never happened")
        time.sleep(0.05)


def run_checks(server, upstream):
    # 1. A background response, polled until it has completed.
    sdk, http = client(server, max_retries=2, timeout=30.0)
    said = "slow:1:in the background"
    t0 = time.time()
    created = sdk.responses.create(model="gpt-safe", input=said, background=True,
                                   extra_headers={"Idempotency-Key": "responses-bg"})
    print(f"  background: answered in {time.time() - t0:.2f} s with status {created.status}")
    check(created.status in ("queued", "in_progress") and created.id.startswith("resp_"),
          "responses.create(background=True) answers at once, queued or in progress")
    polls = 0

    def completed():
        nonlocal polls
        polls += 1
        found = sdk.responses.retrieve(created.id)
        return found if found.status == "completed" else None

    done = until("the background response completing", completed)
    print(f"  background: completed after {polls} polls")
    check(done.output_text == "echo: in the background",
          "responses.retrieve polls it until completed, with the upstream's answer")
    check(done.usage is not None and done.usage.total_tokens == 7,
          "the completed response carries the usage")
    check(sdk.responses.retrieve(created.id).output_text == done.output_text,
          "a poll after completion reads the same response")
    check(upstream.calls_for(said) == 1, "exactly one upstream call for it, however many polls")

    # 2. The SDK's own timeout and retries of one create, under one key.
    sdk, http = client(server, max_retries=2, timeout=1.0)
    said = "slow:2.5:timeouts and retries"
    answer = sdk.responses.create(model="gpt-safe", input=said,
                                  extra_headers={"Idempotency-Key": "responses-retry"})
    print(f"  retries: the SDK sent {http.sent} requests")
    check(http.sent >= 2, "the SDK timed out and retried the create")
    check(http.keys == {"responses-retry"}, "every retry carried the same Idempotency-Key")
    check(answer.output_text == "echo: timeouts and retries",
          "the SDK's final answer is the upstream's")
    check(upstream.calls_for(said) == 1, "one job: the upstream received exactly one call")

    # 3. Cancel a queued response: the one worker slot holds another.
    sdk, http = client(server, max_retries=2, timeout=30.0)
    blocker = sdk.responses.create(model="gpt-safe", input="hold:the blocker", background=True,
                                   extra_headers={"Idempotency-Key": "responses-blocker"})
    until("the blocker reaching the upstream", lambda: upstream.calls_for("hold:the blocker"))
    queued = sdk.responses.create(model="gpt-safe", input="never sent", background=True,
                                  extra_headers={"Idempotency-Key": "responses-queued"})
    check(queued.status == "queued", "with the worker busy, the next response is queued")
    cancelled = sdk.responses.cancel(queued.id)
    check(cancelled.status == "cancelled", "responses.cancel answers it cancelled")
    again = sdk.responses.cancel(queued.id)
    check(again.status == "cancelled" and again.id == cancelled.id,
          "cancelling it again answers the same")
    upstream.released.set()
    until("the blocker completing",
          lambda: sdk.responses.retrieve(blocker.id).status == "completed")
    time.sleep(1)
    check(sdk.responses.retrieve(queued.id).status == "cancelled", "it stays cancelled")
    check(upstream.calls_for("never sent") == 0,
          "the cancelled response never reached the upstream, though the worker was free")
    error = check.refused("a completed response cannot be cancelled", openai.ConflictError,
                          lambda: sdk.responses.cancel(blocker.id))
    check(error.status_code == 409, "cancelling a completed response is a 409 ConflictError")

    # 4. A streamed response: the typed events in order.
    sdk, http = client(server, max_retries=2, timeout=30.0)
    stream = sdk.responses.create(model="gpt-safe", input="streamed", stream=True,
                                  extra_headers={"Idempotency-Key": "responses-stream"})
    types, numbers, deltas, final = [], [], "", None
    for event in stream:
        types.append(event.type)
        numbers.append(event.sequence_number)
        if event.type == "response.output_text.delta":
            deltas += event.delta
        if event.type == "response.completed":
            final = event.response
    print(f"  stream: {len(types)} events")
    check(types[:4] == ["response.created", "response.in_progress",
                        "response.output_item.added", "response.content_part.added"],
          "the stream opens with created, in_progress, output_item.added, content_part.added")
    check(set(types[4:-4]) == {"response.output_text.delta"} and len(types) > 8,
          "then the text deltas")
    check(types[-4:] == ["response.output_text.done", "response.content_part.done",
                         "response.output_item.done", "response.completed"],
          "and it ends with output_text.done, content_part.done, output_item.done, completed")
    check(numbers == list(range(len(numbers))), "sequence numbers count from 0, one apart")
    check(deltas == "echo: streamed" and final.output_text == deltas,
          "the deltas are the completed response's text")
    check(upstream.calls_for("streamed") == 1, "the stream made one upstream call")


if __name__ == "__main__":
    sys.exit(main(check, openai, Upstream, run_checks, "gpt-safe", "RESPONSES_CHECK_UPSTREAM_KEY",
                  extra_config="\n[worker]\nconcurrency = 1\n"))
