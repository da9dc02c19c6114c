"""`--cache-reuse N`: reuse chunks of a slot's KV that reappear later in the new prompt by shifting
them down (spec 3.4). Only for memories that can shift (Gemma 3: with `--swa-full`).

`plan_cache_reuse` is the server's chunk loop as a pure function (which chunks move where); the
core applies the plan with `apply_cache_reuse` through the memory's `seq_rm` / `seq_add`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from slotlab.engine import event_types as T
from slotlab.engine.emit import Emitter
from slotlab.memory import Memory, require_seq_rm


@dataclass(frozen=True)
class Shift:
    """Cells [src0, src1) of the slot move to [dst0, dst1) (dst0 <= src0)."""

    src0: int
    src1: int
    dst0: int
    dst1: int

    def as_tuple(self) -> tuple[int, int, int, int]:
        return (self.src0, self.src1, self.dst0, self.dst1)


def plan_cache_reuse(cache: np.ndarray, prompt: np.ndarray, n_past: int, n_reuse: int) -> list[Shift]:
    """The chunk loop after the common prefix (SC:3218-3266): walk the cached tokens; a run of at
    least `n_reuse` tokens equal to the prompt at the prompt's head is moved there, else skip one
    cached token. Writes in the server land below the read head, so planning on the unmodified
    tokens gives the same chunks.

    The server tries every cached position in turn (a compare each: quadratic in the prompt, ~50 ms
    for an 8k-token Mooncake prompt that shares nothing). Here the positions it would skip are
    skipped at once: a run of at least n_reuse tokens starts where the cached token equals the
    prompt's head token, so only those candidates are compared, in order; the first whose n_reuse
    tokens all equal the prompt's is where the server's loop stops too, and when there is none (or
    fewer than n_reuse tokens remain on either side) it walks to the end without a move."""
    if n_reuse < 1:
        return []  # the server runs the loop only for n_cache_reuse > 0
    cache, prompt = np.asarray(cache), np.asarray(prompt)
    shifts: list[Shift] = []
    head_c = head_p = n_past
    n_c, n_p = len(cache), len(prompt)
    while head_c < n_c and head_p < n_p:
        last = n_c - n_reuse  # the last cached position with n_reuse tokens from it
        if head_p + n_reuse > n_p or head_c > last:
            break  # every remaining position matches fewer than n_reuse: skipped one by one, no move
        want = prompt[head_p:head_p + n_reuse]
        found = -1
        for i in (np.flatnonzero(cache[head_c:last + 1] == want[0]) + head_c).tolist():
            if (cache[i:i + n_reuse] == want).all():
                found = i
                break
        if found < 0:
            break
        head_c = found
        m = min(n_c - head_c, n_p - head_p)
        neq = cache[head_c:head_c + m] != prompt[head_p:head_p + m]
        n_match = int(neq.argmax()) if neq.any() else m
        shifts.append(Shift(head_c, head_c + n_match, head_p, head_p + n_match))
        head_c += n_match
        head_p += n_match
    return shifts


def apply_cache_reuse(memory: Memory, emit: Emitter, slot, n_past: int, n_reuse: int) -> int:
    """Run `--cache-reuse` for the slot's task: log, plan, move the KV and the slot's tokens; returns
    the new n_past. The moves are recorded in `slot.shifts` for the views."""
    can = memory.info.can_shift
    if not can and n_reuse > 0:
        emit(T.CacheReuseUnsupported(), f"cache reuse is not supported - ignoring n_cache_reuse = {n_reuse}",
             level="WRN", slot=slot)
    if not (can and n_reuse > 0):
        return n_past
    emit(T.CacheReuseBegin(), f"trying to reuse chunks with size > {n_reuse}, n_past = {n_past}", level="DBG",
         slot=slot)
    cv = slot.tokens.view()
    for sh in plan_cache_reuse(cv, slot.task.tokens, n_past, n_reuse):
        n = sh.src1 - sh.src0
        emit(T.CacheReuseShift(src=[sh.src0, sh.src1], dst=[sh.dst0, sh.dst1]),
             f"reusing chunk with size {n}, shifting KV cache [{sh.src0}, {sh.src1}) -> "
             f"[{sh.dst0}, {sh.dst1})", slot=slot)
        slot.shifts.append(sh.as_tuple())
        require_seq_rm(memory, slot.id, sh.dst0, sh.src0)
        memory.seq_add(slot.id, sh.src0, sh.src1, sh.dst0 - sh.src0)
        cv[sh.dst0:sh.dst1] = cv[sh.src0:sh.src1].copy()
        n_past += n
    emit(T.CacheReuseEnd(), f"after context reuse, new n_past = {n_past}", level="DBG", slot=slot)
    return n_past
