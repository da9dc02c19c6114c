"""A slot selection (`get_available_slot`, steps A-D): `selected slot by id / LCP similarity / LRU`, the
skip and similarity lines of each slot, the RAM-cache update it may run, and what the engine calls the
`slot_decision` made of them.

The server prints these lines before the task is bound to the slot (`task -1`, or the busy slot's
task), so their events are held until `processing task` names the task (or a deferral ends the
selection), then emitted with it, as the engine does."""

from __future__ import annotations

import math

import numpy as np

from slotlab.engine import event_types as T
from slotlab.engine.prompt_cache import f32_ratio
from slotlab.watch.logread.state import Selection, Spec


class SlotSelection:
    """The selection family (patterns.SELECTION)."""

    def __init__(self, rd):
        self.rd = rd
        self.sps_on = False  # a similarity line was printed: -sps is not 0 (fixed for the server's life)
        self.last_first: Spec | None = None  # the first event of the last selection (a silent restore goes before)
        self.last_task = -1  # the task that selection launched

    @property
    def sel(self) -> Selection | None:
        return self.rd.way.selection

    def open(self) -> Selection:
        self.rd.startup.emit_init()
        if self.rd.way.selection is None:
            self.rd.way.selection = Selection()
        return self.rd.way.selection

    def _new_if_seen(self, slot: int) -> Selection:
        """A skip / check line for a slot this selection already scanned starts the next selection."""
        sel = self.sel
        if sel is not None and (slot in sel.seen or sel.update_cache or sel.how in ("lcp", "lru")):
            self.close(None, None)
        return self.open()

    def _first(self, sel: Selection) -> Spec | None:
        return sel.specs[0] if sel.specs else None

    def on_by_id(self, m, ln, level):
        if self.sel is not None:
            self.close(None, None)
        sel = self.open()
        sel.id_requested = int(m.group(1))
        sel.chosen, sel.how = ln.slot, "id"
        self.rd.spec(T.SLOT_SELECTED_BY_ID, ln.msg, level=level, slot=ln.slot, new_task=True)

    def on_skip_busy(self, m, ln, level):
        sel = self._new_if_seen(ln.slot)
        sel.seen.add(ln.slot)
        sel.sps_on = self.sps_on = True
        self.rd.spec(T.SLOT_SKIP, ln.msg, level=level, slot=ln.slot, new_task=True)

    def on_skip_empty(self, m, ln, level):
        sel = self._new_if_seen(ln.slot)
        sel.seen.add(ln.slot)
        sel.sps_on = self.sps_on = True
        s = self.rd.slot(ln.slot)
        # a slot the reader holds full, emptied without a line (a failed restore and an erase print
        # `clearing prompt`): a restore of a file saved from an empty slot, or reading from the middle;
        # no golden log has one, so no restore is inferred from it
        s.n_tokens, s.checkpoints, s.origin = 0, [], "slot"
        self.rd.spec(T.SLOT_SKIP, ln.msg, level=level, slot=ln.slot, new_task=True)

    def on_sim(self, m, ln, level):
        sel = self._new_if_seen(ln.slot)
        sel.seen.add(ln.slot)
        sel.sps_on = self.sps_on = True
        lcp, n = int(m.group(2)), int(m.group(3))
        f_sim = float(f32_ratio(lcp, n)) if n > 0 else float(m.group(1))
        sel.n_task = n
        sel.checks[ln.slot] = (lcp, n, f_sim)
        s = self.rd.slot(ln.slot)
        sel.n_held[ln.slot] = s.n_tokens
        if s.state == "idle" and s.n_tokens is not None and (s.n_tokens == 0 or lcp > s.n_tokens):
            # the slot holds tokens no line put there (an empty slot prints `skipping, slot is empty`; no
            # slot shares more than it holds): `POST /slots/N?action=restore`, which the server does not log
            self.rd.lifecycle.silent_restore(s, None, before=self._first(sel))
        thold = np.float32(float(m.group(4)))
        sel.thold = float(thold)
        if np.float32(f_sim) > np.float32(sel.f_sim_best) and np.float32(f_sim) > thold:
            sel.f_sim_best = f_sim
            if sel.id_requested != -1:  # the requested slot passed step B: the engine calls that "lcp"
                sel.how = "lcp"
        self.rd.spec(T.SLOT_SIM, ln.msg, level=level, slot=ln.slot, new_task=True, lcp=lcp, f_sim=f_sim)

    def on_by_lcp(self, m, ln, level):
        sel = self.open()
        sel.chosen, sel.how = ln.slot, "lcp"
        chk = sel.checks.get(ln.slot)
        f_sim = chk[2] if chk is not None else float(m.group(1))
        sel.f_sim_best = f_sim
        f_keep = float(m.group(3))
        s = self.rd.slot(ln.slot)
        if chk is not None and s.n_tokens:
            with np.errstate(divide="ignore", invalid="ignore"):
                exact = np.float32(np.float32(f_sim) * np.float32(chk[1])) / np.float32(s.n_tokens)
            if f"{float(exact):.3f}" == m.group(3):
                f_keep = float(exact)
        sel.f_keep = f_keep
        self.rd.spec(T.SLOT_SELECTED_BY_LCP, ln.msg, level=level, slot=ln.slot, new_task=True, f_sim=f_sim,
                     f_keep=f_keep)

    def on_by_lru(self, m, ln, level):
        sel = self.open()
        sel.chosen, sel.how = ln.slot, "lru"
        self.rd.spec(T.SLOT_SELECTED_BY_LRU, ln.msg, level=level, slot=ln.slot, new_task=True,
                     t_last=int(m.group(1)))

    def on_update_begin(self, m, ln, level):
        sel = self.open()
        sel.update_cache = True
        self.rd.way.cache_ctx = (sel.chosen if sel.chosen is not None else -1, -1)
        self.rd.spec(T.CACHE_UPDATE_BEGIN, ln.msg, level=level, new_task=True)

    def on_update_end(self, m, ln, level):
        self.open()
        self.rd.spec(T.CACHE_UPDATE_END, ln.msg, level=level, new_task=True)

    def on_defer(self, m, ln, level):
        if self.sel is not None:
            self.close(None, int(m.group(2)), message=ln.msg, level=level)
        else:
            self.rd.spec(T.TASK_DEFERRED, ln.msg, level=level, task=int(m.group(2)))

    # ------------------------------------------------------------------ the decision

    def decision(self, sel: Selection, slot: int) -> dict:
        """The `slot_decision` data of a selection that chose `slot`."""
        s = self.rd.slots.get(slot) if slot >= 0 else None
        f_keep: float | None = None
        if sel.how == "lcp":
            if sel.f_keep is not None:
                f_keep = sel.f_keep
            else:  # chosen by id, and the requested slot passed the similarity check
                chk = sel.checks.get(slot)
                n_slot = s.n_tokens if s is not None else None
                f_keep = math.nan  # the slot's length is not known (a restore from a file, which logs nothing)
                if chk is not None and n_slot:
                    with np.errstate(divide="ignore", invalid="ignore"):
                        f_keep = float(np.float32(np.float32(chk[2]) * np.float32(chk[1])) / np.float32(n_slot))
        elif sel.how == "id" and (sel.sps_on or self.sps_on):
            f_keep = 0.0 if s is None or s.n_tokens != 0 else math.nan
        d = {"how": sel.how if slot >= 0 else None, "f_sim": float(sel.f_sim_best), "f_keep": f_keep,
             "update_cache": sel.update_cache, "load": sel.load, "id_requested": sel.id_requested,
             "held": self.held(sel), "sps": sel.thold}
        if sel.load is True and sel.load_result is not None:
            d.update(sel.load_result.decision_fields())
        return d

    @staticmethod
    def held(sel: Selection) -> T.Held | None:
        """The longest common prefix the log shows the server held for this prompt: each idle slot's
        `lcp` from its similarity line (-lv 4) and each RAM entry's from the load's listing (printed only
        when the cache was searched). The engine's `held` also scans busy slots and every entry, and
        knows what was dropped (`lost`); a log shows neither, so misses of those kinds stay unexplained
        here. Same order as the engine (slots, then entries; the first longest wins)."""
        cands = [(lcp, "slot", sid, sel.n_held.get(sid) or lcp) for sid, (lcp, _n, _f) in sel.checks.items()]
        cands += [(sc.lcp, "entry", sc.entry_id, sc.n_tokens) for sc in sel.scores or []]
        best = max(cands, key=lambda c: c[0], default=None)
        if best is None or best[0] <= 0:
            return None
        return T.Held(where=best[1], id=best[2], lcp=int(best[0]), n_held=int(best[3]), prompt_text="", held_text="")

    def close(self, launch: tuple[int, int] | None, deferred_task: int | None, *, message: str = "",
              level: str = "DBG") -> None:
        """The selection ended: `launch` = (slot, task) launched, or deferred (task id if a DBG line said)."""
        rd, way = self.rd, self.rd.way
        sel, way.selection = way.selection, None
        cache = rd.prompt_cache
        if way.alloc is not None:
            cache.finish_alloc()
        if way.load is not None:
            sel.scores = way.load.scores
            cache.finish_load(failed=False)
        if way.listing is not None:
            cache.finish_listing()
        if launch is not None:
            slot, task = launch
        else:
            slot = sel.chosen if sel.chosen is not None else -1
            task = deferred_task if deferred_task is not None else -1
        for sp in sel.specs:
            if sp.new_task:
                sp.task = task
        if launch is None:
            way.fixes = []
        if not sel.specs and launch is None:
            return
        dec = Spec(T.SLOT_DECISION, "", "TRC", slot, task, self.decision(sel, slot), rd.t)
        rd.out.append(dec)
        self.last_first = sel.specs[0] if sel.specs else dec
        self.last_task = task
        if sel.load is True and sel.n_task is None and way.fixes:
            lcp = sel.load_result.lcp if sel.load_result is not None else None
            way.fixes.append(lambda n, d=dec.data: d.update(f_sim_best=float(f32_ratio(lcp, n))))
        if launch is None:
            rd.out.append(Spec(T.TASK_DEFERRED, message, level, -1, task, {}, rd.t))
        elif sel.chosen is not None and sel.chosen == slot:
            s = rd.slot(slot)
            chk = sel.checks.get(slot)
            if sel.load is True:
                s.lcp_hint = sel.load_result.lcp if sel.load_result is not None else None
            elif chk is not None:
                s.lcp_hint = chk[0]
            elif s.n_tokens == 0:
                s.lcp_hint = 0
            else:
                s.lcp_hint = None
            if sel.n_task is not None:
                rd.task(task, slot).n_tokens = sel.n_task
