"""The panel's model: a fold over engine events, with no widgets and no engine access.

`PanelState.apply(event)` is the reducer, written against the event schema (`slotlab.engine.event_types`:
kind constants, typed payloads); the provenance spans and "why" lines are folded from the engine's facts
by `slotlab.explain.Explainer`. `PanelState.rebuild(events)` replays a prefix of the log, which is what
the time slider does. `PanelState.from_bus(bus)` rebuilds from an `EventBus` even after its bounded log
was trimmed: the bus retains what the trimmed events defined (init, each slot's last snapshot, the live
RAM-cache entries, the gauges, the recent history rings below), so the result equals a fold of every
event from the first. Everything it keeps is bounded (ring buffers), so a long run does not grow it."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from slotlab import explain, timeline
from slotlab.engine import event_types as T

EVICTION_REASONS = ("make_room", "byte_limit", "token_limit", "obsolete_prefix", "loaded", "shrink", "idle_clear",
                    "purge", "cleared")
PROVENANCE = explain.PROVENANCE


@dataclass
class SlotView:
    id: int
    state: str = "idle"
    task: int = -1
    n_tokens: int = 0
    n_prompt: int = 0
    n_past: int = 0
    prompt_n: int = 0
    n_gen: int = 0
    prov: list = field(default_factory=list)
    divergence: int = -1
    div_text: str = ""
    origin: str = "slot"
    shifts: list = field(default_factory=list)
    checkpoints: list = field(default_factory=list)  # (pos_min, pos_max, n_tokens, size, id_task)
    why: str = ""


@dataclass
class PanelState:
    n_slots: int = 0
    n_ctx_slot: int = 0
    n_swa: int = 0
    cache_ram: int = 0
    flags: list = field(default_factory=list)
    slots: dict = field(default_factory=dict)
    history: dict = field(default_factory=dict)  # slot -> deque of (task, cache_n, prompt_n, kinds)
    entries: dict = field(default_factory=dict)  # entry id -> info, insertion order = FIFO order
    gauge: dict = field(default_factory=dict)
    scores: dict = field(default_factory=dict)  # last cache_load_scores (task, preview, baseline, per entry)
    #: (seq, t, reason, n_tokens, slot): t, the event's time (seconds since the engine started), is plot 3's x
    #: axis; it travels with the event, so a state rebuilt from a trimmed log places it the same
    evictions: collections.deque = field(default_factory=lambda: collections.deque(maxlen=T.EVICTIONS_KEEP))
    ckpt_marks: collections.deque = field(default_factory=lambda: collections.deque(maxlen=T.CHECKPOINT_MARKS_KEEP))
    why: collections.deque = field(default_factory=lambda: collections.deque(maxlen=T.WHY_KEEP))
    misses: collections.deque = field(default_factory=lambda: collections.deque(maxlen=T.WHY_KEEP))  # explain.Miss
    last_seq: int = -1
    n_requests: int = 0
    _explainer: explain.Explainer = field(default_factory=lambda: explain.Explainer(max_lines=T.WHY_KEEP), repr=False,
                                          compare=False)
    #: the conversations tab's fold (slotlab.timeline): chat calls (client_call events) and their numbers
    timeline: timeline.Timeline = field(default_factory=lambda: timeline.Timeline(own_explainer=False), repr=False,
                                        compare=False)
    #: task -> its client_call (what the client changed), for the why line
    _calls: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def rebuild(cls, events, dropped: dict | None = None) -> "PanelState":
        """Fold `events` (in seq order). `dropped`: per-kind counts of earlier events that are gone
        (`EventBus.replay().dropped`), so that counters such as `n_requests` stay right."""
        st = cls()
        st.n_requests = (dropped or {}).get(T.TASK_DONE, 0)
        for e in events:
            st.apply(e)
        return st

    @classmethod
    def from_bus(cls, bus, upto: int | None = None) -> "PanelState":
        """The state as of event `upto` (default: the last) rebuilt from `bus`, trimmed or not; exact
        for any `upto >= bus.first_seq - 1` (what a time slider can reach)."""
        r = bus.replay(upto)
        return cls.rebuild(r.events, r.dropped)

    def slot(self, i: int) -> SlotView:
        if i not in self.slots:
            self.slots[i] = SlotView(i)
            self.history[i] = collections.deque(maxlen=T.HISTORY_PER_SLOT)
        return self.slots[i]

    def apply(self, e) -> None:
        k = e.kind
        self.last_seq = e.seq
        if k in timeline.READS:
            self.timeline.apply(e)
        if k not in _FOLDED:
            return
        p = e.payload
        if k == T.CLIENT_CALL:
            self._calls[e.task] = p
            while len(self._calls) > T.WHY_KEEP:
                self._calls.pop(next(iter(self._calls)))
            for j, (t, s, _) in enumerate(self.why):  # announced after its plan (a live engine): the line again
                if t == e.task:
                    x = self._explainer.slots.get(s)
                    if x is not None and x.task == t:
                        self.why[j] = (t, s, why_text(x, p))
            return
        if k in explain.READS:
            x = self._explainer.apply(e)
            if x is not None:  # a prompt plan: the request's why line, and its miss cause if it lost tokens
                self.why.append((e.task, e.slot, why_text(x, self._calls.get(e.task))))
                if x.miss is not None:
                    self.misses.append(x.miss)
                    self.timeline.note_miss(e.task, x.miss)  # the conversations tab reads the same explainer
        if k == T.INIT:
            self.n_slots, self.n_ctx_slot = p.n_slots, p.n_ctx_slot
            self.n_swa, self.cache_ram, self.flags = p.n_swa, p.cache_ram, p.flags
            for i in range(self.n_slots):
                self.slot(i)
        elif k == T.SLOT_SNAPSHOT:
            sv = self.slot(e.slot)
            sv.task, sv.state = e.task, p.state
            for f in _SNAPSHOT_FIELDS:
                setattr(sv, f, getattr(p, f))
            x = self._explainer.slots.get(e.slot)
            sv.prov = _spans(x, e.task, p.n_tokens, p.n_prompt)
            if x is not None:
                sv.divergence, sv.div_text, sv.why = x.divergence, x.div_text, why_text(x, self._calls.get(x.task))
        elif k == T.TASK_DONE:
            self.n_requests += 1
            self.slot(e.slot)
            x = self._explainer.slots.get(e.slot)
            kinds = tuple(dict.fromkeys(kd for _, _, kd in x.prov)) if x is not None and x.task == e.task else ()
            self.history[e.slot].append((e.task, p.cache_n, p.prompt_n, kinds))
        elif k == T.CACHE_ALLOC:
            self.entries[p.entry_id] = {"id": p.entry_id, "n_tokens": p.n_tokens, "size": p.size,
                                        "size_main": p.size_main, "size_dft": p.size_dft, "size_ckpt": p.size_ckpt,
                                        "head": p.head, "id_slot": p.id_slot, "id_task": p.id_task,
                                        "checkpoints": p.checkpoints}
        elif k == T.CACHE_EVICT:
            self.entries.pop(p.entry_id, None)
            self.evictions.append((e.seq, e.t, p.reason, p.n_tokens, e.slot))
        elif k == T.SLOT_CLEAR:
            if p.reason in T.EVICTING_CLEARS and p.n_tokens > 0:
                self.evictions.append((e.seq, e.t, p.reason, p.n_tokens, e.slot))
        elif k == T.CACHE_STATE:
            self.gauge = {x: getattr(p, x) for x in ("size", "n_tokens", "limit_size", "limit_tokens",
                                                     "limit_tokens_cur", "n_entries")}
        elif k == T.CACHE_LOAD_SCORES:
            self.scores = {"task": e.task, "slot": e.slot, **p.as_dict()}
        elif k in T.CHECKPOINT_MARKS:
            self.ckpt_marks.append((e.seq, e.slot, k.removeprefix("checkpoint_"), getattr(p, "reason", None),
                                    getattr(p, "n_tokens", None), getattr(p, "pos_min", None),
                                    getattr(p, "pos_max", None)))


def _spans(x, task: int, n_tokens: int, n_prompt: int) -> list:
    """The slot's tokens as provenance spans: its last request's prompt spans (`x`, from the explainer)
    cut at what the slot holds, then what it generated; a slot without a request holds `kept` tokens."""
    if task < 0 or n_prompt == 0 or x is None:
        return [(0, n_tokens, "kept")] if n_tokens else []
    prov = [(a, min(b, n_tokens), kd) for a, b, kd in x.prov if a < n_tokens]
    if n_tokens > n_prompt:
        prov.append((n_prompt, n_tokens, "generated"))
    return prov


_SNAPSHOT_FIELDS = ("n_tokens", "n_prompt", "n_past", "prompt_n", "n_gen", "origin", "shifts", "checkpoints")
#: the kinds `PanelState.apply` folds (every other kind only advances `last_seq`)
_FOLDED = frozenset((T.INIT, T.SLOT_SNAPSHOT, T.TASK_DONE, T.CACHE_ALLOC, T.CACHE_EVICT, T.SLOT_CLEAR, T.CACHE_STATE,
                     T.CACHE_LOAD_SCORES, T.SLOT_DECISION, T.PROMPT_PLAN, T.CACHE_SKIP_OVER_LIMIT, T.CLIENT_CALL)
                    + T.CHECKPOINT_MARKS)


def why_text(x, call=None) -> str:
    """A request's why line, with the cause of its miss when it reused less than the server held, and
    the client's change when the call (`call`: its `client_call` payload) rewrote what the server held.
    A live panel has no trace to replay: its flag advice is the untested kind (`Miss.tip`: shown only
    where the events show its precondition, and marked so; a flag a counterfactual tried is shown only
    when it reused more). A client-side change gets the client's fix, never a flag."""
    out = x.why
    if x.miss is not None:
        m = x.miss
        tip = f" ({m.tip()})" if m.tip() else ""
        out += f"; MISSED {m.lost} reusable tokens at {m.where}: {m.detail}{tip}"
    if call is not None and call.change:
        fix = f" — {call.advice}" if call.advice else ""
        out += (f"; CLIENT CHANGE {call.change} at message {call.message_index} ({call.role}): {call.before!r} -> "
                f"{call.after!r}, {call.tokens_lost} tokens the server held processed again (client-side: no server "
                f"flag fixes it{fix})")
    return out
