"""Explanations as a fold over events: where each reused token came from and a plain-words "why"
line per request.

The engine (and, later, the simulator and a real server's log reader) only report facts: the slot
decision (`slot_decision`: how the slot was chosen, f_sim / f_keep, what the RAM cache did) and the
prompt plan (`prompt_plan`: n_past, the common prefix, a checkpoint restored or forced
re-processing, cache-reuse shifts, the divergence). `Explainer.apply(event)` turns those into
provenance spans and a sentence, so every source of events gets the same explanations and none of
them carries text-making code."""

from __future__ import annotations

import collections
import threading
import weakref
from dataclasses import dataclass, field
from typing import Iterable

from slotlab.engine import event_types as T
from slotlab.engine.event_types import UNSET

#: Provenance kinds of a slot's tokens, in the panel's legend order.
PROVENANCE = ("kept", "cache", "file", "checkpoint", "shifted", "prefill", "generated")


def origin_kind(origin: str) -> str:
    """What a slot's tokens came from before this request: kept in the slot, a RAM entry, a file."""
    return "cache" if origin.startswith("cache") else "file" if origin.startswith("file") else "kept"


def provenance(lcp: int, n_past: int, n_prompt: int, ckpt: str | None, origin: str,
               shifts: Iterable) -> list[tuple[int, int, str]]:
    """Spans [(start, end, kind)] of the prompt: reused (kept / cache / file / checkpoint /
    shifted) up to n_past, then prefilled."""
    prov: list[tuple[int, int, str]] = []
    if ckpt == "restored":
        prov.append((0, n_past, "checkpoint"))
    elif ckpt is None:
        if min(lcp, n_past) > 0:
            prov.append((0, min(lcp, n_past), origin_kind(origin)))
        prov += [(c, min(d, n_past), "shifted") for a, b, c, d in shifts if c < n_past]
    prov.append((n_past, n_prompt, "prefill"))
    return prov


def _num(v, default=0):
    """A payload's number, or `default` where the source did not report it (UNSET) or it is None."""
    return default if v is None or v is UNSET else v


def why_line(slot: int, decision: T.SlotDecision | None, plan: T.PromptPlan, sps: float) -> str:
    """One sentence: how the slot was chosen, what the RAM cache did, shifts, checkpoints, totals."""
    d = decision
    if d is None:
        parts = [f"slot {slot} chosen ?"]
    else:
        how = {"id": f"by id_slot {d.id_requested}", "lru": "by LRU",
               "lcp": f"by LCP similarity (f_sim {d.f_sim:.2f} > {sps:.2f})"}
        parts = [f"slot {slot} chosen {how.get(d.how, '?')}"]
        if d.load is True:
            parts.append(f"RAM entry {plan.origin.removeprefix('cache ')} restored (f_keep {_num(d.f_keep_best):.2f}, "
                         f"f_sim {_num(d.f_sim_best):.2f} beat baseline {_num(d.f_keep_base):.2f})")
        elif d.load is False:
            parts.append("RAM entry restore failed: slot cleared")
        elif d.update_cache:
            parts.append("RAM cache searched: nothing better than the slot")
        elif d.how == "lcp":
            parts.append(f"slot kept (f_keep {_num(d.f_keep):.2f} >= 0.50)")
    shifts = plan.shifts or []
    if shifts:
        parts.append(f"cache reuse shifted {len(shifts)} chunk(s), {sum(b - a for a, b, _, _ in shifts)} tokens")
    n_past, n_prompt = plan.n_past, plan.n_prompt
    if plan.ckpt == "restored":
        parts.append(f"checkpoint restored (n_past {n_past})")
    elif plan.ckpt == "forced":
        parts.append("no usable checkpoint: full re-processing forced")
    parts.append(f"{n_past} tokens reused, {n_prompt - n_past} prefilled")
    return "; ".join(parts)


#: Miss causes, in the order they are checked. Each names the mechanism that lost the tokens.
CAUSES = {
    "dropped": "the prefix was held but dropped earlier (an evicted RAM entry, a cleared or overwritten slot)",
    "busy": "the slot holding the prefix was busy with another request",
    "pinned": "the request named another slot (id_slot)",
    "threshold": "the holder's similarity was not above -sps, so another slot was chosen",
    "slot_kept": "the chosen slot kept >= half its tokens, so the RAM cache was not searched",
    "floor": "the RAM entry kept < 0.25 of its tokens (the f_keep floor)",
    "two_axis": "another candidate was better on one axis only: the entry never won on both",
    "restore_failed": "the RAM entry's state could not be restored",
    "no_checkpoint": "no checkpoint at or before the divergence: the memory could not be cut back",
    "checkpoint_early": "the nearest usable checkpoint was earlier than the divergence",
    "cache_prompt_off": "the request set cache_prompt false",
    "other": "not attributed",
}


@dataclass
class Miss:
    """A request that reused fewer tokens than the server held for it, and why.

    `possible` is the longest common prefix with anything held at arrival (or dropped lately), capped
    at n_prompt - 1 (the server always evaluates one token); `lost` = possible - n_past.

    Advice is never a guess presented as a fix. `candidates` are the flag changes that act on the
    mechanism (what a counterfactual tries). `suggest` holds only flag changes a counterfactual
    confirmed (`slotlab.counterfactual.confirm`: they reused more, best first, `saved` the tokens each
    saved), then the advice that is not a flag (a request field, keeping the prompt stable).
    `untested` holds, where no replay was possible (a live engine, a server's log), the candidates
    whose precondition holds in what the events show: data, never printed as advice (`line` says
    instead how to test them, NOT_TESTED)."""

    task: int
    slot: int
    n_prompt: int
    n_past: int
    possible: int
    lost: int
    cause: str
    detail: str
    where: str  # "slot 1", "entry #4"
    prompt_text: str = ""
    held_text: str = ""
    suggest: list = field(default_factory=list)  # confirmed flag changes, best first, then other advice
    untested: list = field(default_factory=list)  # flag changes whose precondition holds, not replayed
    candidates: list = field(default_factory=list)  # every flag change that acts on the mechanism
    tested: bool = False  # True once a counterfactual replay decided `suggest`
    saved: dict = field(default_factory=dict)  # flag change -> tokens it saved (tested, > 0 only)
    cost: dict = field(default_factory=dict)  # flag change -> what it costs (e.g. --swa-full: KV memory)
    not_tried: str = ""  # why the flag changes were not tried (when a counterfactual skipped this miss)
    proposal: str = ""  # where no flag saved it: the change to llama-server (slotlab/proposals) that would

    def flags(self) -> list[str]:
        """The confirmed flag changes (best first)."""
        return [s for s in self.suggest if is_flag(s)]

    def advice(self) -> list[str]:
        """The shown suggestions that are not flag changes."""
        return [s for s in self.suggest if not is_flag(s)]

    def tip(self) -> str:
        """The advice in a few words: tested flags with their figure; where none was tested, how to test them."""
        def fig(f):
            c = f"; {self.cost[f]}" if f in self.cost else ""
            return f"{f} (+{self.saved[f]} tokens reused{c})" if f in self.saved else (f"{f} ({self.cost[f]})" if c else f)
        fl, adv = self.flags(), self.advice()
        parts = []
        if fl:
            parts.append("try " + ", or ".join(fig(f) for f in fl[:3]))
        elif self.untested and not self.tested:  # never advice: only a run of the trace says what a flag saves
            parts.append(NOT_TESTED)
        elif self.tested and self.candidates:
            parts.append("no flag change tried saved tokens")
        if not fl and self.proposal:
            parts.append(self.proposal)
        elif self.not_tried:
            parts.append(f"flag changes not tried ({self.not_tried})")
        parts += adv[:1]
        return "; ".join(parts)

    def line(self) -> str:
        diff = (f" (prompt {self.prompt_text!r} vs held {self.held_text!r})"
                if self.prompt_text or self.held_text else "")
        tip = self.tip()
        return (f"task {self.task}: {self.lost} of {self.possible} reusable tokens lost ({self.where}{diff}): "
                f"{self.detail}" + (f" — {tip}" if tip else ""))

    def as_dict(self) -> dict:
        return dict(self.__dict__)


#: what a miss's line says where flag changes act on it but nothing ran the trace with them
NOT_TESTED = ("flag changes not tested here: `slotlab simulate REC --why` on a recording (slotlab proxy --record) "
              "tests them")


def is_flag(s: str) -> bool:
    """A suggestion that is a server flag change (`--swa-full`, `-sps 0.59`), not advice in words."""
    return s.startswith("-") and "(" not in s


@dataclass
class Evidence:
    """What the events showed beyond one request's facts: the preconditions of untested advice."""

    delimiters: bool = False  # a checkpoint at a user-message start (only message delimiters put one there)
    too_close: int = 0  # checkpoints erased as too close to an earlier one (the -cms rule)
    room: int = 0  # RAM entries evicted or not saved for want of room (bytes / tokens limits)


def _candidates(cause: str, params: dict, ev: "Evidence", hist: dict, extra: dict) -> list[tuple[str, bool]]:
    """The flag changes that act on the mechanism behind `cause`, each with whether its precondition
    holds in what the events show (only those are shown untested; a counterfactual tries them all).

    A flag appears only where it can change the mechanism at all: -cms only when it is not 0 already
    (it spaces user-message checkpoints, which need message delimiters, and the too-close rule),
    --swa-full only for an SWA model without it, --cache-ram only with a RAM cache that ran out of room
    or none at all."""
    out: list[tuple[str, bool]] = []
    n_swa, cms = params.get("n_swa", 0) or 0, params.get("checkpoint_min_step", 0) or 0
    cur = params.get("ctx_checkpoints")
    cur = 32 if cur is None else cur
    if cause in ("no_checkpoint", "checkpoint_early"):
        fifo = hist.get("fifo", 0)
        if cur == 0:
            out.append(("--ctx-checkpoints 32", True))
        else:
            out += [(f"--ctx-checkpoints {n}", fifo > 0) for n in dict.fromkeys((2 * cur, max(32, 4 * cur)))]
        if cms > 0:
            out.append(("--checkpoint-min-step 0", ev.delimiters or ev.too_close > 0))
        if n_swa > 0:
            out.append(("--swa-full", True))
    elif cause == "dropped":
        reason, ram, n = extra.get("reason"), params.get("cache_ram", 0), params.get("n_slots") or 1
        if reason in ("make_room", "byte_limit", "token_limit"):
            if ram and ram > 0:
                out.append((f"--cache-ram {2 * ram}", True))
        elif reason == "overwritten":
            by = extra.get("by")
            kept = by is not None and by.how == "lcp" and not by.update_cache
            if kept:
                sps_up = min(0.99, round(by.f_sim + 0.01, 2))
                out.append((" ".join([f"-sps {sps_up:.2f}", *([] if ram else ["--cache-ram 8192"])]), True))
            if not ram:
                out.append(("--cache-ram 8192", not kept))
            out.append((f"-np {n + 1}", True))
        elif reason in ("idle_clear", "purge"):
            out.append((f"-np {n + 1}", True))
            if not ram:
                out.append(("--cache-ram 8192", True))
            if reason == "purge" and params.get("kv_unified"):
                out.append(("-no-kvu", True))
        else:
            if not ram:
                out.append(("--cache-ram 8192", False))
            out.append((f"-np {n + 1}", False))
    elif cause == "threshold":
        out.append((f"-sps {max(0.0, round(extra['f'] - 0.01, 2)):.2f}", True))
    elif cause == "slot_kept":
        out.append((f"-sps {extra['sps_up']:.2f}", True))
        out.append((f"-np {(params.get('n_slots') or 1) + 1}", False))
    elif cause == "two_axis":
        ram = params.get("cache_ram", 0)
        if ram and ram > 0:
            out.append((f"--cache-ram {2 * ram}", ev.room > 0))
    return out


def diagnose(slot: int, task: int, dec: T.SlotDecision | None, plan: T.PromptPlan, sps: float,
             ckpt_history: dict | None = None, params: dict | None = None, decisions: dict | None = None,
             evidence: Evidence | None = None) -> Miss | None:
    """The cause of a miss from the two facts of a request (its `slot_decision` and `prompt_plan`
    payloads; no decision: nothing is known to be held), or None when nothing the server held was lost.
    `evidence` (what earlier events showed) decides which flag changes are shown untested (`_candidates`)."""
    n_prompt, n_past = plan.n_prompt, plan.n_past
    held, lost = (dec.held, dec.lost) if dec is not None else (None, None)
    h = held.lcp if held else 0
    lo = lost.lcp if lost else 0
    cap = max(0, n_prompt - 1)
    possible = min(max(h, lo), cap)
    if n_past >= possible or possible <= 1:  # nothing lost, or only the BOS token in common
        return None
    params = params or {}
    ev = evidence or Evidence()
    src = lost if lo > h and lo > n_past else held
    where = f"slot {src.id}" if src.where == "slot" else f"entry #{src.id}"
    miss = dict(task=task, slot=slot, n_prompt=n_prompt, n_past=n_past, possible=possible, lost=possible - n_past,
                where=where, prompt_text=src.prompt_text, held_text=src.held_text)
    hist = (ckpt_history or {}).get(slot, {})

    def out(cause, detail, advice=(), **extra):
        cands = _candidates(cause, params, ev, hist, extra)
        return Miss(cause=cause, detail=detail, suggest=list(advice), untested=[f for f, ok in cands if ok],
                    candidates=[f for f, _ in cands], **miss)

    if src is lost:
        what = "RAM entry" if lost.where == "entry" else "slot content"
        if lost.reason == "overwritten":
            # who overwrote it, and why was it not saved first? A slot chosen by similarity with
            # f_keep >= 0.5 skips the RAM cache: only a higher -sps (LRU, which saves) would have kept it.
            by = (decisions or {}).get(lost.by_task) if lost.by_task is not UNSET else None
            if by is not None and by.how == "lcp" and not by.update_cache:
                what = (f"slot content {where} with {lost.n_held} tokens was overwritten by task {lost.by_task}, "
                        f"which kept the slot (f_sim {by.f_sim:.2f} > -sps, f_keep {_num(by.f_keep):.2f}"
                        " >= 0.50) without saving it to the RAM cache")
                return out("dropped", what, reason="overwritten", by=by)
            return out("dropped", f"{what} {where} with {lost.n_held} tokens was dropped ({lost.reason}, event "
                                  f"{lost.seq}) before this request", reason="overwritten", by=by)
        return out("dropped", f"{what} {where} with {lost.n_held} tokens was dropped ({lost.reason}, event "
                              f"{lost.seq}) before this request", reason=lost.reason)
    if plan.cache_prompt is False:
        return out("cache_prompt_off", CAUSES["cache_prompt_off"], ["\"cache_prompt\": true"])
    chosen = f"slot {slot}"
    if held.where == "slot" and held.id != slot:
        checks = {c[0]: c for c in dec.checks or []}
        c = checks.get(held.id)
        if c is not None and c[1] == "is_processing":
            return out("busy", f"slot {held.id} held {held.lcp} tokens but was busy; {chosen} got the request",
                       [f"send it with id_slot {held.id} (it then waits for that slot)"])
        if dec.id_requested != -1:
            return out("pinned", f"the request asked for slot {dec.id_requested} (id_slot) while slot {held.id} "
                                 f"held {held.lcp} tokens", ["id_slot -1"])
        f = held.lcp / max(1, n_prompt)
        return out("threshold", f"slot {held.id} shared {held.lcp}/{n_prompt} tokens (f_sim {f:.2f}, not above "
                                f"-sps {sps:.2f}); {chosen} was chosen {'by LRU' if dec.how == 'lru' else dec.how}",
                   f=f)
    if held.where == "entry" and not str(plan.origin).endswith(f"#{held.id}"):
        if dec.load is False:
            return out("restore_failed", CAUSES["restore_failed"])
        if not dec.update_cache:
            fk = dec.f_keep
            sps_up = min(0.99, round(dec.f_sim + 0.01, 2))
            return out("slot_kept", f"{chosen} kept its own prefix (f_keep {fk if fk is None else f'{fk:.2f}'} >= 0.50), "
                                    f"so the RAM cache, where {where} held {held.lcp} tokens, was not searched",
                       sps_up=sps_up)
        fk_e = held.lcp / max(1, held.n_held)
        if fk_e < 0.25:
            return out("floor", f"{where} shares {held.lcp} of its {held.n_held} tokens (f_keep {fk_e:.2f} < 0.25)",
                       ["no flag moves the f_keep floor (0.25): the entry held much more than this prompt shares"])
        return out("two_axis", f"{where} (f_keep {fk_e:.2f}, f_sim {held.lcp / max(1, n_prompt):.2f}) did not beat the "
                               "slot or an earlier entry on both axes")
    # the content was in the chosen slot (or was loaded into it): the prompt plan lost it
    ck = plan.checkpoints or []
    if plan.ckpt == "forced":
        nearest = f"; checkpoints at n_tokens {[c[2] for c in ck][-4:]}" if ck else "; the slot had no checkpoint"
        advice = []
        if ck and min(c[2] for c in ck) > possible:  # every checkpoint lies after the change
            advice.append(f"keep the prompt's first {possible} tokens stable: it changes right there")
        thold = plan.pos_min_thold if plan.pos_min_thold is not UNSET else None
        rule = (f"pos_min {plan.pos_min} >= {thold}" if plan.pos_min not in (None, UNSET) and thold is not None
                # a log prints the threshold (`checking checkpoint ... against T`), not pos_min
                else f"pos_min >= max(0, pos_next - n_swa) = {thold}" if thold is not None
                else "pos_min >= max(0, pos_next - n_swa)")
        return out("no_checkpoint", f"the memory could not be cut back to {possible} ({rule}) and no checkpoint was at "
                                    f"or before it{nearest}"
                                    + (f"; {hist['fifo']} erased by the --ctx-checkpoints cap" if hist.get("fifo") else ""),
                   advice)
    if plan.ckpt == "restored":
        return out("checkpoint_early", f"the checkpoint restored ends at {n_past}, {possible - n_past} tokens before the "
                                       "divergence (the server checkpoints a few tokens before each prompt's end; "
                                       "what follows, the generated reply included, is processed again)")
    return out("other", f"{CAUSES['other']} (how {dec.how if dec else None}, load {dec.load if dec else None})")


@dataclass
class Explanation:
    """What the explainer knows of the latest request of one slot."""

    task: int = -1
    n_prompt: int = 0
    prov: list = field(default_factory=list)
    divergence: int = -1
    div_text: str = ""
    why: str = ""
    miss: Miss | None = None


#: the kinds `Explainer.apply` reads (slot decisions, prompt plans, init for -sps; checkpoint creations,
#: evictions and RAM-cache evictions are what untested advice's preconditions read): a view that
#: feeds it only these skips the rest of the stream
READS = frozenset((T.INIT, T.SLOT_DECISION, T.PROMPT_PLAN, T.CHECKPOINT_EVICT, T.CHECKPOINT_CREATED, T.CACHE_EVICT,
                   T.CACHE_SKIP_OVER_LIMIT))


class Explainer:
    """The fold: feed it events in order (`apply`), read `slots[i]` and `lines` (the latest why
    lines as (task, slot, text)). Needs `init` for `-sps` (defaults to the server's 0.10)."""

    def __init__(self, max_lines: int = 200):
        self.sps = 0.1
        self.params: dict = {}
        self.decisions: dict[int, T.SlotDecision] = {}  # task -> its slot_decision payload
        self.slots: dict[int, Explanation] = {}
        self.lines: collections.deque = collections.deque(maxlen=max_lines)
        self.misses: collections.deque = collections.deque(maxlen=max_lines)
        self.lost_by_cause: collections.Counter = collections.Counter()  # tokens lost, whole run
        self.ckpt_history: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
        self.evidence = Evidence()
        self._plans: dict[int, tuple[int, int]] = {}  # task -> (n_past, n_prompt), for checkpoint positions
        self.unsubscribe = None  # set by attach()

    def apply(self, e) -> Explanation | None:
        k, d = e.kind, e.payload
        if k == T.INIT:
            self.sps = float(d.sps)
            self.params = _params_of(d)
        elif k == T.CHECKPOINT_EVICT:
            self.ckpt_history[e.slot][d.reason] += 1
            if d.reason == "too_close":
                self.evidence.too_close += 1
        elif k == T.CHECKPOINT_CREATED:
            if not self.evidence.delimiters and e.task in self._plans:
                self.evidence.delimiters = _user_start(d.n_tokens, *self._plans[e.task], self.params)
        elif k == T.CACHE_SKIP_OVER_LIMIT:
            self.evidence.room += 1
        elif k == T.CACHE_EVICT:
            if d.reason in ("make_room", "byte_limit", "token_limit"):
                self.evidence.room += 1
        elif k == T.SLOT_DECISION:
            self.decisions[e.task] = d
            if len(self.decisions) > 4096:  # bounded: only recent tasks can still be planned
                self.decisions.pop(next(iter(self.decisions)))
        elif k == T.PROMPT_PLAN:
            dec = self.decisions.get(e.task)
            self._plans[e.task] = (d.n_past, d.n_prompt)
            if len(self._plans) > 4096:
                self._plans.pop(next(iter(self._plans)))
            x = Explanation(e.task, d.n_prompt, provenance(d.lcp, d.n_past, d.n_prompt, d.ckpt, d.origin, d.shifts or []),
                            d.divergence, d.div_text, why_line(e.slot, dec, d, self.sps))
            # a log prints -sps with each selection
            sps = dec.sps if dec is not None and dec.sps not in (None, UNSET) else self.sps
            x.miss = diagnose(e.slot, e.task, dec, d, sps, self.ckpt_history, self.params, self.decisions,
                              self.evidence)
            if x.miss is not None:
                self.misses.append(x.miss)
                self.lost_by_cause[x.miss.cause] += x.miss.lost
            self.slots[e.slot] = x
            self.lines.append((e.task, e.slot, x.why))
            return x
        return None

    def fold(self, events) -> "Explainer":
        for e in events:
            self.apply(e)
        return self

    def miss(self, task: int) -> Miss | None:
        for m in reversed(self.misses):
            if m.task == task:
                return m
        return None

    def why(self, task: int) -> str | None:
        for t, _, text in reversed(self.lines):
            if t == task:
                return text
        return None


def _user_start(n_tokens: int, n_past: int, n_prompt: int, params: dict) -> bool:
    """A checkpoint at `n_tokens` of a request that reused `n_past` of `n_prompt` tokens that no rule
    but a user-message start explains (spec 4.2: without message spans checkpoints are taken only at
    the start of a batch near the prompt's end: n_past, N - 4, N - (4 + n_ubatch), or a batch boundary
    n_batch apart from n_past)."""
    nb, nu = params.get("n_batch") or 2048, params.get("n_ubatch") or 512
    tails = {n_past, n_prompt - min(nb, 4), n_prompt - min(nb, 4 + nu)}
    return n_tokens > n_past and n_tokens not in tails and (n_tokens - n_past) % nb != 0


def _params_of(init: T.Init) -> dict:
    """The flags a suggestion needs, from the `init` payload (its `flags` are the server's command line)."""
    out = {"n_slots": init.n_slots, "n_swa": init.n_swa, "cache_ram": init.cache_ram, "kv_unified": init.kv_unified}
    flags = list(init.flags or [])
    names = {"--ctx-checkpoints": "ctx_checkpoints", "-ctxcp": "ctx_checkpoints", "--swa-checkpoints": "ctx_checkpoints",
             "--checkpoint-min-step": "checkpoint_min_step", "-cms": "checkpoint_min_step",
             "-b": "n_batch", "--batch-size": "n_batch", "-ub": "n_ubatch", "--ubatch-size": "n_ubatch"}
    for i, f in enumerate(flags[:-1]):
        if f in names:
            try:
                out[names[f]] = int(flags[i + 1])
            except ValueError:
                pass
    out.setdefault("ctx_checkpoints", 32)
    out.setdefault("checkpoint_min_step", 8192)  # the server's default (spec 4.2)
    return out


#: bus -> its attached explainer: attaching twice (a panel on an engine built with the explainer as
#: an observer) must not emit every request_miss twice
_ATTACHED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def attach(bus) -> "Explainer":
    """Fold `bus` as it goes and emit a `request_miss` event (slotlab.engine.event_types) right after
    each prompt plan whose request lost reusable tokens, so every consumer of the stream (the panel's
    event log, `replay --events`, a notebook) sees the cause as data. Returns the explainer (the one
    already attached, if any). The engine imports no view: a front end passes this as one of
    `Engine(observers=...)` (then it sees the first event) or calls it on `engine.events` (a panel
    does, when it opens: it folds what the bus still holds first, silently)."""
    if bus in _ATTACHED:
        return _ATTACHED[bus]
    x = Explainer()
    _ATTACHED[bus] = x
    lock = threading.RLock()  # re-entrant: a request_miss emitted while draining comes back through on_event
    state = {"upto": -1, "early": []}  # while the history is folded, live events wait in `early`

    def apply(e) -> None:
        if e.kind == T.REQUEST_MISS or e.seq <= state["upto"]:
            return
        state["upto"] = e.seq
        r = x.apply(e)
        if r is not None and r.miss is not None:
            m = r.miss
            bus.emit(T.RequestMiss(cause=m.cause, lost=m.lost, possible=m.possible, n_past=m.n_past,
                                   n_prompt=m.n_prompt, where=m.where, detail=m.detail, prompt_text=m.prompt_text,
                                   held_text=m.held_text, suggest=[*m.untested, *m.suggest]),
                     m.line(), level="INF", slot=m.slot, task=m.task)

    def on_event(e) -> None:
        with lock:
            if state["early"] is not None:
                state["early"].append(e)
                return
        apply(e)  # outside the lock: request_miss is emitted to every subscriber from here

    # subscribe first, then fold what the bus holds (an engine already running: a panel opened late),
    # silently; events that arrived meanwhile are applied after it, once each, in seq order
    x.unsubscribe = bus.subscribe(on_event)
    for e in bus.replayable() if bus.log else ():
        if e.kind != T.REQUEST_MISS and e.seq > state["upto"]:
            x.apply(e)
            state["upto"] = e.seq
    with lock:  # the engine's thread waits in on_event until the early ones are applied, so order holds
        early, state["early"] = state["early"], None
        for e in early:
            apply(e)
    return x
