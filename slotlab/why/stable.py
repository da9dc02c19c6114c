"""The loss as the user counts it: what a stable client would have reused.

slotlab.conversation names what a call changed against its conversation's previous call; this module
prices it. For every call it builds the call a *stable* client would have sent — the same new turn,
appended to what the server holds for the conversation (the previous stable call's messages and the
reply the server generated) — and the whole session is run again with those prompts under the same
server rules (the same arrivals, the same replies, the same flags; `runner`). The difference is what
the client's changes cost, counted where the user sees it: tokens re-processed.

How each kind is undone (`stable_calls`; the call's own new messages are always kept):

* `system_changed`, `message_edited`: the previous system prompt / message instead of the rewritten
  one, then the call's new messages;
* `reply_not_echoed`: the reply as generated instead of the client's replacement, then what followed;
* `tools_changed`: the previous tools (a template that does not render tools shows no change at all:
  `change_of` takes it as none);
* `message_inserted`: the inserted messages moved to the end, after the turn they were inserted before;
* `compacted`: the history kept, the new turn appended (not priced where it would not fit the slot:
  the compaction was needed);
* `other`, or a call with more than one change at once: not priced (`StableCall.why` says so), the call
  runs as sent.

Each call's numbers (`CallCost`): what it reused and processed as sent, what the stable call reused and
processed, `client` (what the change cost: processed as sent minus processed stable, on the changed
calls) and `server` (what even the stable call lost to the server's mechanisms: the explainer's miss of
the stable run). `Pricing.by_kind` totals the client cost per kind; `Pricing.knock_on` is what the other
calls gained or lost (a slot or a RAM entry freed or taken by a longer or shorter prompt)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from slotlab.conversation import Call, Renderer, _same, _starts_with, change_of, visible
from slotlab.identity import names, parents

#: the kinds a stable client undoes (an `other` change has no stable form)
PRICED = ("system_changed", "tools_changed", "message_edited", "message_inserted", "compacted",
          "reply_not_echoed")


@dataclass
class StableCall:
    """The call a stable client would have sent in place of call `request`."""

    request: int
    messages: list
    tools: list | None
    change: str | None = None  # the change the call made (None: it appended, or starts a conversation)
    undone: bool = False  # the change was undone at this call
    differs: bool = False  # the stable messages / tools differ from the call's (undone here or earlier)
    free: bool = False  # a change the prompt does not show (tools the template does not render): costs 0
    why: str = ""  # why a change was not undone (not priced)


@dataclass
class CallCost:
    """One call's tokens, as sent and as a stable client would have sent it."""

    request: int
    conversation: str
    change: str | None
    reused: int
    processed: int
    stable_reused: int
    stable_processed: int
    client: int = 0  # tokens the change cost (0 where the call made none, or it could not be priced)
    server: int = 0  # tokens the stable call still lost to the server (its miss in the stable run)
    server_cause: str | None = None
    why: str = ""  # why the change was not priced

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Pricing:
    """A session priced against a stable client (module docstring)."""

    calls: list[CallCost]
    processed: int  # tokens processed, as sent
    stable_processed: int  # tokens processed by the stable client
    by_kind: dict[str, int] = field(default_factory=dict)  # client cost per kind (changed calls only)
    n_by_kind: dict[str, int] = field(default_factory=dict)  # changed calls per kind (priced ones)
    unpriced: list[tuple[int, str]] = field(default_factory=list)  # (request, why)
    server_by_cause: dict[str, int] = field(default_factory=dict)  # what the stable client still loses

    @property
    def saved(self) -> int:
        return self.processed - self.stable_processed

    @property
    def knock_on(self) -> int:
        return self.saved - sum(self.by_kind.values())

    def lines(self) -> list[str]:
        pct = lambda n: f" ({100 * n / self.processed:.0f} % of it)" if self.processed else ""  # noqa: E731
        out = [f"as the user counts it: {self.processed} tokens processed; a stable client (the same new turns, "
               f"appended to what the server held) {self.stable_processed}: {self.saved} lost to the client's "
               f"changes{pct(self.saved)}"]
        for k, n in sorted(self.by_kind.items(), key=lambda kv: -kv[1]):
            out.append(f"  {k}: {n} tokens on {self.n_by_kind.get(k, 0)} call(s)")
        if self.knock_on:
            out.append(f"  the other calls: {self.knock_on:+d} tokens (slots and RAM entries the changed prompts "
                       "took or freed)".replace("+-", "-"))
        for r, why in self.unpriced:
            out.append(f"  #{r}: not priced: {why}")
        srv = sum(self.server_by_cause.values())
        if srv:
            by = ", ".join(f"{c} {n}" for c, n in sorted(self.server_by_cause.items(), key=lambda kv: -kv[1]))
            out.append(f"server side: a stable client would still lose {srv} tokens ({by})")
        return out

    def as_json(self) -> dict:
        return {"processed": self.processed, "stable_processed": self.stable_processed, "saved": self.saved,
                "by_kind": dict(self.by_kind), "n_by_kind": dict(self.n_by_kind), "knock_on": self.knock_on,
                "unpriced": [{"request": r, "why": w} for r, w in self.unpriced],
                "server_by_cause": dict(self.server_by_cause), "calls": [c.as_dict() for c in self.calls]}


# ------------------------------------------------------------------------------------ the stable calls

def _expected(c: Call | StableCall, reply: dict | None) -> list:
    return [*c.messages, *([reply] if reply else [])]


def _undo(kind: str, k: int, c: Call, p: Call, base: list) -> tuple[list | None, str]:
    """The stable messages of `c` (a `kind` change at message `k` against `p`), built on `base` (what
    the server holds for the conversation in the stable world: the stable parent and its reply), or
    (None, why)."""
    cm, exp = c.messages, _expected(p, p.reply)
    if kind in ("system_changed", "message_edited"):
        if len(cm) < len(exp) or not all(_same(x, y) for x, y in zip(cm[k + 1:len(exp)], exp[k + 1:])):
            return None, f"{kind} at message {k} and another change in the same call"
        return [*base, *cm[len(exp):]], ""
    if kind == "reply_not_echoed":
        if not p.reply:
            return None, "the reply as generated was not recorded"
        return [*base, *cm[len(p.messages) + 1:]], ""
    if kind == "tools_changed":
        if len(cm) < len(exp) or not _starts_with(cm, exp):
            return None, "tools changed and the messages too"
        return [*base, *cm[len(exp):]], ""
    if kind == "message_inserted":
        for n in range(1, len(cm) - k):
            if _starts_with(cm[k + n:], exp[k:]):
                return [*base, *cm[k:k + n], *cm[n + len(exp):]], ""
        return None, "the inserted messages could not be told apart"
    if kind == "compacted":
        last = max((j for j, m in enumerate(cm) if m.get("role") == "assistant"), default=-1)
        tail = cm[last + 1:] if last >= k else cm[-1:]
        if not tail or tail[0].get("role") == "assistant":
            return None, "the compacted call's new turn could not be told"
        return [*base, *tail], ""
    return None, "a change with no stable form (messages removed from the end, reordered)"


def stable_calls(calls: Sequence[Call], parent: Sequence[int | None] | None = None,
                 undo: Sequence[str] = PRICED, renderer: Renderer | None = None, n_ctx_slot: int | None = None,
                 n_predict: Sequence[int] | None = None) -> list[StableCall]:
    """Per call (in the order made), the call a stable client would have sent (module docstring):
    changes of the kinds in `undo` undone, the others kept as sent. With a `renderer`, an undone call
    the template refuses, or that would not fit `n_ctx_slot` (with its `n_predict`), is kept as sent
    (its `why` says so), and its conversation's later calls are built on it as sent."""
    parent = parents(calls) if parent is None else parent
    out: list[StableCall] = []
    for i, (c, pj) in enumerate(zip(calls, parent)):
        if pj is None:
            out.append(StableCall(c.request, c.messages, c.tools))
            continue
        p, sp = calls[pj], out[pj]
        ch = change_of(p, c, renderer)
        base = _expected(sp, p.reply)
        free = ch is not None and ch[0] == "tools_changed" and not visible(p, c, renderer)
        if ch is None or free:  # appended (or a retry): the same new messages after the stable history
            kind = ch[0] if free else None
            if not sp.differs:
                out.append(StableCall(c.request, c.messages, c.tools, kind, free=free))
                continue
            exp = _expected(p, p.reply)
            msgs = [*base, *c.messages[len(exp):]] if len(c.messages) >= len(exp) else base[:len(c.messages)]
            out.append(StableCall(c.request, msgs, c.tools if free else sp.tools, kind, differs=True, free=free))
            continue
        kind, k = ch[0], ch[1]
        if kind not in undo:
            out.append(StableCall(c.request, c.messages, c.tools, kind))
            continue
        msgs, why = _undo(kind, k, c, p, base)
        tools = sp.tools if kind == "tools_changed" or sp.tools != p.tools else c.tools
        if msgs is not None and renderer is not None:
            why = _fits(renderer, msgs, tools, n_ctx_slot, n_predict[i] if n_predict else 0)
            msgs = None if why else msgs
        if msgs is None:
            out.append(StableCall(c.request, c.messages, c.tools, kind, why=why))
            continue
        out.append(StableCall(c.request, msgs, tools, kind, undone=True, differs=True))
    return out


def _fits(renderer: Renderer, msgs: list, tools, n_ctx_slot: int | None, n_predict: int) -> str:
    """Why a stable call cannot be priced ("" where it can): the template refuses its messages (a role
    order it does not take), or it would not fit the slot's context (the change was needed)."""
    try:
        toks = renderer.tokens(msgs, tools)
    except Exception as ex:  # noqa: BLE001 - the template's own refusal
        return f"the chat template refuses the stable messages ({type(ex).__name__}: {ex})"
    if n_ctx_slot and len(toks) + n_predict > n_ctx_slot:
        return (f"the stable prompt ({len(toks)} tokens) would not fit the slot's context ({n_ctx_slot}): the "
                "change was needed")
    return ""


# ------------------------------------------------------------------------------------------ the pricing

#: a runner: per call (in the order made), the prompt's token ids -> per call, the run's
#: (cache_n, prompt_n) and the explainer's miss of that call (cause, tokens lost) or None
Runner = Callable[[list], tuple[list[tuple[int, int]], list]]


def price(calls: Sequence[Call], actual: Sequence[np.ndarray], runner: Runner, renderer: Renderer, *,
          undo: Sequence[str] = PRICED, n_ctx_slot: int | None = None, n_predict: Sequence[int] | None = None,
          actual_run: tuple | None = None, parent: Sequence[int | None] | None = None) -> Pricing:
    """Run the session as sent (`actual`: each call's prompt; or `actual_run`, that run's result) and
    as a stable client would have sent it, under the same `runner`, and compare call by call."""
    parent = parents(calls) if parent is None else parent
    conv = names(calls, parent)
    st = stable_calls(calls, parent, undo, renderer, n_ctx_slot, n_predict)
    run_a = actual_run if actual_run is not None else runner(list(actual))
    run_s = runner([renderer.tokens(s.messages, s.tools) if s.differs else a for s, a in zip(st, actual)])
    (res_a, _), (res_s, miss_s) = run_a, run_s
    costs, by_kind, n_by_kind, unpriced, server = [], {}, {}, [], {}
    for i, c in enumerate(calls):
        s = st[i]
        (ra, pa), (rs, ps) = res_a[i], res_s[i]
        cc = CallCost(c.request, conv[i], s.change, ra, pa, rs, ps)
        if s.free:  # nothing to undo: the prompt did not show the change
            n_by_kind[s.change] = n_by_kind.get(s.change, 0) + 1
            by_kind.setdefault(s.change, 0)
        elif s.change is not None and s.change in undo:
            if not s.undone:
                cc.why = s.why or "not priced"
                unpriced.append((c.request, cc.why))
            else:
                cc.client = pa - ps
                by_kind[s.change] = by_kind.get(s.change, 0) + cc.client
                n_by_kind[s.change] = n_by_kind.get(s.change, 0) + 1
        m = miss_s[i] if miss_s else None
        if m is not None:
            cc.server_cause, cc.server = m
            server[m[0]] = server.get(m[0], 0) + m[1]
        costs.append(cc)
    return Pricing(costs, sum(p for _, p in res_a), sum(p for _, p in res_s), by_kind, n_by_kind, unpriced, server)


__all__ = ["CallCost", "PRICED", "Pricing", "StableCall", "price", "stable_calls"]
