"""The cells of a KV cache without window masking, as `llama_kv_cells` holds them, at the cost of counts.

`CountCache` is a full-attention cache (also the full half of an iSWA pair, a hybrid memory's
attention part). Every free cell is usable there, so only the count of free cells per stream decides
`find_slot`, and a state's size does not depend on cell order. Per sequence, sorted positions and
their tokens (`SeqCells`) are observably the same as the cell array, at O(tokens) per decode. The
window cache, where the layout matters, is window.py's `CellCache`; both answer the same calls
(`seq_rm`, `seq_add`, `seq_keep`, `seq_cp`, `pos_min` / `pos_max`, `written` / `n_written` for
`state_write`, `restore` for `state_read_meta`), driven by the context (context.py)."""

from __future__ import annotations

import numpy as np

from slotlab.memory.paper.format import I32_MAX, CacheSpec

__all__ = ["CountCache", "SeqCells"]


class SeqCells:
    """One sequence's cells in a count cache: positions sorted (non-decreasing) and their tokens."""

    __slots__ = ("pos", "tok", "n")

    def __init__(self):
        self.pos = np.empty(64, dtype=np.int32)
        self.tok = np.empty(64, dtype=np.int32)
        self.n = 0

    def view(self) -> tuple[np.ndarray, np.ndarray]:
        return self.pos[:self.n], self.tok[:self.n]

    def extend(self, pos: np.ndarray, tok: np.ndarray, in_order: bool = False) -> None:
        """Append cells; `in_order`: the caller knows `pos` is non-decreasing and starts after the last
        cell (decode checked it), so no sort check is needed."""
        k = len(pos)
        if k == 0:
            return
        need = self.n + k
        if need > len(self.pos):
            cap = max(need, 2 * len(self.pos))
            for name in ("pos", "tok"):
                a = np.empty(cap, dtype=np.int32)
                a[:self.n] = getattr(self, name)[:self.n]
                setattr(self, name, a)
        unsorted = not in_order and self.n > 0 and pos[0] < self.pos[self.n - 1]
        self.pos[self.n:need] = pos
        self.tok[self.n:need] = tok
        self.n = need
        if unsorted or (not in_order and k > 1 and np.any(np.diff(pos) < 0)):
            self._sort()

    def _sort(self) -> None:
        o = np.argsort(self.pos[:self.n], kind="stable")
        self.pos[:self.n] = self.pos[:self.n][o]
        self.tok[:self.n] = self.tok[:self.n][o]

    def remove(self, p0: int, p1: int) -> int:
        """Drop positions in [p0, p1); returns how many."""
        n = self.n
        if n == 0:
            return 0
        p = self.pos[:n]
        i0 = int(p.searchsorted(p0))  # (the array's method: np.searchsorted adds a Python layer)
        i1 = n if p1 > p[n - 1] else int(p.searchsorted(p1))  # [p0, end): every prompt's seq_rm
        k = i1 - i0
        if k:
            self.pos[i0:self.n - k] = self.pos[i1:self.n]
            self.tok[i0:self.n - k] = self.tok[i1:self.n]
            self.n -= k
        return k

    def shift(self, p0: int, p1: int, d: int) -> int:
        """pos += d on [p0, p1); cells pushed below 0 are dropped (returns how many)."""
        p = self.pos[:self.n]
        i0 = int(np.searchsorted(p, p0, "left"))
        i1 = int(np.searchsorted(p, p1, "left"))
        if i0 == i1:
            return 0
        self.pos[i0:i1] += d
        keep = self.pos[:self.n] >= 0
        dropped = int(self.n - keep.sum())
        if dropped:
            pos, tok = self.pos[:self.n][keep].copy(), self.tok[:self.n][keep].copy()
            self.n = len(pos)
            self.pos[:self.n], self.tok[:self.n] = pos, tok
        self._sort()
        return dropped


class CountCache:
    """A cache without window masking: every free cell is usable, so only counts and positions per
    sequence matter (free cells per stream decide `find_slot`; sizes do not depend on cell order)."""

    def __init__(self, spec: CacheSpec):
        self.spec = spec
        self.seqs: dict[int, SeqCells] = {}
        self.used = [0] * spec.n_stream

    def stream_of(self, seq: int) -> int:
        return 0 if self.spec.n_stream == 1 else seq

    def seq_cells(self, seq: int) -> SeqCells:
        s = self.seqs.get(seq)
        if s is None:
            s = self.seqs[seq] = SeqCells()
        return s

    def clear(self) -> None:
        self.seqs.clear()
        self.used = [0] * self.spec.n_stream

    def pos_min(self, seq: int) -> int:
        s = self.seqs.get(seq)
        return int(s.pos[0]) if s is not None and s.n else -1

    def pos_max(self, seq: int) -> int:
        s = self.seqs.get(seq)
        return int(s.pos[s.n - 1]) if s is not None and s.n else -1

    def n_cells(self, seq: int) -> int:
        s = self.seqs.get(seq)
        return s.n if s is not None else 0

    def written(self, seq: int) -> tuple[np.ndarray, np.ndarray]:
        s = self.seqs.get(seq)
        if s is None:
            return np.empty(0, np.int32), np.empty(0, np.int32)
        p, t = s.view()
        return p.copy(), t.copy()

    def n_written(self, seq: int) -> int:
        return self.n_cells(seq)

    def free(self, stream: int) -> int:
        return self.spec.size - self.used[stream]

    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        for q in (list(self.seqs) if seq < 0 else [seq]):
            s = self.seqs.get(q)
            if s is not None and s.n:
                self.used[self.stream_of(q)] -= s.remove(p0, p1)

    def seq_add(self, seq: int, p0: int, p1: int, d: int) -> None:
        s = self.seqs.get(seq)
        if s is not None and s.n:
            self.used[self.stream_of(seq)] -= s.shift(p0, p1, d)

    def seq_keep(self, seq: int) -> None:
        st = self.stream_of(seq)
        for q in list(self.seqs):
            if q != seq and self.stream_of(q) == st:
                self.used[st] -= self.seqs[q].n
                del self.seqs[q]

    def seq_cp(self, src: int, dst: int) -> None:
        """Cross-stream copy (non-unified): the destination stream becomes a copy of src's cells."""
        st = self.stream_of(dst)
        for q in list(self.seqs):
            if self.stream_of(q) == st:
                self.used[st] -= self.seqs[q].n
                del self.seqs[q]
        p, t = self.written(src)
        s = self.seq_cells(dst)
        s.extend(p, t)
        self.used[st] += len(p)

    # -- decode: `prepare` checks, `commit` applies ----------------------------------------------------

    def prepare(self, ubatches: list[list[tuple[int, np.ndarray]]]) -> bool:
        """Can every ubatch find its cells? Each ubatch is [(seq, row indices)] per stream group."""
        need = [0] * self.spec.n_stream
        for ub in ubatches:
            per: dict[int, int] = {}
            for seq, rows in ub:
                st = self.stream_of(seq)
                per[st] = per.get(st, 0) + len(rows)
            for st, k in per.items():
                if k > self.spec.size:
                    return False
                need[st] += k
                if need[st] > self.free(st):
                    return False
        return True

    def commit(self, ubatches, pos: np.ndarray, tok: np.ndarray) -> None:
        for ub in ubatches:
            for seq, rows in ub:
                self.seq_cells(seq).extend(pos[rows], tok[rows])
                self.used[self.stream_of(seq)] += len(rows)

    def restore(self, seq: int, pos: np.ndarray, tok: np.ndarray) -> bool:
        """`state_read_meta` for one sequence: remove it, then place len(pos) cells (False: no room;
        the sequence is then empty in this cache). No cells: nothing happens (the stream is skipped)."""
        if len(pos) == 0:
            return True
        self.seq_rm(seq, 0, I32_MAX)
        st = self.stream_of(seq)
        if len(pos) > self.spec.size or len(pos) > self.free(st):
            return False
        o = np.argsort(pos, kind="stable")
        self.seq_cells(seq).extend(pos[o], tok[o])
        self.used[st] += len(pos)
        return True
