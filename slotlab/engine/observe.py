"""Read-only pictures of the core's state for front ends: `GET /slots` (spec 8.1) and the RAM
cache's contents. Callers hold the driver's lock (the Engine's methods do)."""

from __future__ import annotations

from typing import Any


def slots_json(core) -> list[dict]:
    """`GET /slots`."""
    out = []
    for s in core.slots:
        d: dict[str, Any] = {"id": s.id, "n_ctx": s.n_ctx, "speculative": False, "is_processing": s.is_processing}
        t = s.task or s.task_prev
        if t is not None:
            d.update({
                "id_task": t.id, "n_prompt_tokens": len(s.tokens),
                "n_prompt_tokens_processed": s.stats.n_prompt_processed,
                "n_prompt_tokens_cache": s.stats.n_prompt_cached,
                "params": {"n_predict": t.params.n_predict, "temperature": t.params.temperature,
                           "seed": t.params.seed, "ignore_eos": t.params.ignore_eos},
                "next_token": [{"has_next_token": s.has_next_token, "has_new_line": False,
                                "n_remain": s.n_remaining(), "n_decoded": s.stats.n_gen}],
            })
        out.append(d)
    return out


def cache_json(core) -> dict:
    """Beyond the server: the RAM cache's entries (oldest first), bytes and token limits."""
    c = core.cache
    if c is None:
        return {"enabled": False}
    return {
        "enabled": True, "size": c.size(), "n_tokens": c.n_tokens(), "limit_size": c.limit_size,
        "limit_tokens": c.limit_tokens, "limit_tokens_cur": c.limit_tokens_cur,
        "entries": [{"id": e.id, "n_tokens": e.n_tokens(), "size": e.size(), "size_main": len(e.main),
                     "n_checkpoints": len(e.checkpoints), "id_slot": e.id_slot, "id_task": e.id_task,
                     "head": core.vocab.detokenize(e.tokens[1:9])} for e in c.entries],
    }
