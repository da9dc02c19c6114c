"""One `llama_context` holding one sequence per slot, configured the way llama-server configures it.

Everything the scheduler needs from llama.cpp goes through here: decode with the raw return code,
the sequence operations of `common_memory`, sequence state blobs (NONE / PARTIAL_ONLY) and slot
files. Sizes are reported as the server computes them (spec 6.4) and the memory's seq_rm type is
found with the server's own probe (spec 4.2), so the engine above never touches ctypes."""

from __future__ import annotations

import ctypes
import enum
import os
from pathlib import Path

import numpy as np

from slotlab.errors import ConfigError, ModelError, ShiftNotSupported, StateError
from slotlab.llama import _lib
from slotlab.llama._lib import lib
from slotlab.llama.batch import Batch
from slotlab.llama.model import Model

LLAMA_MAX_SEQ = 256  # llama-cparams.h
STATE_SEQ_FLAGS_NONE = lib.LLAMA_STATE_SEQ_FLAGS_NONE
STATE_SEQ_FLAGS_PARTIAL_ONLY = lib.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY

_u8p = ctypes.POINTER(ctypes.c_uint8)
_i32p = ctypes.POINTER(ctypes.c_int32)


class SeqRmType(enum.Enum):
    """`common_context_seq_rm_type`: how far back a sequence can be truncated."""

    NO = "NO"  # no memory at all
    PART = "PART"  # any suffix can be removed (plain or SWA KV cache)
    FULL = "FULL"  # only whole sequences (recurrent / hybrid without rollback)
    RS = "RS"  # bounded rollback through recurrent-state snapshots


def _pad(n: int, k: int = 256) -> int:
    return (n + k - 1) // k * k


def default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _as_u8(data) -> np.ndarray:
    if isinstance(data, np.ndarray):
        if data.dtype != np.uint8 or not data.flags.c_contiguous:
            raise TypeError("state data must be a contiguous uint8 array")
        return data
    return np.frombuffer(data, dtype=np.uint8)


#: the KV cache types llama-server accepts for -ctk / -ctv (arg.cpp kv_cache_types) -> ggml_type
KV_TYPES = {"f32": 0, "f16": 1, "bf16": 30, "q8_0": 8, "q4_0": 2, "q4_1": 3, "iq4_nl": 20, "q5_0": 6, "q5_1": 7}
FLASH_ATTN = {"auto": lib.LLAMA_FLASH_ATTN_TYPE_AUTO, "on": lib.LLAMA_FLASH_ATTN_TYPE_ENABLED,
              "off": lib.LLAMA_FLASH_ATTN_TYPE_DISABLED}


class Context:
    """A live context: `n_parallel` sequences (slot ids 0..n_parallel-1) over one KV memory."""

    def __init__(
        self,
        model: Model,
        *,
        n_ctx: int = 4096,
        n_parallel: int = 1,
        kv_unified: bool = False,
        swa_full: bool = False,
        n_batch: int = 2048,
        n_ubatch: int = 512,
        n_threads: int | None = None,
        n_threads_batch: int | None = None,
        n_draft: int = 0,
        flash_attn: int | str = lib.LLAMA_FLASH_ATTN_TYPE_AUTO,
        type_k: str = "f16",
        type_v: str = "f16",
        probe_seq_rm: bool = True,
    ):
        for name, v in (("n_ctx", n_ctx), ("n_parallel", n_parallel), ("n_batch", n_batch), ("n_ubatch", n_ubatch)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
                raise ConfigError(f"{name} must be an integer, got {v!r}")
        if n_parallel < 1:
            raise ConfigError(f"n_parallel (-np/--parallel) must be >= 1, got {n_parallel}")
        if n_parallel > LLAMA_MAX_SEQ:
            raise ConfigError(f"n_parallel (-np/--parallel) must be <= {LLAMA_MAX_SEQ}, got {n_parallel}")
        if n_ctx < 0:
            raise ConfigError(f"n_ctx (-c/--ctx-size) must be >= 0 (0 = the model's training context), got {n_ctx}")
        if n_batch < 1 or n_ubatch < 1:
            raise ConfigError(f"n_batch (-b) and n_ubatch (-ub) must be >= 1, got {n_batch} and {n_ubatch}")
        if n_draft < 0:
            raise ConfigError(f"n_draft must be >= 0, got {n_draft}")
        if isinstance(flash_attn, str):
            if flash_attn not in FLASH_ATTN:
                raise ConfigError(f"flash_attn (-fa) must be on, off or auto, got {flash_attn!r}")
            flash_attn = FLASH_ATTN[flash_attn]
        for name, t in (("type_k (-ctk)", type_k), ("type_v (-ctv)", type_v)):
            if t not in KV_TYPES:
                raise ConfigError(f"{name}: Unsupported cache type: {t} (one of {', '.join(KV_TYPES)})")
        threads = default_threads()
        n_threads = threads if n_threads is None else int(n_threads)
        n_threads_batch = n_threads if n_threads_batch is None else int(n_threads_batch)
        if n_threads < 1 or n_threads_batch < 1:
            raise ConfigError(f"n_threads (-t) must be >= 1, got {n_threads}")

        # A per-sequence context beyond the model's training context is not an error: llama.cpp logs
        # "n_ctx_seq (N) > n_ctx_train (M) -- possible training context overflow" (LC:327) and the
        # server runs, capping each slot's context at n_ctx_train (SC:1213, n_ctx_slot below).
        # slotlab does the same; the warning reaches the "slotlab.llama" logger.

        self.model = model
        p = lib.llama_context_default_params()
        p.n_ctx = n_ctx
        p.n_seq_max = n_parallel
        p.n_batch = n_batch
        p.n_ubatch = n_ubatch
        # server_output_limits(): one output per slot, plus the draft tokens verified per step
        p.n_outputs_max = min(n_batch, n_parallel * (1 + n_draft))
        p.n_outputs_max_per_seq = min(n_batch, 1 + n_draft)
        p.n_threads = n_threads
        p.n_threads_batch = n_threads_batch
        p.flash_attn_type = flash_attn
        p.type_k, p.type_v = KV_TYPES[type_k], KV_TYPES[type_v]
        p.no_perf = False
        p.swa_full = bool(swa_full)
        p.kv_unified = bool(kv_unified)
        _lib.clear_recent()
        ptr = lib.llama_init_from_model(model.ptr, p)
        if not ptr:
            errs = _lib.recent_errors()
            raise ModelError("failed to create the llama context" + (": " + " | ".join(errs[-3:]) if errs else ""))
        self._ptr = ptr
        self.mem = lib.llama_get_memory(ptr)
        self.kv_unified = bool(kv_unified)
        self.swa_full = bool(swa_full)
        self.n_threads, self.n_threads_batch = n_threads, n_threads_batch
        self.n_ctx = int(lib.llama_n_ctx(ptr))
        self.n_ctx_seq = int(lib.llama_n_ctx_seq(ptr))
        self.n_batch = int(lib.llama_n_batch(ptr))
        self.n_ubatch = int(lib.llama_n_ubatch(ptr))
        self.n_seq_max = int(lib.llama_n_seq_max(ptr))
        self.n_rs_seq = int(lib.llama_n_rs_seq(ptr))
        self.can_shift = bool(self.mem and lib.llama_memory_can_shift(self.mem))
        # SC:1185: the server's n_swa is 0 with --swa-full (the SWA cache then holds everything)
        self.n_swa = 0 if swa_full else model.n_swa
        self.seq_rm_type = self._probe_seq_rm() if probe_seq_rm else None

    # --- lifetime ---------------------------------------------------------------------------------

    @property
    def ptr(self):
        if self._ptr is None:
            raise StateError("the context has been closed")
        return self._ptr

    def close(self) -> None:
        if getattr(self, "_ptr", None):
            lib.llama_free(self._ptr)
            self._ptr = None

    def __del__(self):  # pragma: no cover
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return (f"Context(n_ctx={self.n_ctx}, n_ctx_seq={self.n_ctx_seq}, n_seq_max={self.n_seq_max}, "
                f"kv_unified={self.kv_unified}, swa_full={self.swa_full}, n_swa={self.n_swa}, "
                f"can_shift={self.can_shift}, seq_rm={self.seq_rm_type and self.seq_rm_type.value})")

    # --- sizes ------------------------------------------------------------------------------------

    def n_ctx_slot(self, kv_unified_per_slot: int = 0) -> int:
        """Each slot's `n_ctx` as the server computes it (SC:4008-4016)."""
        n = self.n_ctx_seq
        if kv_unified_per_slot > 0:
            n = min(n, kv_unified_per_slot)
        return min(n, self.model.n_ctx_train)

    def _probe_seq_rm(self) -> SeqRmType:
        """`common_context_can_seq_rm` (CC:1491): decode two tokens of id 0 on seq 0, try to drop the
        second, clear the memory. Must run before any slot holds data."""
        if not self.mem:
            return SeqRmType.NO
        if self.n_rs_seq > 0:
            return SeqRmType.RS
        self.clear()
        b = Batch(2)
        b.add(0, 0, 0)
        b.add(0, 1, 0, logits=True)
        ret = self.decode(b)
        if ret != 0:
            res = SeqRmType.NO
        elif not lib.llama_memory_seq_rm(self.mem, 0, 1, -1):
            res = SeqRmType.FULL
        else:
            res = SeqRmType.PART
        self.clear()
        lib.llama_synchronize(self.ptr)
        return res

    # --- decode -----------------------------------------------------------------------------------

    def decode(self, batch: Batch, offset: int = 0, n: int | None = None) -> int:
        """Decode tokens [offset, offset+n) of `batch`. Returns llama_decode's raw code: 0 ok,
        1 no KV slot (retry smaller / after clearing), 2 aborted, -1 invalid batch, < -1 fatal."""
        view = batch.view(offset, n)
        if view.n_tokens > self.n_batch:
            # llama.cpp GGML_ASSERTs (kills the process) here; the server decodes in n_batch chunks
            raise ValueError(f"decode of {view.n_tokens} tokens exceeds n_batch {self.n_batch}: decode in chunks")
        return int(lib.llama_decode(self.ptr, view))

    def logits(self, i: int) -> np.ndarray:
        """Logits of batch output `i` (a copy, n_vocab floats)."""
        p = lib.llama_get_logits_ith(self.ptr, i)
        if not p:
            raise StateError(f"no logits for batch index {i} (was logits requested for it?)")
        return np.ctypeslib.as_array(p, shape=(self.model.n_vocab,)).copy()

    # --- sequence operations (common_memory) ------------------------------------------------------

    def _check_seq(self, seq: int, allow_all: bool = False) -> None:
        if allow_all and seq == -1:
            return
        if not 0 <= seq < self.n_seq_max:
            raise ValueError(f"sequence id {seq} outside 0..{self.n_seq_max - 1}")

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        """Remove positions [p0, p1) (-1 = open end) of `seq` (-1 = all); False if the memory refuses."""
        self._check_seq(seq, allow_all=True)
        return bool(lib.llama_memory_seq_rm(self.mem, seq, p0, p1))

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        """Shift positions [p0, p1) of `seq` by `delta` (the `--cache-reuse` KV move)."""
        self._check_seq(seq)
        if not self.can_shift:
            raise ShiftNotSupported(
                "this context cannot shift KV positions (llama_memory_can_shift is false: "
                + ("SWA model without --swa-full" if self.model.n_swa > 0 and not self.swa_full else "memory type")
                + "); cache reuse is not supported"
            )
        lib.llama_memory_seq_add(self.mem, seq, p0, p1, delta)

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        self._check_seq(src)
        self._check_seq(dst)
        lib.llama_memory_seq_cp(self.mem, src, dst, p0, p1)

    def seq_keep(self, seq: int) -> None:
        self._check_seq(seq)
        lib.llama_memory_seq_keep(self.mem, seq)

    def seq_pos_min(self, seq: int) -> int:
        self._check_seq(seq)
        return int(lib.llama_memory_seq_pos_min(self.mem, seq))

    def seq_pos_max(self, seq: int) -> int:
        self._check_seq(seq)
        return int(lib.llama_memory_seq_pos_max(self.mem, seq))

    def clear(self, data: bool = True) -> None:
        lib.llama_memory_clear(self.mem, data)

    def warmup(self) -> int:
        """common_init_from_params' warm-up (on unless --no-warmup): decode [BOS, EOS] once, then clear the
        memory and reset the perf counters. llama-server pays its first graph allocation here, at load, so
        its first request is timed warm; slotlab does the same so that timings compare. Decides nothing:
        the memory is empty afterwards. Returns llama_decode's code, which the server ignores too."""
        v = self.model.vocab
        toks = [t for t in (lib.llama_vocab_bos(v), lib.llama_vocab_eos(v)) if t != -1] or [0]
        toks = toks[: self.n_batch]
        arr = (ctypes.c_int32 * len(toks))(*toks)
        rc = int(lib.llama_decode(self.ptr, lib.llama_batch_get_one(arr, len(toks))))
        lib.llama_memory_clear(self.mem, True)
        lib.llama_synchronize(self.ptr)
        lib.llama_perf_context_reset(self.ptr)
        return rc

    # --- state blobs ------------------------------------------------------------------------------

    def state_seq_size(self, seq: int, flags: int = STATE_SEQ_FLAGS_NONE) -> int:
        self._check_seq(seq)
        return int(lib.llama_state_seq_get_size_ext(self.ptr, seq, flags))

    def state_seq_get(self, seq: int, flags: int = STATE_SEQ_FLAGS_NONE, out: np.ndarray | None = None) -> np.ndarray:
        """Copy the sequence state into a uint8 buffer (`out` if given and large enough)."""
        size = self.state_seq_size(seq, flags)
        if out is None or len(out) < size:
            out = np.empty(size, dtype=np.uint8)
        n = int(lib.llama_state_seq_get_data_ext(self.ptr, out.ctypes.data_as(_u8p), size, seq, flags))
        if n != size:
            raise StateError(f"state copy of sequence {seq} returned {n} bytes, expected {size}")
        return out[:n]

    def state_seq_set(self, data, seq: int, flags: int = STATE_SEQ_FLAGS_NONE) -> int:
        """Restore a state blob into `seq`. Returns the bytes read (0 = failure; llama.cpp then leaves
        the sequence empty). No copy of `data` is made."""
        self._check_seq(seq)
        buf = _as_u8(data)
        return int(lib.llama_state_seq_set_data_ext(self.ptr, buf.ctypes.data_as(_u8p), len(buf), seq, flags))

    def state_seq_save_file(self, path: str | os.PathLike, seq: int, tokens) -> int:
        """`llama_state_seq_save_file`: header + token payload + state. Returns bytes written (0 = failure)."""
        self._check_seq(seq)
        toks = np.ascontiguousarray(tokens, dtype=np.int32)
        return int(lib.llama_state_seq_save_file(self.ptr, os.fsencode(Path(path)), seq,
                                                 toks.ctypes.data_as(_i32p), len(toks)))

    def state_seq_load_file(self, path: str | os.PathLike, seq: int) -> tuple[int, np.ndarray]:
        """Probe the header for the payload length, then load payload and state into `seq`.
        Returns (bytes read, payload words); (0, empty) when llama.cpp refused the file."""
        self._check_seq(seq)
        fpath = os.fsencode(Path(path))
        n = ctypes.c_size_t(0)
        if lib.llama_state_seq_load_file(self.ptr, fpath, seq, None, 0, ctypes.byref(n)) == 0:
            return 0, np.empty(0, dtype=np.int32)
        out = np.empty(max(1, n.value), dtype=np.int32)
        read = int(lib.llama_state_seq_load_file(self.ptr, fpath, seq, out.ctypes.data_as(_i32p), len(out), ctypes.byref(n)))
        if read == 0:
            return 0, np.empty(0, dtype=np.int32)
        return read, out[: n.value].copy()
