"""Slot selection, `get_available_slot` steps A-C (spec 1.1-1.3), as a pure decision.

Given the slots' state and the task, it returns a `SlotSelection` that says which slot, how it was
chosen, every similarity check made on the way and whether the RAM cache must be consulted (step D,
spec 1.4). It reads slots and never changes them, so the same rule runs on any memory, in a preview,
or in a test with no model. The caller (the core) emits the server's log lines from the result."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from slotlab.engine.prompt_cache import f32_ratio


@dataclass(frozen=True)
class SlotCheck:
    """One line of step B's scan: a slot skipped (and why) or its similarity with the task."""

    id_slot: int
    skipped: str | None  # "is_processing" | "empty" | None
    lcp: int = 0
    f_sim: float = 0.0


@dataclass(frozen=True)
class SlotSelection:
    """The outcome of `get_available_slot` before the RAM-cache step.

    `how` is "id" (the request named the slot), "lcp" (similarity above `-sps`), "lru" (the least
    recently used idle slot) or None (no slot: the task is deferred). `update_cache` is the server's
    flag for step D: set by LRU, and by LCP when f_keep < 0.5 (the slot would lose over half of what
    it holds)."""

    id_slot: int | None
    how: str | None
    f_sim_best: np.float32
    f_keep: np.float32 | None
    update_cache: bool
    t_last: int = -1
    checks: tuple[SlotCheck, ...] = ()
    id_requested: int = -1


def slot_index(id_slot: int, n_slots: int) -> int:
    """The slot a requested `id_slot` names: the server indexes `slots[id]` with a size_t, so the id
    wraps modulo 2**64 and then modulo n_slots (-2 is slot (2**64 - 2) % n_slots)."""
    return (id_slot % 2**64) % n_slots


def get_available_slot(slots: Sequence, tokens: np.ndarray, id_slot: int, sps: float,
                       lcps: Sequence[int] | None = None) -> SlotSelection:
    """Steps A-C on `slots` (objects with `id`, `is_processing`, `tokens`, `t_last_used`). `lcps`: each
    slot's (in `slots` order) common prefix with `tokens`, when the caller has computed them already."""
    n_task = int(tokens.shape[0])
    ret = None
    how = None
    update_cache = False
    f_sim_best = np.float32(0.0)
    f_keep = None
    checks: list[SlotCheck] = []
    if id_slot != -1:  # A: by id (spec 1.1); the index wraps as size_t modulo n_slots
        ret, how = slots[slot_index(id_slot, len(slots))], "id"
    sps32 = np.float32(sps)
    if sps32 != 0:  # B: by LCP similarity (spec 1.2)
        for j, s in enumerate(slots):
            if id_slot != -1 and s.id != id_slot:
                continue
            if s.is_processing:
                checks.append(SlotCheck(s.id, "is_processing"))
                continue
            if len(s.tokens) == 0:
                checks.append(SlotCheck(s.id, "empty"))
                continue
            lcp = s.tokens.get_common_prefix(tokens) if lcps is None else lcps[j]
            f_sim = f32_ratio(lcp, n_task)
            checks.append(SlotCheck(s.id, None, lcp, float(f_sim)))
            if f_sim > f_sim_best and f_sim > sps32:
                f_sim_best = f_sim
                ret, how = s, "lcp"
        if ret is not None:
            with np.errstate(divide="ignore", invalid="ignore"):
                f_keep = np.float32(f_sim_best * np.float32(n_task)) / np.float32(len(ret.tokens))
            if f_keep < np.float32(0.5):
                update_cache = True
    t_last = -1
    if ret is None:  # C: least recently used idle slot (spec 1.3)
        for s in slots:
            if s.is_processing:
                continue
            if ret is None or s.t_last_used <= t_last:
                t_last = s.t_last_used
                ret = s
        if ret is not None:
            how = "lru"
            update_cache = True
    return SlotSelection(None if ret is None else ret.id, how, f_sim_best, f_keep, update_cache, t_last, tuple(checks),
                         id_slot)
