"""The slot side of the RAM prompt cache: `server_slot::prompt_save`, `prompt_load`, `prompt_clear`
and the cache `update()` after them (spec 2.3-2.6).

`PromptCache` (prompt_cache.py) decides which entry to make, evict or pick, on token arrays and
sizes alone; this glue moves state between it and the memory for one slot and one task, passed in
on every call. After each call into the cache, the decisions it queued (`PromptCache.take_events`)
are drained and reported as events of that slot and task (the server's log lines carry them the
same way)."""

from __future__ import annotations

import numpy as np

from slotlab.engine import event_types as T
from slotlab.engine.emit import Emitter
from slotlab.engine.prompt_cache import CacheRecord, LoadResult, PromptCache
from slotlab.memory import Memory, require_seq_rm


def scores_json(result: LoadResult) -> dict:
    """A LoadResult as plain data: the slot's baseline and each entry's scores, in scan order."""
    return {"lcp_base": int(result.lcp_base), "f_keep_base": float(result.f_keep_base),
            "f_sim_base": float(result.f_sim_base), "winner_id": None if result.entry is None else result.entry.id,
            "scores": [{"entry_id": sc.entry.id, "n_tokens": sc.n_tokens, "lcp": int(sc.lcp), "f_keep": float(sc.f_keep),
                        "f_sim": float(sc.f_sim), "below_floor": sc.below_floor, "improved": sc.improved,
                        "winner": sc.winner} for sc in result.scores]}


class CacheGlue:
    """Prompt save / load / clear between slots, the memory and the RAM cache (None: `--cache-ram 0`).
    The cache must queue its records (`PromptCache(record=True)`): the glue drains them."""

    def __init__(self, cache: PromptCache | None, memory: Memory, emit: Emitter, hindsight=None):
        if cache is not None and not cache.recording:
            raise ValueError("CacheGlue drains the cache's records: build the PromptCache with record=True")
        self.cache, self.memory, self.emit = cache, memory, emit
        self.hindsight = hindsight  # told of content the server throws away (engine/hindsight.py), or None
        if cache is not None and hindsight is None:  # the kinds nobody reads are not even built
            cache.wants = emit.bus.wants

    # -- reporting the cache's own decisions as this slot's / task's events -------------------------

    def _report(self, slot, task) -> None:
        """The records the last cache call queued, as events of `slot` (None: of no slot) and its task."""
        sid = slot.id if slot is not None else -1
        tid = task.id if task is not None else (slot.task.id if slot is not None and slot.task else -1)
        for rec in self.cache.take_events():
            self._forward(rec, sid, tid)

    def _forward(self, rec: CacheRecord | None, sid: int, tid: int) -> None:
        """The record as its event: the cache's fields, completed with what only the glue knows (an
        alloc's byte split and text head, a look-up's score table), make the kind's payload."""
        if rec is None:  # refused before it was built (PromptCache._skips): numbered all the same
            self.emit.bus.skip()
            return
        entry, kind = rec.entry, rec.kind
        if self.hindsight is None and not self.emit.wanted(kind):
            return  # nobody reads it: numbered, not built (a simulation's look-ups and loads)
        # events carry plain numbers (the cache computes in float32): only the cache's own fields can
        # be numpy floats (entry_json and scores_json make plain values), so only they are looked at,
        # as they are copied (this runs for every record: ~6 a request)
        fields = {"func": rec.func}
        floating = np.floating
        for k, v in rec.fields.items():
            fields[k] = float(v) if isinstance(v, floating) else v
        if kind == T.CACHE_ALLOC and entry is not None:
            fields.update(self.entry_json(entry))
        if rec.result is not None:
            fields.update(scores_json(rec.result), preview=False)
        drop = (kind == T.CACHE_EVICT and entry is not None and self.hindsight is not None
                and fields.get("reason") not in ("loaded", "obsolete_prefix"))  # a hit or a superseded prefix loses nothing
        ev = self.emit(T.REGISTRY[kind](**fields), rec.message, level=rec.level, slot=sid, task=tid)
        if drop:
            self.hindsight.entry_dropped(entry, fields["reason"], ev.seq)

    def entry_json(self, e) -> dict:
        """What a view shows of an entry besides its size: the byte split, checkpoints, a text head."""
        return {"size_main": len(e.main), "size_dft": len(e.drft), "size_ckpt": sum(c.size() for c in e.checkpoints),
                "n_checkpoints": len(e.checkpoints), "head": self.memory.vocab.detokenize(e.tokens[1:13]),
                "checkpoints": [(c.pos_min, c.pos_max, c.n_tokens, c.size()) for c in e.checkpoints]}

    # -- the server's three calls ---------------------------------------------------------------------

    def prompt_save(self, slot, task=None) -> bool:
        """Copy the slot's prompt and state into a new entry (spec 2.3); False when not cached."""
        if self.cache is None or len(slot.tokens) == 0:
            return False
        mem = self.memory
        size_tgt = mem.state_size(slot.id)
        size_dft = mem.state_size(slot.id, draft=True) if mem.info.has_draft else 0
        entry = self.cache.alloc(slot.tokens.view(), slot.checkpoints, size_tgt, size_dft, id_slot=slot.id,
                                 id_task=slot.task_prev.id if slot.task_prev else -1, t_last=slot.t_last_used)
        self._report(slot, task)
        if entry is None:
            return False
        mem.state_get(slot.id, out=entry.main)
        if mem.info.has_draft:
            mem.state_get(slot.id, draft=True, out=entry.drft)
        return True

    def prompt_load(self, slot, task) -> tuple[bool | None, LoadResult | None]:
        """Restore the best entry for `task` into the slot (spec 2.4). Returns (outcome, scores):
        True = an entry was restored, None = nothing better than the slot, False = restore failed."""
        mem = self.memory
        res = self.cache.load(slot.tokens.view(), task.tokens)
        self._report(slot, task)
        if res.entry is None:
            return None, res
        entry = res.entry
        set_dft = (lambda buf: mem.state_set(buf, slot.id, draft=True)) if mem.info.has_draft else None
        ok = self.cache.restore(entry, lambda buf: mem.state_set(buf, slot.id), set_dft)
        self._report(slot, task)
        if not ok:
            self.emit(T.CacheLoadFailed(), "failed to load prompt from cache", level="WRN", slot=slot, task=task.id)
            return False, res
        slot.tokens.assign(entry.tokens)
        slot.checkpoints = list(entry.checkpoints)
        slot.origin = f"cache #{entry.id}"
        self.emit(T.CacheLoaded(entry_id=entry.id, n_tokens=len(slot.tokens), f_keep=float(res.f_keep_best),
                                f_sim=float(res.f_sim_best)), "", slot=slot, task=task.id)
        return True, res

    def update(self, slot, task=None) -> None:
        """`prompt_cache->update()` after a save or load: enforce the limits, log the state."""
        self.cache.update()
        self._report(slot, task)

    def preview(self, slot, task) -> None:
        """The scores `load` would give, without loading (a view's preview; the server logs nothing):
        asked only where hindsight is kept (engine/hindsight.py)."""
        res = self.hindsight.preview(self.cache, slot, task)
        self.emit(T.CacheLoadScores(preview=True, **scores_json(res)), "", slot=slot, task=task.id)

    def prompt_clear(self, slot, reason: str = "clear") -> None:
        """`server_slot::prompt_clear`: the slot's KV, tokens and checkpoints are dropped."""
        ev = self.emit(T.SlotClear(reason=reason, n_tokens=len(slot.tokens)),
                       f"clearing prompt with {len(slot.tokens)} tokens", slot=slot)
        if self.hindsight is not None and reason != "load_failed":
            self.hindsight.slot_dropped(slot, reason, ev.seq)
        require_seq_rm(self.memory, slot.id, -1, -1)
        slot.tokens.clear()
        slot.checkpoints = []
        slot.origin = "slot"

    def clear_cache(self) -> int:
        """Empty the RAM prompt cache through the cache's own eviction (a lab control)."""
        if self.cache is None:
            return 0
        n = self.cache.clear()
        self._report(None, None)
        return n
