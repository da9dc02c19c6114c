"""A `llama_batch` whose arrays are numpy buffers owned by Python.

The server fills one batch with the generated tokens of every GENERATING slot and the prompt tokens
of every processing slot, each at its own position and sequence, then decodes it in `n_batch`
chunks. Owning the arrays lets slotlab fill them with vectorised numpy writes and hand llama.cpp a
window (offset, n) of the same buffers for each chunk, with no copy and no `llama_batch_free`."""

from __future__ import annotations

import ctypes

import numpy as np

from slotlab.llama._lib import lib

_i32p = ctypes.POINTER(ctypes.c_int32)


class Batch:
    """Tokens of several sequences at explicit positions; one sequence per token (as the server)."""

    def __init__(self, capacity: int, *, arrays=None):
        if capacity < 1:
            raise ValueError(f"batch capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        if arrays is not None:
            # share another owner's buffers (the core's planned batch): no copy per decode
            self.token, self.pos, self.seq, self.logits = (arrays.token, arrays.pos, arrays.seq, arrays.logits)
            for name, dt in (("token", np.int32), ("pos", np.int32), ("seq", np.int32), ("logits", np.int8)):
                a = getattr(self, name)
                if a.dtype != dt or len(a) < capacity or not a.flags.c_contiguous:
                    raise ValueError(f"shared batch array {name!r} must be contiguous {np.dtype(dt).name}[>= {capacity}]")
        else:
            self.token = np.zeros(capacity, dtype=np.int32)
            self.pos = np.zeros(capacity, dtype=np.int32)
            self.seq = np.zeros(capacity, dtype=np.int32)
            self.logits = np.zeros(capacity, dtype=np.int8)
        self.n_seq_id = np.ones(capacity, dtype=np.int32)
        # seq_id is `llama_seq_id **`: row i points at self.seq[i].
        self._seq_ptrs = (ctypes.c_void_p * capacity)(
            *[self.seq.ctypes.data + 4 * i for i in range(capacity)]
        )
        self.n_tokens = 0

    def __len__(self) -> int:
        return self.n_tokens

    def clear(self) -> None:
        self.n_tokens = 0

    def _room(self, n: int) -> int:
        i = self.n_tokens
        if i + n > self.capacity:
            raise ValueError(f"batch full: {i} + {n} tokens > capacity {self.capacity}")
        return i

    def add(self, token: int, pos: int, seq_id: int, logits: bool = False) -> int:
        """Append one token; returns its index in the batch (the logits index when `logits`)."""
        i = self._room(1)
        self.token[i], self.pos[i], self.seq[i], self.logits[i] = token, pos, seq_id, logits
        self.n_tokens = i + 1
        return i

    def add_seq(self, tokens, pos0: int, seq_id: int, *, logits_last: bool = False) -> int:
        """Append a run of tokens of one sequence at positions pos0, pos0+1, ...; returns the index
        of the last one (its logits are requested when `logits_last`)."""
        toks = np.asarray(tokens, dtype=np.int32)
        n = len(toks)
        if n == 0:
            raise ValueError("add_seq() needs at least one token")
        i = self._room(n)
        j = i + n
        self.token[i:j] = toks
        self.pos[i:j] = np.arange(pos0, pos0 + n, dtype=np.int32)
        self.seq[i:j] = seq_id
        self.logits[i:j] = 0
        if logits_last:
            self.logits[j - 1] = 1
        self.n_tokens = j
        return j - 1

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
