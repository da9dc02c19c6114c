"""Record the traffic a `Proxy` forwards as a slotlab trace (`slotlab replay` / `simulate` input).

`Recorder` is the proxy's tap: each request to a completion endpoint (`/completion`, `/completions`,
`/v1/completions`, `/v1/chat/completions`, `/chat/completions`) or a slot action
(`POST /slots/N?action=...`) becomes one trace request, in arrival order; the answer's bytes are kept
(bounded) and parsed when it ends, plain JSON or Server-Sent Events alike.

The trace it writes is what `slotlab.engine.replay.parse_trace` reads today, plus top-level keys that
parse_trace ignores:

    {"flags": [...],                        # the server's flags (given: the proxy cannot see them)
     "requests": [{"prompt", "n_predict", "id_slot", "temperature", "seed", "cache_prompt",
                   "n_cache_reuse", "message_delimiters", "wait"}, ...],
     "results":  [...],                     # what the server answered, per request, in replay --json's
                                            # schema (None where the answer does not say)
     "recorded": [{"t": arrival s, "t_done": s, "endpoint", "stream", "status", "cancelled",
                   "n_predicted", "content", "tokens", "prompt_source"}, ...],   # per request
     "recorder": {"upstream", "skipped": [...]}}

* `n_predict` is the number of tokens the server generated (the answer's `tokens_predicted` or
  `usage.completion_tokens`), so a replay (greedy, `ignore_eos`) generates as many and the slots hold
  what they held on the server; without a count (an error, a cancelled stream) it is the request's own
  `n_predict` / `max_tokens` (or the number of streamed chunks when cancelled);
* `temperature` is the request's, else the server default 0.8; the generated tokens themselves match a
  replay only for greedy requests (temperature 0), which is what the equality of results needs;
* a chat request's prompt is the template applied by the upstream (`POST /apply-template`, llama-server's
  own endpoint), else rendered from `GET /props`' `chat_template` (slotlab serve); ChatML prompts get
  the ChatML message delimiters (checkpoints at messages, as slotlab serve sets them);
* `wait: false` marks a request whose successor arrived before its answer was complete (concurrency);
* `sim_fields=True` (`slotlab proxy --sim-fields`) also writes each request's `arrival` (seconds) and
  `output` (the generated token ids, where the answer has them: `return_tokens`) into the request, which
  `slotlab simulate` reads; `slotlab replay` refuses unknown request fields until it learns these two;
* requests a trace cannot express (a token-id or multi-prompt `prompt`, `n > 1`, multimodal messages)
  and requests the server refused before running them (401, 403, 404, 405, 501; a 502 from the proxy)
  are listed in `recorder.skipped` with the reason, not written as requests."""

from __future__ import annotations

import gzip
import json
import os
import re
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

COMPLETION = {"/completion": "completion", "/completions": "completion", "/v1/completions": "oai_text",
              "/v1/chat/completions": "oai_chat", "/chat/completions": "oai_chat"}
SLOT_ACTION = re.compile(r"^/slots/(-?\d+)$")
#: bytes of an answer kept for parsing (beyond: the answer still passes, the record says it was cut)
MAX_ANSWER = 16 << 20
#: answers of a request the server refused before scheduling it (auth, unknown route, unsupported feature):
#: not trace requests (a replay has no such check)
REJECTED = frozenset((401, 403, 404, 405, 501, 502))
#: llama-server's default temperature (a request without one samples at this)
SERVER_TEMPERATURE = 0.8
#: the ChatML delimiters slotlab serve sends with a ChatML chat (slotlab.serve.chat.ChatTemplate.delimiters)
CHATML_DELIMITERS = [{"role": "system", "delimiter": "<|im_start|>system\n"},
                     {"role": "user", "delimiter": "<|im_start|>user\n"},
                     {"role": "assistant", "delimiter": "<|im_start|>assistant\n"}]


@dataclass
class Record:
    """One recorded request and, once done, its answer."""

    index: int
    t: float  # arrival, seconds since the recorder started
    kind: str  # completion / oai_text / oai_chat / action
    path: str
    query: str
    body: dict | None  # the request JSON (None: not JSON)
    headers: dict  # the auth headers (to ask the upstream for a chat template)
    t_done: float | None = None
    status: int | None = None
    cancelled: bool = False
    stream: bool = False
    answer: bytearray = field(default_factory=bytearray)
    cut: bool = False
    content_type: str = ""
    encoding: str = ""
    result: dict | None = None  # replay --json schema
    n_predicted: int | None = None
    n_chunks: int = 0
    content: str | None = None
    tokens: list | None = None
    prompt: str | None = None  # resolved chat prompt
    prompt_source: str = "request"
    skip: str | None = None  # why this request cannot be a trace request
    done: threading.Event = field(default_factory=threading.Event)


class _Tap:
    def __init__(self, recorder: "Recorder", rec: Record):
        self.recorder, self.rec = recorder, rec

    def body(self, chunk: bytes) -> None:
        rec = self.rec
        if len(rec.answer) + len(chunk) > MAX_ANSWER:
            rec.cut = True
            return
        rec.answer += chunk

    def done(self, status: int, headers, cancelled: bool) -> None:
        self.recorder._done(self.rec, status, headers, cancelled)


class Recorder:
    """The proxy's tap (`Proxy(upstream, tap=recorder)`); `trace()` is the trace so far, `write(path)`
    writes it (atomically), `autosave(path)` keeps `path` current while the proxy runs.
    `on_record(record)`: called (in the proxy's thread) when a request's answer is complete."""

    def __init__(self, flags: list[str] | None = None, *, upstream: str | None = None,
                 on_record: Callable[[Record], None] | None = None, keep_answers: bool = False,
                 sim_fields: bool = False):
        self.flags = list(flags or [])
        self.sim_fields = sim_fields  # write `arrival` and `output` into each request (slotlab simulate reads them)
        self.keep_answers = keep_answers  # keep each answer's bytes after parsing it (tests); else dropped
        self.upstream = upstream.rstrip("/") if upstream else None
        self.on_record = on_record
        self.t0 = time.perf_counter()
        self.records: list[Record] = []
        self._lock = threading.Lock()
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._saver: threading.Thread | None = None
        self._template: tuple | None = None  # (source, bos) from /props, once asked
        self.problems: list[str] = []

    # ------------------------------------------------------------------ the tap

    def __call__(self, info) -> _Tap | None:
        kind = COMPLETION.get(info.path)
        if kind is None and info.method == "POST" and SLOT_ACTION.match(info.path):
            kind = "action"
        if kind is None or info.method != "POST":
            return None
        try:
            body = json.loads(info.body) if info.body.strip() else {}
        except ValueError:
            body = None
        auth = {k.decode("latin-1"): v.decode("latin-1") for k, v in info.headers
                if k.lower() in (b"authorization", b"x-api-key")}
        with self._lock:
            rec = Record(len(self.records), info.t - self.t0, kind, info.path, info.query,
                         body if isinstance(body, dict) else None, auth)
            rec.stream = bool(rec.body and rec.body.get("stream"))
            self.records.append(rec)
        return _Tap(self, rec)

    def _done(self, rec: Record, status: int, headers, cancelled: bool) -> None:
        rec.t_done = time.perf_counter() - self.t0
        rec.status, rec.cancelled = status, cancelled
        for k, v in headers or ():
            k = k.lower()
            if k == b"content-type":
                rec.content_type = v.decode("latin-1")
            elif k == b"content-encoding":
                rec.encoding = v.decode("latin-1").lower()
        try:
            parse_answer(rec)
        except Exception as exc:  # a strange answer is noted; the record keeps what it has
            self.problems.append(f"request {rec.index}: answer not understood: {type(exc).__name__}: {exc}")
        if not self.keep_answers:
            rec.answer = bytearray()  # parsed: a long-running proxy keeps what the trace needs, not the bytes
        rec.done.set()
        self._dirty.set()
        if self.on_record is not None:
            self.on_record(rec)

    # ------------------------------------------------------------------ the trace

    def record_after(self, rec: Record) -> Record | None:
        """The record that arrived right after `rec` (None: none yet), read under the recorder's lock."""
        with self._lock:
            return self.records[rec.index + 1] if rec.index + 1 < len(self.records) else None

    def trace_request(self, rec: Record) -> dict | None:
        """The trace request of `rec` (None and `rec.skip` set when a trace cannot express it)."""
        b = rec.body
        if rec.status in REJECTED:
            rec.skip = f"rejected by the server before it ran ({rec.status})"
            return None
        if rec.kind == "action":
            m = SLOT_ACTION.match(rec.path)
            action = dict(x.split("=", 1) for x in rec.query.split("&") if "=" in x).get("action", "")
            if action not in ("save", "restore", "erase"):
                rec.skip = f"slot action {action!r}"
                return None
            r = {"action": action, "id_slot": int(m.group(1))}
            if action != "erase" and b and isinstance(b.get("filename"), str):
                r["filename"] = b["filename"]
            return r
        if b is None:
            rec.skip = "the body is not a JSON object"
            return None
        if int(b.get("n", 1) or 1) != 1:
            rec.skip = "n > 1"
            return None
        if rec.kind == "oai_chat":
            prompt = self._chat_prompt(rec)
            if prompt is None:
                return None
        else:
            prompt = b.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
                prompt = prompt[0]
            if not isinstance(prompt, str):
                rec.skip = "the prompt is not one string (token ids, mixed or several prompts)"
                return None
        r: dict = {"prompt": prompt}
        n = rec.n_predicted
        if n is None and rec.cancelled and rec.n_chunks:
            n = rec.n_chunks
        if n is None:
            n = b.get("n_predict", b.get("max_tokens", b.get("max_completion_tokens", -1)))
        r["n_predict"] = int(n) if isinstance(n, (int, float)) and not isinstance(n, bool) and n >= -1 else -1
        if isinstance(b.get("id_slot"), int) and not isinstance(b.get("id_slot"), bool):
            r["id_slot"] = b["id_slot"]
        for k in ("cache_prompt",):
            if isinstance(b.get(k), bool):
                r[k] = b[k]
        for k in ("n_cache_reuse", "seed"):
            if isinstance(b.get(k), int) and not isinstance(b.get(k), bool):
                r[k] = b[k]
        temp = b.get("temperature", SERVER_TEMPERATURE)
        r["temperature"] = temp if isinstance(temp, (int, float)) and not isinstance(temp, bool) else SERVER_TEMPERATURE
        if isinstance(b.get("message_delimiters"), list):
            r["message_delimiters"] = b["message_delimiters"]
        elif rec.kind == "oai_chat" and "<|im_start|>" in prompt:
            r["message_delimiters"] = [dict(d) for d in CHATML_DELIMITERS]
        return r

    def _chat_prompt(self, rec: Record) -> str | None:
        if rec.prompt is not None:
            return rec.prompt
        msgs = rec.body.get("messages")
        if not isinstance(msgs, list) or not all(isinstance(m, dict) and isinstance(m.get("content", ""), str)
                                                 for m in msgs):
            rec.skip = "chat messages that are not plain text"
            return None
        if self.upstream is None:
            rec.skip = "a chat request, and no upstream to apply its template"
            return None
        try:
            import httpx

            r = httpx.post(self.upstream + "/apply-template", json={"messages": msgs}, headers=rec.headers, timeout=30,
                           trust_env=False)
            if r.status_code == 200 and isinstance(r.json().get("prompt"), str):
                rec.prompt, rec.prompt_source = r.json()["prompt"], "apply-template"
                return rec.prompt
            if self._template is None:
                p = httpx.get(self.upstream + "/props", headers=rec.headers, timeout=30, trust_env=False).json()
                self._template = (p.get("chat_template") or "", p.get("bos_token") or "")
            src, bos = self._template
            if not src:
                rec.skip = "the upstream has no /apply-template and no chat_template in /props"
                return None
            import jinja2

            env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
            rec.prompt = env.from_string(src).render(messages=msgs, add_generation_prompt=True, bos_token=bos,
                                                     eos_token="")
            rec.prompt_source = "props-template"
            return rec.prompt
        except Exception as exc:
            rec.skip = f"the chat template could not be applied: {type(exc).__name__}: {exc}"
            return None

    def trace(self) -> dict:
        """The trace so far: completed requests (and slot actions) in arrival order."""
        with self._lock:
            recs = [r for r in self.records if r.done.is_set()]
        reqs, results, recorded, skipped = [], [], [], []
        items = []
        for rec in recs:
            r = self.trace_request(rec)
            if r is None:
                skipped.append({"t": round(rec.t, 6), "endpoint": rec.path, "reason": rec.skip})
                continue
            items.append((rec, r))
        for i, (rec, r) in enumerate(items):
            nxt = items[i + 1][0] if i + 1 < len(items) else None
            if "action" not in r and nxt is not None and rec.t_done is not None and nxt.t < rec.t_done:
                r["wait"] = False
            if self.sim_fields and "action" not in r:
                r["arrival"] = round(rec.t, 6)
                if rec.tokens:
                    r["output"] = list(rec.tokens)
            reqs.append(r)
            results.append(rec.result)
            recorded.append({"t": round(rec.t, 6), "t_done": round(rec.t_done or 0.0, 6), "endpoint": rec.path,
                             "stream": rec.stream, "status": rec.status, "cancelled": rec.cancelled,
                             "n_predicted": rec.n_predicted, "content": rec.content, "tokens": rec.tokens,
                             "prompt_source": rec.prompt_source if rec.kind == "oai_chat" else "request",
                             **({"answer_cut": True} if rec.cut else {})})
        return {"flags": list(self.flags), "requests": reqs, "results": results, "recorded": recorded,
                "recorder": {"upstream": self.upstream, "skipped": skipped, "problems": list(self.problems[-20:])}}

    def write(self, path: str | Path) -> int:
        """Write the trace to `path` (a temporary file renamed over it); returns the number of requests."""
        tr = self.trace()
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(tr, indent=1, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
        return len(tr["requests"])

    def autosave(self, path: str | Path, period: float = 1.0) -> None:
        """Keep `path` current: rewritten at most every `period` s after a request completes."""
        def loop():
            while not self._stop.is_set():
                if self._dirty.wait(0.2):
                    self._dirty.clear()
                    try:
                        self.write(path)
                    except Exception as exc:
                        self.problems.append(f"writing {path}: {type(exc).__name__}: {exc}")
                    self._stop.wait(period)

        self._saver = threading.Thread(target=loop, name="slotlab-proxy-record", daemon=True)
        self._saver.start()

    def close(self, path: str | Path | None = None) -> None:
        self._stop.set()
        if self._saver is not None:
            self._saver.join(5)
        if path is not None:
            self.write(path)


# ------------------------------------------------------------------------------------------- answers

def _decoded(rec: Record) -> bytes:
    data = bytes(rec.answer)
    if rec.encoding == "gzip":
        return gzip.decompress(data)
    if rec.encoding == "deflate":
        return zlib.decompress(data)
    return data


def parse_answer(rec: Record) -> None:
    """Fill `rec.result` (replay --json schema), `n_predicted`, `content`, `tokens` from the answer."""
    empty = {"status": rec.status, "id_slot": None, "cache_n": None, "prompt_n": None, "tokens_evaluated": None,
             "tokens_cached": None, "content": None, "error": None}
    if rec.kind == "action":
        try:
            reply = json.loads(_decoded(rec) or b"null")
        except ValueError:
            reply = None
        if rec.status != 200 and isinstance(reply, dict):
            reply = {"error": reply.get("error")}
        rec.result = {"action": (dict(x.split("=", 1) for x in rec.query.split("&") if "=" in x).get("action")),
                      "status": rec.status, "reply": reply}
        return
    data = _decoded(rec) if rec.encoding in ("", "identity", "gzip", "deflate") else b""
    finals = []
    text = []
    toks: list = []
    ended = False  # the stream's last event came ([DONE], or the final /completion event)
    if "text/event-stream" in rec.content_type or (rec.stream and data.startswith(b"data:")):
        for line in data.split(b"\n"):
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                ended = True
            if payload == b"[DONE]" or not payload:
                continue
            try:
                obj = json.loads(payload)
            except ValueError:
                continue
            if not isinstance(obj, dict):
                continue
            rec.n_chunks += 1
            if "error" in obj:
                finals.append(obj)
                continue
            t, tk = _piece(obj, rec.kind)
            text.append(t)
            toks += tk
            if obj.get("stop") is True or "timings" in obj or obj.get("usage") or _finish(obj):
                finals.append(obj)
            if rec.kind == "completion" and obj.get("stop") is True:
                ended = True
        final = {}
        for f in finals:
            final.update(f)
        content = "".join(text)
    else:
        try:
            final = json.loads(data) if data else {}
        except ValueError:
            final = {}
        if not isinstance(final, dict):
            final = {}
        content, toks = _piece(final, rec.kind, whole=True)
    rec.content = content if rec.status == 200 else None
    rec.tokens = toks or None
    if rec.cancelled and ended:
        rec.cancelled = False  # the client had the whole answer and closed before the stream's last bytes
    if rec.cancelled:
        rec.result = {**empty, "status": None, "error": {"code": 499, "message": "request cancelled by the client",
                                                         "type": "cancelled"}}
        return
    if rec.status != 200 or "error" in final:
        err = final.get("error") if isinstance(final.get("error"), dict) else {}
        rec.result = {**empty, "error": {"code": err.get("code", rec.status), "message": err.get("message"),
                                         "type": err.get("type")}}
        return
    timings = final.get("timings") or {}
    usage = final.get("usage") or {}
    rec.n_predicted = final.get("tokens_predicted", usage.get("completion_tokens", timings.get("predicted_n")))
    cache_n = timings.get("cache_n", (usage.get("prompt_tokens_details") or {}).get("cached_tokens"))
    tokens_evaluated = final.get("tokens_evaluated", usage.get("prompt_tokens"))
    id_slot = final.get("id_slot")
    rec.result = {**empty, "id_slot": id_slot if isinstance(id_slot, int) and id_slot >= 0 else None,
                  "cache_n": cache_n, "prompt_n": timings.get("prompt_n"), "tokens_evaluated": tokens_evaluated,
                  "tokens_cached": final.get("tokens_cached"), "content": rec.content}


def _finish(obj: dict) -> bool:
    ch = obj.get("choices")
    return bool(isinstance(ch, list) and ch and isinstance(ch[0], dict) and ch[0].get("finish_reason"))


def _piece(obj: dict, kind: str, whole: bool = False) -> tuple[str, list]:
    """The generated text (and token ids, when the answer has them) of an answer or a stream chunk."""
    if kind == "completion":
        toks = obj.get("tokens") or []
        return str(obj.get("content") or ""), [t for t in toks if isinstance(t, int)]
    ch = obj.get("choices")
    if not isinstance(ch, list) or not ch or not isinstance(ch[0], dict):
        return "", []
    c = ch[0]
    if kind == "oai_text":
        return str(c.get("text") or ""), []
    part = c.get("message" if whole else "delta") or {}
    return str(part.get("content") or "") if isinstance(part, dict) else "", []
