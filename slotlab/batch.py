"""The batch the server plans: token, position, sequence and logits flag per row, numpy-owned.

The server fills one batch with the sampled token of every generating slot and the prompt tokens of
every slot processing a prompt, each at its own position and sequence, then decodes it in `n_batch`
chunks. This class is the plan, pure numpy: the decision core fills it, any memory decodes a window
[off, off+n) of it, and the llama layer's `Batch` (a subclass) hands the very same buffers to
llama.cpp with no copy."""

from __future__ import annotations

import numpy as np


class Batch:
    """The batch the core plans: token, position, sequence and logits flag per row, numpy-owned.

    The server fills one batch with the sampled token of every generating slot and the prompt tokens
    of every slot processing a prompt, then decodes it in `n_batch` chunks. A memory decodes a
    window [off, off+n) of these arrays; the llama memory hands the same buffers to llama.cpp with no
    copy."""

    def __init__(self, capacity: int, *, arrays: "Batch | None" = None):
        if capacity < 1:
            raise ValueError(f"batch capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        if arrays is not None:  # share another batch's buffers (what the llama layer decodes)
            for name, dt in (("token", np.int32), ("pos", np.int32), ("seq", np.int32), ("logits", np.int8)):
                a = getattr(arrays, name)
                if a.dtype != dt or len(a) < capacity or not a.flags.c_contiguous:
                    raise ValueError(f"shared batch array {name!r} must be contiguous {np.dtype(dt).name}[>= {capacity}]")
                setattr(self, name, a)
        else:
            self.token = np.zeros(capacity, dtype=np.int32)
            self.pos = np.zeros(capacity, dtype=np.int32)
            self.seq = np.zeros(capacity, dtype=np.int32)
            self.logits = np.zeros(capacity, dtype=np.int8)
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
        """Append one token; returns its row (the logits index when `logits`)."""
        i = self._room(1)
        self.token[i], self.pos[i], self.seq[i], self.logits[i] = token, pos, seq_id, logits
        self.n_tokens = i + 1
        return i

    def add_seq(self, tokens, pos0: int, seq_id: int, *, logits_last: bool = False) -> int:
        """Append a run of one sequence at positions pos0, pos0+1, ...; returns the last row."""
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
