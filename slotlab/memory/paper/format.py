"""The byte format of a sequence state, as the pinned llama.cpp writes and reads it.

`llama_state_seq_get_data_ext` writes an 8-byte header (`IO_MAGIC`, the sequence id) and then each
cache's `state_write` (src/llama-kv-cache.cpp): the stream count, per stream the cell count, per cell
position / seq count / seq id (+ a 12-byte extension with M-RoPE), `v_trans`, the layer count, and
per layer the K (and V) type, row size and the rows of the cells. `CacheSpec` is what one cache's
`state_write` depends on; `write_kv_part` / `read_kv_part` write and parse one cache's part (tensor
data as holes: it is never modelled). `RecurrentSpec` / `write_rs_part` / `read_rs_part` are the
same for a recurrent memory's part (src/llama-memory-recurrent.cpp).

Kept apart from the cell models so that a reader of the format (a slot file, a real context's blob)
needs nothing but this module."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from functools import cached_property
from typing import Iterable

import numpy as np

from slotlab.memory.profile import GGML_TYPES, ModelProfile, row_size

__all__ = ["CacheSpec", "I32_MAX", "IO_MAGIC", "LLAMA_MAX_SEQ", "LayerSpec", "N_POSITIONS", "POSITIONS", "RecurrentSpec",
           "STATE_SEQ_MAGIC", "Cursor", "STATE_SEQ_VERSION", "Source", "StateReadError", "Writer", "kv_layers", "pad", "read_kv_part", "read_rs_part",
           "write_kv_part", "write_rs_part"]

LLAMA_MAX_SEQ = 256
IO_MAGIC = 0xAF143CD8  # llama-context.cpp io_magic: the first u32 of a sequence state blob
STATE_SEQ_MAGIC = 0x67677371  # 'ggsq': llama_state_seq_save_file
STATE_SEQ_VERSION = 3
I32_MAX = 2**31 - 1

#: positions 0, 1, 2, ... as one read-only int32 array, up to N_POSITIONS: the paper memory compares and
#: writes runs of positions as slices of it (a view, not an arange per ubatch group or generation run)
N_POSITIONS = 1 << 18
POSITIONS = np.arange(N_POSITIONS, dtype=np.int32)
POSITIONS.flags.writeable = False


def pad(n: int, k: int = 256) -> int:
    """`GGML_PAD(n, k)`: llama_context pads n_ctx (and the SWA cache's size) to 256 cells."""
    return (n + k - 1) // k * k


@dataclass(frozen=True)
class LayerSpec:
    k_type: int
    k_row: int
    has_v: bool
    v_type: int
    v_row: int
    v_el: int  # ggml_type_size(v type) (transposed V)
    n_embd_v: int


@dataclass(frozen=True)
class CacheSpec:
    """One `llama_kv_cache`: what its `state_write` writes."""

    name: str
    size: int  # cells per stream
    n_stream: int
    n_seq_max: int
    n_swa: int  # 0 = no window masking
    swa_type: str
    layers: tuple[LayerSpec, ...]
    v_trans: bool
    cell_ext: bool

    # the sizes below are asked for every state size (each RAM-cache save, checkpoint, slot file):
    # computed once per spec (cached_property writes the instance dict, which a frozen dataclass allows)
    @cached_property
    def meta_per_cell(self) -> int:
        return 4 + 4 + (12 if self.cell_ext else 0) + 4  # pos, n_seq_id, [ext], seq_id

    @cached_property
    def data_per_cell(self) -> int:
        return sum(l.k_row + (l.v_row if l.has_v else 0) for l in self.layers)

    @cached_property
    def data_header(self) -> int:
        return 8 + sum(12 + (12 if l.has_v else 0) for l in self.layers)

    @cached_property
    def _per_cell(self) -> int:
        return self.meta_per_cell + self.data_per_cell

    def write_size(self, n_cells: int) -> int:
        """Bytes `state_write(io, seq_id)` writes when the sequence has `n_cells` cells in its stream."""
        n = 4 + 4 * self.n_stream
        if n_cells > 0:
            n += n_cells * self._per_cell + self.data_header
        return n

    @property
    def key(self) -> tuple:
        return (self.n_stream, self.v_trans, self.cell_ext, self.layers)

    def write_part(self, w: "Writer", stream: int, seq: int, pos: np.ndarray, tok: np.ndarray) -> None:
        write_kv_part(w, self, stream, seq, pos, tok)

    def read_part(self, src, off: int) -> tuple[int, list[tuple[int, np.ndarray, np.ndarray]]]:
        return read_kv_part(src, off, self)


@dataclass(frozen=True)
class RecurrentSpec:
    """One `llama_memory_recurrent`: what its `state_write` writes (src/llama-memory-recurrent.cpp).

    `size` cells (max(1, n_seq_max): one per sequence), `n_layer` = `hparams.n_layer()` (written as the
    layer count whatever the filter), and per recurrent layer an f32 r row of `n_embd_r` and an s row
    of `n_embd_s` elements a cell. The state of one sequence: the cell count (0 or 1), per cell its
    position and a zero seq count, then `s_trans` (0), the layer count, and per layer the r type, row
    size and rows, then the same for s. The data header is written even without cells (unlike a
    KV cache's). PARTIAL_ONLY changes nothing here: the recurrent state is always whole."""

    name: str
    size: int
    n_layer: int
    n_rs_layers: int
    r_row: int  # ggml_row_size(f32, n_embd_r)
    s_row: int
    n_stream: int = 1  # one cell pool, whatever --kv-unified says
    n_swa: int = 0

    r_type = 0  # GGML_TYPE_F32: create_memory's type_r / type_s
    s_type = 0

    def write_size(self, n_cells: int) -> int:
        return 4 + 8 * n_cells + 8 + self.n_rs_layers * (24 + n_cells * (self.r_row + self.s_row))

    @property
    def key(self) -> tuple:
        return ("rs", self.n_layer, self.n_rs_layers, self.r_row, self.s_row)

    def write_part(self, w: "Writer", stream: int, seq: int, pos: np.ndarray, tok: np.ndarray) -> None:
        write_rs_part(w, self, pos)

    def read_part(self, src, off: int) -> tuple[int, list[tuple[int, np.ndarray, np.ndarray]]]:
        off, pos = read_rs_part(src, off, self)
        return off, ([(0, pos, np.full(len(pos), -1, dtype=np.int32))] if len(pos) else [])


def kv_layers(profile: ModelProfile, ids: Iterable[int], type_k: str, type_v: str) -> tuple[LayerSpec, ...]:
    tk, tv = GGML_TYPES[type_k][0], GGML_TYPES[type_v][0]
    out = []
    for il in ids:
        nv = profile.n_embd_v_gqa(il)
        out.append(LayerSpec(tk, row_size(type_k, profile.n_embd_k_gqa(il)), not profile.mla, tv,
                          row_size(type_v, nv), GGML_TYPES[type_v][2], nv))
    return tuple(out)




class Writer:
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


def write_kv_part(w: Writer, spec: CacheSpec, stream: int, seq: int, pos: np.ndarray, tok: np.ndarray) -> None:
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


class StateReadError(Exception):
    pass


class Source:
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
            raise StateReadError("unexpected end of state data")
        if skip:
            return b""
        if self.f is not None:
            self.f.seek(off)
            return self.f.read(n)
        return self.buf[off:off + n].tobytes()


class Cursor:
    """A read position in a `Source` (or a uint8 buffer): both part readers walk a state with it, each
    `take` checked against the end as llama.cpp's `llama_io_read_buffer` checks it."""

    def __init__(self, src, off: int):
        self.src = src if isinstance(src, Source) else Source(np.asarray(src, dtype=np.uint8))
        self.off = off

    def take(self, n: int, skip: bool = False) -> bytes:
        b = self.src.take(self.off, n, skip)
        self.off += n
        return b

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]


def read_kv_part(src, off: int, spec: CacheSpec) -> tuple[int, list[tuple[int, np.ndarray, np.ndarray]]]:
    """Parse one cache's part of a real-format state (`src`: a uint8 buffer or a `Source`) from `off`;
    returns (new offset, [(stream, positions, tokens)]). Raises StateReadError where llama.cpp fails."""
    cur = Cursor(src, off)
    take, u32 = cur.take, cur.u32
    if u32() != spec.n_stream:
        raise StateReadError("n_stream mismatch")
    out = []
    for s in range(spec.n_stream):
        c = u32()
        if c == 0:
            continue
        if c > spec.size:
            raise StateReadError("not enough cells in kv cache")
        if spec.cell_ext:
            dt = np.dtype([("pos", "<i4"), ("n", "<u4"), ("x", "<i4"), ("y", "<i4"), ("tok", "<i4"), ("seq", "<i4")])
        else:
            dt = np.dtype([("pos", "<i4"), ("n", "<u4"), ("seq", "<i4")])
        meta = np.frombuffer(take(c * dt.itemsize), dtype=dt)
        if np.any(meta["n"] != 1):
            raise StateReadError("invalid seq_id-agnostic kv cell")
        pos = meta["pos"].astype(np.int32)
        tok = meta["tok"].astype(np.int32) if spec.cell_ext else np.full(c, -1, dtype=np.int32)
        v_trans, n_layer = struct.unpack("<II", take(8))
        if n_layer != len(spec.layers):
            raise StateReadError("mismatched layer count")
        if bool(v_trans) != spec.v_trans:
            raise StateReadError("incompatible V transposition")
        for l in spec.layers:
            kt, kr = struct.unpack("<iQ", take(12))
            if kt != l.k_type or kr != l.k_row:
                raise StateReadError("mismatched key type or row size")
            take(c * l.k_row, skip=True)
        for l in spec.layers:
            if not l.has_v:
                continue
            if not spec.v_trans:
                vt, vr = struct.unpack("<iQ", take(12))
                if vt != l.v_type or vr != l.v_row:
                    raise StateReadError("mismatched value type or row size")
                take(c * l.v_row, skip=True)
            else:
                vt, ve, nv = struct.unpack("<iII", take(12))
                if vt != l.v_type or ve != l.v_el or nv != l.n_embd_v:
                    raise StateReadError("mismatched value type or size")
                take(nv * c * l.v_el, skip=True)
        out.append((s, pos, tok))
    return cur.off, out



def write_rs_part(w: Writer, spec: RecurrentSpec, pos: np.ndarray) -> None:
    """`llama_memory_recurrent::state_write` for one sequence whose cells are at `pos` (0 or 1 of them)."""
    c = len(pos)
    w.put(struct.pack("<I", c))
    for p in pos:
        w.put(struct.pack("<iI", int(p), 0))
    w.put(struct.pack("<II", 0, spec.n_layer))
    for row, t in ((spec.r_row, spec.r_type), (spec.s_row, spec.s_type)):
        for _ in range(spec.n_rs_layers):
            w.put(struct.pack("<iQ", t, row))
            w.hole(c * row)


def read_rs_part(src, off: int, spec: RecurrentSpec) -> tuple[int, np.ndarray]:
    """Parse a recurrent part from `off`: (new offset, the cells' positions). Raises StateReadError
    where `state_read_meta` / `state_read_data` fail."""
    cur = Cursor(src, off)
    take = cur.take
    c = cur.u32()
    if c > spec.size:
        raise StateReadError("not enough cells in kv cache")
    pos = np.empty(c, dtype=np.int32)
    for i in range(c):
        p, n_seq = struct.unpack("<iI", take(8))
        if n_seq != 0:
            raise StateReadError("invalid seq_id-agnostic kv cell")
        pos[i] = p
    s_trans, n_layer = struct.unpack("<II", take(8))
    if n_layer != spec.n_layer:
        raise StateReadError("mismatched layer count")
    if s_trans:
        raise StateReadError("incompatible s transposition")
    for row, t in ((spec.r_row, spec.r_type), (spec.s_row, spec.s_type)):
        for _ in range(spec.n_rs_layers):
            tt, rr = struct.unpack("<iQ", take(12))
            if tt != t or rr != row:
                raise StateReadError("mismatched r/s type or row size")
            take(c * row, skip=True)
    return cur.off, pos
