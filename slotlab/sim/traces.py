"""Traces for the simulator: requests with arrival times.

* slotlab trace JSON (`slotlab.engine.replay`): `{"flags": [...], "requests": [...]}`; a request may
  also carry `"arrival"` (seconds from the start; default: all at 0, sent in order), `"prompt"` as
  text (tokenized with the model's vocabulary) or as a list of token ids, and `"output"` (the token
  ids it generated, which the simulation replays instead of placeholders). Slot actions are not
  simulated (they are skipped, with a note).
* Mooncake JSONL (FAST'25 traces): `timestamp` (ms), `input_length`, `output_length`, `hash_ids`
  (one id per 512-token block; equal ids at the same position are equal prefixes). Each block id
  maps to its own deterministic token ids (`block_tokens`), the last block cut to input_length; the
  tokens are made when the request is submitted, so a trace of 145 M prompt tokens needs no memory
  for them.
* OpenAI-messages session logs (JSONL, `load_sessions`): one line a chat call, in the order the calls
  were made, with these fields (any other field is ignored):

  - a first line `{"slotlab_session_log": 1, "flags": [...], "server": {...}}` (optional; what `slotlab
    proxy --record` writes): the server's flags and what its /props told (build, slots, context);
    `slotlab simulate` and `report` take the flags from it;
  - `session_id` (string or integer, optional): the conversation the call belongs to, as the client
    named it; without it (or with `session_source: "content"`, a recorder's own guess) the
    conversation is told by the messages (slotlab.identity); `user` (optional): the client's user field;
  - `messages` (required, non-empty): the OpenAI `messages` array sent, each `{"role", "content"}` with
    string content (or text parts); an assistant message may carry `tool_calls` (`content` then may be
    null), a tool result is `{"role": "tool", "content", "tool_call_id"?}`;
  - `tools` (optional): the OpenAI `tools` array sent (`[{"type": "function", "function": {"name",
    "description"?, "parameters"?}}]`), rendered by the template as the server does;
  - `reply` (optional): the reply as the server generated it — the assistant message (`{"role":
    "assistant", "content", "reasoning_content"?, "tool_calls"?}`) or its text — what a recorder saw
    (`slotlab proxy --record`); it is the call's output, and `slotlab.conversation` compares the next
    call's echo of it (`reply_not_echoed`);
  - `output_length` (or its alias `max_tokens`; integer >= 0): the tokens the call generated. Optional
    where `reply` is recorded or the session's next call shows the reply (its `messages` are this
    call's, then an `assistant` message): the reply's token count is used;
  - `gap` (seconds >= 0): the time from the previous call of the same session (its arrival) to this
    one; for a session's first call, from the start of the log. Or, instead, `timestamp` (seconds
    since the start of the log). Each line has one of the two, not both;
  - optional request fields passed to the server as they are: `id_slot`, `cache_prompt`,
    `n_cache_reuse`, `temperature`, `seed`.

  Each call's prompt is what llama-server's `/v1/chat/completions` decodes: the messages rendered
  by the model's chat template (`slotlab.serve.chat.ChatTemplate`) with the generation prompt, then
  tokenized as a text prompt (BOS, special tokens parsed), with the template's `message_delimiters` so
  checkpoints land at user messages. The reply a call generated, where the next call of its session
  shows it, is tokenized on its own (no BOS, no special tokens) and replayed as the call's output, so
  the slot holds what the next turn repeats and the simulation shows the reuse a real conversation
  gets. Tokenize with the model you simulate (`-m`; default: the embedded model): its token ids must
  fit the profile's vocabulary.

`load_sim_trace` tells the formats apart by content: a JSONL whose first line has `messages` is a
session log, one with `input_length` a Mooncake trace, a JSON object with `requests` a slotlab trace.
A malformed line is refused with a `TraceError` naming the file, the line and the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from slotlab.errors import TraceError
from slotlab.memory.paper.vocab import M64

__all__ = ["SimRequest", "SimTrace", "TraceError", "block_tokens", "load_sim_trace", "load_mooncake", "load_sessions",
           "session_log_header",
           "trace_kind", "infinite_cache_bound"]

BLOCK = 512


@dataclass
class SimRequest:
    arrival: float  # seconds
    n_prompt: int
    n_predict: int
    make_tokens: Callable[[], np.ndarray] | None = None
    prompt: str | list | None = None  # text / ids (slotlab traces)
    output: np.ndarray | None = None
    hash_ids: Sequence[int] | None = None
    fields: dict = field(default_factory=dict)  # id_slot, cache_prompt, n_cache_reuse, ...
    session: str | None = None  # session logs: the conversation
    call: object = None  # session logs: the call as sent (slotlab.conversation.Call: messages, tools, reply)
    action: dict | None = None  # a slot action (slotlab traces): {"action": save|restore|erase, "id_slot", "filename"}
    sequential: bool = False  # no arrival (slotlab traces): posted after the earlier requests that `wait`
    wait: bool = True  # a later sequential request waits for this one's answer (slotlab traces' `wait`)

    def tail(self) -> tuple[int, int] | None:
        """(the prompt's last token, its length) without making the prompt where that is cheap (a
        Mooncake request's is a function of its last key; token ids are read); None for a text or
        empty prompt. The fast-forward's precomputed placeholders start there (fastforward.Prechains)."""
        mk = self.make_tokens
        if mk is not None:
            t = getattr(mk, "tail", None)
            return t() if t is not None else None
        p = self.prompt
        if p is None or isinstance(p, str) or not len(p):
            return None
        return int(p[-1]), len(p)

    def tokens(self, vocab=None) -> np.ndarray:
        if self.make_tokens is not None:
            return self.make_tokens()
        if isinstance(self.prompt, str):
            if vocab is None:
                raise ValueError("a text prompt needs the model's vocabulary (-m MODEL)")
            return vocab.tokenize(self.prompt)
        return np.asarray(self.prompt, dtype=np.int32)


@dataclass
class SimTrace:
    flags: list[str]
    requests: list[SimRequest]
    path: str | None = None
    notes: list[str] = field(default_factory=list)
    block: int = 0  # block size of hash_ids (0: none)
    files: dict | None = None  # slotlab traces: slot files to install before the run ({name: path beside the trace})
    vocab: object = None  # the tokenizer the requests need at submit time (session logs: message_delimiters)
    header: dict | None = None  # session logs: the header line (the server's flags, /props), where there is one




_MUL = np.uint64(0x9E3779B97F4A7C15)


def block_tokens(block_id: int, n: int, lo: int, hi: int) -> np.ndarray:
    """`n` token ids in [lo, hi) for prefix block `block_id`: a fixed function of (id, offset)."""
    return _mix_keys(np.uint64(block_id) * np.uint64(BLOCK) + np.arange(1, n + 1, dtype=np.uint64), lo, hi)


def _mix_keys(x: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """The token ids of keys `block_id * BLOCK + offset + 1` (uint64, changed in place): a splitmix-like
    hash, then `lo + hash % (hi - lo)`."""
    x *= _MUL
    return _mix_multiplied(x, lo, hi)


def _mix_multiplied(x: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """`_mix_keys` of keys already multiplied by `_MUL` (mod 2**64): a prompt's keys are made so, as
    block_id * (BLOCK * _MUL) + (offset + 1) * _MUL, which saves a pass over every token."""
    x ^= x >> np.uint64(29)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(32)
    m = np.uint64(hi - lo)
    q = x // m  # x % m as x - (x // m) * m: numpy divides by a scalar several times faster than it takes a remainder
    q *= m
    x -= q
    x += np.uint64(lo)
    return x.astype(np.int32)


def _mix_key(key: int, lo: int, hi: int) -> int:
    """`_mix_keys` of one key, on Python integers (a numpy call costs more than the arithmetic)."""
    x = (key * 0x9E3779B97F4A7C15) & M64
    x ^= x >> 29
    x = (x * 0xBF58476D1CE4E5B9) & M64
    x ^= x >> 32
    return lo + x % (hi - lo)


_OFFSETS = np.arange(1, BLOCK + 1, dtype=np.uint64)  # offset + 1 within a block
_OFFSETS_MUL = _OFFSETS * _MUL  # the same, times _MUL (mod 2**64)
_BLOCK_MUL = np.uint64((BLOCK * int(_MUL)) & M64)
_TAIL_ID = -1 & 0x7FFFFFFFFFFF  # the block id of tokens beyond the last hash id


def _mooncake_maker(hash_ids, n: int, lo: int, hi: int) -> Callable[[], np.ndarray]:
    """The prompt of a Mooncake request: block i's first tokens are `block_tokens(hash_ids[i], ...)`, the
    last block cut to `n`; tokens beyond the blocks are a tail of their own (never shared). Made in one
    vectorized pass (the simulator makes every prompt at submit time: this is on its hot path)."""
    def make() -> np.ndarray:
        nb = min(len(hash_ids), -(-n // BLOCK))
        m = min(n, nb * BLOCK)
        x = ((np.asarray(hash_ids[:nb], dtype=np.uint64) * _BLOCK_MUL)[:, None] + _OFFSETS_MUL).ravel()[:m]
        if n > m:
            tail = np.uint64(_TAIL_ID) * np.uint64(BLOCK) + np.arange(1, n - m + 1, dtype=np.uint64)
            tail *= _MUL
            x = np.concatenate([x, tail])
        return _mix_multiplied(x, lo, hi)

    def tail() -> tuple[int, int] | None:  # make()[-1] and len(make()), from the last key alone
        if n <= 0:
            return None
        nb = min(len(hash_ids), -(-n // BLOCK))
        m = min(n, nb * BLOCK)
        key = (_TAIL_ID * BLOCK + (n - m)) if n > m else int(hash_ids[(m - 1) // BLOCK]) * BLOCK + (m - 1) % BLOCK + 1
        return _mix_key(key, lo, hi), n

    make.tail = tail
    return make


def _where(path, lineno: int) -> str:
    return f"{path}, line {lineno}"


def _json_line(path, lineno: int, line: str) -> dict:
    try:
        d = json.loads(line)
    except json.JSONDecodeError as ex:
        raise TraceError(f"{_where(path, lineno)}: not JSON ({ex.msg} at column {ex.colno})") from None
    if not isinstance(d, dict):
        raise TraceError(f"{_where(path, lineno)}: expected a JSON object, got {type(d).__name__}")
    return d


def _number(path, lineno: int, d: dict, key: str, *, integer: bool = False, default=None):
    """`d[key]` as a number >= 0 (an int where `integer`), or `default` when absent (None: required)."""
    if key not in d:
        if default is None:
            raise TraceError(f"{_where(path, lineno)}, field '{key}': missing")
        return default
    v = d[key]
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if not ok or isinstance(v, bool) or v < 0:
        what = "an integer" if integer else "a number"
        raise TraceError(f"{_where(path, lineno)}, field '{key}': expected {what} >= 0, got {v!r}")
    return v


def load_mooncake(path, *, limit: int | None = None, lo: int = 10, hi: int = 120_000,
                  time_scale: float = 1.0) -> SimTrace:
    """A Mooncake JSONL trace. Token ids come from [lo, hi) (keep hi below the paper vocabulary's
    placeholder range, `PaperVocab.gen_lo`). `time_scale` < 1 compresses the arrivals."""
    reqs = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            d = _json_line(path, lineno, line)
            n = _number(path, lineno, d, "input_length", integer=True)
            hs = d.get("hash_ids") or []
            if not isinstance(hs, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in hs):
                raise TraceError(f"{_where(path, lineno)}, field 'hash_ids': expected a list of integers")
            ts = _number(path, lineno, d, "timestamp", default=0)
            reqs.append(SimRequest(arrival=ts / 1000.0 * time_scale, n_prompt=n,
                                   n_predict=_number(path, lineno, d, "output_length", integer=True, default=16),
                                   make_tokens=_mooncake_maker(hs, n, lo, hi), hash_ids=hs))
            if limit and len(reqs) >= limit:
                break
    reqs.sort(key=lambda r: r.arrival)  # stable: file order among equal timestamps
    return SimTrace([], reqs, str(path), block=BLOCK)


# ---------------------------------------------------------------------------- session logs

_PASS = ("id_slot", "cache_prompt", "n_cache_reuse", "temperature", "seed")


@dataclass
class _Call:
    lineno: int
    session: str
    messages: list
    n_out: int | None
    timestamp: float | None
    gap: float | None
    fields: dict
    reply: str | None = None
    tools: list | None = None
    recorded: dict | None = None  # the reply as generated (an assistant message), from the line's `reply`
    told: bool = True  # the session is the client's own (False: told by content, by a recorder or here)
    user: str | None = None


def _session_call(path, lineno: int, d: dict) -> _Call:
    """One line of a session log, checked field by field (module docstring)."""
    where = _where(path, lineno)
    sid = d.get("session_id")
    if sid is not None and (isinstance(sid, bool) or not isinstance(sid, (str, int))):
        raise TraceError(f"{where}, field 'session_id': expected a string or an integer, got {sid!r}")
    from slotlab.conversation import check_message, check_messages, check_tools

    msgs = d.get("messages")
    check_messages(where, msgs)
    tools = d.get("tools")
    if tools is not None:
        check_tools(where, tools)
    rec = d.get("reply")
    if rec is not None:
        if isinstance(rec, str):
            rec = {"role": "assistant", "content": rec}
        check_message(where, rec, "reply")
        if rec.get("role") != "assistant":
            raise TraceError(f"{where}, field 'reply.role': expected \"assistant\", got {rec.get('role')!r}")
    key = "output_length" if "output_length" in d else "max_tokens"
    n_out = _number(path, lineno, d, key, integer=True, default=-1)
    if "timestamp" in d and "gap" in d:
        raise TraceError(f"{where}, field 'gap': give 'gap' or 'timestamp', not both")
    ts = _number(path, lineno, d, "timestamp") if "timestamp" in d else None
    gap = _number(path, lineno, d, "gap") if ts is None else None
    user = d.get("user")
    return _Call(lineno, None if sid is None else str(sid), msgs, None if n_out < 0 else int(n_out), ts, gap,
                 {k: d[k] for k in _PASS if k in d}, tools=tools or None, recorded=rec,
                 told=sid is not None and d.get("session_source") != "content",
                 user=None if user is None else str(user))


def _same(a: dict, b: dict) -> bool:
    from slotlab.identity import same

    return same(a, b)


def _reply(call: _Call, nxt: _Call) -> str | None:
    """The assistant reply `call` got, where the session's next call shows it: that call's messages
    are `call`'s, then an assistant message."""
    k = len(call.messages)
    if len(nxt.messages) <= k or nxt.messages[k]["role"] != "assistant":
        return None
    if not all(_same(a, b) for a, b in zip(call.messages, nxt.messages)):
        return None
    return _reply_text(nxt.messages[k])


def _reply_text(m: dict) -> str:
    """What the model generated for an assistant message, as text to tokenize (content; else the
    tool calls as the JSON a model writes)."""
    from slotlab.identity import text_of

    text = (m.get("reasoning_content") or "") + text_of(m)
    if not text and m.get("tool_calls"):
        text = json.dumps([tc.get("function") for tc in m["tool_calls"]], ensure_ascii=False)
    return text


def load_sessions(path, *, model=None, limit: int | None = None, time_scale: float = 1.0,
                  params=None) -> SimTrace:
    """An OpenAI-messages session log (module docstring), tokenized through `model`'s chat template.
    `model`: a loaded `slotlab.llama.Model`, a GGUF path, or None for the embedded default model;
    `params`: the server's flags (ServerParams: `--chat-template-file`, `--jinja` choose the template).
    Every line is checked before the model is loaded, so a bad log fails at once."""
    calls: list[_Call] = []
    header = None
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                d = _json_line(path, lineno, line)
                if header is None and not calls and isinstance(d, dict) and "slotlab_session_log" in d:
                    header = _header(path, lineno, d)
                    continue
                calls.append(_session_call(path, lineno, d))
    from slotlab.conversation import Call

    untold = [c for c in calls if not c.told]
    if untold:  # conversations told by content (slotlab.identity), as the recorder tells them
        from slotlab.identity import names

        probe = [Call(i, c.messages, c.tools, c.recorded, session=c.session if c.told else None, user=c.user)
                 for i, c in enumerate(calls)]
        for c, name in zip(calls, names(probe, fmt="conversation-{n}")):
            if not c.told:
                c.session = name
    last: dict[str, _Call] = {}
    at: dict[str, float] = {}
    arrival: list[float] = []
    for c in calls:  # replies and arrivals, in file order
        prev = last.get(c.session)
        if prev is not None and prev.recorded is None:
            prev.reply = _reply(prev, c)
        last[c.session] = c
        t = c.timestamp if c.timestamp is not None else at.get(c.session, 0.0) + c.gap
        at[c.session] = t
        arrival.append(t * time_scale)
    for c in calls:
        if c.recorded is not None:
            c.reply = _reply_text(c.recorded)
    if limit:
        calls, arrival = calls[:limit], arrival[:limit]
    for c in calls:
        if c.n_out is None and c.reply is None:
            raise TraceError(f"{_where(path, c.lineno)}, field 'output_length': missing, and the session's next "
                             "call does not show the reply (give output_length or max_tokens)")
    if model is None or isinstance(model, (str, Path)):
        from slotlab.llama import Model

        model = Model(model)
    from slotlab.serve.chat import ChatTemplate

    tmpl = ChatTemplate(model, params)
    delims = tmpl.delimiters()
    reqs = []
    for i, (c, t) in enumerate(zip(calls, arrival)):
        try:
            text = tmpl.apply_request({"messages": c.messages, **({"tools": c.tools} if c.tools else {})})
        except Exception as ex:  # the template's own refusal (raise_exception, a bad role order)
            raise TraceError(f"{_where(path, c.lineno)}, field 'messages': the chat template refused them: "
                             f"{ex}") from None
        toks = np.asarray(model.tokenize(text), dtype=np.int32)
        out = None
        if c.reply is not None:
            out = np.asarray(model.tokenize(c.reply, add_special=False, parse_special=False), dtype=np.int32)
        n_out = c.n_out if c.n_out is not None else len(out)
        fields = dict(c.fields)
        if delims:
            fields["message_delimiters"] = [dict(x) for x in delims]
            fields["chat"] = True  # a chat call: the template's delimiters (every build reads them)
        call = Call(i, c.messages, c.tools, c.recorded, c.reply, c.session if c.told else None, c.user)
        reqs.append(SimRequest(arrival=t, n_prompt=len(toks), n_predict=n_out, prompt=toks, output=out,
                               fields=fields, session=c.session, call=call))
    reqs.sort(key=lambda q: q.arrival)  # stable: file order among equal arrivals
    h = header or {}
    return SimTrace(list(h.get("flags") or []), reqs, str(path), notes=list(h.get("notes") or []), vocab=model,
                    header=header)


def _header(path, lineno: int, d: dict) -> dict:
    """A session log's header line (what `slotlab proxy --record` writes first): the server's flags and
    what its /props told."""
    fl = d.get("flags", [])
    if not isinstance(fl, list) or not all(isinstance(x, str) for x in fl):
        raise TraceError(f"{_where(path, lineno)}, field 'flags': expected an array of strings")
    return d


def session_log_header(path) -> dict | None:
    """The header line of a session log (None: it has none, or the file is another kind of trace)."""
    try:
        with open(path) as f:
            for line in f:
                if line.strip():
                    d = json.loads(line)
                    return d if isinstance(d, dict) and "slotlab_session_log" in d else None
    except (OSError, ValueError):
        return None
    return None


# ---------------------------------------------------------------------------- any trace

def trace_kind(path) -> str:
    """"sessions", "mooncake" or "slotlab", from the file's content (module docstring)."""
    p = Path(path)
    with open(p) as f:
        lineno, first = 0, ""
        for lineno, line in enumerate(f, 1):
            if line.strip():
                first = line
                break
    if not first:
        raise TraceError(f"{p}: empty trace")
    try:
        d = json.loads(first)
    except json.JSONDecodeError:
        if p.suffix == ".jsonl":
            _json_line(p, lineno, first)  # raises with the line and the reason
        return "slotlab"  # a pretty-printed JSON object
    if isinstance(d, dict):
        if "messages" in d or "slotlab_session_log" in d:
            return "sessions"
        if "input_length" in d or "hash_ids" in d:
            return "mooncake"
        if "requests" in d or p.suffix != ".jsonl":
            return "slotlab"
    raise TraceError(f"{_where(p, lineno)}: not a known trace line: a session log line has 'messages', a "
                     "Mooncake line 'input_length' (a slotlab trace is one JSON object with 'requests')")


def load_sim_trace(path, *, limit: int | None = None, time_scale: float = 1.0, model=None, params=None,
                   **kw) -> SimTrace:
    """Any trace the simulator reads, its format told from its content (`trace_kind`): a session log
    (tokenized with `model`: see `load_sessions`), a Mooncake JSONL, or a slotlab trace JSON.
    `time_scale` multiplies the arrival times; `kw` goes to `load_mooncake`."""
    p = Path(path)
    kind = trace_kind(p)
    if kind == "sessions":
        return load_sessions(p, model=model, limit=limit, time_scale=time_scale, params=params)
    if kind == "mooncake":
        return load_mooncake(p, limit=limit, time_scale=time_scale, **kw)
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as ex:
        raise TraceError(f"{_where(p, ex.lineno)}: not JSON ({ex.msg} at column {ex.colno})") from None
    if not isinstance(data, dict) or not isinstance(data.get("requests", []), list):
        raise TraceError(f"{p}: a slotlab trace is a JSON object with a \"requests\" array")
    flags = list(data.get("flags", []))
    reqs, notes, missing = [], [], []
    for i, r in enumerate(data.get("requests", [])):
        if not isinstance(r, dict):
            raise TraceError(f"{p}, request {i}: expected an object")
        if "action" in r:  # a slot action: POST /slots/{id_slot}?action=... at its arrival
            if "arrival" not in r:
                missing.append(i)
            act = {k: r[k] for k in ("action", "id_slot", "filename") if k in r}
            reqs.append(SimRequest(arrival=float(r.get("arrival", 0.0)) * time_scale, n_prompt=0, n_predict=0,
                                   prompt=[], action=act, sequential="arrival" not in r,
                                   wait=bool(r.get("wait", True))))
            if limit and len(reqs) >= limit:
                break
            continue
        extra = {k: r[k] for k in ("id_slot", "cache_prompt", "n_cache_reuse", "temperature", "seed",
                                   "message_delimiters") if k in r}
        if "message_delimiters" in r:
            from slotlab.engine.replay import is_chat

            extra["chat"] = is_chat(r)
        out = np.asarray(r["output"], dtype=np.int32) if r.get("output") is not None else None
        if "prompt" not in r:
            raise TraceError(f"{p}, request {i}, field 'prompt': missing")
        prompt = r["prompt"]
        call = None
        if "messages" in r:  # a chat call as a recording proxy keeps it (slotlab.conversation reads it)
            from slotlab.conversation import calls_of_trace

            call = calls_of_trace([r], str(p))[0]
            call.request = i
        if "arrival" not in r:
            missing.append(i)
        reqs.append(SimRequest(arrival=float(r.get("arrival", 0.0)) * time_scale,
                               n_prompt=-1 if isinstance(prompt, str) else len(prompt),
                               n_predict=int(r.get("n_predict", -1)), prompt=prompt, output=out, fields=extra,
                               session=None if call is None else call.session, call=call,
                               sequential="arrival" not in r, wait=bool(r.get("wait", True))))
        if limit and len(reqs) >= limit:
            break
    if missing:  # say what is assumed: a simulation's queueing figures rest on the arrivals
        n = len(missing)
        notes.append(f"{n} of {len(reqs)} requests have no \"arrival\": they are sent in trace order, each when the "
                     "earlier ones it waits for are answered (\"wait\", default true, as slotlab replay sends them), so "
                     "the queue waits and TTFTs below are those of that client; record with slotlab proxy --record, "
                     "which writes each request's arrival" if n == len(reqs) else
                     f"{n} of {len(reqs)} requests have no \"arrival\" (first: request {missing[0]}): sent in trace "
                     "order after the earlier ones they wait for")
    reqs.sort(key=lambda q: q.arrival)
    files = data.get("files") if isinstance(data.get("files"), dict) else None
    return SimTrace(flags, reqs, str(p), notes, files=files)


def infinite_cache_bound(trace: SimTrace) -> tuple[int, int]:
    """(tokens reusable if every prefix ever seen were kept, prompt tokens) over every request: per
    request, the leading blocks whose prefix appeared in an earlier request (Mooncake hash_ids; the
    infinite cache of slotlab.ideal). (0, 0) without ids. `simulate` counts it over the requests
    that succeeded, as its totals."""
    if not trace.block:
        return 0, 0
    from slotlab.ideal import infinite_hit_tokens

    return infinite_hit_tokens(trace.requests, trace.block)
