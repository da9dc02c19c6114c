"""What the server threw away lately: the record a later miss is explained by.

A slot overwritten by another prompt, a slot cleared (purge, idle clear, failed decode), a RAM-cache
entry evicted: each drop keeps a reference to the tokens that were lost, where they were and why.
They decide nothing; `ServerCore.held_prefix` matches a new prompt against them (slotlab.explain
names the cause of a miss from that)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np


@dataclass(frozen=True, slots=True)
class Drop:
    tokens: np.ndarray  # what was held (a reference or a copy; never changed afterwards)
    where: str  # "slot" or "entry"
    id: int  # the slot's id or the entry's id
    reason: str  # the slot_clear / cache_evict reason, or "overwritten"
    seq: int  # the event seq at which it was dropped
    by_task: Optional[int] = None  # the task whose prompt overwrote it ("overwritten" only)
