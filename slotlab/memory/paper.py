"""A paper memory: llama.cpp's KV memory on paper — token ids and positions per cell, no tensors.

`PaperMemory` implements the `Memory` interface (base.py) for the simulator: it computes everything
the server's decisions depend on the way the pinned llama.cpp does, from a `ModelProfile` (a GGUF
header or a JSON profile, profile.py), so an 8B or 70B model can be "served" on a laptop:

* state sizes exactly as `llama_state_seq_get_size_ext` reports them, full and PARTIAL_ONLY, for
  the target and the draft context (src/llama-context.cpp `state_seq_get_size`: an 8-byte header,
  then each cache's `state_write`: stream count, per-stream cell count, per cell position / seq
  count / seq id (+ a 12-byte extension with M-RoPE), `v_trans`, layer count, and per layer the
  K (and V) type, row size and rows of the cells; src/llama-kv-cache.cpp);
* the cell pool: llama.cpp's `find_slot` (a ring scan from the stream's head that may reuse cells
  the sliding window masks), `apply_ubatch` (and its purge of the older positions of a sequence whose
  cell was reused), the ubatch splits (`split_simple` / `split_equal`), one pool of n_ctx cells with
  `--kv-unified`, one stream of n_ctx_seq cells per slot otherwise — so `decode` returns 1 ("failed to
  find free space") exactly when the real context does, and `pos_min` after a decode is the real one;
* the iSWA pair of caches of a SWA model (Gemma 2/3, gpt-oss, ...): a full cache for the full-attention
  layers and a window cache of `pad(n_swa * (n_seq if unified else 1) + n_ubatch, 256)` cells (the
  whole context with `--swa-full`); PARTIAL_ONLY writes the window cache only; `pos_min` / `pos_max`
  are the window cache's; the state holds only the cells the window does not mask;
* `seq_rm` (type PART), `seq_add` / `can_shift` (false for a SWA model unless both caches have the
  same size, i.e. `--swa-full` or a context no larger than the window cache), the position checks of
  `llama_batch_allocr` (decode returns -1 on a non-consecutive batch).

Layout only matters in the window cache; the full cache (and a non-SWA model's cache) is modelled by
its cell counts and sorted positions per sequence, which is observably the same (every free cell is
usable there, and a state's size does not depend on cell order), and O(tokens) per decode.

State blobs are `PaperBlob`s: numpy uint8 arrays whose `len()` / `.nbytes` are the real size but which
occupy no memory (a zero-stride view of one byte) and carry the cells as a compact payload. They pass
through the RAM prompt cache and checkpoints like real buffers (`.copy()` is cheap). Give the engine
`allocate=paper_allocate` (or a `PaperAllocator`) so the cache's entries are PaperBlobs too; with the
default numpy allocator `state_get(out=...)` writes the real llama.cpp byte format (tensor data left
zero) into the buffer, which `state_set` reads back — a real context can also load those bytes.

Slot files (`save_file`) are real llama.cpp sequence-state files (magic, version, token payload, state)
with the tensor data written as holes (sparse files): the byte count and file size are the real ones.

Not modelled: recurrent and hybrid memories (ModelProfile.memory != "kv"), cells shared by several
sequences (`seq_cp` inside one stream), the contents of the K/V tensors. The sampler and the draft
model produce placeholder tokens (see `PaperVocab`).

Usage (what `slotlab simulate` does)::

    params = ServerParams.from_args("-m llama-70b.gguf -np 4 -c 131072 --cache-ram 65536")
    mem = PaperMemory.from_params(params)            # reads the GGUF header only
    eng = Engine(params, memory=mem, allocate=PaperAllocator(limit_bytes=None))
    t = eng.submit(token_ids, n_predict=64)          # token ids: there is no tokenizer
    eng.run_until(lambda: t.done)"""

from __future__ import annotations

import logging

import os
import struct
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from slotlab.errors import ConfigError, ShiftNotSupported
from slotlab.memory.base import SEQ_RM_PART, Batch, MemoryInfo
from slotlab.memory.profile import GGML_TYPES, ModelProfile, row_size

__all__ = ["PaperAllocator", "PaperBlob", "PaperMemory", "PaperVocab", "paper_allocate", "paper_sizes"]

LLAMA_MAX_SEQ = 256
IO_MAGIC = 0xAF143CD8  # llama-context.cpp io_magic: the first u32 of a sequence state blob
STATE_SEQ_MAGIC = 0x67677371  # 'ggsq': llama_state_seq_save_file
STATE_SEQ_VERSION = 3
_I32_MAX = 2**31 - 1


def _pad(n: int, k: int = 256) -> int:
    return (n + k - 1) // k * k


# ============================================================================ blobs

_ONE_BYTE = np.zeros(1, dtype=np.uint8)


class PaperBlob(np.ndarray):
    """A state buffer of `len(blob)` bytes that occupies none: a read-only zero-stride uint8 view of
    one zero byte. `payload` (a `PaperState`, or None while empty) is what a real buffer's bytes would
    say. `.copy()` copies the reference, not bytes; `bytes(blob)` would materialize zeros — avoid it."""

    payload: "PaperState | None"

    def __new__(cls, n: int, payload: "PaperState | None" = None) -> "PaperBlob":
        n = int(n)
        if n < 0:
            raise ValueError(f"a blob of {n} bytes")
        # ndarray's own constructor over the one byte (as_strided, its equivalent, costs 10x more: the
        # simulator makes two blobs per RAM-cache save)
        obj = np.ndarray.__new__(cls, (n,), np.uint8, _ONE_BYTE, 0, (0,))
        obj.flags.writeable = False
        obj.payload = payload
        return obj

    def __array_finalize__(self, obj) -> None:
        self.payload = getattr(obj, "payload", None)

    def copy(self, order="C") -> "PaperBlob":  # noqa: D401 - ndarray's signature
        return PaperBlob(len(self), self.payload)

    def __reduce__(self):
        return (PaperBlob, (len(self), self.payload))

    def __bytes__(self) -> bytes:
        """The real llama.cpp bytes of this state (K/V data zero): what `bytes(blob)` gives, so a blob
        written out (a slot-file appendix) can be restored by a paper memory or a real context."""
        if self.payload is None:
            return bytes(len(self))
        return self.payload.to_bytes()

    def tobytes(self, order="C") -> bytes:
        return bytes(self)

    def __repr__(self) -> str:
        what = "empty" if self.payload is None else f"{self.payload.n_cells} cells"
        return f"PaperBlob({len(self)} bytes, {what})"


def paper_allocate(n: int) -> PaperBlob:
    """An `allocate` callable for `Engine(..., allocate=paper_allocate)`: an empty PaperBlob of n bytes."""
    return PaperBlob(n)


class PaperAllocator:
    """`allocate` with a RAM budget: raises MemoryError (the server's std::bad_alloc) when the blobs it
    handed out and that are still alive would exceed `limit_bytes`. Tracks `live_bytes` and
    `peak_bytes` (a blob is freed when the cache drops it: release after restore, eviction).

    Unbound, "alive" means "still referenced from Python", which lags the server: `PromptCache.alloc`
    keeps the entries it evicts to make room referenced (a local list) until it returns, so at the
    moment it allocates the new entry those are still counted, although the server freed them
    (`states.pop_front()`) before its allocation. `bind(cache)` counts what the server's heap holds
    instead: the bytes of the cache's current entries (`size()`: state blobs and checkpoints) plus
    the blobs handed out for the entry being built (since the last entry was appended) and still alive. `PaperAllocator.bind` is used
    by the simulator (slotlab/sim/paper_replay.py `paper_engine`)."""

    def __init__(self, limit_bytes: int | None = None, cache=None):
        self.limit_bytes = limit_bytes
        self._live = 0
        self.peak_bytes = 0
        self.n_alloc = 0
        self.n_failed = 0
        self.cache = cache
        self._pending: list = []  # (weakref, cache._next_id then): blobs of the entry being built (bound only)

    def bind(self, cache) -> "PaperAllocator":
        """Count the bytes `cache` (a `PromptCache`) holds, as the server frees them (class docstring)."""
        self.cache = cache
        return self

    def _free(self, n: int) -> None:
        self._live -= n

    @property
    def live_bytes(self) -> int:
        if self.cache is None:
            return self._live
        held, ids = 0, set()
        for e in self.cache.entries:
            held += e.size()
            ids.add(id(e.main))
            ids.add(id(e.drft))
        mark = getattr(self.cache, "_next_id", None)  # bumps when an entry is appended
        pending = []
        for w, m in self._pending:
            b = w()
            if b is not None and m == mark and id(b) not in ids:
                pending.append((w, m))
                held += len(b)
        self._pending = pending
        return held

    def __call__(self, n: int) -> PaperBlob:
        n = int(n)
        live = self.live_bytes
        if self.limit_bytes is not None and live + n > self.limit_bytes:
            self.n_failed += 1
            raise MemoryError("std::bad_alloc")
        blob = PaperBlob(n)
        self.n_alloc += 1
        self.peak_bytes = max(self.peak_bytes, live + n)
        if self.cache is None:  # unbound: counted until freed (bound, live_bytes reads the cache instead)
            self._live += n
            weakref.finalize(blob, self._free, n)
        else:
            self._pending.append((weakref.ref(blob), getattr(self.cache, "_next_id", None)))
        return blob


@dataclass(frozen=True, eq=False)
class PaperState:
    """The cells a state blob holds: per cache part, positions and token ids in cell order.
    `key` is what llama.cpp checks on restore (stream count, layers, types, row sizes); `size` the
    real byte count."""

    key: tuple
    parts: tuple[tuple[np.ndarray, np.ndarray], ...]
    size: int
    seq: int = 0
    specs: tuple = ()  # the caches' _Spec, for to_bytes
    streams: tuple = ()

    @property
    def n_cells(self) -> int:
        return sum(len(p) for p, _ in self.parts)

    def to_bytes(self) -> bytes:
        """The state in llama.cpp's byte format, K/V data zero (materializes `size` bytes)."""
        w = _Writer()
        w.put(struct.pack("<Ii", IO_MAGIC, self.seq))
        for spec, st, (p, t) in zip(self.specs, self.streams, self.parts):
            _write_part(w, spec, st, self.seq, p, t)
        out = np.empty(w.n, dtype=np.uint8)
        w.into(out)
        return out.tobytes()


# ============================================================================ cache specs and byte layout

@dataclass(frozen=True)
class _Layer:
    k_type: int
    k_row: int
    has_v: bool
    v_type: int
    v_row: int
    v_el: int  # ggml_type_size(v type) (transposed V)
    n_embd_v: int


@dataclass(frozen=True)
class _Spec:
    """One `llama_kv_cache`: what its `state_write` writes."""

    name: str
    size: int  # cells per stream
    n_stream: int
    n_seq_max: int
    n_swa: int  # 0 = no window masking
    swa_type: str
    layers: tuple[_Layer, ...]
    v_trans: bool
    cell_ext: bool

    @property
    def meta_per_cell(self) -> int:
        return 4 + 4 + (12 if self.cell_ext else 0) + 4  # pos, n_seq_id, [ext], seq_id

    @property
    def data_per_cell(self) -> int:
        return sum(l.k_row + (l.v_row if l.has_v else 0) for l in self.layers)

    @property
    def data_header(self) -> int:
        return 8 + sum(12 + (12 if l.has_v else 0) for l in self.layers)

    def write_size(self, n_cells: int) -> int:
        """Bytes `state_write(io, seq_id)` writes when the sequence has `n_cells` cells in its stream."""
        n = 4 + 4 * self.n_stream
        if n_cells > 0:
            n += n_cells * (self.meta_per_cell + self.data_per_cell) + self.data_header
        return n

    @property
    def key(self) -> tuple:
        return (self.n_stream, self.v_trans, self.cell_ext, self.layers)


def _layers(profile: ModelProfile, ids: Iterable[int], type_k: str, type_v: str) -> tuple[_Layer, ...]:
    tk, tv = GGML_TYPES[type_k][0], GGML_TYPES[type_v][0]
    out = []
    for il in ids:
        nv = profile.n_embd_v_gqa(il)
        out.append(_Layer(tk, row_size(type_k, profile.n_embd_k_gqa(il)), not profile.mla, tv,
                          row_size(type_v, nv), GGML_TYPES[type_v][2], nv))
    return tuple(out)


def _is_masked(swa_type: str, n_swa: int, p0, p1):
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


class _Writer:
    """Segments of the real byte format: bytes, or holes (tensor data, left zero)."""

    def __init__(self):
        self.segs: list[bytes | int] = []
        self.n = 0

    def put(self, b: bytes) -> None:
        self.segs.append(b)
        self.n += len(b)

    def hole(self, n: int) -> None:
        if n:
            self.segs.append(int(n))
            self.n += int(n)

    def into(self, out: np.ndarray) -> None:
        off = 0
        for s in self.segs:
            if isinstance(s, int):
                out[off:off + s] = 0
                off += s
            else:
                out[off:off + len(s)] = np.frombuffer(s, dtype=np.uint8)
                off += len(s)

    def to_file(self, f) -> None:
        for s in self.segs:
            if isinstance(s, int):
                f.seek(s, os.SEEK_CUR)
            else:
                f.write(s)


def _write_part(w: _Writer, spec: _Spec, stream: int, seq: int, pos: np.ndarray, tok: np.ndarray) -> None:
    """`llama_kv_cache::state_write` for one sequence whose cells (in cell order) are `pos` / `tok`."""
    n = len(pos)
    w.put(struct.pack("<I", spec.n_stream))
    for s in range(spec.n_stream):
        c = n if s == stream else 0
        w.put(struct.pack("<I", c))
        if c == 0:
            continue
        if spec.cell_ext:
            dt = np.dtype([("pos", "<i4"), ("n", "<u4"), ("x", "<i4"), ("y", "<i4"), ("tok", "<i4"), ("seq", "<i4")])
        else:
            dt = np.dtype([("pos", "<i4"), ("n", "<u4"), ("seq", "<i4")])
        meta = np.zeros(c, dtype=dt)
        meta["pos"] = pos
        meta["n"] = 1
        meta["seq"] = seq
        if spec.cell_ext:
            meta["x"] = pos
            meta["y"] = pos
            meta["tok"] = tok
        w.put(meta.tobytes())
        w.put(struct.pack("<II", int(spec.v_trans), len(spec.layers)))
        for l in spec.layers:
            w.put(struct.pack("<iQ", l.k_type, l.k_row))
            w.hole(c * l.k_row)
        for l in spec.layers:
            if not l.has_v:
                continue
            if not spec.v_trans:
                w.put(struct.pack("<iQ", l.v_type, l.v_row))
                w.hole(c * l.v_row)
            else:
                w.put(struct.pack("<iII", l.v_type, l.v_el, l.n_embd_v))
                w.hole(l.n_embd_v * c * l.v_el)


class _ReadError(Exception):
    pass


class _Src:
    """Bytes to parse: a uint8 buffer, or an open file (read piecewise: the K/V data is skipped)."""

    def __init__(self, buf: np.ndarray | None = None, f=None):
        self.buf, self.f = buf, f
        if f is not None:
            f.seek(0, os.SEEK_END)
            self.size = f.tell()
        else:
            self.size = len(buf)

    def take(self, off: int, n: int, skip: bool = False) -> bytes:
        if off + n > self.size:
            raise _ReadError("unexpected end of state data")
        if skip:
            return b""
        if self.f is not None:
            self.f.seek(off)
            return self.f.read(n)
        return self.buf[off:off + n].tobytes()


def _read_part(src, off: int, spec: _Spec) -> tuple[int, list[tuple[int, np.ndarray, np.ndarray]]]:
    """Parse one cache's part of a real-format state (`src`: a uint8 buffer or a `_Src`) from `off`;
    returns (new offset, [(stream, positions, tokens)]). Raises _ReadError where llama.cpp fails."""
    if not isinstance(src, _Src):
        src = _Src(np.asarray(src, dtype=np.uint8))

    def take(n: int, skip: bool = False) -> bytes:
        nonlocal off
        b = src.take(off, n, skip)
        off += n
        return b

    def u32() -> int:
        return struct.unpack("<I", take(4))[0]

    if u32() != spec.n_stream:
        raise _ReadError("n_stream mismatch")
    out = []
    for s in range(spec.n_stream):
        c = u32()
        if c == 0:
            continue
        if c > spec.size:
            raise _ReadError("not enough cells in kv cache")
        if spec.cell_ext:
            dt = np.dtype([("pos", "<i4"), ("n", "<u4"), ("x", "<i4"), ("y", "<i4"), ("tok", "<i4"), ("seq", "<i4")])
        else:
            dt = np.dtype([("pos", "<i4"), ("n", "<u4"), ("seq", "<i4")])
        meta = np.frombuffer(take(c * dt.itemsize), dtype=dt)
        if np.any(meta["n"] != 1):
            raise _ReadError("invalid seq_id-agnostic kv cell")
        pos = meta["pos"].astype(np.int32)
        tok = meta["tok"].astype(np.int32) if spec.cell_ext else np.full(c, -1, dtype=np.int32)
        v_trans, n_layer = struct.unpack("<II", take(8))
        if n_layer != len(spec.layers):
            raise _ReadError("mismatched layer count")
        if bool(v_trans) != spec.v_trans:
            raise _ReadError("incompatible V transposition")
        for l in spec.layers:
            kt, kr = struct.unpack("<iQ", take(12))
            if kt != l.k_type or kr != l.k_row:
                raise _ReadError("mismatched key type or row size")
            take(c * l.k_row, skip=True)
        for l in spec.layers:
            if not l.has_v:
                continue
            if not spec.v_trans:
                vt, vr = struct.unpack("<iQ", take(12))
                if vt != l.v_type or vr != l.v_row:
                    raise _ReadError("mismatched value type or row size")
                take(c * l.v_row, skip=True)
            else:
                vt, ve, nv = struct.unpack("<iII", take(12))
                if vt != l.v_type or ve != l.v_el or nv != l.n_embd_v:
                    raise _ReadError("mismatched value type or size")
                take(nv * c * l.v_el, skip=True)
        out.append((s, pos, tok))
    return off, out


# ============================================================================ the two cache models

class _Seq:
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
        p = self.pos[:self.n]
        i0 = int(np.searchsorted(p, p0, "left"))
        i1 = int(np.searchsorted(p, p1, "left"))
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


class _CountCache:
    """A cache without window masking: every free cell is usable, so only counts and positions per
    sequence matter (free cells per stream decide `find_slot`; sizes do not depend on cell order)."""

    def __init__(self, spec: _Spec):
        self.spec = spec
        self.seqs: dict[int, _Seq] = {}
        self.used = [0] * spec.n_stream

    def stream_of(self, seq: int) -> int:
        return 0 if self.spec.n_stream == 1 else seq

    def _get(self, seq: int) -> _Seq:
        s = self.seqs.get(seq)
        if s is None:
            s = self.seqs[seq] = _Seq()
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
        s = self._get(dst)
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
                self._get(seq).extend(pos[rows], tok[rows])
                self.used[self.stream_of(seq)] += len(rows)

    def restore(self, seq: int, pos: np.ndarray, tok: np.ndarray) -> bool:
        """`state_read_meta` for one sequence: remove it, then place len(pos) cells (False: no room;
        the sequence is then empty in this cache). No cells: nothing happens (the stream is skipped)."""
        if len(pos) == 0:
            return True
        self.seq_rm(seq, 0, _I32_MAX)
        st = self.stream_of(seq)
        if len(pos) > self.spec.size or len(pos) > self.free(st):
            return False
        o = np.argsort(pos, kind="stable")
        self._get(seq).extend(pos[o], tok[o])
        self.used[st] += len(pos)
        return True


class _CellCache:
    """A cache with a sliding window: cells, per stream, exactly as `llama_kv_cells` holds them
    (position, sequence, token; -1 = empty) and the stream heads, so `find_slot`'s reuse of masked
    cells, the purges of `apply_ubatch` and the resulting `pos_min` are llama.cpp's.

    Kept cheap for large caches (--swa-full over a long context): per-sequence (pos_min, pos_max)
    are cached and updated as cells are written, `find_slot` scans windows from the head instead of
    the whole stream, and a decode that does not fit is rolled back from a journal of the cells it
    wrote (no copy of the arrays)."""

    _WINDOW = 4096

    def __init__(self, spec: _Spec):
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
            m &= ~_is_masked(self.spec.swa_type, self.spec.n_swa, self.pos[s], pmax)
        return s, m

    def n_written(self, seq: int) -> int:
        """Cells `state_write` writes: the sequence's cells the window does not mask at its pos_max."""
        return int(self._written_mask(seq)[1].sum())

    def written(self, seq: int) -> tuple[np.ndarray, np.ndarray]:
        s, m = self._written_mask(seq)
        return self.pos[s][m].copy(), self.tok[s][m].copy()

    # -- journaled cell writes ------------------------------------------------------------------------

    def _write(self, s: int, idxs: np.ndarray, pos, seq, tok) -> None:
        if self._journal is not None:
            self._journal.append((s, idxs, self.pos[s][idxs].copy(), self.seq[s][idxs].copy(),
                                  self.tok[s][idxs].copy()))
        self.pos[s][idxs] = pos
        self.seq[s][idxs] = seq
        self.tok[s][idxs] = tok

    def _clear_cells(self, s: int, idxs: np.ndarray) -> None:
        """Empty cells (all occupied) and move the head back to the first one, as seq_rm does."""
        if not len(idxs):
            return
        self._invalidate(s, np.unique(self.seq[s][idxs]))
        self._write(s, idxs, -1, -1, -1)
        self.used[s] -= len(idxs)
        if idxs[0] < self.head[s]:
            self.head[s] = int(idxs[0])

    def _begin(self) -> None:
        self._journal = []
        self._saved = (list(self.head), list(self.used), [set(x) for x in self.seqs], dict(self._stats))

    def _rollback(self) -> None:
        for s, idxs, p, q, t in reversed(self._journal):
            self.pos[s][idxs] = p
            self.seq[s][idxs] = q
            self.tok[s][idxs] = t
        self.head, self.used, self.seqs, self._stats = self._saved
        self._journal = None

    def _end(self) -> None:
        self._journal = None
        self._saved = None

    # -- sequence operations -------------------------------------------------------------------------

    def _rm(self, seq: int, p0: int, p1: int) -> None:
        streams = range(self.spec.n_stream) if seq < 0 else [self.stream_of(seq)]
        for s in streams:
            if seq >= 0:
                pmin, pmax = self._minmax(s, seq)
                if pmax < p0 or pmin >= p1:
                    continue  # nothing of this sequence in range
                m = (self.seq[s] == seq) & (self.pos[s] >= p0) & (self.pos[s] < p1)
            else:
                m = (self.seq[s] >= 0) & (self.pos[s] >= p0) & (self.pos[s] < p1)
            self._clear_cells(s, np.flatnonzero(m))

    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        self._rm(seq, p0, p1)

    def seq_add(self, seq: int, p0: int, p1: int, d: int) -> None:
        s = self.stream_of(seq)
        pos, sq = self.pos[s], self.seq[s]
        idx = np.flatnonzero((sq == seq) & (pos >= p0) & (pos < p1))
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
        self._stats = {k: v for k, v in self._stats.items() if k[0] != s1}

    # -- find_slot / apply_ubatch ----------------------------------------------------------------------

    def _find(self, s: int, n: int) -> np.ndarray | None:
        """`find_slot` (non-contiguous): the first n usable cells in ring order from the head."""
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
        while scanned < size and need > 0:
            end = min(size, start + max(self._WINDOW, 2 * need))
            wsq = sq[start:end]
            usable = wsq < 0
            if lut is not None:
                occ = ~usable
                if occ.any():
                    oi = np.flatnonzero(occ)
                    usable[oi] = _is_masked(spec.swa_type, spec.n_swa, pos[start:end][oi].astype(np.int64),
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

    def prepare(self, ubatches, pos: np.ndarray, tok: np.ndarray) -> bool:
        """Place every ubatch in turn (journaled); False, with everything undone, when one does not fit.
        On True the cells stay placed until `commit` (or `rollback`)."""
        self._begin()
        for ub in ubatches:
            groups = []
            if self.spec.n_stream == 1:
                rows = np.concatenate([r for _, r in ub]) if len(ub) > 1 else ub[0][1]
                idxs = self._find(0, len(rows))
                if idxs is None:
                    self._rollback()
                    return False
                seqs = np.concatenate([np.full(len(r), q, dtype=np.int16) for q, r in ub])
                groups.append((0, idxs, pos[rows], seqs, tok[rows]))
            else:
                for q, rows in sorted(ub, key=lambda g: g[0]):
                    idxs = self._find(self.stream_of(q), len(rows))
                    if idxs is None:
                        self._rollback()
                        return False
                    groups.append((self.stream_of(q), idxs, pos[rows], q, tok[rows]))
            self._apply(groups)
        return True

    def commit(self) -> None:
        self._end()

    def rollback(self) -> None:
        self._rollback()

    def restore(self, seq: int, pos: np.ndarray, tok: np.ndarray) -> bool:
        """`state_read_meta`: remove the sequence, find len(pos) cells as one ubatch, place them.
        No cells: nothing happens (`state_read` skips a stream with cell_count 0)."""
        if len(pos) == 0:
            return True
        self._rm(seq, 0, _I32_MAX)
        if len(pos) > self.spec.size:
            return False
        s = self.stream_of(seq)
        idxs = self._find(s, len(pos))
        if idxs is None:
            return False
        self._apply([(s, idxs, pos, seq, tok)])
        return True


# ============================================================================ one context (target or draft)

class _Ctx:
    """The memory of one `llama_context`: a KV cache, or the iSWA pair (full + window)."""

    def __init__(self, profile: ModelProfile, *, n_ctx_seq: int, n_seq_max: int, unified: bool, swa_full: bool,
                 n_ubatch: int, type_k: str, type_v: str, v_trans: bool):
        if profile.memory != "kv":
            raise NotImplementedError(f"{profile.architecture}: a {profile.memory} memory is not modelled by the "
                                      "paper memory yet (only KV caches, with or without a sliding window)")
        self.profile = profile
        self.n_seq_max = n_seq_max
        n_stream = 1 if unified else n_seq_max
        ext = profile.n_pos_per_embd > 1
        self.can_shift = profile.n_pos_per_embd == 1 and profile.architecture != "step35"
        if profile.is_swa_model:
            size_swa = _pad(min(n_ctx_seq, profile.n_swa * (n_seq_max if unified else 1) + n_ubatch))
            if swa_full:
                size_swa = n_ctx_seq
            base = _Spec("base", n_ctx_seq, n_stream, n_seq_max, 0, "none",
                         _layers(profile, profile.layers(False), type_k, type_v), v_trans, ext)
            swa = _Spec("swa", size_swa, n_stream, n_seq_max, profile.n_swa, profile.swa_type,
                        _layers(profile, profile.layers(True), type_k, type_v), v_trans, ext)
            self.caches: tuple = (_CountCache(base), _CellCache(swa))
            self.pos_cache = self.caches[1]
            self.partial_parts = (1,)
            self.can_shift = self.can_shift and base.size == swa.size
        else:
            kv = _Spec("kv", n_ctx_seq, n_stream, n_seq_max, 0, "none",
                       _layers(profile, profile.layers(), type_k, type_v), v_trans, ext)
            self.caches = (_CountCache(kv),)
            self.pos_cache = self.caches[0]
            self.partial_parts = (0,)  # a plain KV cache ignores PARTIAL_ONLY: it writes everything
        self.iswa = profile.is_swa_model

    def parts(self, partial: bool) -> tuple[int, ...]:
        return self.partial_parts if partial else tuple(range(len(self.caches)))

    def key(self, partial: bool) -> tuple:
        return tuple(self.caches[i].spec.key for i in self.parts(partial))

    # -- sequence operations ----------------------------------------------------------------------

    def seq_rm(self, seq: int, p0: int, p1: int) -> bool:
        p0 = 0 if p0 < 0 else p0
        p1 = _I32_MAX if p1 < 0 else p1
        for c in self.caches:
            c.seq_rm(seq, p0, p1)
        return True

    def seq_add(self, seq: int, p0: int, p1: int, d: int) -> None:
        if d == 0:
            return
        p0 = 0 if p0 < 0 else p0
        p1 = _I32_MAX if p1 < 0 else p1
        if p0 == p1:
            return
        for c in self.caches:
            c.seq_add(seq, p0, p1, d)

    def seq_cp(self, src: int, dst: int) -> None:
        if src == dst:
            return
        if self.caches[0].spec.n_stream == 1:
            raise NotImplementedError("seq_cp inside one stream (cells shared by two sequences) is not modelled "
                                      "by the paper memory")
        for c in self.caches:
            c.seq_cp(src, dst)

    def seq_keep(self, seq: int) -> None:
        for c in self.caches:
            c.seq_keep(seq)

    def pos_min(self, seq: int) -> int:
        return self.pos_cache.pos_min(seq)

    def pos_max(self, seq: int) -> int:
        return self.pos_cache.pos_max(seq)

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

    def writer(self, seq: int, partial: bool, *, header: bool = True) -> _Writer:
        w = _Writer()
        if header:
            w.put(struct.pack("<Ii", IO_MAGIC, seq))
        for i in self.parts(partial):
            c = self.caches[i]
            p, t = c.written(seq)
            _write_part(w, c.spec, c.stream_of(seq), seq, p, t)
        return w

    def restore(self, seq: int, partial: bool, parts: Sequence[tuple[np.ndarray, np.ndarray]] | None,
                n_ok: int | None = None) -> bool:
        """Restore parts (cells per cache, in order). `n_ok`: only the first n parts parsed; the next
        cache then fails (it is emptied of the sequence, as `state_clear` does)."""
        ids = self.parts(partial)
        n_ok = len(ids) if n_ok is None else n_ok
        for j, i in enumerate(ids):
            c = self.caches[i]
            if j >= n_ok:
                c.seq_rm(seq, 0, _I32_MAX)
                return False
            p, t = parts[j]
            if not c.restore(seq, np.asarray(p, dtype=np.int32), np.asarray(t, dtype=np.int32)):
                c.seq_rm(seq, 0, _I32_MAX)
                return False
        return True

    def read_real(self, src, off: int, seq: int, partial: bool) -> int:
        """Parse real-format bytes (a buffer or a `_Src`) from `off` and restore them; returns the end
        offset, or 0 on failure."""
        if not isinstance(src, _Src):
            src = _Src(src)
        parts = []
        ids = self.parts(partial)
        for i in ids:
            spec = self.caches[i].spec
            try:
                off, streams = _read_part(src, off, spec)
            except _ReadError:
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
        if n_vocab > 0 and (tok.min() < 0 or tok.max() >= n_vocab):
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
        for q in qs:
            a, b = first[q]
            pq = pos[a:b] if a >= 0 else pos[seq == q]
            lo, hi = int(pq[0]), int(pq[-1])  # sorted (checked below): the extremes are the ends
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
        unified = self.caches[0].spec.n_stream == 1
        if self.iswa:
            attempts = [_split_simple(n, n_ubatch, seq), None] if unified else [None]
            for i, ubs in enumerate(attempts):
                if ubs is None:
                    ubs = _split_equal(runs, seq, n_ubatch, sequential=not unified)
                if not self.caches[0].prepare(ubs):
                    continue
                if not self.caches[1].prepare(ubs, pos, tok):
                    continue
                self.caches[0].commit(ubs, pos, tok)
                self.caches[1].commit()
                return 0
            return 1
        cache = self.caches[0]
        if cache.spec.size >= n_ubatch:
            # No ubatch can exceed the cache, so `prepare` over the ubatches (split_simple / split_equal)
            # fails exactly when a stream's rows exceed its free cells, and `commit` appends each
            # sequence's rows in batch order whatever the split: the same outcome without splitting.
            rows = {q: (pos[a:b], tok[a:b]) if a >= 0 else (pos[seq == q], tok[seq == q])
                    for q, (a, b) in first.items()}
            need: dict[int, int] = {}
            for q, (pq, _) in rows.items():
                st = cache.stream_of(q)
                need[st] = need.get(st, 0) + len(pq)
            if any(k > cache.free(st) for st, k in need.items()):
                return 1
            for q, (pq, tq) in rows.items():
                cache._get(q).extend(pq, tq, in_order=True)
            for st, k in need.items():
                cache.used[st] += k
            return 0
        ubs = _split_simple(n, n_ubatch, seq) if unified else _split_equal(runs, seq, n_ubatch, sequential=True)
        if not cache.prepare(ubs):
            return 1
        cache.commit(ubs, pos, tok)
        return 0

    @staticmethod
    def _runs(seq: np.ndarray) -> list[tuple[int, int, int]]:
        """Maximal runs of one sequence in batch order: (seq, start, end)."""
        n = len(seq)
        if n == 1:
            return [(int(seq[0]), 0, 1)]
        cut = (np.flatnonzero(seq[1:] != seq[:-1]) + 1).tolist()
        starts = [0] + cut
        return [(q, a, b) for q, a, b in zip(seq[starts].tolist(), starts, cut + [n])]


def _split_simple(n: int, n_ubatch: int, seq: np.ndarray) -> list[list[tuple[int, np.ndarray]]]:
    """`split_simple`: consecutive rows, n_ubatch at a time (each ubatch as per-sequence row groups)."""
    out = []
    for a in range(0, n, n_ubatch):
        rows = np.arange(a, min(n, a + n_ubatch))
        # keep batch order: groups of consecutive rows of one sequence
        sq = seq[rows]
        cut = np.flatnonzero(np.diff(sq)) + 1
        out.append([(int(sq[r[0] - a]), r) for r in np.split(rows, cut)])
    return out


def _split_equal(runs, seq: np.ndarray, n_ubatch: int, sequential: bool) -> list[list[tuple[int, np.ndarray]]]:
    """`split_equal`: per ubatch, a set of sequences (in order of appearance; with `sequential`
    consecutive increasing ids), the same number of rows of each."""
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


def _step_batch(runs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A step of `PaperMemory.advance_steps` as batch rows (tokens, positions, sequences)."""
    tok = np.concatenate([np.asarray(t, dtype=np.int32) for _, t, _ in runs])
    pos = np.concatenate([np.arange(p0, p0 + len(t), dtype=np.int32) for _, t, p0 in runs])
    seq = np.concatenate([np.full(len(t), q, dtype=np.int32) for q, t, _ in runs])
    return tok, pos, seq


# ============================================================================ vocabulary and sampling

_M64 = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64 finalizer."""
    x &= _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


class PaperVocab:
    """Opaque token ids 0..n_vocab-1. Generated tokens are placeholders from the top `n_generated`
    ids (below the end-of-generation id n_vocab-1, which is never generated), so they match no prompt
    token as long as prompts use ids below `gen_lo`. There is no tokenizer: `tokenize` raises —
    submit token ids, or give PaperMemory a real vocabulary (e.g. a loaded `slotlab.llama.Model`)."""

    def __init__(self, n_vocab: int, n_generated: int = 4096):
        if n_vocab < 4:
            raise ValueError(f"n_vocab must be >= 4, got {n_vocab}")
        self.n_vocab = int(n_vocab)
        self.eog = self.n_vocab - 1
        self.n_generated = max(1, min(int(n_generated), self.n_vocab // 4))
        self.gen_lo = self.eog - self.n_generated

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> np.ndarray:
        raise NotImplementedError("the paper memory has no tokenizer: submit token ids (or pass vocab= a real "
                                  "vocabulary, e.g. slotlab.llama.Model)")

    def token_to_piece(self, token: int, *, special: bool = True) -> bytes:
        return b"<%d>" % int(token)

    def detokenize(self, tokens) -> str:
        t = tokens.tolist() if isinstance(tokens, np.ndarray) else [int(x) for x in tokens]
        return ("<%d>" * len(t)) % tuple(t)  # one format call (a response's text is made per request)

    def is_eog(self, token: int) -> bool:
        return int(token) == self.eog

    def check_tokens(self, tokens) -> None:
        t = np.asarray(tokens)
        if t.size and (t.min() < 0 or t.max() >= self.n_vocab):
            bad = t[(t < 0) | (t >= self.n_vocab)][0]
            raise ValueError(f"token id {int(bad)} is outside the vocabulary (0..{self.n_vocab - 1})")

    def generated(self, token: int, pos: int, seed: int) -> int:
        """The placeholder the target "samples" after `token` at `pos` (deterministic)."""
        h = _mix(int(token) * 0x9E3779B97F4A7C15 + int(pos) * 0xD1B54A32D192ED03 + int(seed) * 0x8CB92BA72F3D8DD7 + 1)
        return self.gen_lo + h % self.n_generated


class _PaperSampler:
    def __init__(self, mem: "PaperMemory", seed: int):
        self.mem, self.seed = mem, seed

    def sample(self, i: int) -> int:
        rows = self.mem._last
        if rows is None or not 0 <= i < len(rows[0]):
            raise ValueError(f"no logits for batch index {i} of the last decode")
        tok, pos, logits = rows
        if not logits[i]:
            raise ValueError(f"no logits for batch index {i} (was logits requested for it?)")
        return self.mem.vocab_gen(int(tok[i]), int(pos[i]), self.seed)

    def close(self) -> None:
        pass


# ============================================================================ the memory

class PaperMemory:
    """`Memory` on paper for `profile` (and `draft`, the `-md` model's profile; `draft=True` = the
    target's). The arguments are llama-server's: `n_ctx` (-c; 0 = the training context), `n_slots`
    (-np), `kv_unified` (-kvu), `swa_full` (--swa-full), `n_batch` (-b), `n_ubatch` (-ub),
    `kv_unified_per_slot` (--kv-unified-per-slot), `type_k` / `type_v` (-ctk / -ctv, default f16),
    `flash_attn` ("auto" | "on" | "off": off transposes V, which only changes the byte layout).

    `seed` varies the placeholder tokens; `draft_acceptance` is the probability that a drafted token
    equals what the target then samples (deterministic per position). `vocab`: a real vocabulary to use
    instead of `PaperVocab` (token ids are still opaque to the memory)."""

    def __init__(self, profile: ModelProfile, *, n_ctx: int = 0, n_slots: int = 1, kv_unified: bool = False,
                 swa_full: bool = False, n_batch: int = 2048, n_ubatch: int = 512, kv_unified_per_slot: int = 0,
                 draft: ModelProfile | bool | None = None, n_draft: int = 0, type_k: str = "f16",
                 type_v: str = "f16", flash_attn: str = "auto", vocab: Any = None, seed: int = 0,
                 draft_acceptance: float = 0.75):
        for name, v in (("n_ctx", n_ctx), ("n_slots", n_slots), ("n_batch", n_batch), ("n_ubatch", n_ubatch)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
                raise ConfigError(f"{name} must be an integer, got {v!r}")
        if not 1 <= n_slots <= LLAMA_MAX_SEQ:
            raise ConfigError(f"n_parallel (-np/--parallel) must be in 1..{LLAMA_MAX_SEQ}, got {n_slots}")
        if n_ctx < 0:
            raise ConfigError(f"n_ctx (-c/--ctx-size) must be >= 0 (0 = the model's training context), got {n_ctx}")
        if n_batch < 1 or n_ubatch < 1:
            raise ConfigError(f"n_batch (-b) and n_ubatch (-ub) must be >= 1, got {n_batch} and {n_ubatch}")
        for t in (type_k, type_v):
            if t not in GGML_TYPES:
                raise ConfigError(f"unknown KV cache type {t!r} (one of {', '.join(GGML_TYPES)})")
        if flash_attn not in ("auto", "on", "off"):
            raise ConfigError(f"flash_attn must be auto, on or off, got {flash_attn!r}")
        v_trans = flash_attn == "off"  # AUTO creates the cache with flash attention on (v_trans = false)
        if v_trans and GGML_TYPES[type_v][1] > 1:
            raise ConfigError("quantized V cache requires flash_attn to be enabled")
        self.profile = profile
        n_ctx_req = n_ctx or profile.n_ctx_train
        # llama_context: batch sizes from the requested n_ctx, then n_ctx padded to 256 and split per sequence
        n_batch_eff = min(n_ctx_req, n_batch)
        n_ubatch_eff = min(n_batch_eff, n_ubatch)
        n_ctx_pad = _pad(n_ctx_req)
        if kv_unified:
            n_ctx_seq = n_ctx_pad
        else:
            n_ctx_seq = _pad(n_ctx_pad // n_slots)
            n_ctx_pad = n_ctx_seq * n_slots
        if n_ctx_seq > profile.n_ctx_train:  # as llama.cpp: a warning, and each slot is capped below
            logging.getLogger("slotlab.memory").warning(
                "n_ctx_seq (%d) > n_ctx_train (%d) -- possible training context overflow", n_ctx_seq,
                profile.n_ctx_train)
        self.n_ctx, self.n_ctx_seq = n_ctx_pad, n_ctx_seq
        self.n_batch, self.n_ubatch = n_batch_eff, n_ubatch_eff
        self.kv_unified, self.swa_full = bool(kv_unified), bool(swa_full)
        kw = dict(n_ctx_seq=n_ctx_seq, n_seq_max=n_slots, unified=self.kv_unified, swa_full=self.swa_full,
                  n_ubatch=n_ubatch_eff, type_k=type_k, type_v=type_v, v_trans=v_trans)
        self.tgt = _Ctx(profile, **kw)
        if draft is True:
            draft = profile
        self.draft_profile = draft or None
        self.dft = None
        if self.draft_profile is not None:
            if self.draft_profile.n_vocab != profile.n_vocab:
                raise ConfigError(f"the draft vocabulary ({self.draft_profile.n_vocab} tokens) does not match the "
                                  f"target's ({profile.n_vocab}): draft model vocab type must match target model")
            self.dft = _Ctx(self.draft_profile, **kw)
        n_ctx_slot = n_ctx_seq
        if kv_unified_per_slot > 0:
            n_ctx_slot = min(n_ctx_slot, kv_unified_per_slot)
        n_ctx_slot = min(n_ctx_slot, profile.n_ctx_train)
        self.vocab = vocab if vocab is not None else PaperVocab(max(profile.n_vocab, 4))
        self._gen = self.vocab if isinstance(self.vocab, PaperVocab) else PaperVocab(max(profile.n_vocab, 4))
        self.n_vocab = profile.n_vocab
        self.info = MemoryInfo(
            n_ctx=self.n_ctx, n_seq_max=n_slots, n_ctx_slot=n_ctx_slot, n_batch=self.n_batch, n_ubatch=self.n_ubatch,
            n_swa=0 if swa_full else profile.n_swa, kv_unified=self.kv_unified,
            can_shift=self.tgt.can_shift, seq_rm_type=SEQ_RM_PART, has_draft=self.dft is not None,
            n_vocab=profile.n_vocab)
        self.n_draft = n_draft
        self.seed = int(seed)
        self.draft_acceptance = float(draft_acceptance)
        self._last: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self.stats = {"decode": 0, "decode_tokens": 0, "decode_full": 0, "decode_draft": 0, "state_get": 0,
                      "state_set": 0}

    # -- construction from llama-server flags ---------------------------------------------------------

    @classmethod
    def from_params(cls, params, *, profile: ModelProfile | None = None, draft_profile: ModelProfile | None = None,
                    **kw) -> "PaperMemory":
        """A paper memory for parsed llama-server flags (a `slotlab.engine.params.ServerParams`: the
        engine parses the command line, the memory only reads the fields), as
        `slotlab.engine.backend.load` would create the contexts. `profile` defaults to the GGUF at
        `-m` (the embedded default model without -m); the draft to the GGUF at `-md` when
        `--spec-type draft-simple` is on (the same profile when -md names the same file)."""
        from slotlab.memory.profile import default_model_gguf

        if isinstance(params, (str, list, tuple)):
            raise TypeError("PaperMemory.from_params takes parsed flags: ServerParams.from_args(flags)")
        if profile is None:
            profile = ModelProfile.from_gguf(params.model or default_model_gguf())
        draft = None
        if params.speculative:
            if draft_profile is not None:
                draft = draft_profile
            else:
                target = Path(params.model) if params.model else default_model_gguf()
                same = Path(params.model_draft).resolve() == target.resolve()
                draft = profile if same else ModelProfile.from_gguf(params.model_draft)
        return cls(profile, n_ctx=params.n_ctx_requested, n_slots=params.n_slots,
                   kv_unified=params.kv_unified_effective, swa_full=params.swa_full, n_batch=params.n_batch,
                   n_ubatch=params.n_ubatch, kv_unified_per_slot=params.kv_unified_per_slot, draft=draft,
                   n_draft=params.draft_max if params.speculative else 0, type_k=params.cache_type_k,
                   type_v=params.cache_type_v, flash_attn=params.flash_attn, **kw)

    # -- helpers ----------------------------------------------------------------------------------------

    def _check_seq(self, seq: int, allow_all: bool = False) -> None:
        if allow_all and seq == -1:
            return
        if not 0 <= seq < self.info.n_seq_max:
            raise ValueError(f"sequence id {seq} outside 0..{self.info.n_seq_max - 1}")

    def _ctxs(self):
        return (self.tgt,) if self.dft is None else (self.tgt, self.dft)

    def _pick(self, draft: bool) -> _Ctx:
        if draft and self.dft is None:
            raise ValueError("no draft context (-md) in this memory")
        return self.dft if draft else self.tgt

    def vocab_gen(self, token: int, pos: int, seed: int) -> int:
        return self._gen.generated(token, pos, seed ^ self.seed)

    # -- sequence operations ----------------------------------------------------------------------------

    def seq_rm(self, seq: int, p0: int, p1: int) -> bool:
        self._check_seq(seq, allow_all=True)
        return all([c.seq_rm(seq, p0, p1) for c in self._ctxs()])

    def seq_rm_draft(self, seq: int, p0: int, p1: int) -> bool:
        self._check_seq(seq, allow_all=True)
        return self._pick(True).seq_rm(seq, p0, p1)

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        self._check_seq(seq)
        for c in self._ctxs():
            if not c.can_shift:
                raise ShiftNotSupported(
                    "this context cannot shift KV positions (llama_memory_can_shift is false: "
                    + ("SWA model without --swa-full" if c.iswa and not self.swa_full else "memory type")
                    + "); cache reuse is not supported")
        for c in self._ctxs():
            c.seq_add(seq, p0, p1, delta)

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        self._check_seq(src)
        self._check_seq(dst)
        for c in self._ctxs():
            c.seq_cp(src, dst)

    def seq_keep(self, seq: int) -> None:
        self._check_seq(seq)
        for c in self._ctxs():
            c.seq_keep(seq)

    def pos_min(self, seq: int) -> int:
        self._check_seq(seq)
        return self.tgt.pos_min(seq)

    def pos_max(self, seq: int) -> int:
        self._check_seq(seq)
        return self.tgt.pos_max(seq)

    def clear(self) -> None:
        """`llama_memory_clear` on every context."""
        for c in self._ctxs():
            c.clear()

    # -- state blobs --------------------------------------------------------------------------------------

    def state_size(self, seq: int, *, draft: bool = False, partial: bool = False) -> int:
        self._check_seq(seq)
        return self._pick(draft).state_size(seq, partial)

    def state_get(self, seq: int, *, draft: bool = False, partial: bool = False, out: Any = None):
        """The sequence's state: a `PaperBlob` of the real size (into `out` when it is one of at least
        that size). A plain numpy uint8 `out` gets the real byte format (tensor data zero)."""
        self._check_seq(seq)
        ctx = self._pick(draft)
        self.stats["state_get"] += 1
        if out is not None and not isinstance(out, PaperBlob) and isinstance(out, np.ndarray):
            w = ctx.writer(seq, partial)
            if len(out) < w.n:
                out = np.empty(w.n, dtype=np.uint8)
            w.into(out)
            return out[:w.n]
        payload = ctx.payload(seq, partial)
        if isinstance(out, PaperBlob) and len(out) >= payload.size:
            out.payload = payload
            return out if len(out) == payload.size else out[:payload.size]
        return PaperBlob(payload.size, payload)

    def state_bytes(self, seq: int, *, draft: bool = False, partial: bool = False) -> np.ndarray:
        """The state in llama.cpp's byte format (K/V data zero): loadable by a real context of the
        same model and configuration (llama_state_seq_set_data_ext)."""
        self._check_seq(seq)
        w = self._pick(draft).writer(seq, partial)
        out = np.empty(w.n, dtype=np.uint8)
        w.into(out)
        return out

    def state_set(self, data: Any, seq: int, *, draft: bool = False, partial: bool = False) -> int:
        """Restore a blob into `seq`: bytes read (its length) or 0 (the sequence is then empty in the
        cache that refused it, as in llama.cpp)."""
        self._check_seq(seq)
        ctx = self._pick(draft)
        self.stats["state_set"] += 1
        if isinstance(data, PaperBlob):
            p = data.payload
            if p is None or len(data) < p.size:
                return 0  # an unfilled buffer: wrong magic
            if p.key != ctx.key(partial):
                ctx.restore(seq, partial, None, n_ok=0)
                return 0
            return p.size if ctx.restore(seq, partial, p.parts) else 0
        buf = _as_u8(data)
        if len(buf) < 8 or int(buf[:4].view("<u4")[0]) != IO_MAGIC:
            return 0
        end = ctx.read_real(buf, 8, seq, partial)
        return end

    def save_file(self, path, seq: int, tokens: np.ndarray) -> int:
        """`llama_state_seq_save_file`: magic, version, token count, tokens, state — the K/V data as
        holes (a sparse file of the real size). Returns the bytes written."""
        self._check_seq(seq)
        toks = np.ascontiguousarray(tokens, dtype=np.int32)
        w = self.tgt.writer(seq, False, header=False)
        try:
            with open(path, "wb") as f:
                f.write(struct.pack("<III", STATE_SEQ_MAGIC, STATE_SEQ_VERSION, len(toks)))
                f.write(toks.tobytes())
                w.to_file(f)
                f.truncate(12 + 4 * len(toks) + w.n)
        except OSError:
            return 0
        return 12 + 4 * len(toks) + w.n

    def load_file(self, path, seq: int) -> tuple[int, np.ndarray]:
        """`llama_state_seq_load_file`: (bytes read, token payload), (0, []) when refused. Reads real
        llama.cpp sequence files too (positions are restored, tensor data skipped)."""
        self._check_seq(seq)
        empty = np.empty(0, dtype=np.int32)
        try:
            with open(path, "rb") as f:
                head = f.read(12)
                if len(head) < 12:
                    return 0, empty
                magic, version, n = struct.unpack("<III", head)
                if magic != STATE_SEQ_MAGIC or version != STATE_SEQ_VERSION:
                    return 0, empty
                raw = f.read(4 * n)
                if len(raw) < 4 * n:
                    return 0, empty
                toks = np.frombuffer(raw, dtype="<i4").astype(np.int32)
                end = self.tgt.read_real(_Src(f=f), 12 + 4 * n, seq, False)
        except OSError:
            return 0, empty
        if end == 0:
            return 0, empty
        return end, toks

    # -- decoding -----------------------------------------------------------------------------------------

    def _decode(self, ctx: _Ctx, batch: Batch, off: int, n: int) -> int:
        if off < 0 or n < 0 or off + n > batch.n_tokens:
            raise ValueError(f"batch view [{off}, {off + n}) outside [0, {batch.n_tokens})")
        if n > self.n_batch:
            raise ValueError(f"decode of {n} tokens exceeds n_batch {self.n_batch}: decode in chunks")
        tok = batch.token[off:off + n]
        pos = batch.pos[off:off + n]
        seq = batch.seq[off:off + n]
        return ctx.decode(tok, pos, seq, self.n_ubatch, self.n_vocab)

    def decode(self, batch: Batch, off: int, n: int) -> int:
        ret = self._decode(self.tgt, batch, off, n)
        self.stats["decode"] += 1
        if ret == 0:
            self.stats["decode_tokens"] += n
            self._last = (batch.token[off:off + n].copy(), batch.pos[off:off + n].copy(),
                          batch.logits[off:off + n].copy())
        elif ret == 1:
            self.stats["decode_full"] += 1
        return ret

    # -- fast path for the simulator (slotlab/sim/fastforward.py) -------------------------------------

    def advance_generation(self, seqs: Sequence[int], pos0: Sequence[int], feed: np.ndarray) -> int:
        """Up to `k = len(feed)` generation steps at once, each exactly one successful `decode` of a
        batch with one token per sequence: step j decodes `feed[j, c]` at position `pos0[c] + j` for
        sequence `seqs[c]` (batch order = `seqs` order, logits requested for every row).

        Returns how many steps `m <= k` were applied: the steps before the first that `decode` would
        refuse (no free cells: it would return 1, and the server would purge or halve the batch), or
        0 when the first step is not a plain continuation of every sequence (then nothing changed).
        Afterwards the memory is exactly what m `decode` calls would have left (cells, window pruning,
        `pos_min` / `pos_max`, `stats["decode"]` / `["decode_tokens"]`, the rows `sample` reads).

        A KV cache without a sliding window is advanced in bulk (free cells decide; O(cells) numpy);
        an iSWA memory runs the real per-step decode (the window cache's cell reuse and purges), only
        without the server around it. Target context only: a memory with a draft returns 0."""
        feed = np.asarray(feed, dtype=np.int32)
        if feed.ndim != 2 or feed.shape[0] == 0 or self.dft is not None:
            return 0
        k, b = feed.shape
        seq_l, p0_l = [int(q) for q in seqs], [int(p) for p in pos0]  # a few slots: Python, not numpy calls
        if len(seq_l) != b or len(p0_l) != b or b == 0 or b > self.n_batch or len(set(seq_l)) != b:
            return 0
        if min(seq_l) < 0 or max(seq_l) >= self.info.n_seq_max or feed.min() < 0 or feed.max() >= self.n_vocab:
            return 0
        seq = np.asarray(seq_l, dtype=np.int32)
        p0 = np.asarray(p0_l, dtype=np.int32)
        ctx = self.tgt
        if ctx.profile.n_pos_per_embd != 1:
            return 0
        for q, p in zip(seq_l, p0_l):
            pm = ctx.pos_max(q)
            if pm >= 0 and p != pm + 1:
                return 0
        steps = np.arange(k, dtype=np.int32)
        if not ctx.iswa:
            cache = ctx.caches[0]
            if cache.spec.n_stream == 1:
                m = min(k, cache.free(0) // b)
            else:
                m = min([k] + [cache.free(cache.stream_of(int(q))) for q in seq])
            if m <= 0:
                return 0
            for c, q in enumerate(seq.tolist()):
                cache._get(q).extend(p0[c] + steps[:m], feed[:m, c], in_order=True)  # checked: p0 = pos_max + 1
                cache.used[cache.stream_of(q)] += m
        else:
            m = 0
            for j in range(k):
                if ctx.decode(feed[j], p0 + j, seq, self.n_ubatch, self.n_vocab) != 0:
                    break
                m += 1
            if m == 0:
                return 0
        self.stats["decode"] += m
        self.stats["decode_tokens"] += m * b
        self._last = (feed[m - 1].copy(), (p0 + (m - 1)).astype(np.int32), np.ones(b, dtype=np.int8))
        return m

    def advance_steps(self, steps: Sequence[Sequence[tuple[int, Any, int]]], logits: Sequence[Sequence[int]]) -> int:
        """Up to `len(steps)` target decodes at once. A step is a batch given as its runs in row order,
        `(seq, tokens, pos0)`: `tokens` (an int32 array or a list) at positions pos0, pos0 + 1, ...
        of `seq`; at most n_batch rows a step. `logits[j]`: the rows of step j that request logits.

        Returns how many steps `m` were applied: those before the first that `decode` would refuse
        (no free cells, or an invalid batch: the caller's plain step then meets that refusal itself).
        Afterwards the memory is exactly what m `decode` calls would have left, `_last` included (the
        rows `sample` reads). A KV cache without a sliding window whose sequences simply continue is
        advanced in bulk (free cells per stream decide; the cells of all m steps are appended at
        once); anything else runs the real decode step by step. A memory with a draft returns 0.
        (The simulator's prompt fast-forward, slotlab/sim/fastforward.py, calls it.)"""
        if not steps or self.dft is not None:
            return 0
        sizes = [sum(len(t) for _, t, _ in st) for st in steps]
        if min(sizes) == 0 or max(sizes) > self.n_batch:
            return 0
        ctx = self.tgt
        m = -1
        cache = ctx.caches[0]
        if not ctx.iswa and ctx.profile.n_pos_per_embd == 1 and cache.spec.size >= self.n_ubatch:
            m = self._bulk_steps(ctx, cache, steps)
        batch = None
        if m < 0:  # step by step
            m = 0
            for st in steps:
                batch = _step_batch(st)
                if ctx.decode(*batch, self.n_ubatch, self.n_vocab) != 0:
                    break
                m += 1
        if m == 0:
            return 0
        self.stats["decode"] += m
        self.stats["decode_tokens"] += sum(sizes[:m])
        tok, pos, _ = batch if batch is not None and m == len(steps) else _step_batch(steps[m - 1])
        want = np.zeros(len(tok), dtype=np.int8)
        want[list(logits[m - 1])] = 1
        self._last = (tok, pos, want)
        return m

    def _bulk_steps(self, ctx: _Ctx, cache: _CountCache, steps) -> int:
        """`advance_steps` on a count cache: -1 when the steps are not plain continuations (then the
        caller decodes them one by one), else the steps applied (0: the first does not fit)."""
        n_stream = cache.spec.n_stream
        n_seq, n_vocab = self.info.n_seq_max, self.n_vocab
        free = [cache.free(st) for st in range(n_stream)]
        nxt: dict[int, int] = {}  # seq -> the position its next cell must have
        parts: dict[int, list] = {}  # seq -> its token runs, in order
        m = 0
        for st in steps:
            need = [0] * n_stream
            for q, t, p0 in st:
                if not 0 <= q < n_seq:
                    return -1
                if q not in nxt:
                    pm = ctx.pos_max(q)
                    nxt[q] = pm + 1 if pm >= 0 else p0
                    parts[q] = []
                if p0 != nxt[q]:
                    return -1  # not position after position (the real decode may still take it)
                need[cache.stream_of(q)] += len(t)
            if any(k > f for k, f in zip(need, free)):
                break  # prepare would fail here: the steps before it are applied
            for q, t, p0 in st:
                if len(t):
                    if isinstance(t, np.ndarray):
                        if n_vocab > 0 and (t.min() < 0 or t.max() >= n_vocab):
                            return -1
                    elif n_vocab > 0 and not all(0 <= x < n_vocab for x in t):
                        return -1
                    parts[q].append(t)
                nxt[q] = p0 + len(t)
            free = [f - k for k, f in zip(need, free)]
            m += 1
        if m == 0:
            return 0
        for q, ts in parts.items():
            if not ts:
                continue
            toks = np.concatenate([np.asarray(t, dtype=np.int32) for t in ts])
            p0 = nxt[q] - len(toks)
            cache._get(q).extend(np.arange(p0, nxt[q], dtype=np.int32), toks, in_order=True)
            cache.used[cache.stream_of(q)] += len(toks)
        return m

    def decode_draft(self, batch: Batch, off: int, n: int) -> int:
        self.stats["decode_draft"] += 1
        return self._decode(self._pick(True), batch, off, n)

    def sampler(self, *, temperature: float, seed: int, ignore_eos: bool) -> _PaperSampler:
        """Placeholder tokens: a function of (the row's token, its position, and the seed when
        temperature > 0), so equal prompts give equal continuations on any slot."""
        return _PaperSampler(self, int(seed) & 0xFFFFFFFF if temperature > 0 else 0)

    def draft(self, seq: int, token: int, pos: int, n_max: int) -> list[int]:
        """Draft up to `n_max` tokens after `token` at `pos` on the draft context (decoding each, as
        LlamaMemory.draft does, then removing the drafted positions again). Each drafted token is the
        target's greedy placeholder with probability `draft_acceptance`."""
        dctx = self._pick(True)
        self._check_seq(seq)
        b = Batch(1)
        out: list[int] = []
        b.add(token, pos, seq, logits=True)
        if self._decode(dctx, b, 0, 1) == 0:
            prev, p = int(token), int(pos)
            while len(out) < n_max:
                t = self._gen.generated(prev, p, self.seed)
                u = _mix(prev * 0x9E3779B97F4A7C15 + p * 0xC2B2AE3D27D4EB4F + self.seed + 7) / 2.0**64
                if u >= self.draft_acceptance:
                    t = self._gen.gen_lo + (t - self._gen.gen_lo + 1) % self._gen.n_generated
                out.append(t)
                if len(out) == n_max:
                    break
                prev, p = t, pos + len(out)
                b.clear()
                b.add(t, p, seq, logits=True)
                if self._decode(dctx, b, 0, 1) != 0:
                    break
        dctx.seq_rm(seq, pos, -1)
        return out

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return (f"PaperMemory({self.profile.name or self.profile.architecture}, n_ctx={self.n_ctx}, "
                f"n_ctx_seq={self.n_ctx_seq}, n_slots={self.info.n_seq_max}, kv_unified={self.kv_unified}, "
                f"swa_full={self.swa_full}, draft={self.dft is not None})")


def _as_u8(data) -> np.ndarray:
    if isinstance(data, np.ndarray):
        if data.dtype != np.uint8:
            raise TypeError("state data must be a uint8 array")
        return np.ascontiguousarray(data)
    return np.frombuffer(bytes(data) if not isinstance(data, (bytes, bytearray, memoryview)) else data,
                         dtype=np.uint8)


def paper_sizes(profile: ModelProfile, n_tokens: int, **kw) -> dict:
    """Sizes for one sequence of `n_tokens` tokens decoded from position 0 on a fresh PaperMemory built
    with `kw` (PaperMemory's arguments): state (full / partial), cells per cache, pos_min. A quick
    calculator for docs and what-ifs."""
    mem = PaperMemory(profile, **kw)
    b = Batch(mem.n_batch)
    p = 0
    while p < n_tokens:
        k = min(mem.n_batch, n_tokens - p)
        b.clear()
        b.add_seq(np.zeros(k, dtype=np.int32), p, 0)
        if mem.decode(b, 0, k) != 0:
            raise ValueError(f"{n_tokens} tokens do not fit this context")
        p += k
    return {"state": mem.state_size(0), "partial": mem.state_size(0, partial=True), "pos_min": mem.pos_min(0),
            "pos_max": mem.pos_max(0), "cells": [c.n_cells(0) for c in mem.tgt.caches]}
