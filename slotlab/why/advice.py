"""Only advice that worked: every suggestion tested by running the whole session again with it.

`slotlab.explain` names the mechanism behind each miss and the flag changes that act on it
(`Miss.candidates`); slotlab.why.stable builds the calls a stable client would have sent. Here both
are priced the same way, on paper over the whole trace (`SimRunner`: slotlab.sim.simulate, the same
arrivals and replies, nothing decoded — a fraction of a second for an agent session):

* a flag change is advice only where it processed fewer tokens over the whole session than the flags
  as given, with no request failing that did not fail before (a smaller slot context, say); on a miss's
  line it is shown only where it also reused more at that request (`confirm`);
* a client fix (one kind of change undone at every call that made it) is advice only where it saved
  tokens, with the amount.

Everything tried is kept (`Advice.flags`, `Advice.client`) with what it did, so a refuted suggestion
can be shown as refuted — never as advice."""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from slotlab.conversation import ADVICE

#: at most this many flag changes are tried (the most lost-to first); the rest are said to be left out
MAX_FLAGS = 16


@dataclass
class Run:
    """One run of the session: per call (in the order made) (cache_n, prompt_n) and, with the explainer,
    its miss (slotlab.explain.Miss) or None; the calls that failed; the tokens processed."""

    per_call: list[tuple[int, int]]
    misses: list
    failed: set
    processed: int
    result: object = None  # the SimResult (a report's run: its replay dict)
    explainer: object = None  # slotlab.explain.Explainer (explain=True)
    n_ctx_slot: int | None = None  # the slot's context the run had (a stable prompt must fit it)
    lost_by_cause: dict = field(default_factory=dict)  # the explainer's totals (the server's mechanisms)

    def outcome(self) -> tuple[list, list]:
        """What slotlab.why.stable.price compares: per call (cache_n, prompt_n) and (cause, lost) or None."""
        return self.per_call, [None if m is None else (m.cause, int(m.lost)) for m in self.misses]


def stable_runner(sim) -> Callable:
    """A slotlab.why.stable runner over a runner object (SimRunner, slotlab.report.ReportRunner): each
    call's prompt -> the run's outcome, with the explainer."""
    return lambda prompts: sim.run(prompts, explain=True).outcome()


class SimRunner:
    """Runs a session log's trace (slotlab.sim.traces.load_sessions) on paper under `flags`, with each
    call's prompt replaced where asked (the same arrival, reply and fields). A runner (this one, or
    slotlab.report.ReportRunner) has `calls()`, `prompts()`, `n_predict()`, `renderer()` and
    `run(prompts, extra, explain) -> Run`."""

    def __init__(self, trace, flags: list[str], *, speed, profile=None, vocab=None):
        self.trace, self.flags, self.speed, self.profile, self.vocab = trace, list(flags), speed, profile, vocab
        # the chat calls in the order made (by their request numbers, which a proxy's trace leaves
        # sparse where other requests sat between them); a trace without calls: its requests
        made = sorted((q.call.request, j) for j, q in enumerate(trace.requests) if getattr(q, "call", None) is not None)
        self.by_call = {c: j for c, (_, j) in enumerate(made)} or {i: i for i in range(len(trace.requests))}
        self.n_calls = len(self.by_call)
        self.seconds = 0.0
        self.n_runs = 0

    def calls(self) -> list:
        return [self.trace.requests[self.by_call[i]].call for i in range(self.n_calls)]

    def n_predict(self) -> list[int]:
        return [int(self.trace.requests[self.by_call[i]].n_predict) for i in range(self.n_calls)]

    def renderer(self, params=None):
        from slotlab.conversation import Renderer

        return Renderer.of(self.vocab if self.vocab is not None else getattr(self.trace, "vocab", None), params)

    def prompts(self) -> list:
        """Each call's prompt as token ids (None where the trace keeps it as text: run as recorded)."""
        out = []
        for i in range(self.n_calls):
            p = self.trace.requests[self.by_call[i]].prompt
            out.append(None if p is None or isinstance(p, str) else np.asarray(p, dtype=np.int32))
        return out

    def run(self, prompts: Sequence | None = None, extra: Sequence[str] = (), explain: bool = False) -> Run:
        from slotlab.sim.simulate import simulate

        t0 = time.perf_counter()
        reqs = list(self.trace.requests)
        if prompts is not None:
            for c, toks in enumerate(prompts):
                j = self.by_call[c]
                if toks is not None and (isinstance(reqs[j].prompt, str) or not np.array_equal(toks, reqs[j].prompt)):
                    reqs[j] = dataclasses.replace(reqs[j], prompt=np.asarray(toks, dtype=np.int32), n_prompt=len(toks))
        tr = dataclasses.replace(self.trace, requests=reqs)
        order: dict[int, int] = {}

        def listen(e) -> None:
            if e.kind == "task_queued" and e.task not in order:
                order[e.task] = len(order)

        obs = ()
        if explain:
            from slotlab import explain as ex

            obs = (ex.attach,)
        res = simulate(tr, [*self.flags, *extra], speed=self.speed, profile=self.profile, vocab=self.vocab,
                       fast=not explain, listen=listen if explain else None, observers=obs, hindsight=explain)
        call_of = {j: c for c, j in self.by_call.items()}
        per = [(0, 0)] * self.n_calls
        failed = set()
        for j, r in enumerate(res.results):
            c = call_of.get(j)
            if c is None:
                continue
            if r["status"] != 200:
                failed.add(c)
            else:
                per[c] = (int(r["cache_n"]), int(r["prompt_n"]))
        misses = [None] * self.n_calls
        x = res.engine.attached[0] if explain and res.engine is not None and res.engine.attached else None
        if x is not None:
            for m in x.misses:
                j = order.get(m.task)
                if j is not None and j in call_of:
                    misses[call_of[j]] = m
        self.seconds += time.perf_counter() - t0
        self.n_runs += 1
        core = getattr(res.engine, "core", None)
        return Run(per, misses, failed, res.totals["tokens_prefilled"], res, x, getattr(core, "n_ctx_slot", None),
                   dict(x.lost_by_cause) if x is not None else {})


@dataclass
class FlagTrial:
    flags: list[str]
    processed: int
    saved: int  # over the whole session (> 0: advice)
    per_call: list[tuple[int, int]] = field(default_factory=list, repr=False)
    refuted: str = ""  # why it is not advice though it processed fewer tokens (requests failed)

    @property
    def works(self) -> bool:
        return self.saved > 0 and not self.refuted

    @classmethod
    def of(cls, flags: list[str], r: "Run", base: "Run") -> "FlagTrial":
        """The trial of a whole-session run `r` under `flags` against `base`: refuted where a call fails
        that did not fail before."""
        t = cls(flags, r.processed, base.processed - r.processed, r.per_call)
        new_fail = r.failed - base.failed
        if new_fail:
            t.refuted = f"{len(new_fail)} call(s) fail under it"
        return t


@dataclass
class ClientTrial:
    change: str
    calls: int  # calls whose change was undone
    saved: int
    advice: str

    @property
    def works(self) -> bool:
        return self.saved > 0


@dataclass
class Advice:
    processed: int
    flags: list[FlagTrial] = field(default_factory=list)
    client: list[ClientTrial] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)  # flag changes not tried (over MAX_FLAGS)
    seconds: float = 0.0
    n_runs: int = 0
    builds: list[FlagTrial] = field(default_factory=list)  # each newer build's rules over the session
    build: int = 11312  # the build whose rules the session ran under (its --server-build)
    proposals: list[FlagTrial] = field(default_factory=list)  # each proposal (slotlab/proposals) over it

    def lines(self) -> list[str]:
        pct = lambda n: f"{100 * n / self.processed:.1f} %" if self.processed else "-"  # noqa: E731
        out = []
        good = sorted((t for t in self.flags if t.works), key=lambda t: -t.saved)
        bad = [t for t in self.flags if not t.works]
        for t in sorted((t for t in self.client if t.works), key=lambda t: -t.saved):
            out.append(f"advice (client): {t.advice} — saves {t.saved} tokens ({pct(t.saved)} of the session's "
                       f"prefill; tested: the session run again with its {t.calls} {t.change} call(s) undone)")
        for t in good:
            out.append(f"advice (server): {' '.join(t.flags)} — saves {t.saved} tokens ({pct(t.saved)}; tested: "
                       "the whole session run again with it)")
        if bad:
            out.append("tried, not advice: " + ", ".join(
                f"{' '.join(t.flags)} ({t.refuted or f'{t.saved:+d} tokens'})".replace("+-", "-")
                .replace("(+0 tokens)", "(saves nothing)") for t in bad))
        for t in self.client:
            if not t.works:
                out.append(f"tried, not advice: undoing {t.change} ({t.saved:+d} tokens)".replace("+-", "-"))
        for t in self.builds:
            b = t.flags[-1]
            if t.refuted:
                out.append(f"upgrade: b{b} was tried, not advice ({t.refuted})")
            elif t.saved:
                out.append(f"upgrade: on this session b{b} would prefill {abs(t.saved)} tokens "
                           f"{'fewer' if t.saved > 0 else 'more'} than b{self.build} ({pct(abs(t.saved))}; tested: "
                           f"the whole session run again under b{b}'s rules, --server-build {b})")
            else:
                out.append(f"upgrade: on this session b{b} would prefill the same tokens as b{self.build} (tested: "
                           f"--server-build {b}; what it changes does not touch this traffic)")
        for t in self.proposals:
            p = proposal_of(t.flags)
            if t.refuted:
                out.append(f"proposal: {p.label()} was tried, not advice ({t.refuted})")
            elif t.saved > 0:
                out.append(f"proposal: {p.label()} would prefill {t.saved} tokens fewer ({pct(t.saved)}; tested: the "
                           f"whole session run again with {' '.join(t.flags)}; a change to llama-server, not a flag "
                           f"of this build)")
        if self.proposals and not any(t.saved > 0 and not t.refuted for t in self.proposals):
            out.append(f"proposals: none of the {len(self.proposals)} changes to llama-server slotlab knows would "
                       "prefill fewer tokens on this session")
        if not good and not any(t.works for t in self.client):
            out.append("no change tried saved tokens over the session")
        if self.left_out:
            out.append(f"not tried (over {MAX_FLAGS}): {', '.join(self.left_out)}")
        return out

    def as_json(self) -> dict:
        return {"processed": self.processed,
                "flags": [{"flags": t.flags, "processed": t.processed, "saved": t.saved, "refuted": t.refuted,
                           "advice": t.works} for t in self.flags],
                "client": [{"change": t.change, "calls": t.calls, "saved": t.saved, "advice": t.advice,
                            "works": t.works} for t in self.client],
                "left_out": list(self.left_out), "runs": self.n_runs, "build": self.build,
                "builds": [{"build": int(t.flags[-1]), "processed": t.processed, "saved": t.saved,
                            "refuted": t.refuted} for t in self.builds],
                "proposals": [{"name": proposal_of(t.flags).name, "origin": proposal_of(t.flags).origin,
                               "verified": proposal_of(t.flags).verified, "processed": t.processed,
                               "saved": t.saved, "refuted": t.refuted} for t in self.proposals]}


def candidates(misses) -> list[str]:
    """Every flag change the explainer named for the misses (slotlab.explain.Miss.candidates), those of
    the misses that lost the most first, each once."""
    from slotlab.counterfactual import flag_change

    tot: dict[str, int] = {}
    for m in misses:
        for s in m.candidates:
            if flag_change(s) is not None:
                tot[s] = tot.get(s, 0) + m.lost
    return sorted(tot, key=lambda s: -tot[s])


def try_flags(sim, base: "Run", cands: Sequence[str], progress: Callable[[str], None] | None = None
               ) -> tuple[list[FlagTrial], list[str]]:
    """Each candidate flag change run over the whole session (as sent); (trials, left out)."""
    from slotlab.counterfactual import flag_change

    trials = []
    for n, s in enumerate(cands[:MAX_FLAGS]):
        fl = flag_change(s)
        if progress:
            progress(f"testing {s} ({n + 1}/{min(len(cands), MAX_FLAGS)})")
        try:
            r = sim.run(extra=fl)
        except Exception as ex:  # noqa: BLE001 - a flag the server would refuse here: shown as refuted
            trials.append(FlagTrial(fl, base.processed, 0, refuted=f"{type(ex).__name__}: {ex}"))
            continue
        trials.append(FlagTrial.of(fl, r, base))
    return trials, list(cands[MAX_FLAGS:])


def try_builds(sim, base: "Run", progress: Callable[[str], None] | None = None) -> tuple[int, list[FlagTrial]]:
    """Each build newer than the session's (its --server-build, default the pin) run over the whole
    session under that build's rules: (the session's build, the trials). "Should I upgrade" as tokens."""
    from slotlab.engine.flags import SERVER_BUILDS
    from slotlab.engine.params import ServerParams

    params = getattr(sim, "params", None)  # a report's runner has them; SimRunner its flags
    cur = (params if params is not None else ServerParams.from_args(list(sim.flags))).server_build
    out = []
    for b in (x for x in SERVER_BUILDS if x > cur):
        if progress:
            progress(f"testing b{b}'s rules")
        fl = ["--server-build", str(b)]
        out.append(FlagTrial.of(fl, sim.run(extra=fl), base))
    return cur, out


def proposal_of(flags: Sequence[str]):
    """The proposal a trial's flags turn on (the trial was made from its `args`)."""
    from slotlab.proposals import PROPOSALS

    return next(p for p in PROPOSALS.values() if list(p.args) == list(flags))


def try_proposals(sim, base: "Run", progress: Callable[[str], None] | None = None) -> list[FlagTrial]:
    """Each modelled proposal (slotlab/proposals) run over the whole session, the build's rules
    everywhere else: what a change to llama-server itself would save where no flag does."""
    from slotlab.proposals import PROPOSALS

    out = []
    ps = [p for p in PROPOSALS.values() if p.modelled]
    for n, p in enumerate(ps):
        if progress:
            progress(f"testing proposal {p.name} ({n + 1}/{len(ps)})")
        fl = list(p.args)
        try:
            r = sim.run(extra=fl)
        except Exception as ex:  # noqa: BLE001 - shown as refuted, never dropped
            out.append(FlagTrial(fl, base.processed, 0, refuted=f"{type(ex).__name__}: {ex}"))
            continue
        out.append(FlagTrial.of(fl, r, base))
    return out


def confirm_proposals(misses_by_call: dict, base: "Run", trials: Sequence[FlagTrial]) -> None:
    """A miss no flag change saved gets the proposal that reused the most more at its call, if any."""
    for c, m in misses_by_call.items():
        if m.saved:
            continue
        best = None
        for t in trials:
            if t.refuted or c >= len(t.per_call):
                continue
            gain = t.per_call[c][0] - base.per_call[c][0]
            if gain > 0 and (best is None or gain > best[1]):
                best = (t, gain)
        if best is not None:
            p = proposal_of(best[0].flags)
            m.proposal = f"a change to llama-server would: {p.label()} reuses +{best[1]} tokens here"


def try_client(calls, sim, renderer, base: "Run", kinds: Sequence[str], *, n_ctx_slot=None,
                n_predict=None, progress=None) -> list[ClientTrial]:
    """Each kind of client change undone alone, at every call that made it, the session run again."""
    from slotlab.why.stable import stable_calls

    out, actual = [], sim.prompts()
    for n, k in enumerate(kinds):
        if progress:
            progress(f"testing the client with {k} undone ({n + 1}/{len(kinds)})")
        st = stable_calls(calls, undo=(k,), renderer=renderer, n_ctx_slot=n_ctx_slot, n_predict=n_predict)
        undone = sum(s.undone for s in st)
        if not undone:
            continue
        r = sim.run([renderer.tokens(s.messages, s.tools) if s.differs else a for s, a in zip(st, actual)])
        out.append(ClientTrial(k, undone, base.processed - r.processed, ADVICE.get(k, "")))
    return out


def confirm_misses(misses_by_call: dict, base: Run, trials: Sequence[FlagTrial]) -> None:
    """Set each miss's flag advice (slotlab.counterfactual.confirm) from the whole-session trials: a
    change that works over the session and reused more at that call, with what it saved there."""
    from slotlab.counterfactual import Counterfactual, confirm

    for c, m in misses_by_call.items():
        tried = []
        for t in trials:
            if not t.works or c >= len(t.per_call):
                tried.append(Counterfactual(t.flags, None, 0))
                continue
            cn = t.per_call[c][0]
            tried.append(Counterfactual(t.flags, cn, cn - base.per_call[c][0]))
        confirm(m, tried)


def progress_line(who: str) -> Callable[[str], None] | None:
    """Progress on stderr where it is a terminal (one line, rewritten)."""
    if not sys.stderr.isatty():
        return None

    def say(msg: str) -> None:
        print(f"\r{who}: {msg}\033[K", end="", file=sys.stderr, flush=True)
    return say


__all__ = ["Advice", "ClientTrial", "FlagTrial", "MAX_FLAGS", "Run", "SimRunner", "candidates", "confirm_misses",
           "stable_runner", "try_builds", "try_client", "try_flags", "try_proposals", "confirm_proposals",
           "proposal_of"]
