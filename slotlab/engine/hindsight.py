"""Hindsight: the facts a later explanation needs, kept beside the decisions and never read by them.

The server logs what it decides, not what it threw away, so "why was my prompt re-processed?" needs
two facts the decisions do not: what was dropped lately (a slot overwritten by another prompt, a slot
cleared by a purge, an idle clear or a failed decode, a RAM-cache entry evicted: each a `Drop`, a
reference to the tokens lost with where they were and why), and what was held when a prompt arrived
(`held_prefix`: the longest common prefix with any slot, entry or drop). One `Hindsight` per core
owns both, plus the silent score preview a view shows for a slot that needed no load; the core tells
it of each drop and asks it once per selection. Nothing here changes a slot, the cache or a score
the server computes, so `ServerCore(hindsight=False)` (a simulation nobody asks "why" of) makes the
same decisions and only loses the `held` / `lost` facts and the preview. slotlab.explain (a view)
names the cause of a miss from these facts."""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Optional

import numpy as np

from slotlab.engine.event_types import UNSET, Held, Lost
from slotlab.engine.tokens import common_prefix


@dataclass(frozen=True, slots=True)
class Drop:
    tokens: np.ndarray  # what was held (a reference or a copy; never changed afterwards)
    where: str  # "slot" or "entry"
    id: int  # the slot's id or the entry's id
    reason: str  # the slot_clear / cache_evict reason, or "overwritten"
    seq: int  # the event seq at which it was dropped
    by_task: Optional[int] = None  # the task whose prompt overwrote it ("overwritten" only)


class Hindsight:
    """The bounded record of recent drops and the per-selection facts (see the module docstring)."""

    def __init__(self, vocab, keep: int = 32):
        self.vocab = vocab
        self.dropped: collections.deque[Drop] = collections.deque(maxlen=keep)  # references only

    def slot_dropped(self, slot, reason: str, seq: int, by_task: Optional[int] = None) -> None:
        """The slot's tokens are about to go (cleared, or overwritten past n_past by `by_task`)."""
        if len(slot.tokens):
            self.dropped.append(Drop(slot.tokens.copy(), "slot", slot.id, reason, seq, by_task))

    def entry_dropped(self, entry, reason: str, seq: int) -> None:
        """A RAM-cache entry was evicted (its tokens never change, so a reference is kept)."""
        self.dropped.append(Drop(entry.tokens, "entry", entry.id, reason, seq))

    def held(self, toks: np.ndarray, slots, slot_lcps: list[int], cache) -> tuple[dict | None, dict | None]:
        """`held_prefix` over this record: what was held and lost for prompt `toks`."""
        return held_prefix(toks, slots, slot_lcps, cache, self.dropped, self.vocab)

    @staticmethod
    def preview(cache, slot, task):
        """The scores `load` would give the slot's tokens against the prompt, computed silently (the
        server logs nothing: a slot that needed no load); a view shows them beside the decision."""
        return cache.load(slot.tokens.view(), task.tokens, emit=False)


def _snippet(vocab, tokens, d: int, k: int = 6) -> str:
    return vocab.detokenize(tokens[max(0, d - k):d + k]) if len(tokens) else ""


def held_prefix(toks: np.ndarray, slots, slot_lcps: list[int], cache, dropped, vocab) -> tuple[Held | None, Lost | None]:
    """What the server held for prompt `toks` when it arrived: the longest common prefix with any slot
    (`slot_lcps`, one per slot, computed by the caller) or RAM-cache entry (`held`), and with anything
    dropped lately (`lost`: a cleared slot, an evicted entry), each with where it was and the text on
    both sides of the divergence. Facts for explaining a miss; they decide nothing."""
    cands = [(n, "slot", s.id, s.tokens.view()) for n, s in zip(slot_lcps, slots)]
    if cache is not None:  # inside get_available_slot, `load` reuses these lcps (one_prompt)
        cands += [(cache.lcp(e, toks), "entry", e.id, e.tokens) for e in cache.entries]
    held = max(cands, key=lambda c: c[0], default=None)
    # among drops of the same prefix, the latest is the one that finally lost it (e.g. a slot saved to
    # the RAM cache when it was overwritten, then evicted from the cache)
    lost = _longest_drop(dropped, toks)

    def side(lcp, held_toks) -> dict:
        return {"lcp": int(lcp), "n_held": int(len(held_toks)), "prompt_text": _snippet(vocab, toks, lcp),
                "held_text": _snippet(vocab, held_toks, lcp)}

    h = None if held is None or held[0] == 0 else Held(where=held[1], id=held[2], **side(held[0], held[3]))
    lo = None
    if lost is not None and lost[0] > 0:
        d = lost[1]
        lo = Lost(where=d.where, id=d.id, reason=d.reason, seq=d.seq, **side(lost[0], d.tokens),
                  by_task=UNSET if d.by_task is None else d.by_task)
    return h, lo


def _longest_drop(dropped, toks) -> tuple[int, Drop] | None:
    """`max((lcp(d.tokens, toks), d) for d in dropped)` by (lcp, seq), the first on a tie, without
    computing every lcp: taken newest first, an older drop wins only with a longer lcp, which needs
    its token at the best lcp so far to match the prompt's (one element read instead of a scan)."""
    order = sorted(range(len(dropped)), key=lambda i: -dropped[i].seq)  # stable: the first of equal seqs first
    best = None
    n_toks = len(toks)
    for i in order:
        d = dropped[i]
        t = d.tokens
        if best is not None:
            k = best[0]
            if k >= n_toks or k >= len(t) or t[k] != toks[k]:
                continue  # its lcp is at most k: not longer
        lcp = common_prefix(t, toks)
        if best is None or lcp > best[0]:
            best = (lcp, d)
    return best
