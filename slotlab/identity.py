"""Which conversation a chat call belongs to, told by its content — so a client that rewrites its
prompt (a clock in the system prompt, an edited message, a compaction, its own tool call sent back in
place of the model's reply) stays in one conversation, and the rewrite becomes a named client change
(slotlab.conversation) instead of a new conversation nothing is compared with.

A prefix cannot tell it: the very changes that cost the most break the prefix 28 tokens in. What a
call shows instead, strongest first:

* the client's own session id (`Call.session`: a session header such as Claude Code's
  `x-claude-code-session-id`, the session part of Claude Code's `metadata.user_id`): the previous call
  of that session is the parent, nothing else is compared;
* the user field (`Call.user`: OpenAI's `user`, an Anthropic `metadata.user_id` without a session):
  calls of different users are never paired (one user runs several conversations, so it joins none);
* the messages: the earlier call it shares the most non-system messages (or tool-call ids) with — its
  latest turn shares more than any older one — then one whose messages (and the reply it got) it
  starts with, then the longest run of leading messages, then a near-identical system prompt, then the
  latest (the closest in time). A call that
  shares no message with any recent call starts a conversation — which is how two conversations with
  the same system prompt stay apart — and so does one that shares a single message under another
  system prompt (an agent's side request: a title, a classification quoting the user's message).

Messages are compared as a chat template renders them (`key`): role, text (a string or text parts
alike), reasoning, tool calls' names and arguments; ids, `status` and `type` fields are not rendered
and not compared.

Message-level only (no tokenizer): the recorder (slotlab.proxy.record) names the conversations of a
session log with it, and slotlab.conversation pairs calls with it, so the two always agree."""

from __future__ import annotations

import json
from typing import Sequence

#: how many earlier calls a call is compared with (an agent's recent turns; bounds the cost on long logs)
WINDOW = 64


def text_of(m: dict | None) -> str:
    """A message's text as a template sees it: string content or its text parts, joined."""
    if not m:
        return ""
    c = m.get("content")
    if isinstance(c, list):
        c = "".join(p.get("text") or "" for p in c if isinstance(p, dict))
    return c if isinstance(c, str) else ""


def _args(a) -> str:
    if isinstance(a, str):
        try:
            a = json.loads(a)
        except ValueError:
            return a
    return json.dumps(a, sort_keys=True, ensure_ascii=False)


def key(m: dict) -> str:
    """A message as the template renders it (module docstring), as a string to compare and hash."""
    calls = [((tc.get("function") or {}).get("name"), _args((tc.get("function") or {}).get("arguments")))
             for tc in m.get("tool_calls") or [] if isinstance(tc, dict)]
    return json.dumps([m.get("role"), text_of(m), m.get("reasoning_content") or "", calls], ensure_ascii=False)


def same(a: dict, b: dict) -> bool:
    return key(a) == key(b)


def call_ids(msgs: Sequence[dict]) -> set:
    """The tool-call ids a list of messages carries (its assistant tool calls and tool results)."""
    out = set()
    for m in msgs:
        for tc in m.get("tool_calls") or []:
            if isinstance(tc, dict) and tc.get("id"):
                out.add(str(tc["id"]))
        if m.get("tool_call_id"):
            out.add(str(m["tool_call_id"]))
    return out


def near(a: str, b: str) -> bool:
    """Two system prompts that differ in a few characters (a clock, a date, a counter): the common head
    and tail cover 80 % of the longer."""
    if not a or not b:
        return False
    n = min(len(a), len(b))
    p = 0
    while p < n and a[p] == b[p]:
        p += 1
    s = 0
    while s < n - p and a[-1 - s] == b[-1 - s]:
        s += 1
    return (p + s) >= 0.8 * max(len(a), len(b))


class _Seen:
    """What a call shows to the calls after it (computed once)."""

    __slots__ = ("keys", "expected", "shared_keys", "ids", "system")

    def __init__(self, c):
        exp = [*c.messages, *([c.reply] if c.reply else [])]
        self.expected = [key(m) for m in exp]
        self.keys = [key(m) for m in c.messages]
        self.shared_keys = {k for k, m in zip(self.expected, exp) if m.get("role") != "system"}
        self.ids = call_ids(exp)
        self.system = text_of(c.messages[0]) if c.messages and c.messages[0].get("role") == "system" else None


def parents(calls: Sequence) -> list[int | None]:
    """For each call (slotlab.conversation.Call: messages, reply, session, user), the index into `calls`
    of its conversation's previous call, or None where it starts one (module docstring)."""
    seen = [_Seen(c) for c in calls]
    out: list[int | None] = []
    last: dict[str, int] = {}
    for i, c in enumerate(calls):
        sid = getattr(c, "session", None)
        if sid is not None:
            out.append(last.get(sid))
            last[sid] = i
            continue
        me = seen[i]
        mine = [k for k, m in zip(me.keys, c.messages) if m.get("role") != "system"]
        my_ids = call_ids(c.messages)
        user = getattr(c, "user", None)
        best, best_score = None, None
        for j in range(i - 1, max(-1, i - 1 - WINDOW), -1):
            p, ps = calls[j], seen[j]
            pu = getattr(p, "user", None)
            if user is not None and pu is not None and pu != user:
                continue
            lead = 0
            for a, b in zip(me.keys, ps.expected):
                if a != b:
                    break
                lead += 1
            extends = lead >= len(ps.keys)  # its messages (a retry: exactly them), then more
            shared = sum(k in ps.shared_keys for k in mine) + len(my_ids & ps.ids)
            if not extends and not shared:
                continue
            close = (me.system is None and ps.system is None) or near(me.system or "", ps.system or "")
            if not extends and not close and shared < 2:
                continue  # a side request (a title, a summary) quoting one message under its own system prompt
            score = (shared, extends, lead, close, j)
            if best_score is None or score > best_score:
                best, best_score = j, score
        out.append(best)
    return out


def names(calls: Sequence, parent: list[int | None] | None = None, fmt: str = "#{request}") -> list[str]:
    """Each call's conversation name: its session, else its parent's name, else `fmt` of its own
    request (the first call of the conversation)."""
    parent = parents(calls) if parent is None else parent
    out: list[str] = []
    for c, pj in zip(calls, parent):
        sid = getattr(c, "session", None)
        out.append(sid if sid is not None else out[pj] if pj is not None else fmt.format(request=c.request,
                                                                                          n=len(set(out))))
    return out


__all__ = ["WINDOW", "call_ids", "key", "names", "near", "parents", "same", "text_of"]
