"""Record the traffic a `Proxy` forwards as a slotlab trace (`slotlab replay` / `simulate` input).

`Recorder` is the proxy's tap: each request to a completion endpoint (`/completion`, `/completions`,
`/v1/completions`, `/v1/chat/completions`, `/chat/completions`, Anthropic's `/v1/messages`, OpenAI's
`/v1/responses`) or a slot action (`POST /slots/N?action=...`) becomes one trace request, in arrival
order; the answer's bytes are kept (bounded) and parsed when it ends, plain JSON or Server-Sent Events
alike. Any other POST (count_tokens, tokenize, embeddings, ...) is listed in `recorder.not_calls` with
why it is not a trace request: nothing is dropped silently.

A chat call (the three chat APIs) also keeps what the client sent and what it got, which
`slotlab.conversation` compares call by call: `messages` and `tools` in OpenAI's form (Anthropic and
Responses bodies converted as llama-server converts them), `reply` (the assistant message as generated,
streamed or not: content, reasoning_content, tool_calls), `endpoint`, `session_id` where the client
names its conversation (a session header such as Claude Code's `x-claude-code-session-id`, the session
part of Claude Code's `metadata.user_id`) and `user` (OpenAI's `user`). A `.jsonl` record path gets the
chat calls as a session log (`Recorder.sessions`: the format `slotlab simulate` reads), its first line
the server's flags and what its `/props` told (build, slots, context), its conversations told by
content where the client names none (slotlab.identity).

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
  own endpoint), else rendered from `GET /props`' `chat_template` (slotlab serve); ChatML and Gemma
  prompts get the message delimiters the server derives for those formats (checkpoints at user messages);
* `wait: false` marks a request whose successor arrived before its answer was complete (concurrency);
* every request has its `arrival` (seconds since the recorder started): a simulation's queueing rests
  on it; `sim_fields=True` (`slotlab proxy --sim-fields`) also writes `output` (the generated token ids,
  where the answer has them: `return_tokens`), which `slotlab simulate` replays;
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

# imported here, not in the proxy's thread at the first chat call: a client in the same process (a test,
# a notebook) importing httpx at that moment would see a half-initialised module
import httpx

COMPLETION = {"/completion": "completion", "/completions": "completion", "/v1/completions": "oai_text",
              "/v1/chat/completions": "oai_chat", "/chat/completions": "oai_chat",
              "/v1/messages": "anthropic", "/v1/responses": "oai_responses", "/responses": "oai_responses"}
#: the chat kinds: their calls carry messages (converted to OpenAI's form), tools and the reply
CHAT_KINDS = frozenset(("oai_chat", "anthropic", "oai_responses"))
#: POSTs that run nothing a trace replays (listed as skipped, with this reason, never dropped silently)
NOT_CALLS = {"/tokenize": "tokenizing runs no completion", "/detokenize": "detokenizing runs no completion",
             "/apply-template": "applying a template runs no completion",
             "/v1/messages/count_tokens": "counting tokens runs no completion",
             "/embedding": "embeddings are not modelled", "/embeddings": "embeddings are not modelled",
             "/v1/embeddings": "embeddings are not modelled", "/infill": "infill prompts are not modelled",
             "/rerank": "reranking is not modelled", "/v1/rerank": "reranking is not modelled"}
#: headers that name the client's conversation (as kvprof reads them: Claude Code, OpenCode, generic)
SESSION_HEADERS = ("x-claude-code-session-id", "x-opencode-session", "x-session-id", "x-session-affinity",
                   "x-conversation-id")
SLOT_ACTION = re.compile(r"^/slots/(-?\d+)$")
#: bytes of an answer kept for parsing (beyond: the answer still passes, the record says it was cut)
MAX_ANSWER = 16 << 20
#: answers of a request the server refused before scheduling it (auth, unknown route, unsupported feature):
#: not trace requests (a replay has no such check)
REJECTED = frozenset((401, 403, 404, 405, 501, 502))
#: llama-server's default temperature (a request without one samples at this)
SERVER_TEMPERATURE = 0.8
#: the delimiters llama-server derives for a ChatML and a Gemma template (its autoparser; recorded from the
#: real server: tests/serve/golden_delimiters.json), by a marker the rendered prompt shows; other formats
#: get none here (the proxy does not see the template the server analysed)
CHAT_DELIMITERS = {
    "<|im_start|>": [{"role": "assistant", "delimiter": "<|im_start|>assistant"},
                     {"role": "user", "delimiter": "<|im_start|>user"}],
    "<start_of_turn>": [{"role": "assistant", "delimiter": "<start_of_turn>model"},
                        {"role": "user", "delimiter": "<start_of_turn>user"}],
}


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
    session: str | None = None  # the conversation, from a session header or Claude Code's metadata.user_id
    user: str | None = None  # the client's user field (OpenAI `user`, an Anthropic user id without a session)
    chat: dict | None = None  # a chat call's body in OpenAI's form (messages, tools), once converted
    reply: dict | None = None  # the assistant message as generated (content, reasoning, tool calls)
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
        self._props: dict | None = None  # what /props tells of the server (server_info), once asked
        self._auth: dict = {}  # the first call's auth headers (to ask /props)
        self.problems: list[str] = []
        self.ignored: list[dict] = []  # POSTs that are not calls (count_tokens, tokenize, ...), with why

    # ------------------------------------------------------------------ the tap

    def __call__(self, info) -> _Tap | None:
        kind = COMPLETION.get(info.path)
        if kind is None and info.method == "POST" and SLOT_ACTION.match(info.path):
            kind = "action"
        if kind is None and info.method == "POST":  # not a call a trace can hold: listed, never silently gone
            with self._lock:
                self.ignored.append({"t": round(info.t - self.t0, 6), "endpoint": info.path,
                                     "reason": NOT_CALLS.get(info.path, "not a completion endpoint")})
                del self.ignored[:-1000]
            self._dirty.set()
            return None
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
            if auth and not self._auth:
                self._auth = dict(auth)
            rec.stream = bool(rec.body and rec.body.get("stream"))
            rec.session, rec.user = _session_of({k.decode("latin-1").lower(): v.decode("latin-1")
                                                 for k, v in info.headers}, rec.body)
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
        if rec.kind in CHAT_KINDS:
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
        elif rec.kind in CHAT_KINDS:
            for marker, delims in CHAT_DELIMITERS.items():
                if marker in prompt:
                    r["message_delimiters"] = [dict(d) for d in delims]
                    break
        if rec.kind in CHAT_KINDS:  # the call as the client sent it (slotlab.conversation compares them)
            r["endpoint"] = rec.path
            r["messages"] = rec.chat["messages"]
            if rec.chat.get("tools"):
                r["tools"] = rec.chat["tools"]
            if rec.reply is not None:
                r["reply"] = rec.reply
        elif rec.content is not None:
            r["reply"] = rec.content
        if rec.session is not None:
            r["session_id"] = rec.session
        if rec.user is not None:
            r["user"] = rec.user
        return r

    def chat_body(self, rec: Record) -> dict | None:
        """A chat call's body in OpenAI's chat form (Anthropic /v1/messages and /v1/responses converted as
        llama-server converts them); None and `rec.skip` set when it cannot be."""
        if rec.chat is not None:
            return rec.chat
        b = rec.body
        try:
            if rec.kind == "anthropic":
                from slotlab.serve.anthropic import to_oai

                b = to_oai(b)
            elif rec.kind == "oai_responses":
                from slotlab.serve.responses import to_chat

                b = to_chat(b)
        except Exception as exc:  # the server refuses such a body too; the record says why
            rec.skip = f"the {rec.path} body could not be converted to chat messages: {type(exc).__name__}: {exc}"
            return None
        msgs = b.get("messages") if isinstance(b, dict) else None
        if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
            rec.skip = "no chat messages"
            return None
        for m in msgs:
            c = m.get("content")
            if isinstance(c, list) and any(not isinstance(p, dict) or p.get("type") != "text" for p in c):
                rec.skip = "chat messages with media (not text)"
                return None
        tools = b.get("tools")
        rec.chat = {"messages": msgs, **({"tools": tools} if isinstance(tools, list) and tools else {})}
        return rec.chat

    def _chat_prompt(self, rec: Record) -> str | None:
        if rec.prompt is not None:
            return rec.prompt
        chat = self.chat_body(rec)
        if chat is None:
            return None
        if self.upstream is None:
            rec.skip = "a chat request, and no upstream to apply its template"
            return None
        try:
            r = httpx.post(self.upstream + "/apply-template", json=chat, headers=rec.headers, timeout=30,
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
            rec.prompt = env.from_string(src).render(messages=chat["messages"], tools=chat.get("tools"),
                                                     add_generation_prompt=True, bos_token=bos, eos_token="")
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
            if "action" not in r:
                r["arrival"] = round(rec.t, 6)  # always: simulate needs it, and a client's pauses are data
                if self.sim_fields and rec.tokens:
                    r["output"] = list(rec.tokens)
            reqs.append(r)
            results.append(rec.result)
            recorded.append({"t": round(rec.t, 6), "t_done": round(rec.t_done or 0.0, 6), "endpoint": rec.path,
                             "stream": rec.stream, "status": rec.status, "cancelled": rec.cancelled,
                             "n_predicted": rec.n_predicted, "content": rec.content, "tokens": rec.tokens,
                             "prompt_source": rec.prompt_source if rec.kind in CHAT_KINDS else "request",
                             **({"answer_cut": True} if rec.cut else {})})
        with self._lock:
            ignored = list(self.ignored)
        return {"flags": list(self.flags), "requests": reqs, "results": results, "recorded": recorded,
                "recorder": {"upstream": self.upstream, "skipped": skipped, "not_calls": ignored,
                             "problems": list(self.problems[-20:])}}

    def server_info(self) -> dict:
        """What the upstream says about itself (`GET /props`: its slots, context, build, model), asked
        once; {} where it does not answer (the reason is in `problems`)."""
        if self._props is None:
            self._props = {}
            if self.upstream is not None:
                try:
                    r = httpx.get(self.upstream + "/props", timeout=10, trust_env=False,
                                  headers={k: v for k, v in self._auth.items()})
                    p = r.json() if r.status_code == 200 else None
                    if isinstance(p, dict):
                        dg = p.get("default_generation_settings") or {}
                        self._props = {k: v for k, v in {
                            "build": p.get("build_info"), "total_slots": p.get("total_slots"),
                            "n_ctx": dg.get("n_ctx") if isinstance(dg, dict) else None,
                            "model": p.get("model_path")}.items() if v is not None}
                    else:
                        self.problems.append(f"the upstream's /props answered {r.status_code}: the session log "
                                             "has only the --flags given")
                except Exception as exc:
                    self.problems.append(f"the upstream's /props: {type(exc).__name__}: {exc}")
        return self._props

    def header(self) -> dict:
        """The session log's first line: the server's flags (the `--flags` given, with `-np` and `-c` from
        /props where they do not say them) and what /props told (build, slots, context), and what is
        missing."""
        info = self.server_info()
        flags = list(self.flags)
        notes = []
        n = info.get("total_slots")
        if n is not None:
            from slotlab.engine.params import ServerParams

            given = [a for a in flags if a in ("-np", "--parallel")]
            try:
                np_given = ServerParams.from_args(flags).n_parallel if given else None
            except Exception:
                np_given = None
            if not given:
                flags += ["-np", str(n)]
                notes.append(f"-np {n} from the server's /props (--flags did not say it)")
            elif np_given is not None and np_given != n:
                notes.append(f"--flags say -np {np_given}, the server's /props {n} slots")
        ctx = info.get("n_ctx")
        if ctx is not None and n is not None and not any(a in ("-c", "--ctx-size") for a in flags):
            from slotlab.engine.params import ServerParams

            try:  # /props tells a slot's context: the whole one is n slots of it unless the KV is unified
                unified = ServerParams.from_args(flags).kv_unified_effective
            except Exception:
                unified = None
            if unified is not None:
                c = int(ctx) if unified else int(ctx) * int(n)
                flags += ["-c", str(c)]
                notes.append(f"-c {c} from the server's /props ({n} slots of {ctx} tokens"
                             f"{', unified KV' if unified else ''}; --flags did not say it)")
        if info.get("build") and not any(a == "--server-build" for a in flags):
            from slotlab.engine.flags import SERVER_BUILDS, rules_of_build
            from slotlab.watch.builds import BuildWatch

            bw = BuildWatch()  # the number, or the commit of a build made outside llama.cpp's git
            if bw.on_build_info(str(info["build"])):
                rb, why = rules_of_build(bw.build)
                if rb != SERVER_BUILDS[0]:  # the server's rules, where they are not the pin's
                    flags += ["--server-build", str(rb)]
                    notes.append(f"--server-build {rb} from the server's /props ({info['build']})")
                if why:
                    notes.append(why)
        if not self.flags:
            notes.append("no --flags given: the flags /props does not tell (--cache-ram, -sps, checkpoints, ...) "
                         "are the defaults")
        return {"slotlab_session_log": 1, "flags": flags, **({"server": info} if info else {}),
                **({"notes": notes} if notes else {})}

    def sessions(self) -> list[dict]:
        """The chat calls as a session log (`slotlab simulate` reads it: slotlab.sim.traces): a header
        line (`header`), then one line a call with its `messages`, `tools`, the `reply` as generated,
        `timestamp` and `output_length`. A call without the client's own session id gets its
        conversation from its content (slotlab.identity: the messages it extends or shares, so a
        rewritten system prompt or message stays in its conversation), marked `session_source:
        "content"`."""
        from slotlab.conversation import Call
        from slotlab.identity import names

        tr = self.trace()
        reqs = [r for r in tr["requests"] if "messages" in r]
        calls = [Call(i, r["messages"], r.get("tools"), r["reply"] if isinstance(r.get("reply"), dict) else None,
                      session=r.get("session_id"), user=r.get("user")) for i, r in enumerate(reqs)]
        name = names(calls, fmt="conversation-{n}")
        out = [self.header()]
        for r, c, sid in zip(reqs, calls, name):
            line = {"session_id": sid, **({} if c.session is not None else {"session_source": "content"}),
                    **({"user": c.user} if c.user is not None else {}),
                    "timestamp": r["arrival"], "endpoint": r.get("endpoint"), "messages": r["messages"]}
            if r.get("tools"):
                line["tools"] = r["tools"]
            if isinstance(r.get("reply"), dict):
                line["reply"] = r["reply"]
            line["output_length"] = max(0, r["n_predict"])
            out.append(line)
        return out

    def write(self, path: str | Path) -> int:
        """Write the trace to `path` (a temporary file renamed over it); returns the number of requests.
        A `.jsonl` path gets the chat calls as a session log (`sessions`) instead."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        if path.suffix == ".jsonl":
            lines = self.sessions()
            tmp.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines))
            os.replace(tmp, path)
            return len(lines)
        tr = self.trace()
        info = self.server_info()
        if info:
            tr["recorder"]["server"] = info
            tr["flags"] = self.header()["flags"]  # with -np from /props where --flags did not say it
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
    events: list[dict] = []
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
            events.append(obj)
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
            if obj.get("type") in ("message_stop", "response.completed"):  # Anthropic's / Responses' last event
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
    if rec.kind in CHAT_KINDS:
        rec.reply = chat_reply(rec.kind, final, events)
        if rec.reply is not None and rec.kind != "oai_chat":
            rec.content = rec.reply["content"]
    rec.n_predicted = final.get("tokens_predicted", usage.get("completion_tokens", timings.get("predicted_n")))
    cache_n = timings.get("cache_n", (usage.get("prompt_tokens_details") or {}).get("cached_tokens"))
    tokens_evaluated = final.get("tokens_evaluated", usage.get("prompt_tokens"))
    if rec.kind in ("anthropic", "oai_responses"):
        n_out, cached, n_in = _usage_of(rec.kind, final)
        rec.n_predicted = rec.n_predicted if rec.n_predicted is not None else n_out
        cache_n = cache_n if cache_n is not None else cached
        tokens_evaluated = tokens_evaluated if tokens_evaluated is not None else n_in
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


# ------------------------------------------------------------------------------------------- chat calls

#: Claude Code's `metadata.user_id` ("user_<hash>_account_<uuid>_session_<uuid>"): the session part
_CLAUDE_SESSION = re.compile(r"_session_([0-9A-Za-z-]+)$")


def _session_of(headers: dict, body: dict | None) -> tuple[str | None, str | None]:
    """(the client's conversation id, its user field). The conversation: a session header, else the
    session part of Claude Code's `metadata.user_id`. The user: OpenAI's `user`, an Anthropic
    `metadata.user_id` without a session part — a user runs several conversations, so it only keeps
    other users' calls apart (slotlab.identity)."""
    sid = user = None
    for h in SESSION_HEADERS:
        if headers.get(h):
            sid = headers[h][:128]
            break
    if isinstance(body, dict):
        md = body.get("metadata")
        uid = md.get("user_id") if isinstance(md, dict) else None
        if isinstance(uid, str) and uid:
            m = _CLAUDE_SESSION.search(uid)
            if m and sid is None:
                sid = m.group(1)[:128]
            elif not m:
                user = uid[:128]
        if isinstance(body.get("user"), str) and body["user"]:
            user = body["user"][:128]
    return sid, user


def _tool_call(name, args, cid=None) -> dict:
    return {"type": "function", "function": {"name": name or "", "arguments": args if isinstance(args, str)
                                             else json.dumps(args, ensure_ascii=False)},
            **({"id": cid} if cid else {})}


def chat_reply(kind: str, final: dict, events: list[dict]) -> dict | None:
    """The assistant message a chat call generated, in OpenAI's form (`content`, `reasoning_content`,
    `tool_calls`), from the whole answer (`final`) or from its stream (`events`), for the three chat
    APIs; None when the answer holds none."""
    text, think, calls = [], [], {}
    if kind == "oai_chat":
        if not events:
            ch = (final.get("choices") or [{}])[0] if isinstance(final.get("choices"), list) else {}
            m = ch.get("message") if isinstance(ch, dict) else None
            if not isinstance(m, dict):
                return None
            out = {"role": "assistant", "content": m.get("content") or ""}
            if m.get("reasoning_content"):
                out["reasoning_content"] = m["reasoning_content"]
            if m.get("tool_calls"):
                out["tool_calls"] = [_tool_call((t.get("function") or {}).get("name"),
                                                (t.get("function") or {}).get("arguments", ""), t.get("id"))
                                     for t in m["tool_calls"] if isinstance(t, dict)]
            return out
        for ev in events:
            ch = ev.get("choices")
            d = ch[0].get("delta") if isinstance(ch, list) and ch and isinstance(ch[0], dict) else None
            if not isinstance(d, dict):
                continue
            text.append(d.get("content") or "")
            think.append(d.get("reasoning_content") or "")
            for t in d.get("tool_calls") or []:
                c = calls.setdefault(t.get("index", len(calls)), {"name": "", "args": "", "id": None})
                fn = t.get("function") or {}
                c["name"] += fn.get("name") or ""
                c["args"] += fn.get("arguments") or ""
                c["id"] = c["id"] or t.get("id")
    elif kind == "anthropic":
        blocks = final.get("content") if not events else None
        if isinstance(blocks, list):
            for b in blocks:
                if not isinstance(b, dict):
                    continue
                if b.get("type") == "text":
                    text.append(b.get("text") or "")
                elif b.get("type") == "thinking":
                    think.append(b.get("thinking") or "")
                elif b.get("type") == "tool_use":
                    calls[len(calls)] = {"name": b.get("name"), "args": json.dumps(b.get("input") or {}),
                                         "id": b.get("id")}
        for ev in events:
            t = ev.get("type")
            if t == "content_block_start" and (ev.get("content_block") or {}).get("type") == "tool_use":
                cb = ev["content_block"]
                calls[ev.get("index", len(calls))] = {"name": cb.get("name"), "args": "", "id": cb.get("id")}
            elif t == "content_block_delta":
                d = ev.get("delta") or {}
                if d.get("type") == "text_delta":
                    text.append(d.get("text") or "")
                elif d.get("type") == "thinking_delta":
                    think.append(d.get("thinking") or "")
                elif d.get("type") == "input_json_delta":
                    calls.setdefault(ev.get("index", 0), {"name": "", "args": "", "id": None})["args"] += \
                        d.get("partial_json") or ""
    elif kind == "oai_responses":
        items = (final.get("response") or final).get("output") if not events else None
        for ev in events:
            if ev.get("type") == "response.completed" and isinstance(ev.get("response"), dict):
                items = ev["response"].get("output")
        for it in items or []:
            if not isinstance(it, dict):
                continue
            if it.get("type") == "message":
                text += [p.get("text") or "" for p in it.get("content") or [] if isinstance(p, dict)]
            elif it.get("type") == "reasoning":
                think += [p.get("text") or "" for p in it.get("content") or it.get("summary") or []
                          if isinstance(p, dict)]
            elif it.get("type") == "function_call":
                calls[len(calls)] = {"name": it.get("name"), "args": it.get("arguments") or "",
                                     "id": it.get("call_id")}
        if items is None:
            text += [ev.get("delta") or "" for ev in events if ev.get("type") == "response.output_text.delta"]
    else:
        return None
    out = {"role": "assistant", "content": "".join(text)}
    if "".join(think):
        out["reasoning_content"] = "".join(think)
    if calls:
        out["tool_calls"] = [_tool_call(c["name"], c["args"], c["id"]) for _, c in sorted(calls.items())]
    return out


def _usage_of(kind: str, final: dict) -> tuple:
    """(n_predicted, cache_n, n_prompt) from a chat answer's usage, for the APIs whose answers carry no
    llama-server `timings` (Anthropic: input_tokens excludes the cached ones; Responses: usage)."""
    u = final.get("usage") or (final.get("response") or {}).get("usage") or {}
    if kind == "anthropic":
        cached = u.get("cache_read_input_tokens")
        n_in = u.get("input_tokens")
        return u.get("output_tokens"), cached, None if n_in is None else n_in + (cached or 0)
    if kind == "oai_responses":
        return u.get("output_tokens"), (u.get("input_tokens_details") or {}).get("cached_tokens"), u.get("input_tokens")
    return None, None, None
