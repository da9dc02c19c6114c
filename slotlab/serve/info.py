"""What the server says about itself and a request's settings: `task_params::to_json` (a response's
`generation_settings`, /props's `default_generation_settings.params`), `/props`, `/v1/models` and the
Prometheus text of `/metrics` (ST:30-146, SC:4560-4626, ST:1523-1617), with the server's keys,
order and help texts.

Request defaults come from `slotlab.serve.defaults.sampling_defaults(params)` (the flags) for parsed flags;
else from `SERVER_DEFAULTS`, llama.cpp's `common_params_sampling` defaults as the server reports them."""

from __future__ import annotations

import dataclasses
import os
import secrets

from slotlab.engine.params import ServerParams
from slotlab.llama.chat_builtin import special_texts
from slotlab.serve import nljson as J
from slotlab.serve.defaults import sampling_defaults

# llama_build_info() of the llama.cpp slotlab reproduces (the llama-server `make llama-server` builds from
# llama-cpp-python 0.3.36's vendored tree), marked as slotlab's: /props build_info and every OpenAI
# answer's system_fingerprint (clients read it as "b<build>-<commit>")
BUILD_INFO = "b1-0c1e570-slotlab"

# common_params_sampling / task_params defaults, as the server's JSON shows them (float32 values)
SERVER_DEFAULTS = {
    "seed": 4294967295, "temperature": 0.800000011920929, "dynatemp_range": 0.0, "dynatemp_exponent": 1.0,
    "top_k": 40, "top_p": 0.949999988079071, "min_p": 0.05000000074505806, "top_n_sigma": -1.0,
    "xtc_probability": 0.0, "xtc_threshold": 0.10000000149011612, "typical_p": 1.0, "repeat_last_n": 64,
    "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "dry_multiplier": 0.0,
    "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": 64,
    "dry_sequence_breakers": ["\n", ":", "\"", "*"], "mirostat": 0, "mirostat_tau": 5.0,
    "mirostat_eta": 0.10000000149011612, "adaptive_target": -1.0, "adaptive_decay": 0.8999999761581421,
    "stop": [], "n_predict": -1, "n_keep": 0, "n_discard": 0, "ignore_eos": False, "stream": False,
    "logit_bias": [], "n_probs": 0, "min_keep": 0, "grammar": "", "grammar_lazy": False, "grammar_triggers": [],
    "preserved_tokens": [], "chat_format": "Content-only", "reasoning_format": "none", "reasoning_in_content": False,
    "generation_prompt": "", "samplers": ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc",
                                          "temperature"],
    "speculative.types": "none", "timings_per_token": False, "post_sampling_probs": False,
    "backend_sampling": False, "lora": [], "cache_prompt": True, "n_cache_reuse": 0, "sse_ping_interval": 30,
    "n_cmpl": 1, "return_tokens": False, "return_progress": False, "response_fields": [],
}

# to_json(only_metrics=true): /props and /slots; to_json(false) adds the rest in place (FULL_KEYS)
METRIC_KEYS = ["seed", "temperature", "dynatemp_range", "dynatemp_exponent", "top_k", "top_p", "min_p", "top_n_sigma",
               "xtc_probability", "xtc_threshold", "typical_p", "repeat_last_n", "repeat_penalty", "presence_penalty",
               "frequency_penalty", "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
               "mirostat", "mirostat_tau", "mirostat_eta", "adaptive_target", "adaptive_decay", "max_tokens",
               "n_predict", "n_keep", "n_discard", "ignore_eos", "stream", "n_probs", "min_keep", "chat_format",
               "reasoning_format", "reasoning_in_content", "generation_prompt", "samplers", "speculative.types",
               "timings_per_token", "post_sampling_probs", "backend_sampling", "lora"]
FULL_KEYS = (METRIC_KEYS[:19] + ["dry_sequence_breakers"] + METRIC_KEYS[19:24] + ["stop"] + METRIC_KEYS[24:30]
             + ["logit_bias"] + METRIC_KEYS[30:32] + ["grammar", "grammar_lazy", "grammar_triggers", "preserved_tokens"]
             + METRIC_KEYS[32:])


def request_defaults(params) -> dict:
    """The values a request starts from (eval_llama_cmpl_schema copies them from the command line)."""
    out = dict(SERVER_DEFAULTS)
    if isinstance(params, ServerParams):
        for k, v in sampling_defaults(params).items():
            if k in out and k not in ("grammar", "logit_bias"):
                out[k] = v
    out["n_predict"] = getattr(params, "n_predict", -1)
    out["verbose"] = getattr(params, "verbosity", 3) > 9  # params_from_json_cmpl: -v turns __verbose on
    out["cache_prompt"] = getattr(params, "cache_prompt", True)
    return out


def task_params_json(values: dict, only_metrics: bool = False) -> dict:
    v = {**SERVER_DEFAULTS, **values}
    v["max_tokens"] = v["n_predict"]
    if not isinstance(v.get("samplers"), list):
        v["samplers"] = SERVER_DEFAULTS["samplers"]
    return {k: v[k] for k in (METRIC_KEYS if only_metrics else FULL_KEYS)}


def props_json(engine, chat, params, t_alias: str) -> dict:
    """get_res_props (SC:4590-4626): a default task_params (so n_predict -1, reasoning_format none)
    with the command line's sampling."""
    sampling = {k: v for k, v in request_defaults(params).items()
                if k not in ("n_predict", "n_keep", "stop", "reasoning_format", "cache_prompt")}
    m = engine.model
    props = {
        "default_generation_settings": {"params": task_params_json(sampling, only_metrics=True),
                                        "n_ctx": engine.n_ctx_slot},
        "total_slots": len(engine.slots),
        "model_alias": t_alias,
        "model_ftype": m.desc.split(" ", 2)[2] if m.desc.count(" ") >= 2 else "",  # llama_model_desc: arch type ftype
        "model_path": str(m.path),
        "modalities": {"vision": False, "video": False, "audio": False},
        "media_marker": MEDIA_MARKER,
        "endpoint_slots": bool(getattr(params, "slots_endpoint", True)),
        "endpoint_props": bool(getattr(params, "endpoint_props", False)),
        "endpoint_metrics": bool(getattr(params, "metrics", False)),
        "ui": False,  # slotlab serves no web UI
        "ui_settings": {},
        "chat_template": chat.source,
        "bos_token": special_texts(m)["bos_token"],
        "eos_token": special_texts(m)["eos_token"],
        "build_info": BUILD_INFO,
        "is_sleeping": False,
        "cors_proxy_enabled": False,
    }
    caps = getattr(chat, "caps", None)
    props["chat_template_caps"] = dict(sorted({**CAPS_DEFAULT, **(dataclasses.asdict(caps) if caps else {})}.items()))
    order = list(props)  # the server's key order: the caps right after the template
    order.insert(order.index("chat_template") + 1, order.pop(order.index("chat_template_caps")))
    return {k: props[k] for k in order}


# the caps llama.cpp reports that slotlab's template probe does not (no tool calling is modelled)
CAPS_DEFAULT = {"supports_object_arguments": False, "supports_parallel_tool_calls": False,
                "supports_preserve_reasoning": False, "supports_reasoning_effort": False,
                "supports_string_content": True, "supports_system_role": True, "supports_tool_calls": False,
                "supports_tools": False, "supports_typed_content": False}
# get_media_marker(): $LLAMA_MEDIA_MARKER, else a random marker fixed for the process
MEDIA_MARKER = os.environ.get("LLAMA_MEDIA_MARKER") or f"<__media_{secrets.token_urlsafe(24)[:32]}__>"


def models_json(name: str, aliases: list[str], tags: list[str], created: int, meta: dict,
                server_build: int = 11312) -> dict:
    """get_res_models (SC:4527-4588): the Ollama-style `models` list and the OpenAI `data` list. From
    b11434 each model also says its modalities (`architecture`, text only here: slotlab has no mtmd)."""
    arch = {"architecture": {"input_modalities": ["text"], "output_modalities": ["text"]}} if server_build >= 11434 else {}
    return {
        "models": [{"name": name, "model": name, "modified_at": "", "size": "", "digest": "", "type": "model",
                    "description": "", "tags": [""], "capabilities": ["completion"], "parameters": "",
                    "details": {"parent_model": "", "format": "gguf", "family": "", "families": [""],
                                "parameter_size": "", "quantization_level": ""}}],
        "object": "list",
        "data": [{"id": name, "aliases": aliases, "tags": tags, "object": "model", **arch, "created": created,
                  "owned_by": "llamacpp", "meta": meta}],
    }


_COUNTERS = [
    ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens"),
    ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache"),
    ("prompt_seconds_total", "Total time spent processing prompts"),
    ("tokens_predicted_total", "Number of generation tokens processed"),
    ("tokens_predicted_seconds_total", "Total time spent generating tokens"),
    ("n_decode_total", "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding"),
    ("n_tokens_max", "Largest observed sequence length (prompt + generation)"),
    ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated"),
    ("spec_decode_num_accepted_tokens_total", "Speculative: Total draft tokens accepted by the target model"),
    ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps"),
]
_GAUGES = [
    ("prompt_tokens_seconds", "Average prompt throughput in tokens/s"),
    ("predicted_tokens_seconds", "Average generation throughput in tokens/s"),
    ("requests_processing", "Number of requests processing"),
    ("requests_deferred", "Number of requests deferred"),
    ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call"),
]


def _num(x: float) -> str:
    """std::stringstream << double: 6 significant digits."""
    return f"{float(x):.6g}"


def metrics_text(values: dict) -> str:
    """server_task_result_metrics::to_metrics: HELP, TYPE and value for every counter, then gauges."""
    out = []
    for typ, items in (("counter", _COUNTERS), ("gauge", _GAUGES)):
        for name, help_ in items:
            out += [f"# HELP llamacpp:{name} {help_}", f"# TYPE llamacpp:{name} {typ}",
                    f"llamacpp:{name} {_num(values.get(name, 0))}"]
    return "\n".join(out) + "\n"


def json_nested(paths: list[str], js: dict) -> dict:
    """json_get_nested_values (`response_fields`): each path found, keyed by the path as written."""
    out = {}
    for path in paths:
        cur, ok = js, True
        for k in path.split("/"):
            if ok and isinstance(cur, dict) and k in cur:
                cur = cur[k]
            else:
                ok = False
        if ok:
            out[path] = cur
    return out


def finite(obj):
    return J.finite(obj)
