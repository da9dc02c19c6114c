"""A recorded session explained end to end: what `slotlab simulate --why` and `slotlab report` print.

One fold of three runs of the same trace, on paper (slotlab.why.advice.SimRunner):

1. the session as sent, with the explainer attached: each miss's mechanism (slotlab.explain) and each
   call's change against its conversation's previous call (slotlab.conversation, conversations told
   by content: slotlab.identity);
2. the session as a stable client would have sent it (slotlab.why.stable): what each change cost, per
   call and per kind, and what the server's mechanisms still lose;
3. every flag change the explainer named and every kind of client change undone on its own, each run
   over the whole session (slotlab.why.advice): only what saved tokens is advice.

`SessionWhy.lines()` is the text, `as_json()` the same as data."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from slotlab.why.advice import (Advice, Run, SimRunner, candidates, confirm_misses, confirm_proposals, stable_runner,
                                try_builds, try_client, try_flags, try_proposals)
from slotlab.why.stable import PRICED, Pricing, price


@dataclass
class SessionWhy:
    base: Run
    misses: list  # (call index, slotlab.explain.Miss)
    changes: list  # slotlab.conversation.ClientChange, priced
    pricing: Pricing | None
    advice: Advice
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"#{i} {m.line()}" for i, m in self.misses]
        out += [c.line() for c in self.changes]
        tot = ", ".join(f"{c} {n}" for c, n in sorted(self.base.lost_by_cause.items(), key=lambda kv: -kv[1]))
        out.append(f"tokens lost by cause (the server's mechanisms, as sent): {tot or 'none'}")
        if self.pricing is not None:
            out += self.pricing.lines()
        out += self.advice.lines()
        out += [f"note: {n}" for n in self.notes]
        return out

    def as_json(self) -> dict:
        return {"misses": [{"request": i, **m.as_dict()} for i, m in self.misses],
                "lost_by_cause": dict(self.base.lost_by_cause),
                "client_changes": [c.as_dict() for c in self.changes],
                "stable": None if self.pricing is None else self.pricing.as_json(),
                "advice": self.advice.as_json(), **({"notes": self.notes} if self.notes else {})}


def analyse(trace, flags: list[str], *, speed, profile=None, vocab=None, params=None,
            progress: Callable[[str], None] | None = None) -> SessionWhy:
    """`trace`: a SimTrace (a session log's: its requests carry their calls; any other: flag advice
    only), run on paper under `flags` (the server's) by slotlab.sim.simulate."""
    sim = SimRunner(trace, flags, speed=speed, profile=profile, vocab=vocab)
    has_calls = any(getattr(q, "call", None) is not None for q in trace.requests)
    return analyse_runs(sim, params=params, chat=has_calls, progress=progress)


def analyse_runs(sim, *, params=None, chat: bool = True, progress: Callable[[str], None] | None = None) -> SessionWhy:
    """The three runs (module docstring) through a runner (slotlab.why.advice.SimRunner, or
    slotlab.report.ReportRunner); `chat`: its calls are chat calls (their changes are priced)."""
    from slotlab.conversation import client_changes

    if progress:
        progress("the session as sent")
    base = sim.run(explain=True)
    x = base.explainer
    misses = [(i, m) for i, m in enumerate(base.misses) if m is not None]
    notes = []
    if x is not None and len(x.misses) == x.misses.maxlen:
        notes.append(f"only the last {x.misses.maxlen} misses are listed (the totals count all)")
    calls = sim.calls() if chat else []
    changes, pricing, client = [], None, []
    if len(calls) > 1:
        renderer = sim.renderer(params)
        changes = client_changes(calls, renderer)
        n_predict = sim.n_predict()
        if progress:
            progress("the session as a stable client would have sent it")
        pricing = price(calls, sim.prompts(), stable_runner(sim), renderer, n_ctx_slot=base.n_ctx_slot,
                        n_predict=n_predict, actual_run=base.outcome())
        cost = {c.request: c for c in pricing.calls}
        for ch in changes:
            cc = cost.get(ch.request)
            if cc is not None and cc.change == ch.change:
                if cc.why:
                    ch.stable_why = cc.why
                elif ch.change in PRICED:
                    ch.stable = cc.client
        kinds = [k for k in PRICED if any(c.change == k for c in changes)]
        client = try_client(calls, sim, renderer, base, kinds, n_ctx_slot=base.n_ctx_slot, n_predict=n_predict,
                            progress=progress)
    cands = candidates(list(x.misses) if x is not None else [m for _, m in misses])
    trials, left = try_flags(sim, base, cands, progress=progress)
    confirm_misses({i: m for i, m in misses}, base, trials)
    build, builds = try_builds(sim, base, progress=progress)
    props = try_proposals(sim, base, progress=progress)
    confirm_proposals({i: m for i, m in misses}, base, props)
    adv = Advice(base.processed, trials, client, left, sim.seconds, sim.n_runs, builds, build, props)
    return SessionWhy(base, misses, changes, pricing, adv, notes)


__all__ = ["SessionWhy", "analyse", "analyse_runs"]
