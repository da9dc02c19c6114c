"""`--cache-reuse N`: reuse chunks of a slot's KV that reappear later in the new prompt by shifting
them down (spec 3.4). Only for memories that can shift (Gemma 3: with `--swa-full`)."""

from __future__ import annotations


def cache_reuse(engine, slot, n_past: int) -> int:
    """Run the server's chunk loop after the common prefix; returns the new n_past."""
    task = slot.task
    n_reuse = task.params.n_cache_reuse
    can = engine.ctx.can_shift
    if not can and n_reuse > 0:
        engine._emit("cache_reuse_unsupported", f"cache reuse is not supported - ignoring n_cache_reuse = {n_reuse}",
                     level="WRN", slot=slot)
    if not (can and n_reuse > 0):
        return n_past
    engine._emit("cache_reuse_begin", f"trying to reuse chunks with size > {n_reuse}, n_past = {n_past}", level="DBG",
                 slot=slot)
    cache, prompt = slot.tokens, task.tokens
    head_c = head_p = n_past
    n_c, n_p = len(cache), len(prompt)
    while head_c < n_c and head_p < n_p:
        cv = cache.view()
        m = min(n_c - head_c, n_p - head_p)
        neq = cv[head_c:head_c + m] != prompt[head_p:head_p + m]
        n_match = int(neq.argmax()) if neq.any() else m
        if n_match >= n_reuse:
            engine._emit("cache_reuse_shift", f"reusing chunk with size {n_match}, shifting KV cache "
                         f"[{head_c}, {head_c + n_match}) -> [{head_p}, {head_p + n_match})", slot=slot,
                         src=[head_c, head_c + n_match], dst=[head_p, head_p + n_match])
            slot.shifts.append((head_c, head_c + n_match, head_p, head_p + n_match))
            shift = head_p - head_c
            engine.seq_rm(slot, head_p, head_c)
            engine.seq_add(slot, head_c, head_c + n_match, shift)
            cv[head_p:head_p + n_match] = cv[head_c:head_c + n_match].copy()
            n_past += n_match
            head_c += n_match
            head_p += n_match
        else:
            head_c += 1
    engine._emit("cache_reuse_end", f"after context reuse, new n_past = {n_past}", level="DBG", slot=slot)
    return n_past
