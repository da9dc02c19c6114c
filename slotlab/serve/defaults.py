"""The defaults a request starts from, as the flags set them: what /props shows as
`default_generation_settings` and what a /completion request's missing fields take.

llama-server copies `params_base.sampling` (and n_keep, n_predict, n_cache_reuse, cache_prompt,
antiprompt, sse_ping_interval, reasoning_format) into each task (server-schema.cpp
eval_llama_cmpl_schema); `sampling_defaults(params)` is that copy, keyed by the request's field
names, from parsed flags (slotlab.engine.params.ServerParams)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

from slotlab.engine import arg_values as V
from slotlab.engine.params import ServerParams
from slotlab.sampling import SAMPLER_ALIASES

__all__ = ["REQUEST_FIELDS", "SAMPLING_REQUEST_KEYS", "sampling_defaults"]

# ServerParams field -> the /completion request field it is the default of (server-task.cpp to_json)
REQUEST_FIELDS = {
    "seed": "seed", "temp": "temperature", "dynatemp_range": "dynatemp_range",
    "dynatemp_exponent": "dynatemp_exponent", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
    "top_n_sigma": "top_n_sigma", "xtc_probability": "xtc_probability", "xtc_threshold": "xtc_threshold",
    "typ_p": "typical_p", "penalty_last_n": "repeat_last_n", "penalty_repeat": "repeat_penalty",
    "penalty_present": "presence_penalty", "penalty_freq": "frequency_penalty", "dry_multiplier": "dry_multiplier",
    "dry_base": "dry_base", "dry_allowed_length": "dry_allowed_length", "dry_penalty_last_n": "dry_penalty_last_n",
    "dry_sequence_breakers": "dry_sequence_breakers", "mirostat": "mirostat", "mirostat_tau": "mirostat_tau",
    "mirostat_eta": "mirostat_eta", "adaptive_target": "adaptive_target", "adaptive_decay": "adaptive_decay",
    "antiprompt": "stop", "n_predict": "n_predict", "n_keep": "n_keep", "ignore_eos": "ignore_eos",
    "grammar": "grammar", "samplers": "samplers", "cache_prompt": "cache_prompt", "cache_reuse": "n_cache_reuse",
    "sse_ping_interval": "sse_ping_interval", "reasoning_format": "reasoning_format",
    "reasoning_budget_tokens": "reasoning_budget_tokens",
}
# the request fields whose defaults live in common_params_sampling: the only ones /props shows from the
# flags (get_res_props copies params.sampling into a fresh task_params, so its n_predict, n_keep,
# reasoning_format ... there are task_params' own defaults, not the flags')
SAMPLING_REQUEST_KEYS = frozenset(REQUEST_FIELDS[f] for f in REQUEST_FIELDS if f not in (
    "antiprompt", "n_predict", "n_keep", "cache_prompt", "cache_reuse", "sse_ping_interval",
    "reasoning_format")) | {"logit_bias", "n_probs", "min_keep", "backend_sampling"}
# flags that set a bit of user_sampling_config (then the GGUF's general.sampling.* does not apply)
_USER_SAMPLING = {"temp", "top_k", "top_p", "min_p", "xtc_probability", "xtc_threshold", "penalty_last_n",
                  "penalty_repeat", "mirostat", "mirostat_tau", "mirostat_eta", "samplers"}


_MODEL_SAMPLING_KEYS = {  # general.sampling.<key> -> (field, conversion), common_init_sampler_from_model
    "top_k": ("top_k", V.stoi), "top_p": ("top_p", V.stof), "min_p": ("min_p", V.stof),
    "xtc_probability": ("xtc_probability", V.stof), "xtc_threshold": ("xtc_threshold", V.stof),
    "temp": ("temp", V.stof), "penalty_last_n": ("penalty_last_n", V.stoi),
    "penalty_repeat": ("penalty_repeat", V.stof), "mirostat": ("mirostat", V.stoi),
    "mirostat_tau": ("mirostat_tau", V.stof), "mirostat_eta": ("mirostat_eta", V.stof),
}


def sampling_defaults(params: ServerParams, model_meta: Mapping[str, Any] | None = None) -> dict:
    """The defaults a /completion request starts from, keyed by the request's field names
    (server-schema.cpp eval_llama_cmpl_schema copies params_base.sampling, n_keep, n_predict,
    n_cache_reuse, cache_prompt, antiprompt, sse_ping_interval and reasoning_format into each
    task). Floats are the server's float32 values (0.8 is 0.800000011920929 in its JSON).
    /props's default_generation_settings.params shows only SAMPLING_REQUEST_KEYS from these.

    `model_meta` (the GGUF's key/value metadata) applies the model's `general.sampling.*`
    recommendations for every value the command line did not set, as common_init_sampler_from_model
    does after loading the model."""
    p = params
    if model_meta:
        p = dataclasses.replace(params, **_model_sampling(params, model_meta))
    out: dict[str, Any] = {}
    for fld, req in REQUEST_FIELDS.items():
        v = getattr(p, fld)
        out[req] = V.f32(v) if isinstance(v, float) else list(v) if isinstance(v, tuple) else v
    out["logit_bias"] = [{"bias": V.f32(b), "token": t} for t, b in p.logit_bias]  # format_logit_bias
    out.update(n_probs=0, min_keep=0, backend_sampling=False,  # no flag sets them for the server
               json_schema=json.loads(p.json_schema) if p.json_schema else None)
    return out

def _model_sampling(params: ServerParams, meta: Mapping[str, Any]) -> dict:
    """common_init_sampler_from_model: general.sampling.* values for fields the user did not set
    (each parsed with strtol / strtof prefix rules; unparsable values are skipped)."""
    out: dict[str, Any] = {}
    user = _user_sampling(params)
    seq = meta.get("general.sampling.sequence")
    if seq is not None and "samplers" not in user:
        names = [n for n in (SAMPLER_ALIASES.get(x.lower()) for x in str(seq).split(";")) if n]
        if names:
            out["samplers"] = tuple(names)
    for key, (fld, conv) in _MODEL_SAMPLING_KEYS.items():
        if fld in user or f"general.sampling.{key}" not in meta:
            continue
        try:
            out[fld] = conv(str(meta[f"general.sampling.{key}"]))
        except V.BadValue:
            continue
    return out

def _user_sampling(params: ServerParams) -> set:
    """The fields the server marks in user_sampling_config (set by a flag, so the model's
    metadata does not override them)."""
    return {k for k in params.explicit if k in _USER_SAMPLING}
