"""The memory of one `llama_context` (the target, or the draft of `-md`) on paper.

`PaperContext` holds the caches llama.cpp's `create_memory` builds for the model and answers what
`llama_memory_*` and `llama_decode` answer: a plain KV cache (`CountCache`), or the iSWA pair of a SWA
model (a full cache for the full-attention layers and a window cache of
`pad(n_swa * (n_seq if unified else 1) + n_ubatch, 256)` cells, the whole context with `--swa-full`).
`decode` applies `llama_batch_allocr`'s position checks (-1 on a non-consecutive batch), splits into
ubatches as the memory's `init_batch` does (`split_simple` / `split_equal`) and prepares every cache
before committing any, so it returns 1 ("failed to find free space") exactly when the real context
does. The state (`state_size`, `payload`, `writer`, `restore`, `read_real`) is written and read
part by part, in the order of the memory's `state_write`; PARTIAL_ONLY writes the window cache only."""

from __future__ import annotations

import struct
from typing import Sequence

import numpy as np

from slotlab.errors import ConfigError, ModelError
from slotlab.memory.paper.blob import PaperState
from slotlab.memory.paper.cells import CountCache
from slotlab.memory.paper.window import CellCache
from slotlab.memory.paper.format import (I32_MAX, IO_MAGIC, CacheSpec, RecurrentSpec, Source, StateReadError, Writer,
                                         kv_layers, pad)
from slotlab.memory.paper.recurrent import RecurrentCache
from slotlab.memory.paper.vocab import outside
from slotlab.memory.profile import ModelProfile

__all__ = ["PaperContext", "split_equal", "split_simple", "step_batch"]


class PaperContext:
    """The memory of one `llama_context`, as `llama_model::create_memory` builds it for the profile:

    * "kv": a KV cache, or the iSWA pair (full + window) of a SWA model;
    * "recurrent": a recurrent memory (recurrent.py), one state a sequence;
    * "hybrid": an attention part (a KV cache over the attention layers, or an iSWA pair when the
      model has a sliding window: llama_memory_hybrid_iswa) plus a recurrent part over the
      recurrent layers (llama_memory_hybrid).

    `caches` lists the parts in `state_write` order (attention first)."""

    def __init__(self, profile: ModelProfile, *, n_ctx_seq: int, n_seq_max: int, unified: bool, swa_full: bool,
                 n_ubatch: int, type_k: str, type_v: str, v_trans: bool):
        if profile.memory not in ("kv", "recurrent", "hybrid"):
            raise ConfigError(f"{profile.architecture}: a model without a memory ({profile.memory}) cannot be served")
        if profile.unsized:
            raise ModelError(profile.unsized)
        self.profile = profile
        self.kind = profile.memory
        self.n_seq_max = n_seq_max
        n_stream = 1 if unified else n_seq_max
        ext = profile.n_pos_per_embd > 1
        self.can_shift = profile.n_pos_per_embd == 1 and profile.architecture != "step35"
        self.iswa = profile.is_swa_model and self.kind != "recurrent"
        attn: tuple = ()
        if self.kind == "recurrent":
            pass
        elif self.iswa:
            size_swa = pad(min(n_ctx_seq, profile.n_swa * (n_seq_max if unified else 1) + n_ubatch))
            if swa_full:
                size_swa = n_ctx_seq
            base = CacheSpec("base", n_ctx_seq, n_stream, n_seq_max, 0, "none",
                             kv_layers(profile, profile.layers(False), type_k, type_v), v_trans, ext)
            swa = CacheSpec("swa", size_swa, n_stream, n_seq_max, profile.n_swa, profile.swa_type,
                            kv_layers(profile, profile.layers(True), type_k, type_v), v_trans, ext)
            attn = (CountCache(base), CellCache(swa))
            self.can_shift = self.can_shift and base.size == swa.size
        else:
            kv = CacheSpec("kv", n_ctx_seq, n_stream, n_seq_max, 0, "none",
                           kv_layers(profile, profile.layers(), type_k, type_v), v_trans, ext)
            attn = (CountCache(kv),)
        self.attn = attn
        self.recr: RecurrentCache | None = None
        if self.kind != "kv":
            size = max(1, n_seq_max)
            self.recr = RecurrentCache(RecurrentSpec("rs", size, profile.n_layer_trunk(), len(profile.rs_layers()),
                                                     4 * profile.n_embd_r(), 4 * profile.n_embd_s()))
            if self.kind == "recurrent":
                self.can_shift = True  # llama_memory_recurrent::get_can_shift: only the position moves
        self.caches: tuple = attn + ((self.recr,) if self.recr is not None else ())
        self.pos_cache = attn[-1] if attn else self.recr  # the iSWA pair reports its window cache's positions
        # PARTIAL_ONLY: a plain KV cache ignores it (writes everything), an iSWA pair writes its window
        # cache, a hybrid memory skips its attention part unless that is an iSWA pair (which then
        # writes its window cache), the recurrent state is always written
        if self.kind == "kv":
            self.partial_parts = (1,) if self.iswa else (0,)
        else:
            self.partial_parts = ((1,) if self.iswa else ()) + (len(self.caches) - 1,)
        self.plain_kv = self.kind == "kv" and not self.iswa  # one count cache: the simulator's bulk paths

    def parts(self, partial: bool) -> tuple[int, ...]:
        return self.partial_parts if partial else tuple(range(len(self.caches)))

    def key(self, partial: bool) -> tuple:
        return tuple(self.caches[i].spec.key for i in self.parts(partial))

    # -- sequence operations ----------------------------------------------------------------------

    def seq_rm(self, seq: int, p0: int, p1: int) -> bool:
        """`llama_memory_seq_rm`: False when the recurrent part refuses (then nothing changed: the
        hybrid memory asks it first)."""
        p0 = 0 if p0 < 0 else p0
        p1 = I32_MAX if p1 < 0 else p1
        if self.recr is not None and not self.recr.seq_rm(seq, p0, p1):
            return False
        for c in self.attn:
            c.seq_rm(seq, p0, p1)
        return True

    def seq_add(self, seq: int, p0: int, p1: int, d: int) -> None:
        if d == 0:
            return
        p0 = 0 if p0 < 0 else p0
        p1 = I32_MAX if p1 < 0 else p1
        if p0 == p1:
            return
        for c in self.caches:
            c.seq_add(seq, p0, p1, d)

    def seq_cp(self, src: int, dst: int) -> None:
        if src == dst:
            return
        if self.attn and self.attn[0].spec.n_stream == 1:
            raise NotImplementedError("seq_cp inside one stream (cells shared by two sequences) is not modelled "
                                      "by the paper memory")
        for c in self.caches:
            c.seq_cp(src, dst)

    def seq_keep(self, seq: int) -> None:
        for c in self.caches:
            c.seq_keep(seq)

    def pos_min(self, seq: int) -> int:
        """The hybrid memory reports the larger of its parts' minimums (the recurrent part's: its end)."""
        if self.recr is None or not self.attn:
            return self.pos_cache.pos_min(seq)
        return max(self.pos_cache.pos_min(seq), self.recr.pos_min(seq))

    def pos_max(self, seq: int) -> int:
        """The hybrid memory reports the smaller of its parts' maximums."""
        if self.recr is None or not self.attn:
            return self.pos_cache.pos_max(seq)
        return min(self.pos_cache.pos_max(seq), self.recr.pos_max(seq))

    def clear(self) -> None:
        for c in self.caches:
            c.clear()

    # -- state ----------------------------------------------------------------------------------------

    def state_size(self, seq: int, partial: bool) -> int:
        return 8 + sum(self.caches[i].spec.write_size(self.caches[i].n_written(seq)) for i in self.parts(partial))

    def payload(self, seq: int, partial: bool) -> PaperState:
        ids = self.parts(partial)
        parts = tuple(self.caches[i].written(seq) for i in ids)
        size = 8 + sum(self.caches[i].spec.write_size(len(p)) for i, (p, _) in zip(ids, parts))
        return PaperState(self.key(partial), parts, size, seq, tuple(self.caches[i].spec for i in ids),
                          tuple(self.caches[i].stream_of(seq) for i in ids))

    def writer(self, seq: int, partial: bool, *, header: bool = True) -> Writer:
        w = Writer()
        if header:
            w.put(struct.pack("<Ii", IO_MAGIC, seq))
        for i in self.parts(partial):
            c = self.caches[i]
            p, t = c.written(seq)
            c.spec.write_part(w, c.stream_of(seq), seq, p, t)
        return w

    def restore(self, seq: int, partial: bool, parts: Sequence[tuple[np.ndarray, np.ndarray]] | None,
                n_ok: int | None = None) -> bool:
        """Restore parts (cells per cache, in order). `n_ok`: only the first n parts parsed; the next
        cache then fails (it is emptied of the sequence, as `state_clear` does). When the recurrent
        part of a hybrid memory fails, the attention part read before it is cleared too
        (llama_memory_hybrid::state_read; the iSWA hybrid does not)."""
        ids = self.parts(partial)
        n_ok = len(ids) if n_ok is None else n_ok
        for j, i in enumerate(ids):
            c = self.caches[i]
            ok = j < n_ok
            if ok:
                p, t = parts[j]
                ok = c.restore(seq, np.asarray(p, dtype=np.int32), np.asarray(t, dtype=np.int32))
            if not ok:
                c.seq_rm(seq, 0, I32_MAX)
                if c is self.recr and self.kind == "hybrid" and not self.iswa:
                    for k in ids[:j]:
                        self.caches[k].seq_rm(seq, 0, I32_MAX)
                return False
        return True

    def read_real(self, src, off: int, seq: int, partial: bool) -> int:
        """Parse real-format bytes (a buffer or a `Source`) from `off` and restore them; returns the end
        offset, or 0 on failure."""
        if not isinstance(src, Source):
            src = Source(src)
        parts = []
        ids = self.parts(partial)
        for i in ids:
            spec = self.caches[i].spec
            try:
                off, streams = spec.read_part(src, off)
            except StateReadError:
                self.restore(seq, partial, parts, n_ok=len(parts))
                return 0
            if streams:
                _, p, t = streams[-1]  # every stream loads into the destination's: the last one wins
            else:
                p, t = np.empty(0, np.int32), np.empty(0, np.int32)
            parts.append((p, t))
        return off if self.restore(seq, partial, parts) else 0

    # -- decode -----------------------------------------------------------------------------------------

    def decode(self, tok: np.ndarray, pos: np.ndarray, seq: np.ndarray, n_ubatch: int, n_vocab: int) -> int:
        n = len(tok)
        if n == 0:
            return -1
        if n_vocab > 0 and outside(tok, n_vocab):
            return -1
        # every step of a simulation decodes here: numpy calls are kept few (runs and slices, not masks)
        runs = self._runs(seq)
        first: dict[int, tuple[int, int]] = {}  # seq -> its only run (a, b); (-1, -1): several runs
        for q, a, b in runs:
            first[q] = (a, b) if q not in first else (-1, -1)
        qs = sorted(first)  # np.unique(seq), from the runs
        if qs[0] < 0 or qs[-1] >= self.n_seq_max:
            return -1
        # llama_batch_allocr::init: positions must continue each sequence (Y = X + 1), never decrease
        mrope = self.profile.n_pos_per_embd > 1
        last: dict[int, int] = {}  # seq -> its last position in the batch (where a recurrent state ends)
        for q in qs:
            a, b = first[q]
            pq = pos[a:b] if a >= 0 else pos[seq == q]
            lo, hi = int(pq[0]), int(pq[-1])  # sorted (checked below): the extremes are the ends
            last[q] = hi
            if len(pq) > 1:
                d = pq[1:] - pq[:-1]
                if d.min() < 0:
                    return -1
            p0 = self.pos_max(q)
            if mrope:
                if p0 >= 0 and p0 >= lo:
                    return -1
            else:
                if p0 >= 0 and lo != p0 + 1:
                    return -1
                if hi - lo + 1 > (1 + int(np.count_nonzero(d)) if len(pq) > 1 else 1):  # distinct values
                    return -1
        if self.attn:
            rc = self._place(n, n_ubatch, runs, first, seq, pos, tok)
            if rc != 0:
                return rc
        if self.recr is not None:  # its find_slot cannot fail: every sequence id below n_seq_max has a cell
            self.recr.commit(last)
        return 0

    def advance_tokens(self, seqs: list[int], p0s: list[int], feed: np.ndarray) -> int:
        """Up to `len(feed)` decodes of one token per sequence at once (step j: `feed[j, c]` at position
        `p0s[c] + j` of `seqs[c]`; the caller checked that each continues its sequence, p0 = pos_max + 1).
        Returns the steps applied, those before the first that `decode` would refuse (1: no cells), or
        -1 (nothing changed) where only the real per-step decode knows: a window cache whose stream
        several sequences share (`CellCache.advance_tokens`).

        A count cache (the full-attention cache, the full half of an iSWA pair, a hybrid memory's
        attention part) fails a step exactly when a stream lacks a free cell for its rows, whatever
        the split; the recurrent part never fails and ends each sequence at its last position."""
        k, b = feed.shape
        m = k
        if self.attn:
            base = self.attn[0]
            if any(base.pos_max(q) >= p for q, p in zip(seqs, p0s)):
                return -1  # (a hybrid memory's pos_max is its parts' smaller one)
            if base.spec.n_stream == 1:
                m = min(m, base.free(0) // b)
            else:
                m = min([m] + [base.free(base.stream_of(q)) for q in seqs])
            if m <= 0:
                return 0
            if self.iswa:
                m = self.attn[1].advance_tokens(seqs, p0s, feed, m)
                if m <= 0:
                    return m
            steps = np.arange(m, dtype=np.int32)
            for c, q in enumerate(seqs):
                base.seq_cells(q).extend(p0s[c] + steps, feed[:m, c], in_order=True)
                base.used[base.stream_of(q)] += m
        if self.recr is not None:
            self.recr.commit({q: p0 + m - 1 for q, p0 in zip(seqs, p0s)})
        return m

    def _place(self, n, n_ubatch, runs, first, seq, pos, tok) -> int:
        """Find cells for the batch in the attention caches and write them (0), or change nothing (1),
        splitting as the memory's `init_batch` does: a KV memory (iSWA too) split_simple when unified
        (the iSWA pair retries with split_equal), else split_equal sequential; a hybrid memory
        split_equal, sequential unless unified."""
        unified = self.attn[0].spec.n_stream == 1
        hybrid = self.kind == "hybrid"
        if self.iswa:
            base, win = self.attn
            # the full half, split-free where no ubatch can exceed it (see `_unsplit`): checked once,
            # written after the window half has found its cells
            rows = self._unsplit(base, n_ubatch, first, seq, pos, tok)
            if rows is False:
                return 1
            if hybrid:
                attempts = [split_equal(runs, seq, n_ubatch, sequential=not unified)]
            else:
                attempts = [split_simple(n, n_ubatch, seq), None] if unified else [None]
            for ubs in attempts:
                if ubs is None:
                    ubs = split_equal(runs, seq, n_ubatch, sequential=not unified)
                if rows is None and not base.prepare(ubs):
                    continue
                if not win.prepare(ubs, pos, tok):
                    continue
                if rows is None:
                    base.commit(ubs, pos, tok)
                else:
                    self._append(base, rows)
                win.commit()
                return 0
            return 1
        cache = self.attn[0]
        rows = self._unsplit(cache, n_ubatch, first, seq, pos, tok)
        if rows is False:
            return 1
        if rows is not None:
            self._append(cache, rows)
            return 0
        if unified and not hybrid:
            ubs = split_simple(n, n_ubatch, seq)
        else:
            ubs = split_equal(runs, seq, n_ubatch, sequential=not (hybrid and unified))
        if not cache.prepare(ubs):
            return 1
        cache.commit(ubs, pos, tok)
        return 0

    @staticmethod
    def _unsplit(cache: CountCache, n_ubatch: int, first, seq, pos, tok):
        """A count cache's part of a decode without splitting it: each sequence's rows (positions,
        tokens), or False when they do not fit; None where the split matters (a cache smaller than a
        ubatch).

        Why: no ubatch can exceed a cache of at least n_ubatch cells, so `prepare` over the ubatches
        (split_simple / split_equal) fails exactly when a stream's rows exceed its free cells, and
        `commit` appends each sequence's rows in batch order whatever the split: the same outcome
        without splitting. (The iSWA pair's window half still needs the split.)"""
        if cache.spec.size < n_ubatch:
            return None
        rows = {q: (pos[a:b], tok[a:b]) if a >= 0 else (pos[seq == q], tok[seq == q]) for q, (a, b) in first.items()}
        need: dict[int, int] = {}
        for q, (pq, _) in rows.items():
            st = cache.stream_of(q)
            need[st] = need.get(st, 0) + len(pq)
        if any(k > cache.free(st) for st, k in need.items()):
            return False
        return rows

    @staticmethod
    def _append(cache: CountCache, rows) -> None:
        """Write `_unsplit`'s rows. `decode` checked that each sequence's positions do not decrease in
        the batch and start after the memory's pos_max; that is this cache's unless it is the full
        half of an iSWA pair (whose pos_max the window half reports), so the start is compared here."""
        for q, (pq, tq) in rows.items():
            sc = cache.seq_cells(q)
            sc.extend(pq, tq, in_order=not (sc.n and pq[0] < sc.pos[sc.n - 1]))
            cache.used[cache.stream_of(q)] += len(pq)

    @staticmethod
    def _runs(seq: np.ndarray) -> list[tuple[int, int, int]]:
        """Maximal runs of one sequence in batch order: (seq, start, end)."""
        n = len(seq)
        if n == 1:
            return [(int(seq[0]), 0, 1)]
        cut = (np.flatnonzero(seq[1:] != seq[:-1]) + 1).tolist()
        starts = [0] + cut
        return [(q, a, b) for q, a, b in zip(seq[starts].tolist(), starts, cut + [n])]


def split_simple(n: int, n_ubatch: int, seq: np.ndarray) -> list[list[tuple[int, np.ndarray]]]:
    """`split_simple`: consecutive rows, n_ubatch at a time (each ubatch as per-sequence row groups)."""
    out = []
    for a in range(0, n, n_ubatch):
        rows = np.arange(a, min(n, a + n_ubatch))
        # keep batch order: groups of consecutive rows of one sequence
        sq = seq[rows]
        cut = np.flatnonzero(np.diff(sq)) + 1
        out.append([(int(sq[r[0] - a]), r) for r in np.split(rows, cut)])
    return out


def split_equal(runs, seq: np.ndarray, n_ubatch: int, sequential: bool) -> list[list[tuple[int, np.ndarray]]]:
    """`split_equal`: per ubatch, a set of sequences (in order of appearance; with `sequential`
    consecutive increasing ids), the same number of rows of each."""
    if len({r[0] for r in runs}) == len(runs):
        return _split_equal_runs(runs, n_ubatch, sequential)
    return _split_equal_rows(runs, seq, n_ubatch, sequential)


def _split_equal_rows(runs, seq: np.ndarray, n_ubatch: int, sequential: bool) -> list[list[tuple[int, np.ndarray]]]:
    """`split_equal` for any batch: each sequence's rows, wherever its runs are."""
    rows_of: dict[int, np.ndarray] = {}
    if len(runs) == 1:
        rows_of[runs[0][0]] = np.arange(len(seq))
    else:
        for q in sorted({r[0] for r in runs}):  # np.unique(seq), from the runs
            rows_of[q] = np.flatnonzero(seq == q)
    cur_idx = {q: 0 for q in rows_of}
    n_left = len(seq)
    out = []
    while n_left > 0:
        chosen: list[int] = []
        last = -1
        for q, a, b in runs:
            # a run is "unused" while its sequence still has rows at or after this run's start
            r = rows_of[q]
            if cur_idx[q] >= len(r) or r[cur_idx[q]] >= b:
                continue
            if q in chosen:
                continue
            if sequential and chosen and q != last + 1:
                continue
            chosen.append(q)
            last = q
            if len(chosen) > n_ubatch:
                break
        if not chosen:
            break
        k_max = max(1, n_ubatch // len(chosen))
        k = min(min(len(rows_of[q]) - cur_idx[q] for q in chosen), k_max)
        ub = []
        for q in chosen:
            i = cur_idx[q]
            ub.append((q, rows_of[q][i:i + k]))
            cur_idx[q] = i + k
            n_left -= k
        out.append(ub)
    return out


def _split_equal_runs(runs, n_ubatch: int, sequential: bool) -> list[list[tuple[int, np.ndarray]]]:
    """`split_equal` where every sequence has one run of rows (the batches the server builds: one token
    per generating slot, a chunk per prompt): `split_equal_spans` as row indices."""
    return [[(q, np.arange(i, i + k)) for q, i, k in ub] for ub in split_equal_spans(runs, n_ubatch, sequential)]


_SPANS: dict = {}  # split_equal_spans' answers, by its arguments (a fast-forward's steps repeat a few shapes)


def split_equal_spans(runs, n_ubatch: int, sequential: bool) -> list[list[tuple[int, int, int]]]:
    """`split_equal` where every sequence has one run of rows, runs given as (seq, start, end) in
    row order: per ubatch its groups (seq, first row, rows). That a sequence's rows are a..b makes
    "still has rows at or after the run's start" mean "not used up", decided on integers; the same
    ubatches as the general loop (`_split_equal_rows`).

    A pure function of its arguments, remembered: the steps of a prompt fast-forward have the same
    rows (one per generating slot, then the chunk) step after step. The answer is shared: read it,
    do not change it."""
    key = (tuple(runs), n_ubatch, sequential)
    out = _SPANS.get(key)
    if out is None:
        if len(_SPANS) >= 4096:
            _SPANS.clear()
        out = _SPANS[key] = _split_equal_spans(runs, n_ubatch, sequential)
    return out


def _split_equal_spans(runs, n_ubatch: int, sequential: bool) -> list[list[tuple[int, int, int]]]:
    cur = {q: a for q, a, _ in runs}
    n_left = sum(b - a for _, a, b in runs)
    out = []
    while n_left > 0:
        chosen: list[tuple[int, int]] = []  # (seq, end of its run)
        last = -1
        for q, _, b in runs:
            if cur[q] >= b:
                continue
            if sequential and chosen and q != last + 1:
                continue
            chosen.append((q, b))
            last = q
            if len(chosen) > n_ubatch:
                break
        if not chosen:
            break
        k = min(min(b - cur[q] for q, b in chosen), max(1, n_ubatch // len(chosen)))
        ub = []
        for q, _ in chosen:
            ub.append((q, cur[q], k))
            cur[q] += k
        n_left -= k * len(chosen)
        out.append(ub)
    return out


def step_batch(runs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A step of `PaperMemory.advance_steps` as batch rows (tokens, positions, sequences)."""
    tok = np.concatenate([np.asarray(t, dtype=np.int32) for _, t, _ in runs])
    pos = np.concatenate([np.arange(p0, p0 + len(t), dtype=np.int32) for _, t, p0 in runs])
    seq = np.concatenate([np.full(len(t), q, dtype=np.int32) for q, t, _ in runs])
    return tok, pos, seq

