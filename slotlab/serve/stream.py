"""Streamed answers (`"stream": true`) as llama-server sends them (server-context.cpp
handle_completions_impl, send_partial_response / send_final_response; server-task.cpp to_json_*).

- The first result decides the HTTP answer: an error before anything was streamed (a prompt longer than
  the context) is a plain JSON error with its status, as OpenAI's API does; otherwise 200 and SSE.
- Each sampled token is one partial result (`process_token`): its `text_to_send` is what is new and
  complete (an unfinished UTF-8 character sends nothing; a stop string is cut, and text that may be the
  start of one is held back), with `tokens: [id]`, `tokens_predicted` / `tokens_evaluated`, the
  token's probabilities (`n_probs`) and, with `timings_per_token`, the slot's timings at that moment.
- `return_progress`: a `prompt_progress` partial when the slot starts the prompt (`processed` = the
  tokens reused from the cache) and after every decode while the prompt is processed
  (`{total, cache, processed, time_ms}`).
- Several tasks (`n` > 1 choices, several prompts) stream into one response, each chunk with its
  `index`; OpenAI formats end with `data: [DONE]`. An error after the start ends the stream with
  `data: {"error": ...}`.
- Chat chunks: the first token (and every progress update) opens with a `{"role": "assistant",
  "content": null}` delta, then the content delta; a token whose text is empty sends nothing; the
  last chunk has the finish reason and an empty delta, then (`stream_options.include_usage`) one with
  no choices and the usage."""

from __future__ import annotations

import asyncio
import json
import time

from starlette.responses import JSONResponse, StreamingResponse

from slotlab.engine import event_types as T
from slotlab.engine.slot import SlotState, now_us
from slotlab.serve import anthropic as A
from slotlab.serve import info
from slotlab.serve import responses as R
from slotlab.serve import sampling as smp


def validate_utf8(b: bytes) -> int:
    """server-common.cpp validate_utf8: the length of `b` without an unfinished character at its end."""
    n = len(b)
    for i in range(1, min(4, n) + 1):
        c = b[n - i]
        if (c & 0xE0) == 0xC0:
            if i < 2:
                return n - i
        elif (c & 0xF0) == 0xE0:
            if i < 3:
                return n - i
        elif (c & 0xF8) == 0xF0:
            if i < 4:
                return n - i
    return n


def find_partial_stop(text: bytes, stop: bytes) -> int:
    """common.cpp string_find_partial_stop: where a suffix of `text` that begins `stop` starts, or -1."""
    if text and stop:
        last = text[-1:]
        for i in range(len(stop) - 1, -1, -1):
            if stop[i:i + 1] == last and text.endswith(stop[:i + 1]):
                return len(text) - i - 1
    return -1


class TextSender:
    """process_token's `text_to_send` for one task (bytes, as the server's std::string)."""

    def __init__(self, model, stops):
        self.model = model
        self.stops = [w.encode("utf-8") for w in stops or () if w]
        self.generated = b""
        self.n_sent = 0
        self.stopping_word = ""
        self.has_new_line = False

    def _find(self, text: bytes, last_size: int, full: bool) -> int:
        stop_pos = -1
        for w in self.stops:
            if full:
                tmp = len(w) + last_size
                pos = text.find(w, len(text) - tmp if len(text) > tmp else 0)
            else:
                pos = find_partial_stop(text, w)
            if pos != -1 and (stop_pos == -1 or pos < stop_pos):
                if full:
                    self.stopping_word = w.decode("utf-8", errors="replace")
                stop_pos = pos
        return stop_pos

    def push(self, tok: int) -> str | None:
        """The text this token sends, "" when held back, None when no partial is sent (an unfinished
        UTF-8 character)."""
        is_eog = self.model.is_eog(tok)
        piece = b"" if is_eog else self.model.token_to_piece(tok)  # the server renders without specials
        self.generated += piece
        if validate_utf8(self.generated) < len(self.generated):
            return None
        pos = min(self.n_sent, len(self.generated))
        test = self.generated[pos:]
        send = True
        stop_pos = self._find(test, len(piece), True)
        if stop_pos != -1:
            self.generated = self.generated[:pos + stop_pos]
            pos = min(self.n_sent, len(self.generated))
        elif not is_eog:
            send = self._find(test, len(piece), False) == -1
        if not send:
            return ""
        out = self.generated[pos:]
        self.n_sent += len(out)
        if b"\n" in out:
            self.has_new_line = True
        return out.decode("utf-8", errors="replace")

    @classmethod
    def replay(cls, model, tokens, stops) -> "TextSender":
        """The sender after a whole generation: `.generated` is the server's generated_text (the final
        content), with `.stopping_word` and `.has_new_line`."""
        s = cls(model, stops)
        for t in tokens:
            s.push(int(t))
        return s

    @property
    def content(self) -> str:
        return self.generated.decode("utf-8", errors="replace")


def progress_json(task, slot) -> dict:
    """result_prompt_progress: the task's prompt length, the reused tokens, the tokens the slot holds
    now and the time since the prompt started."""
    return {"total": task.n_tokens, "cache": slot.stats.n_prompt_cached, "processed": len(slot.tokens),
            "time_ms": max(0, now_us() - slot.stats.t_start) // 1000}


class Streamer:
    """The SSE answer of one request over its tasks (one per prompt and choice)."""

    def __init__(self, api, kind: str, cid: str | None):
        self.api, self.kind, self.cid = api, kind, cid
        self.engine = api.engine
        self.model = api.engine.model
        self.loop = asyncio.get_running_loop()
        self.q: asyncio.Queue = asyncio.Queue()
        self.tasks: list = []
        self.senders: dict[int, TextSender] = {}
        self.n_done = 0
        self._unsubscribe = None
        self._ids: dict[int, object] = {}  # task id -> task
        self._progress: dict[int, object] = {}  # task id -> task, those with return_progress
        self._begun: set[int] = set()  # task ids whose slot started their prompt
        self._text_started: set[int] = set()  # anthropic: task ids whose text block is open
        self._resp: dict[int, dict] = {}  # responses: each task's stream state (ids, created, text started)

    # ------------------------------------------------------------------ engine side (engine thread)

    def on_token(self, task, tok):
        slot = self.engine.core.slots[task.id_slot]
        v = task.values
        timings = slot.stats.timings() if v.get("timings_per_token") else None
        probs = task.token_probs[-1] if task.token_probs else None  # appended just before this call
        item = (tok, probs, timings, slot.stats.n_gen, slot.stats.n_prompt_cached)
        self.loop.call_soon_threadsafe(self.q.put_nowait, ("tok", task, item))

    def _on_event(self, ev) -> None:
        if ev.kind == T.PROMPT_PLAN:
            task = self._progress.get(ev.task)
            if task is not None:
                self._send_progress(task)
            elif ev.task in self._ids and ev.task not in self._begun:
                # no progress asked: the server's is_begin partial (it only sends the HTTP headers)
                self._begun.add(ev.task)
                t = self._ids[ev.task]
                self.loop.call_soon_threadsafe(self.q.put_nowait, ("begin", t, None))
        elif ev.kind == T.DECODE:
            for task in self._progress.values():
                if task.id_slot < 0 or task.done:
                    continue
                slot = self.engine.core.slots[task.id_slot]
                if slot.task is task and slot.state in (SlotState.PROCESSING_PROMPT, SlotState.DONE_PROMPT):
                    self._send_progress(task)

    def _send_progress(self, task) -> None:
        slot = self.engine.core.slots[task.id_slot]
        timings = slot.stats.timings() if task.values.get("timings_per_token") else None
        item = (progress_json(task, slot), timings, slot.stats.n_gen)
        self.loop.call_soon_threadsafe(self.q.put_nowait, ("progress", task, item))

    def watch(self, task) -> None:
        """Follow a task just submitted (hold the engine's lock from the submit to here, so that no step
        runs in between: its events are matched by task id)."""
        self.tasks.append(task)
        self._ids[task.id] = task
        self.senders[task.id] = TextSender(self.model, task.values.get("stop") or ())
        if task.values.get("return_progress"):
            self._progress[task.id] = task
        task.add_done_callback(lambda t: self.loop.call_soon_threadsafe(self.q.put_nowait, ("done", t, None)))

    def subscribe(self) -> None:
        self._unsubscribe = self.engine.events.subscribe(self._on_event)

    def close(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        for t in self.tasks:
            if not t.done:
                self.engine.cancel(t)  # the client went away mid-stream: release its slot

    # ------------------------------------------------------------------ chunks

    def _base_oai(self, obj: str) -> dict:
        return {"created": int(time.time()), "id": self.cid, "model": self.api.results.model_name(),
                "system_fingerprint": info.BUILD_INFO, "object": obj}

    def _partial(self, task, text: str, tok: int, n_decoded: int, timings, progress, probs,
                 n_cached: int = 0) -> list[dict]:
        """server_task_result_cmpl_partial::to_json for this request's format."""
        if self.kind == "responses":
            return R.partial_events(self._resp_state(task), text, progress is not None, n_decoded, timings, progress)
        if self.kind == "anthropic":  # to_json_anthropic: no timings, no progress, no probs
            out = []
            if n_decoded == 1:
                out.append(A.message_start(self.cid, self.api.results.model_name(), task.n_tokens, n_cached))
            if text:
                out += A.text_events(text, task.id in self._text_started)
                self._text_started.add(task.id)
            return out
        probs_js = smp.probs_json(self.model, [probs], task.params.sampling.post_sampling_probs) \
            if probs is not None else None
        if self.kind == "completion":
            return [self._completion_partial(task, text, tok, n_decoded, timings, progress, probs_js)]
        if self.kind == "oai_text":
            out = {"choices": [{"text": text, "index": task.index,
                                "logprobs": {"content": probs_js} if probs_js else None, "finish_reason": None}],
                   **self._base_oai("text_completion")}
            if task.values.get("verbose"):  # the partial's own JSON, as /completion streams it
                out["__verbose"] = self._completion_partial(task, text, tok, n_decoded, timings, progress, probs_js)
            if timings is not None:
                out["timings"] = timings
            if progress is not None:
                out["prompt_progress"] = progress
            return [out]
        deltas = []

        def add(delta):
            deltas.append({"choices": [{"finish_reason": None, "index": task.index, "delta": delta}],
                           **self._base_oai("chat.completion.chunk")})

        if n_decoded == 1 or progress is not None:
            add({"role": "assistant", "content": None})
        if text:
            add({"content": text})
        if deltas:
            last = deltas[-1]
            if probs_js:
                last["choices"][0]["logprobs"] = {"content": probs_js}
            if timings is not None:
                last["timings"] = timings
            if progress is not None:
                last["prompt_progress"] = progress
        return deltas

    @staticmethod
    def _completion_partial(task, text, tok, n_decoded, timings, progress, probs_js) -> dict:
        """server_task_result_cmpl_partial::to_json_non_oaicompat."""
        out = {"index": task.index, "content": text, "tokens": [tok], "stop": False, "id_slot": -1,
               "tokens_predicted": n_decoded, "tokens_evaluated": task.n_tokens}
        if timings is not None:
            out["timings"] = timings
        if progress is not None:
            out["prompt_progress"] = progress
        if probs_js:
            out["completion_probabilities"] = probs_js
        return out

    def _final(self, task) -> list[dict]:
        api, r = self.api, task.result
        if self.kind == "anthropic":
            text = api.results.text(task)
            return A.final_events(r, bool(text.content), text.stopping_word)
        if self.kind == "responses":
            return R.final_events(self._resp_state(task), api.results.model_name(), r, api.results.text(task).content,
                                  int(time.time()))
        if self.kind == "completion":
            out = api.results.final_json(task)
            out["content"] = ""
            out["tokens"] = []
            out.pop("completion_probabilities", None)  # streamed with each token instead
            return [out]
        finish = "length" if r["stop_type"] == "limit" else "stop"
        if self.kind == "oai_text":
            out = {"choices": [{"text": "", "index": task.index, "logprobs": None, "finish_reason": finish}],
                   **self._base_oai("text_completion"), "usage": api.results.usage(r)}
            if task.values.get("verbose"):
                out["__verbose"] = self._verbose_final(task)
            out["timings"] = r["timings"]
            return [out]
        chunks = [{"choices": [{"finish_reason": finish, "index": task.index, "delta": {}}],
                   **self._base_oai("chat.completion.chunk")}]
        if task.values.get("include_usage"):
            chunks.append({"choices": [], **self._base_oai("chat.completion.chunk"), "usage": api.results.usage(r)})
        chunks[-1]["timings"] = r["timings"]
        if task.values.get("verbose"):
            chunks[0]["__verbose"] = self._verbose_final(task)
        return chunks

    def _verbose_final(self, task) -> dict:
        out = self.api.results.final_json(task)
        out["content"], out["tokens"] = "", []  # in stream mode the text went out with the partials
        out.pop("completion_probabilities", None)
        return out

    def _render(self, what: str, task, item) -> list[dict]:
        if what == "begin":
            return []
        if what == "progress":
            progress, timings, n_decoded = item
            return self._partial(task, "", 0, n_decoded, timings, progress, None)
        if what == "tok":
            tok, probs, timings, n_decoded, n_cached = item
            text = self.senders[task.id].push(tok)
            if text is None:
                return []  # an unfinished UTF-8 character: no partial
            return self._partial(task, text, tok, n_decoded, timings, None, probs, n_cached)
        self.n_done += 1
        return self._final(task)

    def _resp_state(self, task) -> dict:
        if task.id not in self._resp:
            self._resp[task.id] = R.new_state()
        return self._resp[task.id]

    def _sse(self, objs: list[dict]) -> bytes:
        if self.kind in ("anthropic", "responses"):
            return A.sse(objs)  # format_anthropic_sse: `event:` lines
        return b"".join(f"data: {json.dumps(o, ensure_ascii=False)}\n\n".encode() for o in objs)

    # ------------------------------------------------------------------ the answer

    async def response(self, request):
        """Wait for the first result; an error there is the JSON answer, else the SSE stream."""
        try:
            while True:
                what, task, item = await self._next(request)
                if what is None:
                    self.close()
                    return JSONResponse(None)  # the client is gone: nothing is read any more
                if what == "done" and task.error is not None:
                    self.close()
                    return self.api.results.task_error(task)
                first = self._render(what, task, item)
                if first or what in ("done", "begin"):
                    break
        except BaseException:
            self.close()
            raise
        return StreamingResponse(self._events(first), media_type="text/event-stream")

    async def _next(self, request):
        while True:
            try:
                return await asyncio.wait_for(self.q.get(), 0.5)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    return None, None, None

    async def _events(self, first: list[dict]):
        try:
            if first:
                yield self._sse(first)
            while self.n_done < len(self.tasks):
                what, task, item = await self.q.get()
                if what == "done" and task.error is not None:
                    err = task.error.to_json()
                    yield self._sse([{"event": "error", "data": err} if self.kind == "anthropic" else {"error": err}])
                    return
                chunks = self._render(what, task, item)
                if chunks:
                    yield self._sse(chunks)
            if self.kind not in ("completion", "anthropic", "responses"):
                yield b"data: [DONE]\n\n"
        finally:
            self.close()
