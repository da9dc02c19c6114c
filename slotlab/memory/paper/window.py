"""The cells of a KV cache with a sliding window, exactly as `llama_kv_cells` holds them.

`CellCache` is the window half of an iSWA pair. `find_slot` may reuse cells the window masks, and
`apply_ubatch` then purges the older positions of the sequence whose cell was reused, so the layout
matters: cells per stream as llama.cpp holds them, and the stream heads. It answers the calls of
cells.py's `CountCache` (the context, context.py, drives both), plus the simulator's bulk paths
(`advance_tokens`, the dense path of `prepare`)."""

from __future__ import annotations

from typing import Iterable

import numpy as np

from slotlab.memory.paper.format import I32_MAX, LLAMA_MAX_SEQ, N_POSITIONS, POSITIONS, CacheSpec

__all__ = ["CellCache", "is_masked"]

_FREE = -(1 << 62)  # the threshold of an empty cell: usable at any step
_MAX = np.maximum.reduce  # an array's maximum without ndarray.max's Python wrapper
_MIN = np.minimum.reduce
_NEVER = 1 << 62  # a cell no window masks


def is_masked(swa_type: str, n_swa: int, p0, p1):
    """`llama_hparams::is_masked_swa` on arrays (p0: the cell's position, p1: the query position)."""
    if swa_type == "standard":
        return (p1 - p0) >= n_swa
    if swa_type == "chunked":
        return p0 < (p1 // n_swa) * n_swa
    if swa_type == "symmetric":
        d = p1 - p0
        h = n_swa // 2
        return (d < -h) | (d > h)
    return np.zeros(np.shape(p0), dtype=bool)


class CellCache:
    """A cache with a sliding window: cells, per stream, exactly as `llama_kv_cells` holds them
    (position, sequence, token; -1 = empty) and the stream heads, so `find_slot`'s reuse of masked
    cells, the purges of `apply_ubatch` and the resulting `pos_min` are llama.cpp's.

    Kept cheap for large caches (--swa-full over a long context): per-sequence (pos_min, pos_max)
    are cached and updated as cells are written, `find_slot` scans windows from the head instead of
    the whole stream, and a decode that does not fit is rolled back from a journal of the cells it
    wrote (no copy of the arrays)."""

    _WINDOW = 4096

    def __init__(self, spec: CacheSpec):
        self.spec = spec
        self._journal: list | None = None
        self.clear()

    def clear(self) -> None:
        sh = (self.spec.n_stream, self.spec.size)
        self.pos = np.full(sh, -1, dtype=np.int32)
        self.seq = np.full(sh, -1, dtype=np.int16)
        self.tok = np.full(sh, -1, dtype=np.int32)
        self.head = [0] * self.spec.n_stream
        self.used = [0] * self.spec.n_stream
        self.seqs: list[set[int]] = [set() for _ in range(self.spec.n_stream)]  # may hold cells
        self._stats: dict[tuple[int, int], tuple[int, int]] = {}  # (stream, seq) -> (pos_min, pos_max)
        # per stream: (q, lo, hi) = it holds exactly sequence q's cells at positions lo..hi, each once
        # (`_dense`); False = it does not; None = not known (any write but the dense path's forgets it)
        self.dense: list = [None] * self.spec.n_stream

    def stream_of(self, seq: int) -> int:
        return 0 if self.spec.n_stream == 1 else seq

    # -- per-sequence extremes ------------------------------------------------------------------------

    def _minmax(self, s: int, q: int) -> tuple[int, int]:
        v = self._stats.get((s, q))
        if v is None:
            p = self.pos[s][self.seq[s] == q]
            v = (int(p.min()), int(p.max())) if len(p) else (-1, -1)
            self._stats[(s, q)] = v
        return v

    def _invalidate(self, s: int, qs: Iterable[int]) -> None:
        for q in qs:
            self._stats.pop((s, int(q)), None)

    # -- queries ----------------------------------------------------------------------------------------

    def pos_min(self, seq: int) -> int:
        return self._minmax(self.stream_of(seq), seq)[0]

    def pos_max(self, seq: int) -> int:
        return self._minmax(self.stream_of(seq), seq)[1]

    def n_cells(self, seq: int) -> int:
        s = self.stream_of(seq)
        return int((self.seq[s] == seq).sum())

    def _written_mask(self, seq: int) -> tuple[int, np.ndarray]:
        s = self.stream_of(seq)
        m = self.seq[s] == seq
        pmax = self._minmax(s, seq)[1]
        if pmax >= 0 and self.spec.n_swa > 0:
            m &= ~is_masked(self.spec.swa_type, self.spec.n_swa, self.pos[s], pmax)
        return s, m

    def n_written(self, seq: int) -> int:
        """Cells `state_write` writes: the sequence's cells the window does not mask at its pos_max.
        Counted without a look at the cells where the stream's dense record holds: positions lo..hi,
        each once, so the unmasked ones are those from the first position the window keeps at hi
        (every checkpoint and RAM-cache save of a sliding-window model asks for this size)."""
        s = self.stream_of(seq)
        d = self.dense[s]
        if d and d[0] == seq:
            _, lo, hi = d
            n, t = self.spec.n_swa, self.spec.swa_type
            if n <= 0:
                first = lo
            elif t == "standard":  # masked at hi when hi - p >= n
                first = hi - n + 1
            elif t == "chunked":  # masked when p < (hi // n) n
                first = (hi // n) * n
            elif t == "symmetric":  # p <= hi: masked when hi - p > n // 2
                first = hi - n // 2
            else:  # no window type masks nothing
                first = lo
            return hi - max(lo, first) + 1
        return int(self._written_mask(seq)[1].sum())

    def written(self, seq: int) -> tuple[np.ndarray, np.ndarray]:
        s, m = self._written_mask(seq)
        return self.pos[s][m].copy(), self.tok[s][m].copy()

    # -- journaled cell writes ------------------------------------------------------------------------

    def _write(self, s: int, idxs, pos, seq, tok, keep_dense: bool = False) -> None:
        """Write cells `idxs` (an index array or a slice) of stream s, journaled inside a decode."""
        if not keep_dense:
            self.dense[s] = None
        if self._journal is not None:
            self._journal.append((s, idxs, self.pos[s][idxs].copy(), self.seq[s][idxs].copy(),
                                  self.tok[s][idxs].copy()))
        self.pos[s][idxs] = pos
        self.seq[s][idxs] = seq
        self.tok[s][idxs] = tok

    def _clear_cells(self, s: int, idxs: np.ndarray, seq: int = -1) -> None:
        """Empty cells (all occupied) and move the head back to the first one, as seq_rm does.
        `seq` >= 0: they are all that sequence's (no np.unique of their owners needed)."""
        if not len(idxs):
            return
        self._invalidate(s, [seq] if seq >= 0 else np.unique(self.seq[s][idxs]))
        self._write(s, idxs, -1, -1, -1)
        self.used[s] -= len(idxs)
        if idxs[0] < self.head[s]:
            self.head[s] = int(idxs[0])

    def _begin(self) -> None:
        self._journal = []
        self._saved = (list(self.head), list(self.used), [set(x) for x in self.seqs], dict(self._stats), list(self.dense))

    def _rollback(self) -> None:
        for s, idxs, p, q, t in reversed(self._journal):
            self.pos[s][idxs] = p
            self.seq[s][idxs] = q
            self.tok[s][idxs] = t
        self.head, self.used, self.seqs, self._stats, self.dense = self._saved
        self._journal = None

    def _end(self) -> None:
        self._journal = None
        self._saved = None

    # -- sequence operations -------------------------------------------------------------------------

    def _rm(self, seq: int, p0: int, p1: int) -> None:
        streams = range(self.spec.n_stream) if seq < 0 else [self.stream_of(seq)]
        for s in streams:
            d = None
            if seq >= 0:
                pmin, pmax = self._minmax(s, seq)
                if pmax < p0 or pmin >= p1:
                    continue  # nothing of this sequence in range
                m = (self.seq[s] == seq) & (self.pos[s] >= p0) & (self.pos[s] < p1)
                d = self.dense[s]
            else:
                m = (self.seq[s] >= 0) & (self.pos[s] >= p0) & (self.pos[s] < p1)
            self._clear_cells(s, np.flatnonzero(m), seq)
            if d and d[0] == seq:  # a prefix or a suffix of lo..hi gone: the rest is still lo'..hi'
                _, lo, hi = d
                if p0 <= lo and p1 > hi:
                    pass  # nothing left: an empty stream needs no record
                elif p0 <= lo:
                    self.dense[s] = (seq, p1, hi)
                elif p1 > hi:
                    self.dense[s] = (seq, lo, p0 - 1)

    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        self._rm(seq, p0, p1)

    def seq_add(self, seq: int, p0: int, p1: int, d: int) -> None:
        s = self.stream_of(seq)
        pos, sq = self.pos[s], self.seq[s]
        idx = np.flatnonzero((sq == seq) & (pos >= p0) & (pos < p1))
        self.dense[s] = None
        first_freed = None
        if len(idx):
            self._invalidate(s, [seq])
            pos[idx] += d
            gone = idx[pos[idx] < 0]
            if len(gone):
                pos[gone] = -1
                sq[gone] = -1
                self.tok[s][gone] = -1
                self.used[s] -= len(gone)
                first_freed = int(gone[0])
        self.head[s] = first_freed if first_freed is not None else 0

    def seq_keep(self, seq: int) -> None:
        s = self.stream_of(seq)
        self._clear_cells(s, np.flatnonzero((self.seq[s] >= 0) & (self.seq[s] != seq)))

    def seq_cp(self, src: int, dst: int) -> None:
        s0, s1 = self.stream_of(src), self.stream_of(dst)
        m = self.seq[s0] == src
        self.pos[s1][:] = -1
        self.seq[s1][:] = -1
        self.tok[s1][:] = -1
        self.pos[s1][m] = self.pos[s0][m]
        self.seq[s1][m] = dst
        self.tok[s1][m] = self.tok[s0][m]
        self.head[s1] = self.head[s0]
        self.used[s1] = int(m.sum())
        self.seqs[s1] = {dst}
        self.dense[s1] = None
        self._stats = {k: v for k, v in self._stats.items() if k[0] != s1}

    # -- find_slot / apply_ubatch ----------------------------------------------------------------------

    def _find(self, s: int, n: int) -> np.ndarray | None:
        """`find_slot` (non-contiguous): the first n usable cells in ring order from the head, each cell
        tested once (n_tested < size), so fewer than n usable cells fail it."""
        spec = self.spec
        size = spec.size
        head = self.head[s]
        if head > self.used[s] + 2 * n:
            head = 0
        if n > size:
            return None
        pos, sq = self.pos[s], self.seq[s]
        lut = None
        if spec.n_swa > 0 and self.used[s]:
            lut = np.full(LLAMA_MAX_SEQ, -1, dtype=np.int64)
            for q in self.seqs[s]:
                lut[q] = self._minmax(s, q)[1]
        found: list[np.ndarray] = []
        need, start, scanned = n, head, 0
        while scanned < size and need > 0:  # [head, size), then [0, head): each cell tested once
            end = min(size if start >= head else head, start + max(self._WINDOW, 2 * need))
            wsq = sq[start:end]
            usable = wsq < 0
            if lut is not None:
                occ = ~usable
                if occ.any():
                    oi = np.flatnonzero(occ)
                    usable[oi] = is_masked(spec.swa_type, spec.n_swa, pos[start:end][oi].astype(np.int64),
                                            lut[wsq[oi]] + 1)
            idx = np.flatnonzero(usable)[:need]
            if len(idx):
                found.append(idx + start)
                need -= len(idx)
            scanned += end - start
            start = end if end < size else 0
        if need > 0:
            return None
        return np.concatenate(found) if len(found) > 1 else found[0]

    def _apply(self, groups: list[tuple[int, np.ndarray, np.ndarray, int | np.ndarray, np.ndarray]]) -> None:
        """`apply_ubatch`: groups of (stream, cell idxs, positions, seq(s), tokens) already found."""
        rm_max: dict[int, int] = {}
        for s, idxs, pos, seq, tok in groups:
            old_sq = self.seq[s][idxs]
            occ = old_sq >= 0
            n_new = len(idxs)
            if occ.any():
                old_pos = self.pos[s][idxs][occ]
                osq = old_sq[occ]
                for q in np.unique(osq):
                    q = int(q)
                    rm_max[q] = max(rm_max.get(q, -1), int(old_pos[osq == q].max()))
                    self._stats.pop((s, q), None)
                n_new -= int(occ.sum())
            self._write(s, idxs, pos, seq, tok)
            self.used[s] += n_new
            for q in (np.unique(seq).tolist() if isinstance(seq, np.ndarray) else [int(seq)]):
                self.seqs[s].add(int(q))
                v = self._stats.get((s, q))
                if v is not None:
                    pq = pos if not isinstance(seq, np.ndarray) else pos[seq == q]
                    lo, hi = int(pq.min()), int(pq.max())
                    self._stats[(s, q)] = (lo if v[0] < 0 else min(v[0], lo), max(v[1], hi))
        for q in sorted(rm_max):
            mx = rm_max[q]
            s = self.stream_of(q)
            pmin = self._minmax(s, q)[0]
            if pmin <= mx:
                self._rm(q, max(pmin, 0), mx + 1)
        for s, idxs, _, _, _ in groups:
            self.head[s] = int(idxs[-1]) + 1

    # -- generation in bulk (the simulator's fast-forward) -----------------------------------------------

    def _thresholds(self, pos: np.ndarray, free: np.ndarray) -> np.ndarray:
        """Per cell, the first query position at which `find_slot` may take it: -inf (FREE) for an
        empty cell, else the first P with `is_masked(pos, P)`. With one sequence in a stream the query
        is that sequence's pos_max + 1, and masking is monotonic in it (a masked cell stays masked as
        the sequence grows), so "usable at step P" is one comparison: threshold <= P."""
        n, t = self.spec.n_swa, self.spec.swa_type
        p = pos.astype(np.int64)
        if t == "standard":
            th = p + n
        elif t == "chunked":
            th = (p // n + 1) * n
        elif t == "symmetric":  # the query is always after the cell: only d > n_swa // 2 masks
            th = p + n // 2 + 1
        else:
            th = np.full(len(p), _NEVER, dtype=np.int64)
        th[free] = _FREE
        return th

    def advance_tokens(self, seqs: list[int], p0s: list[int], feed: np.ndarray, m: int) -> int:
        """Up to `m` decodes of one token per sequence at once, each what `prepare` + `commit` of that
        step would do: step j writes `feed[j, c]` at position `p0s[c] + j` of `seqs[c]`. Returns the
        steps applied (those before the first whose `find_slot` fails in some stream; then nothing of
        that step is written), or -1 (nothing changed) unless every sequence has a stream of its own
        holding no other sequence's cells and continues after its last cell here.

        Why it is exact: with one sequence a stream and one row a step, every split gives the same
        ubatch per stream (that row), streams do not interact, and the window masks a cell by its
        sequence's pos_max + 1, which is this step's position. So each stream is stepped alone
        (`_advance_stream`), and the streams' step counts agree unless one fails first (then all are
        redone to the smallest)."""
        spec = self.spec
        if m <= 0:
            return 0
        if spec.n_stream == 1 and len(seqs) > 1:
            return -1
        for q, p0 in zip(seqs, p0s):
            s = self.stream_of(q)
            d = self.dense[s]
            if d and d[0] == q:  # only q's cells, each position once (the dense record): no scan needed
                if d[2] >= p0:
                    return -1
                continue
            sq = self.seq[s]
            idx = np.flatnonzero(sq >= 0)
            if len(idx) and (sq[idx] != q).any():
                return -1  # another sequence's cells in the stream
            ps = np.sort(self.pos[s][idx])
            if len(ps) and (ps[-1] >= p0 or (len(ps) > 1 and (ps[1:] == ps[:-1]).any())):
                return -1  # not after its last cell, or a position held twice
        outs = [self._advance_stream(self.stream_of(q), q, p0, feed[:, c], m) for c, (q, p0) in enumerate(zip(seqs, p0s))]
        done = min(o[0] for o in outs)
        if done == 0:
            return 0
        if done < m:  # a stream failed first: the others stop at the same step
            outs = [self._advance_stream(self.stream_of(q), q, p0, feed[:, c], done)
                    for c, (q, p0) in enumerate(zip(seqs, p0s))]
        for q, (_, s, pos, sq, tk, head, used, lo_hi) in zip(seqs, outs):
            self.pos[s], self.seq[s], self.tok[s] = pos, sq, tk
            self.head[s], self.used[s] = head, used
            self.seqs[s].add(q)
            self._stats[(s, q)] = lo_hi
            # the stream holds only q, each position once (checked above; the run writes positions
            # above all of them): dense exactly when the count spans lo..hi
            self.dense[s] = (q, lo_hi[0], lo_hi[1]) if used and used == lo_hi[1] - lo_hi[0] + 1 else None
        return done

    def _advance_ring(self, s: int, q: int, p0: int, toks: np.ndarray, m: int):
        """`_advance_stream` where the stream is a full ring in order: every cell holds one of q's
        positions lo..hi (the dense record, size of them), cell head holds lo and the cells after it,
        around the ring, lo + 1, ..., hi (what a long prompt, or a generation, leaves), and p0 = hi + 1.
        None where it is not that (nothing read beyond the check).

        Then each step's find_slot takes the cell at the head: it holds the oldest position, lo + j at
        step j, which every window masks at p0 + j = lo + size + j once size > n_swa (standard:
        lo + j + n_swa <= p0 + j; chunked and symmetric mask sooner), the purge after it removes
        nothing else (lower positions are gone), and the head never resets (used = size). So the m
        steps write positions p0.. at the cells from the head around the ring, all at once."""
        d = self.dense[s]
        size = self.spec.size
        if not d or d[0] != q or self.used[s] != size or size <= self.spec.n_swa:
            return None
        _, lo, hi = d
        if hi - lo + 1 != size or p0 != hi + 1 or hi + m >= N_POSITIONS or m <= 0:
            return None
        head = self.head[s]
        c0 = head if head < size else 0
        ps = self.pos[s]
        w = size - c0  # cells c0.. hold lo .. lo + w - 1, cells ..c0 - 1 the rest
        if not ((ps[c0:] == POSITIONS[lo:lo + w]).all() and (ps[:c0] == POSITIONS[lo + w:hi + 1]).all()):
            return None
        pos, sq, tk = ps.copy(), self.seq[s].copy(), self.tok[s].copy()
        k = min(m, size)  # the last `size` steps are what the cells keep
        j0 = m - k  # the first step whose cell survives, at ring offset j0 % size from c0
        c = (c0 + j0) % size
        a = min(k, size - c)  # cells c.., then from 0
        pos[c:c + a] = POSITIONS[p0 + j0:p0 + j0 + a]
        tk[c:c + a] = toks[j0:j0 + a]
        if a < k:
            pos[:k - a] = POSITIONS[p0 + j0 + a:p0 + m]
            tk[:k - a] = toks[j0 + a:m]
        head = (c0 + m - 1) % size + 1
        return m, s, pos, sq, tk, head, size, (lo + m, p0 + m - 1)

    def _advance_stream(self, s: int, q: int, p0: int, toks: np.ndarray, m: int):
        """Step one stream holding only sequence `q` (or nothing) through up to `m` one-token decodes
        at positions p0, p0 + 1, ..., on copies of its cells; returns (steps done, s, pos, seq, tok,
        head, used, (pos_min, pos_max)).

        Stepped in runs, not token by token. A run starts with a plain `find_slot` from the head (the
        head reset when head > used + 2 included): the first cell, in ring order, whose threshold
        (`_thresholds`) the step's position has reached. The next steps then take the following cells
        one by one for as long as each is usable at its own step and the head neither wraps nor
        resets, all decided at once on numpy slices:

        * the purge `apply_ubatch` does after overwriting a masked cell of position po removes every
          cell of the sequence at or below po. A cell the run reaches while still occupied holds a
          position above every one reached before it (anything lower was purged), so the purge bound
          after step t is the running maximum M_t of the run cells' old positions, and the cells gone
          by then are exactly the sequence's cells (as the run began) at or below M_t: a prefix of
          them sorted by position, counted by one searchsorted;
        * so used after step t is used0 + (t + 1) - that count, which decides the head reset rule at
          step t + 1;
        * a cell purged before the run reaches it was masked already (its position is at most a
          masked one's), so "usable at its step" needs only its threshold as the run began; the cells
          the run writes hold positions above every M_t and are never purged within it."""
        r = self._advance_ring(s, q, p0, toks, m)
        if r is not None:
            return r
        size = self.spec.size
        pos, sq, tk = self.pos[s].copy(), self.seq[s].copy(), self.tok[s].copy()
        head, used = self.head[s], self.used[s]
        free = sq < 0
        th = self._thresholds(pos, free)
        occ = np.flatnonzero(~free)
        d = self.dense[s]
        if d and d[0] == q and len(occ):  # positions lo..hi, each once: ordered by a scatter, not a sort
            lo, hi = d[1], d[2]
            spos = np.arange(lo, hi + 1, dtype=np.int64)
            scell = np.empty(hi - lo + 1, dtype=occ.dtype)
            scell[pos[occ] - lo] = occ
        else:
            o = np.argsort(pos[occ], kind="stable")
            spos, scell = pos[occ][o].astype(np.int64), occ[o]  # the sequence's cells by position
        j = 0
        while j < m:
            P = p0 + j
            if head > used + 2:
                head = 0
            start = head if head < size else 0
            ok = th[start:] <= P
            i = int(ok.argmax())
            if ok[i]:
                c = start + i
            else:
                ok = th[:start] <= P
                i = int(ok.argmax()) if start else 0
                if not start or not ok[i]:
                    break  # find_slot fails: this step and the rest are refused
                c = i
            w = min(size - c, m - j)
            t = np.arange(w, dtype=np.int64)
            qv = pos[c:c + w].astype(np.int64)  # (an empty cell's position is -1)
            mx = np.maximum.accumulate(qv)
            gone = spos.searchsorted(mx, "right")
            used_t = used + 1 + t - gone
            if w > 1:
                stop = (th[c + 1:c + w] > P + t[1:]) | (c + t[1:] > used_t[:-1] + 2)
                i = int(stop.argmax())
                n = 1 + i if stop[i] else w
            else:
                n = 1
            k = int(gone[n - 1])
            if k:  # the purged cells (and the run's overwritten ones, rewritten just below)
                cells = scell[:k]
                pos[cells] = -1
                sq[cells] = -1
                tk[cells] = -1
                th[cells] = _FREE
            newp = np.arange(P, P + n, dtype=np.int64)
            pos[c:c + n] = newp
            sq[c:c + n] = q
            tk[c:c + n] = toks[j:j + n]
            th[c:c + n] = self._thresholds(newp, np.zeros(n, dtype=bool))
            spos = np.concatenate((spos[k:], newp))
            scell = np.concatenate((scell[k:], np.arange(c, c + n)))
            used = int(used_t[n - 1])
            head = c + n
            j += n
        lo_hi = (int(spos[0]), int(spos[-1])) if len(spos) else (-1, -1)
        return j, s, pos, sq, tk, head, used, lo_hi

    def prepare(self, ubatches, pos: np.ndarray, tok: np.ndarray) -> bool:
        """Place every ubatch in turn (journaled); False, with everything undone, when one does not fit.
        On True the cells stay placed until `commit` (or `rollback`).

        A group whose stream holds no other sequence's cells (every stream of `-np N` without
        `--kv-unified`, where the simulator spends its prompt time) takes `_find_one` / `_apply_one`:
        the same cells and purges with a third of the numpy calls. Streams do not interact, so such a
        group may be placed before the ubatch's other groups are found."""
        self._begin()
        for ub in ubatches:
            groups = []
            if self.spec.n_stream == 1:
                if len(ub) == 1 and self.seqs[0] <= {ub[0][0]}:
                    q, rows = ub[0]
                    if not self._place_one(0, q, pos[rows], tok[rows]):
                        self._rollback()
                        return False
                    continue
                rows = np.concatenate([r for _, r in ub]) if len(ub) > 1 else ub[0][1]
                idxs = self._find(0, len(rows))
                if idxs is None:
                    self._rollback()
                    return False
                seqs = np.concatenate([np.full(len(r), q, dtype=np.int16) for q, r in ub])
                groups.append((0, idxs, pos[rows], seqs, tok[rows]))
            else:
                for q, rows in sorted(ub, key=lambda g: g[0]):
                    s = self.stream_of(q)
                    if self.seqs[s] <= {q}:  # alone in its stream
                        if not self._place_one(s, q, pos[rows], tok[rows]):
                            self._rollback()
                            return False
                        continue
                    idxs = self._find(s, len(rows))
                    if idxs is None:
                        self._rollback()
                        return False
                    groups.append((s, idxs, pos[rows], q, tok[rows]))
            if groups:
                self._apply(groups)
        return True

    def place_alone(self, ubatches) -> bool:
        """`prepare` + `commit` of one decode whose every group is alone in its stream (`-np N` without
        `--kv-unified`), the groups given as (seq, positions, tokens) per ubatch: placed as `prepare`
        places them (ubatch by ubatch, groups by sequence), journaled; False, with everything undone,
        when one does not fit. The simulator's prompt fast-forward (`PaperMemory.advance_steps`) calls
        it per step, without building the step's batch arrays."""
        safe = self._cannot_fail(ubatches)  # then nothing needs undoing: no journal
        if not safe:
            self._begin()
        for ub in ubatches:
            for q, pos, tok in sorted(ub, key=lambda g: g[0]) if len(ub) > 1 else ub:
                if not self._place_one(self.stream_of(q), q, pos, tok, run=True):
                    if safe:
                        raise AssertionError(f"window cache: a group of {len(pos)} cells found no room, "
                                             "which its size rules out")
                    self._rollback()
                    return False
        if not safe:
            self._end()
        return True

    def _cannot_fail(self, ubatches) -> bool:
        """Whether `place_alone` of these groups cannot fail, so that no journal is needed to undo it:
        a window masks all but fewer than n_swa of a sequence's positions below its next one (standard,
        chunked and symmetric windows alike), so in a stream that holds only the sequence, each
        position once (its dense record, or nothing), and grows position after position, at most
        n_swa - 1 cells are not usable, and a group of at most size - n_swa + 1 cells always finds
        its cells."""
        spec = self.spec
        if spec.n_swa <= 0 or spec.swa_type not in ("standard", "chunked", "symmetric"):
            return False
        lim = spec.size - spec.n_swa + 1
        nxt: dict[int, int] = {}  # stream -> the position its next group must start at (-1: any)
        for ub in ubatches:
            for q, pos, _ in ub:
                n = len(pos)
                if n == 0 or n > lim:
                    return False
                s = self.stream_of(q)
                p = nxt.get(s)
                if p is None:
                    p = -1
                    if self.used[s]:
                        d = self._dense_of(s, q)
                        if not d or d[0] != q:
                            return False
                        p = d[2] + 1
                if p >= 0 and int(pos[0]) != p:
                    return False
                nxt[s] = int(pos[0]) + n  # (place_alone's groups are position after position)
        return True

    def _place_one(self, s: int, q: int, pos: np.ndarray, tok: np.ndarray, run: bool = False) -> bool:
        """Find and apply the cells of one group in a stream that holds only sequence `q`'s cells
        (False: find_slot fails; the caller rolls the decode back). `run`: `pos` is known to be
        position after position (an arange)."""
        r = self._place_dense(s, q, pos, tok, run)
        if r is not None:
            return r
        idxs = self._find_one(s, q, len(pos))
        if idxs is None:
            return False
        self._apply_one(s, q, idxs, pos, tok)
        return True

    def _dense_of(self, s: int, q: int):
        """The stream's dense record (q, lo, hi), computed when not known: does it hold exactly q's
        cells at positions lo..hi, each once? (False: no; None: the stream is empty.)"""
        d = self.dense[s]
        if d is None and self.used[s]:
            sq = self.seq[s]
            m = sq >= 0
            if (sq[m] != q).any():
                d = False
            else:
                p = self.pos[s][m]
                lo, hi = int(p.min()), int(p.max())
                d = (q, lo, hi) if hi - lo + 1 == len(p) and np.bincount(p - lo).max() == 1 else False
            self.dense[s] = d
        return d

    def _place_dense(self, s: int, q: int, pos: np.ndarray, tok: np.ndarray, run: bool = False) -> bool | None:
        """`_find_one` + `_apply_one` with slices, for the layout a prompt or a generation leaves: the
        stream is empty or holds q's positions lo..hi each once (`_dense_of`), the group writes
        hi + 1 .. hi + n, and the n cells from the (possibly reset) head are all usable, so find_slot
        takes exactly them. None: not that case (the caller takes the general path).

        Why it is exact: find_slot's first n usable cells in ring order from the head are [head,
        head + n) when every one of them is usable. The purge of `apply_ubatch` removes q's cells at
        or below mx, the largest position overwritten; with lo..hi each held once there are
        mx - lo + 1 of them, n_occ of which were overwritten, so only when more remain does a scan
        find them, and afterwards the stream holds mx + 1 .. hi + n (or lo .. hi + n without a purge),
        each once: the record stays exact without a look at the cells. On typical traffic every group
        of a `-np N` simulation takes this path (a few numpy calls on slices instead of masks over
        the whole stream)."""
        n = len(pos)
        size = self.spec.size
        used = self.used[s]
        if used:
            d = self.dense[s]
            if d is None:
                d = self._dense_of(s, q)
            if not d:
                return None
            _, lo, hi = d
            p0 = hi + 1
        else:
            lo, p0 = -1, int(pos[0])
        if int(pos[0]) != p0 or (n > 1 and not run and int(pos[-1]) != p0 + n - 1) or n > size:
            return None
        head = self.head[s]
        if head > used + 2 * n:
            head = 0
        if head >= size:
            head = 0  # find_slot's scan starts over at cell 0 (the ring order from a head at the end)
        if n > 1 and not run and not (pos[1:] - pos[:-1] == 1).all():
            return None
        sq, ps = self.seq[s], self.pos[s]
        sw, t = self.spec.n_swa, self.spec.swa_type
        if n == 1:  # (a generating row: scalar reads and writes, journaled as such)
            o, op = int(sq[head]), int(ps[head])
            mx = op if o >= 0 else -1
            if o >= 0 and not is_masked(t, sw, mx, p0):
                return None
            if self._journal is not None:
                self._journal.append((s, head, op, o, int(self.tok[s][head])))
            ps[head], sq[head], self.tok[s][head] = p0, q, int(tok[0])
            if o < 0:
                self.used[s] = used + 1
            elif mx > lo:  # q's cells lo..mx - 1 are left below the overwritten one: purged
                gone = np.flatnonzero((sq >= 0) & (ps <= mx))
                self._write(s, gone, -1, -1, -1, keep_dense=True)
                self.used[s] = used - len(gone)
            lo = p0 if used == 0 else (mx + 1 if o >= 0 else lo)
            self.head[s] = head + 1
            self.seqs[s].add(q)
            self.dense[s] = (q, lo, p0)
            self._stats[(s, q)] = (lo, p0)
            return True
        end = head + n
        if end <= size:
            nw = slice(head, end)
        else:  # the cells wrap around the ring: [head, size), then [0, end - size)
            nw = np.concatenate((np.arange(head, size), np.arange(end - size)))
            end -= size
        # an empty cell's position is -1, below every held one: the largest position overwritten is
        # the slice's maximum, -1 when every cell is free. Every window type masks a cell at p0 (the
        # group's first position, after all of q's) the more surely the older it is, so all are
        # masked exactly when the youngest, mx, is
        pw = ps[nw]
        mx = int(_MAX(pw))
        n_occ = 0
        if mx >= 0:  # (every cell taken, as in a full ring: one minimum instead of a count)
            n_occ = n if int(_MIN(pw)) >= 0 else int(np.count_nonzero(pw >= 0))
            if t == "standard":
                if p0 - mx < sw:
                    return None
            elif not is_masked(t, sw, mx, p0):
                return None
        tk = self.tok[s]  # (`_write`'s journaled write, inline: this runs for every ubatch group)
        if self._journal is not None:
            self._journal.append((s, nw, pw.copy(), sq[nw].copy(), tk[nw].copy()))
        ps[nw] = pos
        if n_occ < n:  # (a taken cell holds q already: the stream holds only q's cells)
            sq[nw] = q
        tk[nw] = tok
        used += n - n_occ
        hi = p0 + n - 1
        if mx >= lo >= 0:  # the purge: q's cells at or below mx
            left = mx - lo + 1 - n_occ
            if left:
                gone = np.flatnonzero((sq >= 0) & (ps <= mx))
                self._write(s, gone, -1, -1, -1, keep_dense=True)
                used -= len(gone)
            lo = mx + 1
        elif lo < 0:
            lo = p0
        self.used[s] = used
        self.head[s] = end
        self.seqs[s].add(q)
        self.dense[s] = (q, lo, hi)
        self._stats[(s, q)] = (lo, hi)
        return True

    def _find_one(self, s: int, q: int, n: int) -> np.ndarray | None:
        """`_find` in a stream that holds only sequence `q`'s cells: usable = empty, or masked at q's
        pos_max + 1; the first n in ring order from the (possibly reset) head, as find_slot tests them."""
        size = self.spec.size
        if n > size:
            return None
        head, used = self.head[s], self.used[s]
        if head > used + 2 * n:
            head = 0
        if used == 0:  # every cell empty
            idx = np.arange(head, head + n)
            return idx if head + n <= size else idx % size
        sq = self.seq[s]
        p1 = self._minmax(s, q)[1] + 1
        u = is_masked(self.spec.swa_type, self.spec.n_swa, self.pos[s], p1)
        u |= sq < 0
        after = np.flatnonzero(u[head:])
        if len(after) >= n:
            return after[:n] + head
        before = np.flatnonzero(u[:head])[:n - len(after)]
        if len(after) + len(before) < n:
            return None
        return np.concatenate((after + head, before))

    def _apply_one(self, s: int, q: int, idxs: np.ndarray, pos: np.ndarray, tok: np.ndarray) -> None:
        """`_apply` of one group in a stream holding only `q`'s cells: write, then the purge of q's
        cells at or below the largest position overwritten (every q cell is at or above pos_min, so
        `pos <= mx` is the range [pos_min, mx]); the head after the last cell written."""
        psq, ppos = self.seq[s], self.pos[s]
        old = psq[idxs]
        occ = old >= 0
        n_occ = int(np.count_nonzero(occ))
        mx = int(ppos[idxs][occ].max()) if n_occ else -1
        self._write(s, idxs, pos, q, tok)
        self.used[s] += len(idxs) - n_occ
        self.seqs[s].add(q)
        key = (s, q)
        if n_occ:
            self._stats.pop(key, None)
        else:
            v = self._stats.get(key)
            if v is not None:
                lo, hi = int(pos.min()), int(pos.max())
                self._stats[key] = (lo if v[0] < 0 else min(v[0], lo), max(v[1], hi))
        if mx >= 0 and self._minmax(s, q)[0] <= mx:
            gone = np.flatnonzero((psq >= 0) & (ppos <= mx))
            self._write(s, gone, -1, -1, -1)
            self.used[s] -= len(gone)
            self._stats.pop(key, None)
        self.head[s] = int(idxs[-1]) + 1

    def commit(self) -> None:
        self._end()

    def rollback(self) -> None:
        self._rollback()

    def restore(self, seq: int, pos: np.ndarray, tok: np.ndarray) -> bool:
        """`state_read_meta`: remove the sequence, find len(pos) cells as one ubatch, place them.
        No cells: nothing happens (`state_read` skips a stream with cell_count 0)."""
        if len(pos) == 0:
            return True
        self._rm(seq, 0, I32_MAX)
        if len(pos) > self.spec.size:
            return False
        s = self.stream_of(seq)
        if self.seqs[s] <= {seq}:  # its stream holds nothing else now: as `prepare` places a lone group
            return self._place_one(s, seq, pos, tok)
        idxs = self._find(s, len(pos))
        if idxs is None:
            return False
        self._apply([(s, idxs, pos, seq, tok)])
        return True

