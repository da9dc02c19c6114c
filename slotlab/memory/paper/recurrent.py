"""The cells of a recurrent memory (`llama_memory_recurrent`) on paper.

A recurrent memory (Mamba, RWKV, the delta-net / short-convolution / SSM layers of a hybrid model)
keeps one state a sequence, not one cell per token: `size` = max(1, n_seq_max) cells, each holding
the state after the sequence's last position (`cell.pos`). What the server's decisions see of it:

* `pos_min` = `pos_max` = that position (a sequence "holds" only its end);
* `seq_rm` cannot cut a state back: removing [p0, p1) with 0 < p0 <= pos < p1 is refused (false;
  with n_rs_seq = 0, as llama-server creates its contexts unless an MTP / EAGLE draft asks for
  rollback snapshots), while a range that covers the end from 0 (or the whole sequence) drops it,
  and a range before or after the end changes nothing;
* `decode` always finds a cell: every sequence id below n_seq_max owns (or copies into) one, so it
  never returns 1 for the recurrent part;
* the state blob holds 0 or 1 cell (format.py `RecurrentSpec`).

Cells shared between sequences (`seq_cp`) are modelled by their observable effect: the destination
gets the source's position, and each sequence's later changes are its own (llama.cpp copies the
shared cell on the next decode of either)."""

from __future__ import annotations

import numpy as np

from slotlab.memory.paper.format import I32_MAX, RecurrentSpec

__all__ = ["RecurrentCache"]


class RecurrentCache:
    """Per sequence, the position of its state (-1: none). Answers the calls a KV cache model
    (cells.py) answers, with the recurrent memory's semantics (module docstring)."""

    def __init__(self, spec: RecurrentSpec):
        self.spec = spec
        self.pos = [-1] * spec.size

    def stream_of(self, seq: int) -> int:
        return 0

    def clear(self) -> None:
        self.pos = [-1] * self.spec.size

    def pos_min(self, seq: int) -> int:
        return self.pos[seq] if 0 <= seq < len(self.pos) else -1

    pos_max = pos_min

    def n_cells(self, seq: int) -> int:
        return 1 if self.pos_min(seq) >= 0 else 0

    n_written = n_cells

    def written(self, seq: int) -> tuple[np.ndarray, np.ndarray]:
        p = self.pos_min(seq)
        if p < 0:
            return np.empty(0, np.int32), np.empty(0, np.int32)
        return np.array([p], dtype=np.int32), np.array([-1], dtype=np.int32)

    # -- sequence operations (llama_memory_recurrent::seq_*) ------------------------------------------

    def can_rm(self, seq: int, p0: int, p1: int) -> bool:
        """Would `seq_rm(seq, p0, p1)` succeed (p0 / p1 already clamped to [0, I32_MAX])?"""
        if seq < 0:
            return p0 == p1 or (p0 == 0 and p1 == I32_MAX)
        if seq >= self.spec.size:
            return False
        pos = self.pos[seq]
        return not (pos >= 0 and 0 < p0 <= pos < p1)  # a partial cut of the end: no snapshot to roll back to

    def seq_rm(self, seq: int, p0: int, p1: int) -> bool:
        if not self.can_rm(seq, p0, p1):
            return False
        for q in (range(len(self.pos)) if seq < 0 else (seq,)):
            if p0 <= self.pos[q] < p1:
                self.pos[q] = -1
        return True

    def seq_add(self, seq: int, p0: int, p1: int, d: int) -> None:
        if 0 <= seq < len(self.pos) and p0 <= self.pos[seq] < p1:
            self.pos[seq] += d

    def seq_keep(self, seq: int) -> None:
        for q in range(len(self.pos)):
            if q != seq:
                self.pos[q] = -1

    def seq_cp(self, src: int, dst: int) -> None:
        if src != dst and 0 <= src < len(self.pos) and 0 <= dst < len(self.pos):
            self.pos[dst] = self.pos[src]

    # -- decode and restore ---------------------------------------------------------------------------------

    def commit(self, last: dict[int, int]) -> None:
        """After a decode: each sequence's state is at the last position the batch gave it."""
        for q, p in last.items():
            self.pos[q] = p

    def restore(self, seq: int, pos: np.ndarray, tok: np.ndarray) -> bool:
        """`state_read_meta` for one sequence: drop its state, then take the cell's position."""
        if len(pos) > self.spec.size:
            return False
        self.pos[seq] = -1
        if len(pos):
            self.pos[seq] = int(pos[-1])
        return True
