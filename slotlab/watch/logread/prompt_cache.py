"""The RAM prompt cache in a server's lines (`server_prompt_cache`): a save (` - saving prompt with
length N, total state size = X MiB`) and its allocation chain (a duplicate or over-limit skip, the
evictions that make room, a failed allocation and the limit it reduces), a load (` - looking for
better prompt`, one score line per entry, ` - found better prompt`, a restore failure) and the
` - cache state` listing that ends each update.

The reader keeps the cache's FIFO list (entries numbered 0, 1, ... in allocation order, as the engine's)
and makes it agree with every listing (`resync`). Events the log implies but does not print are
inferred with an empty message: `cache_alloc` (a save not skipped), `cache_evict` reason `loaded` and
`cache_loaded` (a found prompt not followed by a restore failure), `cache_load_scores` (the scan)."""

from __future__ import annotations

import numpy as np

from slotlab.engine import event_types as T
from slotlab.engine.prompt_cache import f32_ratio
from slotlab.units import MIB, cache_ram_bytes
from slotlab.watch.lines import LogLine
from slotlab.watch.logread.checkpoints import mib_bytes
from slotlab.watch.logread.state import Entry, LoadResult, PendingAlloc, PendingListing, PendingLoad, Score, Spec

#: the reason of a `cache_evict` / the note of a RAM-cache entry the listing showed but the reader missed
RESYNC = "resync"
#: the server's floor on f_keep for a cached prompt to be loaded
F_KEEP_FLOOR = np.float32(0.25)


def scores_table(ld: PendingLoad, n_task: int | None) -> dict:
    """`cache_load_scores` data of a load: the baseline and each entry's ratios (recomputed exactly once
    the prompt length `n_task` is known), and which entries were below the floor / improved / won."""
    win = ld.winner
    f_sim_base = ld.f_sim_base
    if n_task and ld.lcp_base >= 0:
        f_sim_base = float(f32_ratio(ld.lcp_base, n_task))
    best_k, best_s = np.float32(ld.f_keep_base), np.float32(f_sim_base)
    scores = []
    for i, sc in enumerate(ld.scores):
        f_sim = float(f32_ratio(sc.lcp, n_task)) if n_task else sc.f_sim
        k, s = np.float32(sc.f_keep), np.float32(f_sim)
        below = bool(k < F_KEEP_FLOOR)
        improved = (not below) and bool(best_k < k) and bool(best_s < s)
        if improved:
            best_k, best_s = k, s
        scores.append({"entry_id": sc.entry_id, "n_tokens": sc.n_tokens, "lcp": sc.lcp, "f_keep": sc.f_keep,
                       "f_sim": f_sim, "below_floor": below, "improved": improved, "winner": i == win})
    return {"func": "load", "preview": False, "lcp_base": ld.lcp_base, "f_keep_base": ld.f_keep_base,
            "f_sim_base": f_sim_base, "winner_id": ld.scores[win].entry_id if win is not None else None,
            "scores": scores}


class PromptCacheLines:
    """The RAM-cache family (patterns.PROMPT_CACHE)."""

    def __init__(self, rd):
        self.rd = rd
        self.entries: list[Entry] = []  # the RAM cache, FIFO (oldest first)
        self.next_id = 0
        self.shrink = False  # byte-limit evictions after a failed allocation
        self.n_resyncs = 0

    # ------------------------------------------------------------------ context

    def ctx(self) -> tuple[int, int]:
        """(slot, task) of the RAM-cache call under way: the slot being selected, or the idle slot saved."""
        way = self.rd.way
        if way.selection is not None:
            return (way.selection.chosen if way.selection.chosen is not None else -1, -1)
        if way.idle_slot is not None:
            return way.cache_ctx
        return (-1, -1)

    def spec(self, kind: str, ln: LogLine, level: str, func: str | None = None, **data) -> Spec:
        slot, task = self.ctx()
        if func or ln.func:
            data["func"] = func or ln.func
        return self.rd.spec(kind, ln.msg, level=level, slot=slot, task=task, new_task=self.rd.way.selection is not None,
                            **data)

    def index(self, entry_id: int) -> int:
        for i, e in enumerate(self.entries):
            if e.id == entry_id:
                return i
        return -1

    # ------------------------------------------------------------------ save and allocation

    def on_save(self, m, ln, level):
        rd, way = self.rd, self.rd.way
        n, total, dft = int(m.group(1)), mib_bytes(m.group(2)), mib_bytes(m.group(3))
        slot, _ = self.ctx()
        s = rd.slots.get(slot)
        id_task = s.task_prev if s is not None and s.task < 0 else (s.task if s is not None else -1)
        if s is not None and way.selection is not None and s.task >= 0:  # a busy slot requested by id
            id_task = s.task_prev
        if s is not None:
            sel = way.selection
            rd.lifecycle.slot_length(s, n, before=sel.specs[0] if sel is not None and sel.specs
                                     else rd.selection.last_first)
        self.spec(T.CACHE_SAVE, ln, level, n_tokens=n, size_tgt=total - dft, size_dft=dft, id_slot=slot,
                  id_task=id_task)
        ck = [list(c) for c in s.checkpoints] if s is not None else []
        way.alloc = PendingAlloc(n, total - dft, dft, slot, id_task, ck, ln)

    def on_skip_duplicate(self, m, ln, level):
        a, self.rd.way.alloc = self.rd.way.alloc, None
        self.spec(T.CACHE_SKIP_DUPLICATE, ln, level, entry_id=-1, n_tokens=a.n_tokens if a else -1)

    def on_skip_over_limit(self, m, ln, level):
        a, self.rd.way.alloc = self.rd.way.alloc, None
        self.spec(T.CACHE_SKIP_OVER_LIMIT, ln, level, size=mib_bytes(m.group(1)), limit_size=mib_bytes(m.group(2)),
                  n_tokens=a.n_tokens if a else -1)

    def on_skip_entry_limit(self, m, ln, level):
        self.rd.way.alloc = None
        self.spec(T.CACHE_SKIP_ENTRY_LIMIT, ln, level, n_tokens=int(m.group(1)), limit_tokens_entry=int(m.group(2)))

    def on_lru_placed(self, m, ln, level):
        """--cache-ram-lru: the entry being allocated goes to `position` (or, followed by a duplicate skip, an
        entry holding the prompt moved there: which one the next listing says, `resync`)."""
        a = self.rd.way.alloc
        pos = int(m.group(2))
        if a is not None:
            a.lru_pos = pos
        self.spec(T.CACHE_LRU_PLACED, ln, level, entry_id=-1, t_last=int(m.group(1)), position=pos,
                  n_entries=int(m.group(3)))

    def _evict(self, idx: int | None, reason: str, ln: LogLine, level: str, size_mib: str | None = None) -> None:
        e = self.entries.pop(idx) if idx is not None and 0 <= idx < len(self.entries) else None
        if e is None:
            self.spec(T.CACHE_EVICT, ln, level, reason=reason, entry_id=-1, n_tokens=-1,
                      size=mib_bytes(size_mib) if size_mib else -1)
            return
        self.rd.way.new_entries.pop(e.id, None)
        self.spec(T.CACHE_EVICT, ln, level, reason=reason, entry_id=e.id, n_tokens=e.n_tokens, size=e.size)

    def on_evict_obsolete(self, m, ln, level):
        n = int(m.group(1))
        idx = next((i for i, e in enumerate(self.entries) if e.n_tokens == n), None)
        self._evict(idx, "obsolete_prefix", ln, level)

    def on_evict_make_room(self, m, ln, level):
        self._evict(0, "make_room", ln, level, m.group(1))

    def on_evict_byte_limit(self, m, ln, level):
        self._evict(0, "shrink" if self.shrink else "byte_limit", ln, level, m.group(1))

    def on_evict_token_limit(self, m, ln, level):
        self._evict(0, "token_limit", ln, level, m.group(3))

    def on_alloc_failed(self, m, ln, level):
        a, self.rd.way.alloc = self.rd.way.alloc, None
        self.shrink = True
        self.spec(T.CACHE_ALLOC_FAILED, ln, level, size_tgt=a.size_tgt if a else -1, size_dft=a.size_dft if a else -1,
                  error=m.group(1))

    def on_limit_reduced(self, m, ln, level):
        sh = self.rd.shape
        new = mib_bytes(m.group(1))
        old = cache_ram_bytes(sh.cache_ram or 0)
        if sh.cache_ram is not None and sh.cache_ram > 0:
            sh.cache_ram = max(1, int(round(new / MIB)))
        self.spec(T.CACHE_LIMIT_REDUCED, ln, level, limit_size=new, limit_size_old=old)

    def finish_alloc(self) -> None:
        """The save's chain ended without a skip or failure: the entry is allocated (`cache_alloc`)."""
        way = self.rd.way
        a, way.alloc = way.alloc, None
        ck = a.checkpoints
        size_ckpt = sum(c[3] for c in ck)
        e = Entry(self.next_id, a.n_tokens, a.size_tgt + a.size_dft + size_ckpt, a.size_dft, ck, a.id_slot, a.id_task)
        self.next_id += 1
        if a.lru_pos is not None and a.lru_pos < len(self.entries):
            self.entries.insert(a.lru_pos, e)
        else:
            self.entries.append(e)
        sp = self.spec(T.CACHE_ALLOC, a.line, "TRC", func="alloc", entry_id=e.id, n_tokens=e.n_tokens, size=e.size,
                       id_slot=e.id_slot, id_task=e.id_task, size_main=a.size_tgt, size_dft=a.size_dft,
                       size_ckpt=size_ckpt, n_checkpoints=len(ck), head="", checkpoints=[tuple(c[:4]) for c in ck])
        sp.message = ""
        way.new_entries[e.id] = sp

    # ------------------------------------------------------------------ load

    def on_load_base(self, m, ln, level):
        rd, way = self.rd, self.rd.way
        slot, _ = self.ctx()
        s = rd.slots.get(slot)
        f_keep, f_sim = float(m.group(1)), float(m.group(2))
        sel = way.selection
        n_slot = s.n_tokens if s is not None and s.n_tokens is not None else -1
        chk = sel.checks.get(slot) if sel is not None else None
        if f_keep < 0:
            lcp = 0
            n_slot = 0 if n_slot < 0 else n_slot
        elif chk is not None:
            lcp = chk[0]
        elif sel is not None and sel.n_task:
            lcp = int(round(f_sim * sel.n_task))
        elif n_slot > 0:
            lcp = int(round(f_keep * n_slot))
        else:
            lcp = -1
        n_task = sel.n_task if sel is not None else None
        if lcp >= 0 and n_task:
            f_sim = float(f32_ratio(lcp, n_task))
        if lcp >= 0 and n_slot > 0:  # exact when the slot's length the reader keeps agrees with the print
            exact = float(f32_ratio(lcp, n_slot))
            if f"{exact:.3f}" == m.group(1):
                f_keep = exact
        way.load = PendingLoad(lcp, f_keep, f_sim, n_task)
        sp = self.spec(T.CACHE_LOAD_BASE, ln, level, lcp=lcp, f_keep=f_keep, f_sim=f_sim, n_tokens=n_slot)
        if not n_task and lcp >= 0:
            way.fixes.append(lambda n, d=sp.data: d.update(f_sim=float(f32_ratio(lcp, n))))

    def _load(self) -> PendingLoad:
        """The load under way (one without its base line: read from its middle)."""
        if self.rd.way.load is None:
            self.rd.way.load = PendingLoad(-1, -1.0, 0.0, None)
        return self.rd.way.load

    def on_load_score(self, m, ln, level):
        ld = self._load()
        i = len(ld.scores)
        e = self.entries[i] if i < len(self.entries) else None
        n, lcp = int(m.group(1)), int(m.group(2))
        f_keep, f_sim = float(f32_ratio(lcp, n)) if n else float(m.group(3)), float(m.group(4))
        if ld.n_task:
            f_sim = float(f32_ratio(lcp, ld.n_task))
        eid = e.id if e is not None else -1
        ld.scores.append(Score(eid, n, lcp, f_keep, f_sim, (m.group(3), m.group(4))))
        sp = self.spec(T.CACHE_LOAD_SCORE, ln, level, entry_id=eid, n_tokens=n, lcp=lcp, f_keep=f_keep, f_sim=f_sim)
        if not ld.n_task:
            self.rd.way.fixes.append(lambda n, d=sp.data: d.update(f_sim=float(f32_ratio(lcp, n))))

    def on_load_found(self, m, ln, level):
        ld = self._load()
        pk, ps = m.group(1), m.group(2)
        # the winner is the last entry that beat the running best on both ratios (as the server scans)
        best_k, best_s, win = np.float32(ld.f_keep_base), np.float32(ld.f_sim_base), None
        for i, sc in enumerate(ld.scores):
            k, s = np.float32(sc.f_keep), np.float32(sc.f_sim)
            if not k < F_KEEP_FLOOR and best_k < k and best_s < s:
                best_k, best_s, win = k, s, i
        if win is None or ld.scores[win].printed != (pk, ps):
            cands = [i for i, sc in enumerate(ld.scores) if sc.printed == (pk, ps)]
            win = cands[-1] if cands else win
        ld.winner = win
        sc = ld.scores[win] if win is not None else None
        f_keep = sc.f_keep if sc is not None else float(pk)
        f_sim = sc.f_sim if sc is not None else float(ps)
        ld.found = (f_keep, f_sim)
        sp = self.spec(T.CACHE_LOAD_FOUND, ln, level, entry_id=sc.entry_id if sc is not None else -1, f_keep=f_keep,
                       f_sim=f_sim)
        if not ld.n_task and sc is not None:
            self.rd.way.fixes.append(lambda n, d=sp.data, lcp=sc.lcp: d.update(f_sim=float(f32_ratio(lcp, n))))

    def on_restore_failed(self, m, ln, level):
        ld = self.rd.way.load
        size = int(m.group(1))
        eid = ld.scores[ld.winner].entry_id if ld is not None and ld.winner is not None else -1
        self.finish_load(failed=True)
        self.spec(T.CACHE_RESTORE_FAILED, ln, level, entry_id=eid, which="tgt" if level == "ERR" else "dft", size=size)

    def on_load_failed(self, m, ln, level):
        rd = self.rd
        rd.lifecycle.clear_reason[ln.slot] = "load_failed"
        if rd.way.selection is not None:
            rd.way.selection.load = False
        rd.spec(T.CACHE_LOAD_FAILED, ln.msg, level=level, slot=ln.slot, task=ln.task,
                new_task=rd.way.selection is not None)

    def finish_load(self, failed: bool) -> None:
        """The load's lines ended: the scan's table, and unless it failed or found nothing, the entry
        leaves the cache for the slot (`cache_evict` reason `loaded`, `cache_loaded`)."""
        rd, way = self.rd, self.rd.way
        ld, way.load = way.load, None
        sel = way.selection
        slot = way.cache_ctx[0] if sel is None else (sel.chosen if sel.chosen is not None else -1)
        win = ld.winner
        new = sel is not None
        table = Spec(T.CACHE_LOAD_SCORES, "", "TRC", slot, -1, scores_table(ld, None), rd.t, new)
        rd.out.append(table)
        if new:
            sel.specs.append(table)
        if not ld.n_task:
            way.fixes.append(lambda n, d=table.data, ld=ld: d.update(scores_table(ld, n)))
        if new:
            sel.scores = ld.scores
        if win is None or failed:
            return
        sc = ld.scores[win]
        idx = self.index(sc.entry_id)
        e = self.entries.pop(idx) if idx >= 0 else None
        if e is not None:
            way.new_entries.pop(e.id, None)
            sp = Spec(T.CACHE_EVICT, "", "TRC", slot, -1, {"func": "load", "reason": "loaded", "entry_id": e.id,
                                                           "n_tokens": e.n_tokens, "size": e.size}, rd.t, new)
            rd.out.append(sp)
            if new:
                sel.specs.append(sp)
        s = rd.slot(slot) if slot >= 0 else None
        if s is not None:
            s.n_tokens = e.n_tokens if e is not None else sc.n_tokens
            s.checkpoints = [list(c) for c in e.checkpoints] if e is not None else []
            s.origin = f"cache #{sc.entry_id}"
        sp = Spec(T.CACHE_LOADED, "", "TRC", slot, -1, {"entry_id": sc.entry_id, "n_tokens": sc.n_tokens,
                                                       "f_keep": sc.f_keep, "f_sim": sc.f_sim}, rd.t, new)
        rd.out.append(sp)
        if not ld.n_task:
            way.fixes.append(lambda n, d=sp.data, lcp=sc.lcp: d.update(f_sim=float(f32_ratio(lcp, n))))
        if new:
            sel.specs.append(sp)
            sel.load = True
            sel.load_result = LoadResult(sc.f_keep, sc.f_sim, ld.f_keep_base, sc.lcp)

    # ------------------------------------------------------------------ the listing

    def on_state(self, m, ln, level):
        self.shrink = False
        n, mib, lim_mib, lim_tok, est = int(m.group(1)), m.group(2), m.group(3), int(m.group(4)), int(m.group(5))
        self.rd.way.listing = PendingListing(ln, level, n, mib_bytes(mib), mib_bytes(lim_mib), lim_tok, est)
        if n == 0:
            self.finish_listing()

    def on_state_entry(self, m, ln, level):
        L = self.rd.way.listing
        if L is None:
            self.rd.plain(ln)
            return
        L.rows.append((m.group(1), int(m.group(2)), int(m.group(3)), mib_bytes(m.group(4)), ln, level))
        if len(L.rows) >= L.n:
            self.finish_listing()

    def finish_listing(self) -> None:
        way = self.rd.way
        L, way.listing = way.listing, None
        rows = L.rows
        self.resync(rows)
        self.spec(T.CACHE_STATE, L.line, L.level, n_entries=L.n, size=L.size, n_tokens=sum(r[1] for r in rows),
                  limit_size=L.limit_size, limit_tokens=L.limit_tokens, limit_tokens_cur=L.est)
        for (addr, n, n_ck, size, rln, lvl), e in zip(rows, self.entries):
            self.spec(T.CACHE_STATE_ENTRY, rln, lvl, entry_id=e.id, n_tokens=n, n_checkpoints=n_ck, size=size)
        way.new_entries.clear()

    def resync(self, rows: list) -> None:
        """Make the reader's FIFO list agree with a listing (each row: address, tokens, checkpoints, bytes)."""
        rd, way = self.rd, self.rd.way
        same = len(rows) == len(self.entries) and all(r[1] == e.n_tokens for r, e in zip(rows, self.entries))
        if not same:
            by_addr = {e.addr: e for e in self.entries if e.addr is not None}
            keep: list[Entry] = []
            for r in rows:
                e = by_addr.get(r[0])
                if e is None or e.n_tokens != r[1] or any(x is e for x in keep):
                    e = next((x for x in self.entries if x.n_tokens == r[1] and not any(y is x for y in keep)), None)
                if e is None:
                    e = Entry(self.next_id, r[1], r[3], 0, [], -1, -1)
                    self.next_id += 1
                    rd.spec(T.CACHE_ALLOC, "", slot=-1, task=-1, func="alloc", entry_id=e.id, n_tokens=e.n_tokens,
                            size=e.size, id_slot=-1, id_task=-1, size_main=e.size, size_dft=0, size_ckpt=0,
                            n_checkpoints=r[2], head="", checkpoints=[])
                keep.append(e)
            for e in self.entries:
                if not any(x is e for x in keep):
                    way.new_entries.pop(e.id, None)
                    rd.spec(T.CACHE_EVICT, "", slot=-1, task=-1, reason=RESYNC, entry_id=e.id, n_tokens=e.n_tokens,
                            size=e.size)
            self.n_resyncs += 1
            self.entries = keep
        for r, e in zip(rows, self.entries):
            e.addr = r[0]
            if e.size != r[3]:  # the listing's MiB is the entry's own total: take it
                e.size = r[3]
                sp = way.new_entries.get(e.id)
                if sp is not None:  # the checkpoints' bytes: the entry's total minus the state it saved
                    sp.data["size"] = r[3]
                    if sp.data["n_checkpoints"]:
                        sp.data["size_ckpt"] = max(0, r[3] - sp.data["size_main"] - sp.data["size_dft"])
                    else:
                        sp.data["size_main"] = max(0, r[3] - sp.data["size_dft"])
