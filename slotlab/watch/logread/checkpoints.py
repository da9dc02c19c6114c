"""Context checkpoints in a slot's lines: the check against the prompt (`checking checkpoint with [..]
against T`), a restore or its absence (forced re-processing), and each checkpoint created and erased
(invalidated, FIFO, too close, superseded). The reader keeps each slot's chain, which a RAM-cache
entry copies when the slot is saved."""

from __future__ import annotations

from slotlab.engine import event_types as T
from slotlab.units import MIB
from slotlab.watch.logread.state import SlotState


def mib_bytes(mib: str) -> int:
    """Bytes of a size printed in MiB with 3 decimals (within 512 bytes)."""
    return int(round(float(mib) * MIB))


class Checkpoints:
    """The checkpoint family (patterns.CHECKPOINTS)."""

    def __init__(self, rd):
        self.rd = rd

    def on_ckpt_check(self, m, ln, level):
        s, _ = self.rd.lifecycle.slot_task(ln)
        if s.plan is not None:
            s.plan.pos_min_thold = int(m.group(3))
        self.rd.spec(T.CHECKPOINT_CHECK, ln.msg, level=level, slot=ln.slot, task=ln.task)

    def on_ckpt_restored(self, m, ln, level):
        s, _ = self.rd.lifecycle.slot_task(ln)
        n_past = int(m.group(4))
        if s.plan is not None:
            s.plan.ckpt = "restored" if n_past > 0 else "forced"
        self.rd.spec(T.CHECKPOINT_RESTORED, ln.msg, level=level, slot=ln.slot, task=ln.task, n_tokens=int(m.group(3)),
                   n_past=n_past, pos_min=int(m.group(1)), pos_max=int(m.group(2)),
                   size=mib_bytes(m.group(5)) if m.group(5) else -1)

    def on_ckpt_none(self, m, ln, level):
        s, _ = self.rd.lifecycle.slot_task(ln)
        if s.plan is not None:
            s.plan.ckpt = "forced"
        self.rd.spec(T.CHECKPOINT_NONE, ln.msg, level=level, slot=ln.slot, task=ln.task)

    def remove(self, s: SlotState, pos_min: int | None, pos_max: int | None, n_tokens: int) -> list | None:
        for c in s.checkpoints:
            if c[2] == n_tokens and (pos_min is None or (c[0] == pos_min and c[1] == pos_max)):
                s.checkpoints.remove(c)
                return c
        return None

    def on_ckpt_invalidated(self, m, ln, level):
        s, _ = self.rd.lifecycle.slot_task(ln)
        if m.group(4) is not None and not self.rd.shape.swa_full:
            self.rd.shape.n_swa_model = int(m.group(4))
        n = int(m.group(3))
        self.remove(s, int(m.group(1)), int(m.group(2)), n)
        self.rd.spec(T.CHECKPOINT_EVICT, ln.msg, level=level, slot=ln.slot, task=ln.task, reason="invalidated",
                   n_tokens=n, pos_min=int(m.group(1)), pos_max=int(m.group(2)))

    def on_ckpt_created(self, m, ln, level):
        s, _ = self.rd.lifecycle.slot_task(ln)
        pmin, pmax, n, size = int(m.group(3)), int(m.group(4)), int(m.group(5)), mib_bytes(m.group(6))
        self.rd.shape.ckpt_max = int(m.group(2))
        s.checkpoints.append([pmin, pmax, n, size, ln.task])
        if s.n_tokens is not None and s.n_tokens < n:
            s.n_tokens = n
        self.rd.spec(T.CHECKPOINT_CREATED, ln.msg, level=level, slot=ln.slot, task=ln.task, n_tokens=n, pos_min=pmin,
                   pos_max=pmax, size=size)

    def _evict(self, m, ln, level, reason):
        s, _ = self.rd.lifecycle.slot_task(ln)
        pmin, pmax, n = int(m.group(1)), int(m.group(2)), int(m.group(3))
        self.remove(s, pmin, pmax, n)
        self.rd.spec(T.CHECKPOINT_EVICT, ln.msg, level=level, slot=ln.slot, task=ln.task, reason=reason, n_tokens=n,
                   pos_min=pmin, pos_max=pmax)

    def on_ckpt_fifo(self, m, ln, level):
        self._evict(m, ln, level, "fifo")

    def on_ckpt_too_close(self, m, ln, level):
        self._evict(m, ln, level, "too_close")

    def on_ckpt_supersede(self, m, ln, level):
        s, _ = self.rd.lifecycle.slot_task(ln)
        n = int(m.group(1))
        c = self.remove(s, None, None, n)
        # the line has no positions: they come from the chain the reader keeps (-1 when it never saw it)
        data = {"reason": "supersede", "n_tokens": n, "pos_min": c[0] if c is not None else -1,
                "pos_max": c[1] if c is not None else -1}
        self.rd.spec(T.CHECKPOINT_EVICT, ln.msg, level=level, slot=ln.slot, task=ln.task, **data)

