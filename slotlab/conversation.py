"""The client's side of a lost prefix: what a chat call changed against its conversation's previous one.

The server's flags cannot fix a prompt the client rewrote: a clock in the system prompt, tools sent in
another order, an earlier message edited, history compacted, reasoning stripped from the assistant turn
it sends back. `client_changes(calls, renderer)` compares every call that continues a conversation with
that conversation's previous call — its `messages`, `tools` and, where it was recorded, the reply the
server generated — and names the change:

* kinds (exactly these): `system_changed`, `tools_changed`, `message_edited`, `message_inserted`,
  `compacted` (earlier messages removed or replaced), `reply_not_echoed` (the assistant turn sent back
  differs from what the server generated; known only where the reply was recorded), `other`. A call
  that only appends (the previous messages, the reply, new turns) is no change;
* `message`: the index into this call's `messages` where it happened (0 for the system prompt and for
  the tools, which templates render in the system block), its `role`, and `before` / `after`: the text
  on both sides, short, the differing part in `[...]`;
* `tokens_lost`: what the server held past the point where the prompt diverged and this call sent
  again, so it was processed again — the tokens of the previous prompt and its reply (as the server
  held them) that re-occur after the divergence in this call's prompt. What the server lost before
  the divergence (an SWA or recurrent memory that could not be cut back) is the server-side miss that
  `slotlab.explain` names.

Positions come from rendering each call through the model's chat template exactly as llama-server's
chat endpoint does (`slotlab.serve.chat.ChatTemplate`: Gemma's system prompt folded into the first user
turn, tools rendered in their block) and tokenizing the prompt as a text prompt.

Conversations: by content (slotlab.identity): the client's session id where it sends one, else the
earlier call whose messages this one extends or shares the most messages with — so a call that rewrote
its system prompt or an earlier message is compared with its own conversation's previous call."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from slotlab.errors import TraceError
from slotlab.identity import names, parents, same, text_of

KINDS = ("system_changed", "tools_changed", "message_edited", "message_inserted", "compacted", "reply_not_echoed",
         "other")

#: the client's fix for each kind (never a server flag: no flag makes a rewritten prompt reusable)
ADVICE = {
    "system_changed": "keep the system prompt byte-stable: move what changes (a clock, a date) into the last user "
                      "message",
    "tools_changed": "send the same tools, in the same order, on every call",
    "message_edited": "leave earlier messages as sent: append a correction as a new message",
    "message_inserted": "append new messages at the end: an insertion re-processes everything after it",
    "compacted": "a compaction costs one re-processing of the new history; compact rarely, and keep the "
                 "system prompt and the first messages in front of the summary",
    "reply_not_echoed": "send the assistant turn back as the server generated it (reasoning and tool calls "
                        "included), or the server re-processes it",
    "other": "",
}

#: matching runs shorter than this after the divergence are coincidences (a newline, a role marker)
MIN_RUN = 4


@dataclass
class Call:
    """One chat call: what the client sent and, where recorded, what the server generated."""

    request: int  # index of the call in the trace or log
    messages: list
    tools: list | None = None
    reply: dict | None = None  # the assistant message as generated ({"role", "content", "tool_calls"?})
    reply_text: str | None = None  # the generated text as the server held it (reasoning, tool-call markup)
    session: str | None = None  # the client's own session id (a header); None: told by content
    user: str | None = None  # the client's user field (OpenAI `user`): calls of other users never pair


@dataclass
class ClientChange:
    """What a call changed against its conversation's previous call, and what it cost."""

    request: int
    session: str
    change: str
    message: int
    role: str
    tokens_lost: int
    before: str
    after: str
    previous: int = -1  # the request it was compared with
    position: int = -1  # the token where its prompt diverged from what the server held
    advice: str = ""
    stable: int | None = None  # tokens a stable client would not have processed (slotlab.why.stable), priced
    stable_why: str = ""  # why it could not be priced

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("request", "session", "change", "message", "role", "tokens_lost",
                                              "before", "after", "previous", "position", "stable", "stable_why")}

    def line(self) -> str:
        tip = f" — {self.advice}" if self.advice else ""
        cost = (f"; a stable client would have processed {self.stable} fewer" if self.stable is not None and
                self.stable > 0 else "; a stable client would have processed as many: it cost nothing"
                if self.stable == 0 else f"; a stable client would have processed {-self.stable} more: it cost "
                "nothing" if self.stable is not None else
                f"; not priced: {self.stable_why}" if self.stable_why else "")
        return (f"#{self.request} client change in conversation {self.session} (against #{self.previous}): "
                f"{self.change} at message {self.message} ({self.role}): {self.before!r} -> {self.after!r}; "
                f"{self.tokens_lost} tokens the server held were processed again{cost}{tip}")


# ---------------------------------------------------------------------------------------------- rendering

class Renderer:
    """Messages (+ tools) to token ids as llama-server's chat endpoint makes them: the chat template
    with the generation prompt, tokenized as a text prompt (BOS, special tokens parsed). A reply the
    server generated is tokenized on its own (what the slot holds after the prompt)."""

    def __init__(self, model, params=None):
        from slotlab.serve.chat import ChatTemplate

        self.model = model
        self.template = ChatTemplate(model, params)
        self._memo: dict[str, np.ndarray] = {}

    @classmethod
    def of(cls, model=None, params=None) -> "Renderer":
        from slotlab.llama import Model

        if model is None or isinstance(model, str):
            model = Model(model)
        return cls(model, params)

    def prompt(self, messages: list, tools: list | None = None, now: float = 0.0) -> str:
        body = {"messages": messages}
        if tools:
            body["tools"] = tools
        return self.template.apply_request(body, now=now)

    def tokens(self, messages: list, tools: list | None = None) -> np.ndarray:
        text = self.prompt(messages, tools)
        if text not in self._memo:
            self._memo[text] = np.asarray(self.model.tokenize(text), dtype=np.int32)
        return self._memo[text]

    def reply_tokens(self, text: str) -> np.ndarray:
        return np.asarray(self.model.tokenize(text, add_special=False, parse_special=False), dtype=np.int32)


def held_tokens(r: Renderer, c: Call) -> np.ndarray:
    """What the server held after `c`: its prompt, then the reply it generated (where recorded)."""
    p = r.tokens(c.messages, c.tools)
    text = c.reply_text if c.reply_text is not None else _text(c.reply) if c.reply else ""
    return np.concatenate([p, r.reply_tokens(text)]) if text else p


def lcp(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    ne = np.flatnonzero(a[:n] != b[:n])
    return int(ne[0]) if len(ne) else n


def resent_after(held: np.ndarray, cur: np.ndarray, d: int) -> int:
    """Tokens of `held` past `d` that re-occur, in order, in `cur` past `d` (runs of >= MIN_RUN tokens)."""
    a, b = held[d:].tolist(), cur[d:].tolist()
    if not a or not b:
        return 0
    sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
    return sum(m.size for m in sm.get_matching_blocks() if m.size >= MIN_RUN)


# ---------------------------------------------------------------------------------------------- comparing

def _text(m: dict | None) -> str:
    """A message's text as a template sees it: string content, text parts, tool calls as JSON."""
    if not m:
        return ""
    s = text_of(m)
    if m.get("reasoning_content"):
        s = m["reasoning_content"] + s
    for tc in m.get("tool_calls") or []:
        fn = tc.get("function") or {}
        args = fn.get("arguments")
        s += f"{fn.get('name')}({args if isinstance(args, str) else json.dumps(args, sort_keys=True)})"
    return s


def _same(a: dict, b: dict) -> bool:
    """The same message as the template renders it (slotlab.identity.key: ids, status fields and text
    given as parts or as a string alike)."""
    return same(a, b)


def _tool_names(tools: list | None) -> str:
    return ", ".join(str((t.get("function") or t).get("name", "?")) for t in tools or [] if isinstance(t, dict))


def marked(a: str, b: str, width: int = 24) -> tuple[str, str]:
    """`a` and `b` shortened around where they differ, the differing part in brackets."""
    p = 0
    n = min(len(a), len(b))
    while p < n and a[p] == b[p]:
        p += 1
    s = 0
    while s < n - p and a[len(a) - 1 - s] == b[len(b) - 1 - s]:
        s += 1

    def cut(x: str) -> str:
        mid = x[p:len(x) - s]
        if len(mid) > 2 * width:
            mid = mid[:width] + "…" + mid[-width // 2:]
        head = x[max(0, p - width):p]
        tail = x[len(x) - s:len(x) - s + width // 2]
        return (("…" if p > width else "") + head + "[" + mid + "]" + tail + ("…" if s > width // 2 else "")
                ).replace("\n", "\\n")

    return cut(a), cut(b)


def _starts_with(xs: list, ys: list) -> bool:
    return len(xs) >= len(ys) and all(_same(x, y) for x, y in zip(xs, ys))


def classify(prev: Call, cur: Call) -> tuple[str, int, str, str, str] | None:
    """(change, message, role, before, after) of `cur` against `prev`, or None when `cur` only appends
    (or repeats `prev`: a retry re-sends what the server holds)."""
    if json.dumps(prev.tools or [], sort_keys=True) != json.dumps(cur.tools or [], sort_keys=True):
        b, a = marked(_tool_names(prev.tools) or "(none)", _tool_names(cur.tools) or "(none)")
        if _tool_names(prev.tools) == _tool_names(cur.tools):  # same names: a definition changed
            b, a = marked(json.dumps(prev.tools, sort_keys=True), json.dumps(cur.tools, sort_keys=True))
        return "tools_changed", 0, "tools", b, a
    pm, cm = prev.messages, cur.messages
    expected = [*pm, prev.reply] if prev.reply else list(pm)
    k = next((i for i, (x, y) in enumerate(zip(cm, expected)) if not _same(x, y)), None)
    if k is None:
        if len(cm) >= len(pm):
            return None
        # the call sends fewer messages than the previous one: a branch back (regenerate, undo)
        gone = pm[len(cm)]
        return "other", len(cm) - 1, gone.get("role", "?"), *marked(_text(gone), "")
    x, y = cm[k] if k < len(cm) else None, expected[k]
    role = (x or y).get("role", "?")
    if k == 0 and "system" in (y.get("role"), x and x.get("role")):
        if x is not None and x.get("role") == "system" and y.get("role") == "system":
            return "system_changed", 0, "system", *marked(_text(y), _text(x))
        return "system_changed", 0, "system", *marked(_text(y) if y.get("role") == "system" else "",
                                                    _text(x) if x and x.get("role") == "system" else "")
    if prev.reply and k == len(pm) and x is not None and x.get("role") == "assistant":
        return "reply_not_echoed", k, "assistant", *marked(_text(prev.reply), _text(x))
    # one or more messages inserted before what followed (a note and its answer, where turns alternate)
    if x is not None and any(_starts_with(cm[k + n:], expected[k:]) for n in range(1, len(cm) - k)):
        return "message_inserted", k, role, *marked("", _text(x))
    if x is not None and x.get("role") == y.get("role") and (_starts_with(cm[k + 1:], expected[k + 1:])
                                                            or k == len(expected) - 1
                                                            or _starts_with(expected[k + 1:], cm[k + 1:])):
        return "message_edited", k, role, *marked(_text(y), _text(x))
    for j in range(k + 1, len(expected) + 1):  # earlier messages removed (optionally replaced by a summary)
        rest = expected[j:]
        if rest and (_starts_with(cm[k:], rest) or _starts_with(cm[k + 1:], rest)):
            return "compacted", k, role, *marked(_text(y), _text(x))
    if len(cm) < len(expected):
        return "compacted", k, role, *marked(_text(y), _text(x))
    return "other", k, role, *marked(_text(y), _text(x) if x else "")


def visible(prev: Call, cur: Call, renderer: Renderer | None) -> bool:
    """Whether a tools change shows in the prompt: a template that does not render tools (ChatML,
    Gemma 3's) gives the same tokens either way, and the server held everything."""
    if renderer is None:
        return True
    try:
        return not np.array_equal(renderer.tokens(cur.messages, prev.tools), renderer.tokens(cur.messages, cur.tools))
    except Exception:  # noqa: BLE001 - a template that refuses one of them: the change shows
        return True


def change_of(prev: Call, cur: Call, renderer: Renderer | None = None):
    """`classify(prev, cur)`; a tools change the template does not render (`visible`) gives way to a
    change of the messages in the same call, which is what the prompt shows (else it stays, costing
    nothing: INVISIBLE_TOOLS says so)."""
    ch = classify(prev, cur)
    if ch is not None and ch[0] == "tools_changed" and not visible(prev, cur, renderer):
        return classify(Call(prev.request, prev.messages, cur.tools, prev.reply), cur) or ch
    return ch


#: the advice for a tools change the chat template does not render
INVISIBLE_TOOLS = ("the chat template does not render the tools: the change cost nothing (and the model never "
                   "sees the tools: use a template that renders them, e.g. --jinja with the model's own)")


# ---------------------------------------------------------------------------------------------- pairing

def pair(calls: Sequence[Call], r: Renderer | None = None) -> list[int | None]:
    """For each call, the index (into `calls`) of its conversation's previous call, or None: by content
    (slotlab.identity.parents; `r` is not needed, kept for callers that pass it)."""
    return parents(calls)


def client_changes(calls: Sequence[Call], renderer: Renderer,
                   progress: Callable[[str], None] | None = None) -> list[ClientChange]:
    """Every change a call made against its conversation's previous call (module docstring)."""
    parent = parents(calls)
    name = names(calls, parent)
    out = []
    for i, (c, pj) in enumerate(zip(calls, parent)):
        if pj is None:
            continue
        p = calls[pj]
        kind = change_of(p, c, renderer)
        if kind is None:
            continue
        change, k, role, before, after = kind
        held = held_tokens(renderer, p)
        cur = renderer.tokens(c.messages, c.tools)
        d = lcp(cur, held)
        tip = INVISIBLE_TOOLS if change == "tools_changed" and not visible(p, c, renderer) else ADVICE[change]
        out.append(ClientChange(c.request, name[i], change, k, role, resent_after(held, cur, d), before, after,
                                previous=p.request, position=d, advice=tip))
    return out


# ---------------------------------------------------------------------------------------------- input

def check_messages(where: str, msgs, field_name: str = "messages") -> None:
    """A call's `messages` as a chat endpoint takes them; a TraceError names `where` and the field."""

    if not isinstance(msgs, list) or not msgs:
        raise TraceError(f"{where}, field '{field_name}': expected a non-empty array of messages")
    for j, m in enumerate(msgs):
        check_message(where, m, f"{field_name}[{j}]")


def check_message(where: str, m, f: str) -> None:

    if not isinstance(m, dict):
        raise TraceError(f"{where}, field '{f}': expected an object with \"role\" and \"content\"")
    if not isinstance(m.get("role"), str) or not m["role"]:
        raise TraceError(f"{where}, field '{f}.role': missing or not a string")
    c = m.get("content")
    tc = m.get("tool_calls")
    if tc is not None:
        if m["role"] != "assistant":
            raise TraceError(f"{where}, field '{f}.tool_calls': only an assistant message has tool calls")
        if not isinstance(tc, list):
            raise TraceError(f"{where}, field '{f}.tool_calls': expected an array, got {tc!r}")
        for q, t in enumerate(tc):
            fn = t.get("function") if isinstance(t, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise TraceError(f"{where}, field '{f}.tool_calls[{q}].function.name': missing or not a string")
            if not isinstance(fn.get("arguments", ""), (str, dict)):
                raise TraceError(f"{where}, field '{f}.tool_calls[{q}].function.arguments': expected a JSON "
                                 f"string or an object, got {fn.get('arguments')!r}")
    if c is None and tc is not None:
        return
    if isinstance(c, list):
        for q, part in enumerate(c):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise TraceError(f"{where}, field '{f}.content': part {q} is not a text part "
                                 "{\"type\": \"text\", \"text\": ...} (media is not supported)")
        return
    if not isinstance(c, str):
        raise TraceError(f"{where}, field '{f}.content': expected a string (or text parts), got {c!r}")


def check_tools(where: str, tools) -> None:
    """A call's `tools` as OpenAI's chat API takes them: `[{"type": "function", "function": {"name", ...}}]`."""

    if not isinstance(tools, list):
        raise TraceError(f"{where}, field 'tools': expected an array of tools, got {tools!r}")
    for j, t in enumerate(tools):
        if not isinstance(t, dict):
            raise TraceError(f"{where}, field 'tools[{j}]': expected an object "
                             f"{{\"type\": \"function\", \"function\": {{...}}}}, got {t!r}")
        if t.get("type") != "function":
            raise TraceError(f"{where}, field 'tools[{j}].type': expected \"function\"")
        fn = t.get("function")
        if not isinstance(fn, dict):
            raise TraceError(f"{where}, field 'tools[{j}].function': expected an object with \"name\", got {fn!r}")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise TraceError(f"{where}, field 'tools[{j}].function.name': missing or not a string")
        if "parameters" in fn and not isinstance(fn["parameters"], dict):
            raise TraceError(f"{where}, field 'tools[{j}].function.parameters': expected a JSON schema object")


def calls_of_trace(requests: Sequence[dict], where: str = "trace") -> list[Call]:
    """The chat calls of a slotlab trace's requests (those with `messages`: what `slotlab proxy --record`
    writes), each checked (a TraceError names the request and the field)."""
    out = []
    for i, r in enumerate(requests):
        if "messages" not in r:
            continue
        w = f"{where}: requests[{i}]"
        check_messages(w, r["messages"])
        if r.get("tools") is not None:
            check_tools(w, r["tools"])
        rep = r.get("reply")
        if isinstance(rep, str):
            rep = {"role": "assistant", "content": rep}
        if rep is not None:
            check_message(w, rep, "reply")
        sid = r.get("session_id")
        if r.get("session_source") == "content":  # a recorder's name, told by content: told again here
            sid = None
        user = r.get("user")
        out.append(Call(i, r["messages"], r.get("tools") or None, rep, None, None if sid is None else str(sid),
                        None if user is None else str(user)))
    return out


def as_dicts(changes: list[ClientChange]) -> list[dict]:
    return [c.as_dict() for c in changes]


__all__ = ["ADVICE", "Call", "ClientChange", "KINDS", "Renderer", "classify", "client_changes", "marked", "pair",
           "check_messages", "check_tools", "as_dicts", "calls_of_trace"]
