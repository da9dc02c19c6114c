"""State buffers of the real size that occupy no memory, and an allocator with a RAM budget.

A simulated server keeps gigabytes of state blobs in its RAM prompt cache and checkpoints; the
paper memory only needs their sizes and which cells they hold. A `PaperBlob` is a numpy uint8 array
whose `len()` / `.nbytes` are the real size but which is a zero-stride view of one byte, carrying
the cells as a compact `PaperState` payload; it passes through the cache like a real buffer.
`PaperAllocator` hands them out and refuses (std::bad_alloc) past a byte limit."""

from __future__ import annotations

import struct
import weakref
from dataclasses import dataclass

import numpy as np

from slotlab.memory.paper.format import IO_MAGIC, Writer

__all__ = ["PaperAllocator", "PaperBlob", "PaperState", "paper_allocate"]

_ONE_BYTE = np.zeros(1, dtype=np.uint8)


class PaperBlob(np.ndarray):
    """A state buffer of `len(blob)` bytes that occupies none: a read-only zero-stride uint8 view of
    one zero byte. `payload` (a `PaperState`, or None while empty) is what a real buffer's bytes would
    say. `.copy()` copies the reference, not bytes; `bytes(blob)` would materialize zeros — avoid it."""

    payload: "PaperState | None"

    #: written once: a blob gets its payload when made, or when it is filled as a just allocated
    #: buffer (`PaperMemory.state_get(out=)` refuses a blob that holds one), and never after; so a
    #: copy of a checkpoint may share it (`prompt_cache._copy_buffer`), as a copy of `bytes` does
    immutable = True

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
        self._pending: list = []  # (weakref, cache.n_allocated then): blobs of the entry being built (bound only)

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
        held = self.cache.size()  # the cache's running total of its entries' bytes
        mark = self.cache.n_allocated  # bumps when an entry is appended
        pending = []
        for w, m in self._pending:  # a blob handed out since the last append is no entry's yet: the
            b = w()  # append that makes it one bumps n_allocated past its mark
            if b is not None and m == mark:
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
            self._pending.append((weakref.ref(blob), self.cache.n_allocated))
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
    specs: tuple = ()  # the caches' CacheSpec, for to_bytes
    streams: tuple = ()

    @property
    def n_cells(self) -> int:
        return sum(len(p) for p, _ in self.parts)

    def to_bytes(self) -> bytes:
        """The state in llama.cpp's byte format, K/V data zero (materializes `size` bytes)."""
        w = Writer()
        w.put(struct.pack("<Ii", IO_MAGIC, self.seq))
        for spec, st, (p, t) in zip(self.specs, self.streams, self.parts):
            spec.write_part(w, st, self.seq, p, t)
        out = np.empty(w.n, dtype=np.uint8)
        w.into(out)
        return out.tobytes()

