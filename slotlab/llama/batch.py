"""A `llama_batch` whose arrays are numpy buffers owned by Python.

The server fills one batch with the generated tokens of every GENERATING slot and the prompt tokens
of every processing slot, each at its own position and sequence, then decodes it in `n_batch`
chunks. Owning the arrays lets slotlab fill them with vectorised numpy writes and hand llama.cpp a
window (offset, n) of the same buffers for each chunk, with no copy and no `llama_batch_free`."""

from __future__ import annotations

import ctypes

import numpy as np

from slotlab.batch import Batch as PlannedBatch
from slotlab.llama._lib import lib

_i32p = ctypes.POINTER(ctypes.c_int32)


class Batch(PlannedBatch):
    """A planned batch (slotlab.batch) that llama.cpp can read: `view()` is the C struct of a window."""

    def __init__(self, capacity: int, *, arrays=None):
        super().__init__(capacity, arrays=arrays)
        self.n_seq_id = np.ones(capacity, dtype=np.int32)
        # seq_id is `llama_seq_id **`: row i points at self.seq[i].
        self._seq_ptrs = (ctypes.c_void_p * capacity)(
            *[self.seq.ctypes.data + 4 * i for i in range(capacity)]
        )

    def view(self, offset: int = 0, n: int | None = None) -> "lib.llama_batch":
        """The C struct for tokens [offset, offset+n) — what one `llama_decode` chunk sees."""
        if n is None:
            n = self.n_tokens - offset
        if offset < 0 or n < 0 or offset + n > self.n_tokens:
            raise ValueError(f"batch view [{offset}, {offset + n}) outside [0, {self.n_tokens})")
        b = lib.llama_batch()
        b.n_tokens = n
        b.token = ctypes.cast(self.token.ctypes.data + 4 * offset, _i32p)
        b.embd = None
        b.pos = ctypes.cast(self.pos.ctypes.data + 4 * offset, _i32p)
        b.n_seq_id = ctypes.cast(self.n_seq_id.ctypes.data + 4 * offset, _i32p)
        b.seq_id = ctypes.cast(ctypes.addressof(self._seq_ptrs) + ctypes.sizeof(ctypes.c_void_p) * offset,
                               ctypes.POINTER(_i32p))
        b.logits = ctypes.cast(self.logits.ctypes.data + offset, ctypes.POINTER(ctypes.c_int8))
        return b
