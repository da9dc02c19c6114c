"""The one seam through which the server machinery reports a decision: `Emitter(payload, message, ...)`.

Checkpoints, cache reuse, the RAM-cache glue and speculative decoding get this callable (and the
memory), never the engine, so each can be read and tested alone. The caller builds the event's payload
(`emit(T.CheckpointCreated(n_tokens=..., ...), "created context checkpoint ...", slot=slot)`), whose
class is the schema (`slotlab.engine.event_types`). It fills in the task from the slot when the caller
does not name one, as the server's `SLT_*` log macros print `id_task` of the slot."""

from __future__ import annotations

from typing import Any, Sequence

from slotlab.engine.event_types import Payload


class Emitter:
    def __init__(self, bus, slots: Sequence):
        self.bus = bus
        self.slots = slots

    def wanted(self, kind: str) -> bool:
        """Whether an event of `kind` would be kept; when not, it is numbered as refused (as `__call__`
        numbers it), so a hot caller asks first and builds neither the payload nor its line: a
        simulation nobody reads refuses ten a request."""
        only = self.bus.only
        if only is None or kind in only:
            return True
        self.bus.skip()
        return False

    def __call__(self, payload: Payload, message: str = "", *, level: str = "TRC", slot: Any = None,
                 task: int | None = None):
        bus = self.bus
        only = bus.only
        if only is not None and payload.KIND not in only:  # refused: numbered, as emit would (no slot or task)
            bus.skip()
            return None
        sid = slot if isinstance(slot, int) else (-1 if slot is None else slot.id)
        if task is None:
            s = self.slots[sid] if sid >= 0 else None
            task = s.task.id if s is not None and s.task is not None else -1
        return self.bus.emit(payload, message, level=level, slot=sid, task=task)
