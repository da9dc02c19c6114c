"""A request's sampling settings: llama.cpp's `common_params_sampling` as plain data.

The engine carries it on a task (TaskParams.sampling) and the memory hands it to its sampler, so it
lives beside neither: pure Python, no llama-cpp import, the defaults of common/common.h. The llama
layer (slotlab.llama.sampling) builds the server's sampler chain from it; slotlab.serve.sampling fills
it from a request body as the server's schema does (server-schema.cpp)."""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: a random seed

# common_sampler_type in the order of common_params_sampling::samplers (the default chain)
DEFAULT_SAMPLERS = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")
_CANONICAL = ("dry", "top_k", "top_p", "top_n_sigma", "typ_p", "min_p", "temperature", "xtc", "infill", "penalties",
              "adaptive_p")
# common_sampler_type_to_chr
SAMPLER_CHARS = {"dry": "d", "top_k": "k", "typ_p": "y", "top_p": "p", "top_n_sigma": "s", "min_p": "m",
                 "temperature": "t", "xtc": "x", "infill": "i", "penalties": "e", "adaptive_p": "a"}


def _sampler_aliases() -> dict[str, str]:
    """common_sampler_types_from_names: canonical names, their kebab-case and no-dash forms, and
    `nucleus`, `temp`, `typ`."""
    out = {}
    for c in _CANONICAL:
        if "_" in c:
            out[c.replace("_", "-")] = c
            out[c.replace("_", "")] = c
    out.update({"nucleus": "top_p", "temp": "temperature", "typ": "typ_p"})
    out.update({c: c for c in _CANONICAL})
    return out


SAMPLER_ALIASES = _sampler_aliases()


def samplers_from_names(names: list[str]) -> tuple[str, ...]:
    """Unknown names are skipped (the server only logs a warning)."""
    return tuple(SAMPLER_ALIASES[n] for n in names if n in SAMPLER_ALIASES)


def samplers_from_chars(chars: str) -> tuple[str, ...]:
    by_chr = {v: k for k, v in SAMPLER_CHARS.items()}
    return tuple(by_chr[c] for c in chars if c in by_chr)


@dataclass
class SamplingParams:
    """common_params_sampling fields slotlab models (names as in common.h); `logit_bias` is a list
    of (token, bias) in the server's order (user biases, then the EOG biases of ignore_eos)."""

    seed: int = DEFAULT_SEED
    n_probs: int = 0
    min_keep: int = 0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.10
    typ_p: float = 1.0
    temp: float = 0.80
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    penalty_last_n: int = 64
    penalty_repeat: float = 1.0
    penalty_freq: float = 0.0
    penalty_present: float = 0.0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64
    adaptive_target: float = -1.0
    adaptive_decay: float = 0.90
    mirostat: int = 0
    top_n_sigma: float = -1.0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.10
    ignore_eos: bool = False
    dry_sequence_breakers: tuple[str, ...] = ("\n", ":", "\"", "*")
    samplers: tuple[str, ...] = DEFAULT_SAMPLERS
    grammar: str = ""  # GBNF (a json_schema is converted before it gets here)
    logit_bias: list = field(default_factory=list)  # [(token, bias)]
    post_sampling_probs: bool = False  # task_params, kept here since only the sampler reads it
