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


@dataclass
class Explanation:
    """What the explainer knows of the latest request of one slot."""

    task: int = -1
    n_prompt: int = 0
    prov: list = field(default_factory=list)
    divergence: int = -1
    div_text: str = ""
    why: str = ""


class Explainer:
    """The fold: feed it events in order (`apply`), read `slots[i]` and `lines` (the latest why
    lines as (task, slot, text)). Needs `init` for `-sps` (defaults to the server's 0.10)."""

    def __init__(self, max_lines: int = 200):
        self.sps = 0.1
        self.decisions: dict[int, dict] = {}  # task -> slot_decision data (+ load scores)
        self.slots: dict[int, Explanation] = {}
        self.lines: collections.deque = collections.deque(maxlen=max_lines)

    def apply(self, e) -> Explanation | None:
        k, d = e.kind, e.data
        if k == "init":
            self.sps = float(d.get("sps", self.sps))
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
            self.slots[e.slot] = x
            self.lines.append((e.task, e.slot, x.why))
            return x
        return None

    def fold(self, events) -> "Explainer":
        for e in events:
            self.apply(e)
        return self

    def why(self, task: int) -> str | None:
        for t, _, text in reversed(self.lines):
            if t == task:
                return text
        return None
