"""The conversation timeline: per conversation, each call as what it reused and what it processed,
the processed part by cause — so an agent's whole run shows at a glance where its prefix broke.

A fold over typed events, like every view: `Timeline.apply(event)` reads

* `client_call` (slotlab.engine.event_types.ClientCall): which chat call a task is, in which
  conversation, and the client's change against that conversation's previous call
  (slotlab.conversation: kind, message, tokens lost);
* `task_done`: the request's `cache_n` (reused) and `prompt_n` (processed);
* the explainer's facts (`init`, `slot_decision`, `prompt_plan`, ...): the server mechanism behind a
  miss (slotlab.explain: a prefix the server held and lost, e.g. no checkpoint near the divergence).

A call's bar is `cache_n` reused, then its `prompt_n` processed tokens split by cause: what the client's
change made the server process again (`tokens_lost`: held past the divergence and sent again), what a
server mechanism lost (the miss's `lost`: held before the divergence and not reused), and the rest,
new tokens nothing held (the new turn). The parts always sum to `prompt_n`, so the bar's length is the
prompt. The same fold feeds the static picture (`slotlab.figures.timeline`, `slotlab report --png`) and
the panel's conversations tab (`slotlab.panel.timeline`).

Who emits `client_call`: `slotlab report` (slotlab.report: a session log or a proxy's trace, replayed)
and `Conversations` below (chat calls sent to an engine from a notebook, live)."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from slotlab import explain
from slotlab.engine import event_types as T

#: what the processed tokens that nothing held are called
NEW = "new"
#: the kinds the fold reads (every other kind is skipped)
READS = explain.READS | {T.CLIENT_CALL, T.TASK_DONE}


@dataclass
class Bar:
    """One call: `cache_n` reused, `prompt_n` processed (`parts`: (cause, tokens), summing to prompt_n;
    a cause is `client:KIND`, `server:CAUSE` or `new`)."""

    request: int
    session: str
    task: int
    cache_n: int
    prompt_n: int
    parts: list = field(default_factory=list)
    call: T.ClientCall | None = None
    miss: explain.Miss | None = None

    @property
    def reprocessed(self) -> int:
        """Processed although the server held them (the client's change and the server's misses)."""
        return sum(n for c, n in self.parts if c != NEW)

    def cause_tokens(self) -> dict:
        return dict(self.parts)

    def label(self) -> str:
        """A few words for the bar: what broke the prefix, and what it cost."""
        out = []
        if self.call is not None and self.call.change:
            out.append(f"{self.call.change} at message {self.call.message_index}: {self.call.tokens_lost} re-processed")
        if self.miss is not None:
            out.append(f"{self.miss.cause}: {self.miss.lost} lost")
        return "; ".join(out)


def split(cache_n: int, prompt_n: int, call: T.ClientCall | None, miss: explain.Miss | None) -> list:
    """`prompt_n` by cause (module docstring), in prompt order: the server's loss lies before the
    divergence (right after what was reused), the client's past it, so they never overlap; each is capped at what is left of `prompt_n` (a re-tokenized reply
    can count one token more than the server held)."""
    parts, left = [], prompt_n
    if miss is not None and miss.lost > 0:  # [n_past, possible): right after what was reused
        n = min(miss.lost, left)
        if n:
            parts.append((f"server:{miss.cause}", n))
            left -= n
    if call is not None and call.change and call.tokens_lost > 0:  # past the divergence
        n = min(call.tokens_lost, left)
        if n:
            parts.append((f"client:{call.change}", n))
            left -= n
    if left > 0:
        parts.append((NEW, left))
    return parts


class Timeline:
    """The fold (module docstring). `conversations()`: session -> its bars in call order; `bars()`: all,
    in call order. Bounded: the last `keep` calls (`event_types.TIMELINE_KEEP`, what a trimmed bus
    retains). `own_explainer=False`: the owner folds the explainer's events through its own `Explainer` and
    hands each miss over with `note_miss` (the panel: one explainer, not two over the same events)."""

    def __init__(self, keep: int = T.TIMELINE_KEEP, *, own_explainer: bool = True):
        self.keep = keep
        self.calls: collections.OrderedDict[int, T.ClientCall] = collections.OrderedDict()  # task -> call
        self.done: dict[int, tuple[int, int]] = {}  # task -> (cache_n, prompt_n)
        self.misses: dict[int, explain.Miss] = {}  # task -> miss
        self._explainer = explain.Explainer(max_lines=keep) if own_explainer else None

    def apply(self, e) -> None:
        k = e.kind
        if k not in READS:
            return
        if k in explain.READS:
            if self._explainer is not None:
                x = self._explainer.apply(e)
                if x is not None and x.miss is not None:
                    self.note_miss(e.task, x.miss)
            return
        p = e.payload
        if k == T.CLIENT_CALL:
            self.calls[e.task] = p
            while len(self.calls) > self.keep:
                old, _ = self.calls.popitem(last=False)
                self.done.pop(old, None)
                self.misses.pop(old, None)
        elif k == T.TASK_DONE:  # kept for every task: a live engine may finish a task before its call is announced
            self.done[e.task] = (p.cache_n, p.prompt_n)
            self._bound(self.done)

    def note_miss(self, task: int, miss: explain.Miss) -> None:
        """Task `task` lost tokens the server held (`miss`, from the explainer)."""
        self.misses[task] = miss
        self._bound(self.misses)

    def fold(self, events) -> "Timeline":
        for e in events:
            self.apply(e)
        return self

    def _bound(self, d: dict) -> None:
        while len(d) > 4 * self.keep:
            d.pop(next(iter(d)))

    @property
    def n_other(self) -> int:
        """Requests done that no `client_call` named (not chat calls: not drawn)."""
        return sum(1 for t in self.done if t not in self.calls)

    def bars(self) -> list[Bar]:
        """Every finished call, in call order."""
        out = []
        for task, c in self.calls.items():
            if task not in self.done:
                continue  # queued or running: drawn once it is done
            cache_n, prompt_n = self.done[task]
            m = self.misses.get(task)
            out.append(Bar(c.request, c.session, task, cache_n, prompt_n, split(cache_n, prompt_n, c, m), c, m))
        return sorted(out, key=lambda b: b.request)

    def conversations(self) -> dict[str, list[Bar]]:
        """session -> its bars, conversations in the order of their first call."""
        out: dict[str, list[Bar]] = {}
        for b in self.bars():
            out.setdefault(b.session, []).append(b)
        return out

    def totals(self) -> dict:
        """Tokens by cause over every bar (`reused` = the cache_n total)."""
        t: collections.Counter = collections.Counter()
        for b in self.bars():
            t["reused"] += b.cache_n
            for c, n in b.parts:
                t[c] += n
        return dict(t)


def call_fields(request: int, session: str, change=None) -> dict:
    """The `client_call` payload of a call (`change`: a slotlab.conversation.ClientChange or None)."""
    d = {"request": request, "session": session}
    if change is not None:
        d.update(previous=change.previous, change=change.change, message_index=change.message, role=change.role,
                 tokens_lost=change.tokens_lost, before=change.before, after=change.after, position=change.position,
                 advice=change.advice)
    return d


def emit_call(bus, task: int, request: int, session: str, change=None):
    """Emit the `client_call` event of a queued task (its message: the change's line, or a short note)."""
    msg = change.line() if change is not None else f"#{request} call of conversation {session}"
    return bus.emit(T.ClientCall(**call_fields(request, session, change)), msg, level="INF", task=task)


def sessions_of(calls, renderer) -> list[str]:
    """Each call's conversation, as slotlab.conversation.client_changes names them (slotlab.identity:
    the call's own session, else its paired previous call's, else `#request` of its first call);
    `renderer` is not needed (kept for callers that pass it)."""
    from slotlab.identity import names

    return names(calls)


class Conversations:
    """Chat calls sent to an engine from a notebook, each announced on its event bus as a `client_call`
    (so the panel's timeline draws it): `conv.chat(messages, session="agent")` renders the messages
    through the model's chat template as llama-server's chat endpoint does, compares the call with its
    conversation's previous one (its reply as the engine generated it), queues it and returns the task."""

    def __init__(self, engine, renderer=None):
        from slotlab.conversation import Renderer

        self.engine = engine
        self.renderer = renderer or Renderer(engine.model, engine.params)
        self.calls: list = []
        self._tasks: list = []

    def _replies(self) -> None:
        """The replies of finished calls, as the slot holds them (the generated text)."""
        for c, t in zip(self.calls, self._tasks):
            if c.reply is None and t.done and t.result is not None:
                text = t.result.get("content", "")
                c.reply, c.reply_text = {"role": "assistant", "content": text}, text

    def chat(self, messages: list, *, tools: list | None = None, session: str | None = None, **fields):
        """Queue one chat call (`fields`: the engine's completion fields, e.g. n_predict); returns its task."""
        from slotlab.conversation import Call, check_messages, check_tools, client_changes

        check_messages("chat call", messages)
        if tools is not None:
            check_tools("chat call", tools)
        self._replies()
        call = Call(len(self.calls), [dict(m) for m in messages], tools or None, None, None, session)
        self.calls.append(call)
        changes = [c for c in client_changes(self.calls, self.renderer) if c.request == call.request]
        sess = sessions_of(self.calls, self.renderer)[-1]
        toks = self.renderer.tokens(call.messages, call.tools)
        delims = self.renderer.template.delimiters()
        if delims and "message_delimiters" not in fields:
            fields["message_delimiters"] = [dict(x) for x in delims]
        task = self.engine.submit(toks, **fields)
        emit_call(self.engine.events, task.id, call.request, sess, changes[0] if changes else None)
        self._tasks.append(task)
        return task

    def analysis(self, progress=None):
        """The finished calls priced against a stable client and every flag change and client fix run
        over them (slotlab.why.session, as `slotlab report` does): the calls replayed one at a time on
        paper under the engine's flags, each generating what it generated here. Returns the
        SessionWhy (`Panel.show_stable` draws it on the conversations tab)."""
        import dataclasses

        import numpy as np

        from slotlab.report import Loaded, analysis

        self._replies()
        done = [(c, t) for c, t in zip(self.calls, self._tasks) if t.done and t.result is not None and t.error is None]
        if not done:
            raise ValueError("no finished chat call to price yet: send some with chat() and run the engine")
        reqs, calls, outs = [], [], []
        for i, (c, t) in enumerate(done):
            reqs.append({"prompt": self.renderer.tokens(c.messages, c.tools).tolist(),
                         "n_predict": len(t.result.get("tokens") or []) or 1})
            calls.append(dataclasses.replace(c, request=i))
            outs.append(np.asarray(t.result.get("tokens") or [], dtype=np.int32))
        ld = Loaded(self.engine.params.to_args(), reqs, calls, outs, self.engine.model, "panel")
        sw = analysis(ld, progress=progress)
        back = [c.request for c, _ in done]  # the calls' own numbers (the timeline's rows)
        for cc in (sw.pricing.calls if sw.pricing is not None else []):
            cc.request = back[cc.request]
        for ch in sw.changes:
            ch.request, ch.previous = back[ch.request], back[ch.previous] if ch.previous >= 0 else -1
        return sw


__all__ = ["Bar", "Conversations", "NEW", "Timeline", "call_fields", "emit_call", "sessions_of", "split"]
