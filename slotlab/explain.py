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
from dataclasses import dataclass, field
from typing import Iterable

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


def why_line(slot: int, decision: dict, plan: dict, sps: float) -> str:
    """One sentence: how the slot was chosen, what the RAM cache did, shifts, checkpoints, totals."""
    d = decision or {}
    how = {"id": f"by id_slot {d.get('id_requested', '?')}", "lru": "by LRU",
           "lcp": f"by LCP similarity (f_sim {d.get('f_sim', 0):.2f} > {sps:.2f})"}
    parts = [f"slot {slot} chosen {how.get(d.get('how'), '?')}"]
    origin = plan.get("origin", "slot")
    if d.get("load") is True:
        parts.append(f"RAM entry {origin.removeprefix('cache ')} restored (f_keep {d.get('f_keep_best', 0):.2f}, "
                     f"f_sim {d.get('f_sim_best', 0):.2f} beat baseline {d.get('f_keep_base', 0):.2f})")
    elif d.get("load") is False:
        parts.append("RAM entry restore failed: slot cleared")
    elif d.get("update_cache"):
        parts.append("RAM cache searched: nothing better than the slot")
    elif d.get("how") == "lcp":
        parts.append(f"slot kept (f_keep {d.get('f_keep', 0):.2f} >= 0.50)")
    shifts = plan.get("shifts") or []
    if shifts:
        parts.append(f"cache reuse shifted {len(shifts)} chunk(s), {sum(b - a for a, b, _, _ in shifts)} tokens")
    n_past, n_prompt = plan["n_past"], plan["n_prompt"]
    if plan.get("ckpt") == "restored":
        parts.append(f"checkpoint restored (n_past {n_past})")
    elif plan.get("ckpt") == "forced":
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
    at n_prompt - 1 (the server always evaluates one token); `lost` = possible - n_past."""

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
    suggest: list = field(default_factory=list)  # candidate flag changes, most specific first

    def line(self) -> str:
        diff = (f" (prompt {self.prompt_text!r} vs held {self.held_text!r})"
                if self.prompt_text or self.held_text else "")
        return (f"task {self.task}: {self.lost} of {self.possible} reusable tokens lost ({self.where}{diff}): "
                f"{self.detail}" + (f" — try {self.suggest[0]}" if self.suggest else ""))

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def diagnose(slot: int, task: int, dec: dict, plan: dict, sps: float, ckpt_history: dict | None = None,
             params: dict | None = None, decisions: dict | None = None) -> Miss | None:
    """The cause of a miss from the two facts of a request (its `slot_decision` and `prompt_plan`),
    or None when nothing the server held was lost."""
    n_prompt, n_past = plan["n_prompt"], plan["n_past"]
    held, lost = dec.get("held"), dec.get("lost")
    h = held["lcp"] if held else 0
    lo = lost["lcp"] if lost else 0
    cap = max(0, n_prompt - 1)
    possible = min(max(h, lo), cap)
    if n_past >= possible or possible <= 1:  # nothing lost, or only the BOS token in common
        return None
    params = params or {}
    src = lost if lo > h and lo > n_past else held
    where = f"slot {src['id']}" if src["where"] == "slot" else f"entry #{src['id']}"
    miss = dict(task=task, slot=slot, n_prompt=n_prompt, n_past=n_past, possible=possible, lost=possible - n_past,
                where=where, prompt_text=src.get("prompt_text", ""), held_text=src.get("held_text", ""))

    def out(cause, detail, suggest=()):
        return Miss(cause=cause, detail=detail, suggest=list(suggest), **miss)

    if src is lost:
        what = "RAM entry" if lost["where"] == "entry" else "slot content"
        sugg = ["--cache-ram " + str(2 * params["cache_ram"]) if params.get("cache_ram", 0) > 0 else "--cache-ram 8192"]
        if lost["reason"] == "overwritten":
            # who overwrote it, and why was it not saved first? A slot chosen by similarity with
            # f_keep >= 0.5 skips the RAM cache: only a higher -sps (LRU, which saves) would have kept it.
            by = (decisions or {}).get(lost.get("by_task"), {})
            ram = [] if params.get("cache_ram") else ["--cache-ram 8192"]
            sugg = []
            if by.get("how") == "lcp" and not by.get("update_cache"):
                sps_up = min(0.99, round(by.get("f_sim", 0) + 0.01, 2))
                sugg.append(" ".join([f"-sps {sps_up:.2f}", *ram]))
                what = (f"slot content {where} with {lost['n_held']} tokens was overwritten by task {lost['by_task']}, "
                        f"which kept the slot (f_sim {by.get('f_sim', 0):.2f} > -sps, f_keep {by.get('f_keep') or 0:.2f}"
                        " >= 0.50) without saving it to the RAM cache")
                return out("dropped", what, sugg + [f"-np {params.get('n_slots', 1) + 1}"])
            sugg = ram + [f"-np {params.get('n_slots', 1) + 1}" if params.get("n_slots") else "more slots (-np)"]
        elif lost["reason"] in ("idle_clear", "purge"):
            sugg = ["-np " + str(params.get("n_slots", 1) + 1) if params.get("n_slots") else "--cache-ram 8192",
                    *(["-kvu off (separate KV per slot)"] if lost["reason"] == "purge" else [])]
        return out("dropped", f"{what} {where} with {lost['n_held']} tokens was dropped ({lost['reason']}, event "
                              f"{lost['seq']}) before this request", sugg)
    if not plan.get("cache_prompt", True):
        return out("cache_prompt_off", CAUSES["cache_prompt_off"], ["\"cache_prompt\": true"])
    chosen = f"slot {slot}"
    if held["where"] == "slot" and held["id"] != slot:
        checks = {c[0]: c for c in dec.get("checks") or []}
        c = checks.get(held["id"])
        if c is not None and c[1] == "is_processing":
            return out("busy", f"slot {held['id']} held {held['lcp']} tokens but was busy; {chosen} got the request",
                       [f"send it with id_slot {held['id']} (it then waits for that slot)"])
        if dec.get("id_requested", -1) != -1:
            return out("pinned", f"the request asked for slot {dec['id_requested']} (id_slot) while slot {held['id']} "
                                 f"held {held['lcp']} tokens", ["id_slot -1"])
        f = held["lcp"] / max(1, n_prompt)
        return out("threshold", f"slot {held['id']} shared {held['lcp']}/{n_prompt} tokens (f_sim {f:.2f}, not above "
                                f"-sps {sps:.2f}); {chosen} was chosen {'by LRU' if dec.get('how') == 'lru' else dec.get('how')}",
                   [f"-sps {max(0.0, round(f - 0.01, 2)):.2f}"])
    if held["where"] == "entry" and not str(plan.get("origin", "")).endswith(f"#{held['id']}"):
        if dec.get("load") is False:
            return out("restore_failed", CAUSES["restore_failed"])
        if not dec.get("update_cache"):
            fk = dec.get("f_keep")
            sps_up = min(0.99, round(dec.get("f_sim", 0) + 0.01, 2))
            return out("slot_kept", f"{chosen} kept its own prefix (f_keep {fk if fk is None else f'{fk:.2f}'} >= 0.50), "
                                    f"so the RAM cache, where {where} held {held['lcp']} tokens, was not searched",
                       [f"-sps {sps_up:.2f}", f"-np {params.get('n_slots', 1) + 1}" if params.get("n_slots")
                        else "more slots (-np)"])
        fk_e = held["lcp"] / max(1, held["n_held"])
        if fk_e < 0.25:
            return out("floor", f"{where} shares {held['lcp']} of its {held['n_held']} tokens (f_keep {fk_e:.2f} < 0.25)",
                       ["shorter cached prompts (the floor is fixed)"])
        return out("two_axis", f"{where} (f_keep {fk_e:.2f}, f_sim {held['lcp'] / max(1, n_prompt):.2f}) did not beat the "
                               "slot or an earlier entry on both axes", ["--cache-ram (a different FIFO order)"])
    # the content was in the chosen slot (or was loaded into it): the prompt plan lost it
    ck = plan.get("checkpoints") or []
    if plan.get("ckpt") == "forced":
        near = [c for c in ck if c[1] <= n_past] or ck
        nearest = f"; checkpoints at n_tokens {[c[2] for c in ck][-4:]}" if ck else "; the slot had no checkpoint"
        hist = (ckpt_history or {}).get(slot, {})
        sugg = []
        if hist.get("fifo"):
            cur = params.get("ctx_checkpoints") or 32
            sugg += [f"--ctx-checkpoints {n}" for n in dict.fromkeys((2 * cur, max(32, 4 * cur)))]
        if params.get("checkpoint_min_step", 0) > 0:
            sugg.append("--checkpoint-min-step 0")
        if params.get("n_swa", 0) > 0:
            sugg.append("--swa-full")
        if not sugg:
            sugg.append("--ctx-checkpoints 64")
        if ck and min(c[2] for c in ck) > possible:  # every checkpoint lies after the change: no flag can help
            sugg.append(f"keep the prompt's first {possible} tokens stable: it changes right there")
        del near
        thold = plan.get("pos_min_thold")
        rule = (f"pos_min {plan['pos_min']} >= {thold}" if plan.get("pos_min") is not None and thold is not None
                # a log prints the threshold (`checking checkpoint ... against T`), not pos_min
                else f"pos_min >= max(0, pos_next - n_swa) = {thold}" if thold is not None
                else "pos_min >= max(0, pos_next - n_swa)")
        return out("no_checkpoint", f"the memory could not be cut back to {possible} ({rule}) and no checkpoint was at "
                                    f"or before it{nearest}"
                                    + (f"; {hist['fifo']} erased by the --ctx-checkpoints cap" if hist.get("fifo") else ""),
                   sugg)
    if plan.get("ckpt") == "restored":
        return out("checkpoint_early", f"the checkpoint restored ends at {n_past}, {possible - n_past} tokens before the "
                                       "divergence (the server checkpoints a few tokens before each prompt's end; "
                                       "what follows, the generated reply included, is processed again)",
                   ["--checkpoint-min-step 0", "a checkpoint per user message (message_delimiters)"])
    return out("other", f"{CAUSES['other']} (how {dec.get('how')}, load {dec.get('load')})")


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


class Explainer:
    """The fold: feed it events in order (`apply`), read `slots[i]` and `lines` (the latest why
    lines as (task, slot, text)). Needs `init` for `-sps` (defaults to the server's 0.10)."""

    def __init__(self, max_lines: int = 200):
        self.sps = 0.1
        self.params: dict = {}
        self.decisions: dict[int, dict] = {}  # task -> slot_decision data (+ load scores)
        self.slots: dict[int, Explanation] = {}
        self.lines: collections.deque = collections.deque(maxlen=max_lines)
        self.misses: collections.deque = collections.deque(maxlen=max_lines)
        self.lost_by_cause: collections.Counter = collections.Counter()  # tokens lost, whole run
        self.ckpt_history: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
        self.unsubscribe = None  # set by attach()

    def apply(self, e) -> Explanation | None:
        k, d = e.kind, e.data
        if k == "init":
            self.sps = float(d.get("sps", self.sps))
            self.params = _params_of(d)
        elif k == "checkpoint_evict":
            self.ckpt_history[e.slot][d.get("reason", "?")] += 1
        elif k == "slot_decision":
            self.decisions[e.task] = dict(d)
            if len(self.decisions) > 4096:  # bounded: only recent tasks can still be planned
                self.decisions.pop(next(iter(self.decisions)))
        elif k == "prompt_plan":
            dec = self.decisions.get(e.task, {})
            x = Explanation(e.task, d["n_prompt"],
                            provenance(d["lcp"], d["n_past"], d["n_prompt"], d.get("ckpt"), d.get("origin", "slot"),
                                       d.get("shifts") or []),
                            d.get("divergence", -1), d.get("div_text", ""), why_line(e.slot, dec, d, self.sps))
            sps = dec.get("sps") if dec.get("sps") is not None else self.sps  # a log prints it per selection
            x.miss = diagnose(e.slot, e.task, dec, d, sps, self.ckpt_history, self.params, self.decisions)
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


def _params_of(init: dict) -> dict:
    """The flags a suggestion needs, from the `init` event (its `flags` are the server's command line)."""
    out = {"n_slots": init.get("n_slots"), "n_swa": init.get("n_swa", 0), "cache_ram": init.get("cache_ram", 0)}
    flags = list(init.get("flags") or [])
    names = {"--ctx-checkpoints": "ctx_checkpoints", "-ctxcp": "ctx_checkpoints", "--checkpoint-min-step": "checkpoint_min_step",
             "-cms": "checkpoint_min_step"}
    for i, f in enumerate(flags[:-1]):
        if f in names:
            try:
                out[names[f]] = int(flags[i + 1])
            except ValueError:
                pass
    out.setdefault("ctx_checkpoints", 32)
    out.setdefault("checkpoint_min_step", 0)
    return out


def attach(bus) -> "Explainer":
    """Fold `bus` as it goes and emit a `request_miss` event (slotlab.engine.event_types) right after
    each prompt plan whose request lost reusable tokens, so every consumer of the stream (the panel's
    event log, `replay --events`, a notebook) sees the cause as data. Returns the explainer."""
    x = Explainer()

    def on_event(e) -> None:
        if e.kind == "request_miss":
            return
        r = x.apply(e)
        if r is not None and r.miss is not None:
            m = r.miss
            bus.emit("request_miss", m.line(), level="INF", slot=m.slot, task=m.task, cause=m.cause, lost=m.lost,
                     possible=m.possible, n_past=m.n_past, n_prompt=m.n_prompt, where=m.where, detail=m.detail,
                     prompt_text=m.prompt_text, held_text=m.held_text, suggest=list(m.suggest))

    x.unsubscribe = bus.subscribe(on_event)
    return x
