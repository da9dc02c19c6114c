"""llama-server's flags, with the server's names, aliases and defaults (spec section 9).

A user pastes the flags they run in production (`ServerParams.from_args([...])`) or passes keyword
arguments named after the long flag (`ServerParams(cache_ram=128, n_parallel=2)`). Every option of
the pinned llama.cpp's argument table (slotlab/engine/arg_table.py, generated from its common/arg.cpp)
is accepted, in three classes (slotlab/engine/flag_classes.py): modelled into a field below (named
as in common_params where slotlab had no older name), speed-only (a note), or a feature slotlab does
not model (accepted; `unsupported_notes()` says what answers not_supported_error). Values are
converted as the server converts them (slotlab/engine/arg_values.py); anything unknown, removed or
out of range is a ConfigError that names the flag."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from slotlab.engine import arg_values as V
from slotlab.engine.arg_table import ARGS as _ROWS
from slotlab.engine.arg_table import KEYS as _KEYS
from slotlab.engine.flag_classes import MODEL_SOURCE, SPEED, UNMODELLED
from slotlab.errors import ConfigError
from slotlab.sampling import SAMPLER_ALIASES, SAMPLER_CHARS, samplers_from_chars

AUTO = -1
#: `--cache-ram`'s default (common_params::cache_ram_mib), in MiB: a log that does not print it means this
CACHE_RAM_MIB_DEFAULT = 8192


@dataclass
class ServerParams:
    model: str | None = None  # -m; None = the embedded default model
    n_ctx: int = 0  # -c; 0 = training context (slotlab does no --fit reduction)
    n_parallel: int = AUTO  # -np; -1 = auto: 4 slots and a unified KV
    n_batch: int = 2048  # -b
    n_ubatch: int = 512  # -ub
    n_threads: int | None = None  # -t; None = the CPUs this process may use
    n_threads_batch: int | None = None  # -tb
    n_gpu_layers: int = 0  # -ngl; -1 = all (needs a GPU build)
    no_repack: bool = True  # --no-repack (the reference server is run with it)
    cache_ram: int = CACHE_RAM_MIB_DEFAULT  # --cache-ram MiB; -1 no byte limit; 0 disabled
    slot_prompt_similarity: float = 0.10  # -sps; 0 disables LCP selection
    kv_unified: bool = False  # -kvu / -no-kvu (forced true when -np is auto)
    kv_unified_per_slot: int = 0  # --kv-unified-per-slot
    cache_idle_slots: bool = True  # --cache-idle-slots / --no-cache-idle-slots
    swa_full: bool = False  # --swa-full
    cache_prompt: bool = True  # --cache-prompt / --no-cache-prompt
    cache_reuse: int = 0  # --cache-reuse
    ctx_checkpoints: int = 32  # -ctxcp / --ctx-checkpoints / --swa-checkpoints
    checkpoint_min_step: int = 8192  # -cms / --checkpoint-min-step
    slot_save_path: str | None = None  # --slot-save-path
    n_predict: int = -1  # -n
    cont_batching: bool = True  # -cb / -nocb
    model_draft: str | None = None  # -md / --spec-draft-model
    draft_max: int = 3  # --spec-draft-n-max (common_params_speculative_draft::n_max)
    draft_min: int = 0  # --spec-draft-n-min
    spec_type: str = "none"  # --spec-type: slotlab models "draft-simple" (with -md) and "none"
    verbosity: int = 3  # -lv; -v = INT_MAX (DBG lines too)
    # slotlab's extension, opt-in: --slot-appendices appends the slot's context checkpoints (SCKP) and draft
    # state (SDFT) to slot files and reads them back on restore. Off (the default, --no-slot-appendices),
    # slot files are written and read exactly as llama-server does: no checkpoints travel with them.
    slot_appendices: bool = False
    # the HTTP front (`slotlab serve`)
    host: str = "127.0.0.1"  # --host
    port: int = 8080  # --port
    sleep_idle_seconds: int = -1  # --sleep-idle-seconds (slotlab/serve/sleep.py; -1: never)
    api_key: str | None = None  # --api-key
    metrics: bool = False  # --metrics
    slots_endpoint: bool = True  # --slots / --no-slots
    webui: bool = True  # --webui / --no-webui (slotlab serves no web UI; accepted for compatibility)
    endpoint_props: bool = False  # --props (POST /props may change global properties)
    model_alias: tuple = ()  # -a/--alias, comma-separated; a std::set in the server: sorted, unique
    model_tags: tuple = ()  # --tags (informational, /v1/models)
    api_keys: tuple = ()  # every key: --api-key (comma-separated) and --api-key-file lines; see api_key
    timeout_read: int = 3600  # -to/--timeout (sets read and write)
    timeout_write: int = 3600
    sse_ping_interval: int = 30  # --sse-ping-interval (request default)
    cors_origins: str = "*"  # --cors-origins ("localhost" = reflect a localhost Origin)
    cors_methods: str = "GET, POST, DELETE, OPTIONS"  # --cors-methods
    cors_headers: str = "*"  # --cors-headers
    cors_credentials: bool = True  # --cors-credentials / --no-cors-credentials
    log_file: str | None = None  # --log-file: the server's log lines go (also) there
    # the KV cache's element types and attention kernel: they set the bytes of every slot state, RAM-cache
    # entry and slot file, so --cache-ram evictions depend on them (llama_context_params type_k / type_v /
    # flash_attn_type; a quantized V needs flash attention, which llama.cpp then turns on in auto)
    cache_type_k: str = "f16"  # -ctk / --cache-type-k
    cache_type_v: str = "f16"  # -ctv / --cache-type-v
    flash_attn: str = "auto"  # -fa / --flash-attn on|off|auto
    warmup: bool = True  # --warmup / --no-warmup: an empty decode at load (common_init_from_params)
    # chat templates and reasoning (common_params names)
    use_jinja: bool = True  # --jinja / --no-jinja (on by default in this llama.cpp)
    chat_template: str = ""  # --chat-template NAME|JINJA, or --chat-template-file's contents
    chat_template_file: str | None = None  # --chat-template-file (the path, for messages)
    default_template_kwargs: dict = field(default_factory=dict)  # --chat-template-kwargs, -rea, --reasoning-*:
    #   name -> JSON text, as the server keeps them; "preserve_reasoning" is "true" unless given
    reasoning_format: str = "deepseek"  # --reasoning-format none|auto|deepseek|deepseek-legacy
    enable_reasoning: int = -1  # -rea/--reasoning on|off|auto -> 1|0|-1
    prefill_assistant: bool = True  # --prefill-assistant / --no-prefill-assistant
    force_pure_content_parser: bool = False  # --skip-chat-parsing
    # request defaults (common_params / common_params_sampling names); sampling_defaults() maps them to
    # the request's field names
    n_keep: int = 0  # --keep
    antiprompt: tuple = ()  # -r/--reverse-prompt (repeatable): the request's default `stop`
    escape: bool = True  # -e/--escape: process \n, \t ... in -r and --dry-sequence-breaker
    seed: int = 0xFFFFFFFF  # -s/--seed; LLAMA_DEFAULT_SEED = random
    temp: float = 0.8  # --temp
    top_k: int = 40  # --top-k
    top_p: float = 0.95  # --top-p
    min_p: float = 0.05  # --min-p
    top_n_sigma: float = -1.0  # --top-nsigma
    xtc_probability: float = 0.0  # --xtc-probability
    xtc_threshold: float = 0.1  # --xtc-threshold
    typ_p: float = 1.0  # --typical
    penalty_last_n: int = 64  # --repeat-last-n
    penalty_repeat: float = 1.0  # --repeat-penalty
    penalty_present: float = 0.0  # --presence-penalty
    penalty_freq: float = 0.0  # --frequency-penalty
    dry_multiplier: float = 0.0  # --dry-multiplier
    dry_base: float = 1.75  # --dry-base (values < 1 are ignored, as the server does)
    dry_allowed_length: int = 2  # --dry-allowed-length
    dry_penalty_last_n: int = 64  # --dry-penalty-last-n
    dry_sequence_breakers: tuple = ("\n", ":", "\"", "*")  # --dry-sequence-breaker (repeatable; "none")
    adaptive_target: float = -1.0  # --adaptive-target
    adaptive_decay: float = 0.9  # --adaptive-decay
    dynatemp_range: float = 0.0  # --dynatemp-range
    dynatemp_exponent: float = 1.0  # --dynatemp-exp
    mirostat: int = 0  # --mirostat
    mirostat_eta: float = 0.1  # --mirostat-lr
    mirostat_tau: float = 5.0  # --mirostat-ent
    samplers: tuple = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")
    ignore_eos: bool = False  # --ignore-eos
    logit_bias: tuple = ()  # -l/--logit-bias TOKEN(+/-)BIAS (repeatable): ((token, bias), ...)
    grammar: str = ""  # --grammar / --grammar-file (GBNF)
    json_schema: str | None = None  # -j/--json-schema, -jf (the server converts it to a grammar)
    reasoning_budget_tokens: int = -1  # --reasoning-budget
    reasoning_budget_message: str = ""  # --reasoning-budget-message
    notes: tuple = ()  # flags accepted only for compatibility (performance-only), one line each
    unsupported: tuple = ()  # flags of features slotlab does not model: what answers not_supported_error
    other_flags: tuple = field(default=(), compare=False)  # ((flag, value), ...) of the flags not modelled
    explicit: frozenset = field(default_factory=frozenset, repr=False, compare=False)

    def __post_init__(self) -> None:
        if "preserve_reasoning" not in self.default_template_kwargs:  # arg.cpp: on unless said otherwise
            self.default_template_kwargs = {**self.default_template_kwargs, "preserve_reasoning": "true"}
        self.validate()

    # --- derived values, as the server resolves them ----------------------------------------------

    @property
    def n_slots(self) -> int:
        return 4 if self.n_parallel == AUTO else self.n_parallel

    @property
    def kv_unified_effective(self) -> bool:
        """SRV:156-161: auto -np forces a unified KV, overriding --no-kv-unified."""
        return True if self.n_parallel == AUTO else self.kv_unified

    @property
    def n_ctx_requested(self) -> int:
        """SRV:164-174: with --kv-unified-per-slot and no -c, the pool is n_parallel * per_slot."""
        if self.kv_unified_per_slot > 0 and self.n_ctx == 0 and "n_ctx" not in self.explicit:
            return self.n_slots * self.kv_unified_per_slot
        return self.n_ctx

    @property
    def speculative(self) -> bool:
        """A draft context exists only for `--spec-type draft-simple` with `-md`: this llama-server
        loads `-md` alone but then reports "no implementations specified" and drops the context."""
        return bool(self.model_draft) and "draft-simple" in self.spec_type.split(",")

    @property
    def cache_idle_slots_effective(self) -> bool:
        """SC:1401-1415: idle-slot caching needs a prompt cache."""
        return self.cache_idle_slots and self.cache_ram != 0

    def validate(self) -> None:
        def need(cond: bool, flag: str, msg: str) -> None:
            if not cond:
                raise ConfigError(f"{flag}: {msg}")

        need(self.n_parallel == AUTO or self.n_parallel >= 1, "-np/--parallel", f"must be >= 1 (or -1 for auto), got {self.n_parallel}")
        need(self.n_parallel <= 256, "-np/--parallel", f"must be <= 256, got {self.n_parallel}")
        need(self.n_ctx >= 0, "-c/--ctx-size", f"must be >= 0, got {self.n_ctx}")
        need(self.n_batch >= 1, "-b/--batch-size", f"must be >= 1, got {self.n_batch}")
        need(self.n_ubatch >= 1, "-ub/--ubatch-size", f"must be >= 1, got {self.n_ubatch}")
        need(self.n_threads is None or self.n_threads >= 1, "-t/--threads", f"must be >= 1, got {self.n_threads}")
        need(self.cache_ram >= -1, "-cram/--cache-ram", f"must be -1 (no limit), 0 (off) or a size in MiB, got {self.cache_ram}")
        need(0.0 <= self.slot_prompt_similarity <= 1.0, "-sps/--slot-prompt-similarity", f"must be in [0, 1], got {self.slot_prompt_similarity}")
        need(self.kv_unified_per_slot >= 0, "--kv-unified-per-slot", f"must be >= 0, got {self.kv_unified_per_slot}")
        need(self.cache_reuse >= 0, "--cache-reuse", f"must be >= 0, got {self.cache_reuse}")
        need(self.ctx_checkpoints >= 0, "-ctxcp/--ctx-checkpoints", f"must be >= 0, got {self.ctx_checkpoints}")
        need(self.checkpoint_min_step >= 0, "-cms/--checkpoint-min-step", f"must be >= 0, got {self.checkpoint_min_step}")
        need(self.n_predict >= -1, "-n/--n-predict", f"must be >= -1, got {self.n_predict}")
        need(self.draft_max >= 0 and self.draft_min >= 0, "--spec-draft-n-max/--spec-draft-n-min", "must be >= 0")
        types = [t for t in self.spec_type.split(",") if t]
        bad = [t for t in types if t not in SPEC_TYPES]
        need(not bad, "--spec-type", f"unknown speculative decoding type {', '.join(bad)} (one of: {', '.join(SPEC_TYPES)})")
        need("draft-simple" not in types or bool(self.model_draft), "--spec-type",
             "draft-simple needs a draft model (-md)")
        if self.slot_save_path is not None:
            need(Path(self.slot_save_path).is_dir(), "--slot-save-path", f"{self.slot_save_path!r} is not an existing directory")
        # the server's own checks (arg.cpp handlers)
        need(self.penalty_last_n >= 0, "--repeat-last-n", f"error: invalid repeat-last-n = {self.penalty_last_n}")
        need(math.isfinite(self.penalty_repeat) and self.penalty_repeat > 0 and math.isfinite(1.0 / self.penalty_repeat),
             "--repeat-penalty", "error: repeat-penalty must be finite and greater than 0")
        need(math.isfinite(self.penalty_present), "--presence-penalty", "error: presence-penalty must be finite")
        need(math.isfinite(self.penalty_freq), "--frequency-penalty", "error: frequency-penalty must be finite")
        need(self.reasoning_budget_tokens >= -1, "--reasoning-budget", "invalid value")
        need(self.reasoning_format in REASONING_FORMATS, "--reasoning-format",
             f"Unknown reasoning format: {self.reasoning_format}")
        bad_samplers = [n for n in self.samplers if n not in SAMPLER_CHARS]
        need(not bad_samplers, "--samplers", f"unknown sampler {', '.join(bad_samplers)}")

    # --- what other parts read ----------------------------------------------------------------------

    def sampling_defaults(self, model_meta: Mapping[str, Any] | None = None) -> dict:
        """The defaults a /completion request starts from, keyed by the request's field names
        (server-schema.cpp eval_llama_cmpl_schema copies params_base.sampling, n_keep, n_predict,
        n_cache_reuse, cache_prompt, antiprompt, sse_ping_interval and reasoning_format into each
        task). Floats are the server's float32 values (0.8 is 0.800000011920929 in its JSON).
        /props's default_generation_settings.params shows only SAMPLING_REQUEST_KEYS from these.

        `model_meta` (the GGUF's key/value metadata) applies the model's `general.sampling.*`
        recommendations for every value the command line did not set, as common_init_sampler_from_model
        does after loading the model."""
        p = self
        if model_meta:
            p = dataclasses.replace(self, **self._model_sampling(model_meta))
        out: dict[str, Any] = {}
        for fld, req in REQUEST_FIELDS.items():
            v = getattr(p, fld)
            out[req] = V.f32(v) if isinstance(v, float) else list(v) if isinstance(v, tuple) else v
        out["logit_bias"] = [{"bias": V.f32(b), "token": t} for t, b in p.logit_bias]  # format_logit_bias
        out.update(n_probs=0, min_keep=0, backend_sampling=False,  # no flag sets them for the server
                   json_schema=json.loads(p.json_schema) if p.json_schema else None)
        return out

    def _model_sampling(self, meta: Mapping[str, Any]) -> dict:
        """common_init_sampler_from_model: general.sampling.* values for fields the user did not set
        (each parsed with strtol / strtof prefix rules; unparsable values are skipped)."""
        out: dict[str, Any] = {}
        seq = meta.get("general.sampling.sequence")
        if seq is not None and "samplers" not in self._user_sampling:
            names = [n for n in (SAMPLER_ALIASES.get(x.lower()) for x in str(seq).split(";")) if n]
            if names:
                out["samplers"] = tuple(names)
        for key, (fld, conv) in _MODEL_SAMPLING_KEYS.items():
            if fld in self._user_sampling or f"general.sampling.{key}" not in meta:
                continue
            try:
                out[fld] = conv(str(meta[f"general.sampling.{key}"]))
            except V.BadValue:
                continue
        return out

    @property
    def _user_sampling(self) -> set:
        """The fields the server marks in user_sampling_config (set by a flag, so the model's
        metadata does not override them)."""
        return {k for k in self.explicit if k in _USER_SAMPLING}

    def unsupported_notes(self) -> list[str]:
        """One line per flag given for a feature slotlab does not model: which endpoints or fields
        answer not_supported_error (or what behaves otherwise). `slotlab serve` prints them at start."""
        return list(self.unsupported)

    @property
    def hostnames(self) -> tuple[str, ...]:
        """The addresses --host names (llama-server listens on each: TCP, or a UNIX socket for a path
        ending in .sock)."""
        return tuple(h for h in self.host.split(",") if h)

    def replace(self, **kw) -> "ServerParams":
        return dataclasses.replace(self, explicit=self.explicit | set(kw), **kw)

    # --- parsing ----------------------------------------------------------------------------------

    @classmethod
    def from_args(cls, args: list[str] | str, env: Mapping[str, str] | None = None, **overrides) -> "ServerParams":
        """Parse a llama-server argument list (or one shell-quoted string).

        `env` (e.g. os.environ; `slotlab serve` passes it) is read as the server reads its LLAMA_ARG_*
        variables: before the command line, so a flag given on the command line wins (and a note says
        the variable was overwritten); a switch's variable is true / false by is_truthy / is_falsey
        (anything else is an error), LLAMA_ARG_NO_X sets the switch X off, and a value-less flag's
        variable counts only when truthy. None (the default) reads no environment, so a trace's flags
        replay the same everywhere."""
        if isinstance(args, str):
            args = shlex.split(args)
        st = _ParseState()
        if env:
            env_tokens, env_opts = _env_tokens(env)
            st.parse(env_tokens, source="env")
            st.env_opts = env_opts
        st.parse(list(args), source="cli")
        values = st.values
        kw = dict(values.pop("default_template_kwargs", {}))
        given_kw = bool(kw)
        sources = [n for n in st.given if n in MODEL_SOURCE]
        if sources and not values.get("model"):
            raise ConfigError(f"{st.given[sources[0]]}: {MODEL_SOURCE[sources[0]]}; slotlab serves one local GGUF file: "
                              "pass -m PATH (or drop the flag to serve the embedded default model)")
        types = [t for t in str(values.get("spec_type", "")).split(",") if t and t not in ("none", "draft-simple")]
        if types and all(t in SPEC_TYPES for t in types):
            st.unsupported.append(f"--spec-type {','.join(types)}: speculative decoding type not modelled: slotlab "
                                  "decodes without it")
        values["default_template_kwargs"] = kw
        values.update(overrides)
        if st.notes:
            values["notes"] = tuple(st.notes)
        if st.unsupported:
            values["unsupported"] = tuple(dict.fromkeys(st.unsupported))
        if st.other:
            values["other_flags"] = tuple(st.other)
        explicit = frozenset(k for k in values if k not in ("notes", "unsupported", "other_flags")
                             and (k != "default_template_kwargs" or given_kw or k in overrides))
        return cls(explicit=explicit, **values)

    def to_args(self) -> list[str]:
        """The llama-server flags that reproduce these parameters (non-defaults only)."""
        out: list[str] = []
        default = ServerParams.__new__(ServerParams)
        for f in dataclasses.fields(ServerParams):
            if f.name == "explicit":
                continue
            object.__setattr__(default, f.name, f.default if f.default is not dataclasses.MISSING else None)
        for key, flag in _CANONICAL.items():
            if key == "api_key":
                continue  # never echo a secret into logs or the panel
            v, d = getattr(self, key), getattr(default, key)
            if v == d and key not in self.explicit:
                continue
            if isinstance(v, bool):
                on, off = _SWITCHES[key]
                if off or v:
                    out.append(on if v else off)
            elif isinstance(v, (int, float, str)):
                out += [flag, str(v)]
            # tuples and dicts (aliases, keys, kwargs, logit biases...) are not echoed back
        return out


# --- the argument table ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Option:
    """One row of llama-server's argument table (see slotlab/engine/arg_table.py for the columns)."""

    names: tuple
    neg: tuple
    env: str | None
    kind: str
    hint: str | None
    hint2: str | None
    conv: str | None
    field: str | None
    type: str | None
    default: Any
    default_cpp: str | None
    sampling: bool
    spec: bool
    choices: tuple | None
    removed: str | None

    @property
    def canonical(self) -> str:
        """The first long name (the key of slotlab/engine/flag_classes.py)."""
        return next((n for n in self.names if n.startswith("--")), self.names[0])

    @property
    def n_values(self) -> int:
        return {"void": 0, "bool": 0, "int": 1, "string": 1, "str_str": 2}[self.kind]


def _row(r) -> Option:
    d = dict(zip(_KEYS, r))
    d["names"], d["neg"] = tuple(d["names"]), tuple(d["neg"])
    d["choices"] = tuple(d["choices"]) if d["choices"] is not None else None
    return Option(**d)


TABLE: tuple[Option, ...] = tuple(_row(r) for r in _ROWS)
OPTIONS: dict[str, tuple[Option, bool]] = {}  # every name -> (its option, positive?)
for _o in TABLE:
    OPTIONS.update({n: (_o, True) for n in _o.names})
    OPTIONS.update({n: (_o, False) for n in _o.neg})

SPEC_TYPES = ("none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark", "ngram-simple",
              "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")  # common/speculative.cpp names
REASONING_FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")  # common_reasoning_format_from_name
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

# flags slotlab accepted before this llama.cpp dropped them (not in its table): still accepted, with a note
_LEGACY = {"--mlock": "not a flag of this llama.cpp (see -lm/--load-mode); ignored by slotlab",
           "--no-mmap": "not a flag of this llama.cpp (see -lm/--load-mode); ignored by slotlab"}


# --- the modelled flags: name -> (field, conversion) ---------------------------------------------------

_SWITCH_ON = object()
_SWITCH_OFF = object()


class _Acc:
    """A flag whose handler does more than set one field (appends, sets two fields, reads a file):
    fn(values, raw_values) updates the parsed values in place."""

    def __init__(self, fn: Callable, n_values: int = 1):
        self.fn, self.n_values = fn, n_values

    def __call__(self, values: dict, raws: list[str]) -> None:
        self.fn(values, raws)


def _int(s: str) -> int:
    return V.stoi(s)


FLAGS: dict[str, tuple[str, Callable | object]] = {}
_CANONICAL: dict[str, str] = {}
_SWITCHES: dict[str, tuple[str, str | None]] = {}


def _flag(key: str, names: str, conv) -> None:
    for n in names.split():
        FLAGS[n] = (key, conv)
    _CANONICAL.setdefault(key, names.split()[-1])


def _switch(key: str, on: str, off: str | None = None) -> None:
    for n in on.split():
        FLAGS[n] = (key, _SWITCH_ON)
    for n in (off or "").split():
        FLAGS[n] = (key, _SWITCH_OFF)
    _CANONICAL.setdefault(key, on.split()[-1])
    _SWITCHES[key] = (on.split()[-1], off.split()[-1] if off else None)


def _read_file(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        raise V.BadValue(f"error: failed to open file '{path}'") from None


def _csv_row(value: str) -> list[str]:
    """arg.cpp parse_csv_row: commas split, "quoted, fields" and "" escapes."""
    fields, cur, quoted, i = [], "", False, 0
    while i < len(value):
        ch = value[i]
        if ch == '"':
            if not quoted:
                if cur:
                    cur += '"'
                else:
                    quoted = True
            elif i + 1 < len(value) and value[i + 1] == '"':
                cur += '"'
                i += 1
            else:
                quoted = False
        elif ch == "," and not quoted:
            fields.append(cur)
            cur = ""
        else:
            cur += ch
        i += 1
    fields.append(cur)
    return fields


def process_escapes(s: str) -> str:
    """common.cpp string_process_escapes (what -e, on by default, does to -r and DRY breakers)."""
    out, i = [], 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):
            i += 1
            e = s[i]
            simple = {"n": "\n", "r": "\r", "t": "\t", "'": "'", '"': '"', "\\": "\\"}
            if e in simple:
                out.append(simple[e])
            elif e == "x" and i + 2 < len(s) and all(h in "0123456789abcdefABCDEF" for h in s[i + 1:i + 3]):
                out.append(chr(int(s[i + 1:i + 3], 16)))
                i += 2
            else:
                out += ["\\", e]
        else:
            out.append(c)
        i += 1
    return "".join(out)


def _set_add(key: str):
    def fn(values, raws):
        items = set(values.get(key, ()))
        items.update(a.strip() for a in raws[0].split(",") if a.strip())
        values[key] = tuple(sorted(items))  # std::set order
    return _Acc(fn)


def _append(key: str, conv=str):
    def fn(values, raws):
        values[key] = tuple(values.get(key, ())) + (conv(raws[0]),)
    return _Acc(fn)


def _kwargs(values) -> dict:
    values["default_template_kwargs"] = kw = dict(values.get("default_template_kwargs", {}))
    return kw


def _h_dry_base(values, raws):
    v = V.stof(raws[0])
    if v >= 1.0:
        values["dry_base"] = v


def _h_dry_breaker(values, raws):
    cur = () if "_dry_cleared" not in values else values.get("dry_sequence_breakers", ())
    values["_dry_cleared"] = True
    values["dry_sequence_breakers"] = () if raws[0] == "none" else tuple(cur) + (raws[0],)


def _h_samplers(values, raws):
    names = [SAMPLER_ALIASES.get(n.lower()) for n in raws[0].split(";")]
    values["samplers"] = tuple(n for n in names if n)


def _h_sampler_seq(values, raws):
    values["samplers"] = samplers_from_chars(raws[0])


def _h_logit_bias(values, raws):
    m = re.match(r"[ \t\n\v\f\r]*([-+]?\d+)[ \t\n\v\f\r]*([+-])(.*)\Z", raws[0], re.S)
    if not m:
        raise V.BadValue("invalid input format")
    try:
        bias = V.stof(m.group(3)) * (-1.0 if m.group(2) == "-" else 1.0)
    except V.BadValue:
        raise V.BadValue("invalid input format") from None
    values["logit_bias"] = tuple(values.get("logit_bias", ())) + ((int(m.group(1)), bias),)


def _h_json_schema(values, raws, text=None):
    text = raws[0] if text is None else text
    try:
        json.loads(text)
    except ValueError as e:
        raise V.BadValue(f"not valid JSON ({e})") from None
    values["json_schema"] = text


def _h_chat_template_file(values, raws):
    values["chat_template"] = _read_file(raws[0])
    values["chat_template_file"] = raws[0]


def _h_template_kwargs(values, raws):
    try:
        parsed = json.loads(raws[0])
    except ValueError as e:
        raise V.BadValue(f"not a JSON object ({e})") from None
    if not isinstance(parsed, dict):
        raise V.BadValue("must be a JSON object, e.g. '{\"key1\":\"value1\"}'")
    kw = _kwargs(values)
    for k, v in parsed.items():
        kw[k] = json.dumps(v, separators=(",", ":"), ensure_ascii=False)  # nlohmann's dump()


def _h_reasoning(values, raws):
    v = raws[0]
    if v in V.TRUTHY:
        values["enable_reasoning"] = 1
        _kwargs(values)["enable_thinking"] = "true"
    elif v in V.FALSEY:
        values["enable_reasoning"] = 0
        _kwargs(values)["enable_thinking"] = "false"
    elif v in V.AUTOY:
        values["enable_reasoning"] = -1
    else:
        raise V.BadValue(f"error: unknown value for --reasoning: '{v}'")


def _h_reasoning_effort(values, raws):
    kw = _kwargs(values)
    if raws[0] == "default":
        kw.pop("reasoning_effort", None)
    else:
        kw["reasoning_effort"] = json.dumps(raws[0], ensure_ascii=False)


def _h_preserve(on: bool):
    def fn(values, raws):
        _kwargs(values)["preserve_reasoning"] = "true" if on else "false"
    return _Acc(fn, n_values=0)


def _h_timeout(values, raws):
    values["timeout_read"] = values["timeout_write"] = V.stoi(raws[0])


def _h_api_key(values, raws):
    values["api_key"] = raws[0]  # slotlab's single key (serve/app.py); api_keys holds the server's list
    values["api_keys"] = tuple(values.get("api_keys", ())) + tuple(k for k in _csv_row(raws[0]) if k)


def _h_api_key_file(values, raws):
    keys = tuple(k for k in _read_file(raws[0]).split("\n") if k and not k.startswith("#"))
    values["api_keys"] = tuple(values.get("api_keys", ())) + keys
    if keys and not values.get("api_key"):
        values["api_key"] = keys[0]  # never leave a server open that was given keys


def _ngl(s: str) -> int:
    """-ngl N|auto|all; slotlab's 0 is the CPU build's "auto", its -1 is "all"."""
    return {"auto": 0, "all": -1}[s] if s in ("auto", "all") else V.stoi(s)


#: arg.cpp kv_cache_types: the -ctk / -ctv values the server accepts
KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


def _kv_type(s: str) -> str:
    if s not in KV_CACHE_TYPES:
        raise V.BadValue(f"Unsupported cache type: {s}")
    return s


def _flash_attn(s: str) -> str:
    """arg.cpp -fa: is_truthy / is_falsey / is_autoy."""
    if s in V.TRUTHY:
        return "on"
    if s in V.FALSEY:
        return "off"
    if s in ("auto", "-1"):
        return "auto"
    raise V.BadValue(f"error: unknown value for --flash-attn: '{s}'")


def _temp(s: str) -> float:
    return max(V.stof(s), 0.0)


_flag("model", "-m --model", str)
_flag("cache_type_k", "-ctk --cache-type-k", _kv_type)
_flag("cache_type_v", "-ctv --cache-type-v", _kv_type)
_flag("flash_attn", "-fa --flash-attn", _flash_attn)
_flag("n_ctx", "-c --ctx-size", _int)
_flag("n_parallel", "-np --parallel", _int)
_flag("n_batch", "-b --batch-size", _int)
_flag("n_ubatch", "-ub --ubatch-size", _int)
_flag("n_threads", "-t --threads", _int)
_flag("n_threads_batch", "-tb --threads-batch", _int)
_flag("n_gpu_layers", "-ngl --gpu-layers --n-gpu-layers", _ngl)
_switch("no_repack", "-nr --no-repack", "--repack")
_flag("cache_ram", "-cram --cache-ram", _int)
_flag("slot_prompt_similarity", "-sps --slot-prompt-similarity", float)
_switch("kv_unified", "-kvu --kv-unified", "-no-kvu --no-kv-unified")
_flag("kv_unified_per_slot", "--kv-unified-per-slot", _int)
_switch("cache_idle_slots", "--cache-idle-slots", "--no-cache-idle-slots")
_switch("swa_full", "--swa-full")
_switch("warmup", "--warmup", "--no-warmup")
_switch("cache_prompt", "--cache-prompt", "--no-cache-prompt")
_flag("cache_reuse", "--cache-reuse", _int)
_flag("ctx_checkpoints", "-ctxcp --swa-checkpoints --ctx-checkpoints", _int)
_flag("checkpoint_min_step", "-cms --checkpoint-min-step", _int)
_flag("slot_save_path", "--slot-save-path", str)
_flag("n_predict", "-n --predict --n-predict", _int)
_switch("cont_batching", "-cb --cont-batching", "-nocb --no-cont-batching")
_flag("model_draft", "-md --model-draft --spec-draft-model", str)
# this llama.cpp renamed --draft-max / --draft-min (it now rejects them); slotlab accepts both spellings
_flag("draft_max", "--draft-max --draft-n --spec-draft-n-max", _int)
_flag("draft_min", "--draft-min --draft-n-min --spec-draft-n-min", _int)
_flag("spec_type", "--spec-type", str)
_flag("verbosity", "-lv --verbosity --log-verbosity", _int)
_switch("slot_appendices", "--slot-appendices", "--no-slot-appendices")  # slotlab only (opt-in extension)
FLAGS["-v"] = FLAGS["--verbose"] = FLAGS["--log-verbose"] = ("verbosity", 2**31 - 1)  # arg.cpp: INT_MAX (every line, DBG too)
def _host(value: str) -> str:
    """arg.cpp --host: comma-separated addresses (parse_csv_row, each stripped, empties dropped); at least
    one. Kept as one comma-joined string; ServerParams.hostnames is the list the server listens on."""
    hosts = [h.strip() for h in _csv_row(value) if h.strip()]
    if not hosts:
        raise V.BadValue("--host requires at least one address")
    return ",".join(hosts)


_flag("host", "--host", _host)
_flag("sleep_idle_seconds", "--sleep-idle-seconds", _int)
_flag("port", "--port", _int)
_flag("api_key", "--api-key", _Acc(_h_api_key))
_flag("api_keys", "--api-key-file", _Acc(_h_api_key_file))
_switch("metrics", "--metrics")
_switch("slots_endpoint", "--slots", "--no-slots")
_switch("webui", "--ui --webui", "--no-ui --no-webui")
_switch("endpoint_props", "--props")
_flag("model_alias", "-a --alias", _set_add("model_alias"))
_flag("model_tags", "--tags", _set_add("model_tags"))
_flag("timeout_read", "-to --timeout", _Acc(_h_timeout))
_flag("sse_ping_interval", "--sse-ping-interval", _int)
_flag("cors_origins", "--cors-origins", str)
_flag("cors_methods", "--cors-methods", str)
_flag("cors_headers", "--cors-headers", str)
_switch("cors_credentials", "--cors-credentials", "--no-cors-credentials")
_flag("log_file", "--log-file", str)
# chat templates and reasoning
_switch("use_jinja", "--jinja", "--no-jinja")
_flag("chat_template", "--chat-template", str)
_flag("chat_template_file", "--chat-template-file", _Acc(_h_chat_template_file))
_flag("default_template_kwargs", "--chat-template-kwargs", _Acc(_h_template_kwargs))
_flag("reasoning_format", "--reasoning-format", str)
_flag("enable_reasoning", "-rea --reasoning", _Acc(_h_reasoning))
_flag("default_template_kwargs", "--reasoning-effort", _Acc(_h_reasoning_effort))
FLAGS["--reasoning-preserve"] = ("default_template_kwargs", _h_preserve(True))
FLAGS["--no-reasoning-preserve"] = ("default_template_kwargs", _h_preserve(False))
_flag("reasoning_budget_tokens", "--reasoning-budget", _int)
_flag("reasoning_budget_message", "--reasoning-budget-message", str)
_switch("prefill_assistant", "--prefill-assistant", "--no-prefill-assistant")
_switch("force_pure_content_parser", "--skip-chat-parsing", "--no-skip-chat-parsing")
# request defaults: sampling and the rest the server copies into each task
_flag("n_keep", "--keep", _int)
_flag("antiprompt", "-r --reverse-prompt", _append("antiprompt"))
_switch("escape", "-e --escape", "--no-escape")
_flag("seed", "-s --seed", V.stoul)
_flag("temp", "--temp --temperature", _temp)
_flag("top_k", "--top-k", _int)
for _key, _names in (("top_p", "--top-p"), ("min_p", "--min-p"), ("top_n_sigma", "--top-nsigma --top-n-sigma"),
                     ("xtc_probability", "--xtc-probability"), ("xtc_threshold", "--xtc-threshold"),
                     ("typ_p", "--typical --typical-p"), ("penalty_repeat", "--repeat-penalty"),
                     ("penalty_present", "--presence-penalty"), ("penalty_freq", "--frequency-penalty"),
                     ("dry_multiplier", "--dry-multiplier"), ("adaptive_target", "--adaptive-target"),
                     ("adaptive_decay", "--adaptive-decay"), ("dynatemp_range", "--dynatemp-range"),
                     ("dynatemp_exponent", "--dynatemp-exp"), ("mirostat_eta", "--mirostat-lr"),
                     ("mirostat_tau", "--mirostat-ent")):
    _flag(_key, _names, V.stof)
for _key, _names in (("penalty_last_n", "--repeat-last-n"), ("dry_allowed_length", "--dry-allowed-length"),
                     ("dry_penalty_last_n", "--dry-penalty-last-n"), ("mirostat", "--mirostat")):
    _flag(_key, _names, _int)
_flag("dry_base", "--dry-base", _Acc(_h_dry_base))
_flag("dry_sequence_breakers", "--dry-sequence-breaker", _Acc(_h_dry_breaker))
_flag("samplers", "--samplers", _Acc(_h_samplers))
_flag("samplers", "--sampler-seq --sampling-seq", _Acc(_h_sampler_seq))
_switch("ignore_eos", "--ignore-eos")
_flag("logit_bias", "-l --logit-bias", _Acc(_h_logit_bias))
_flag("grammar", "--grammar", str)
_flag("grammar", "--grammar-file", _read_file)
_flag("json_schema", "-j --json-schema", _Acc(_h_json_schema))
_flag("json_schema", "-jf --json-schema-file", _Acc(lambda values, raws: _h_json_schema(values, raws, _read_file(raws[0]))))


# --- the parser ------------------------------------------------------------------------------------


def _env_tokens(env: Mapping[str, str]) -> tuple[list[tuple[list[str], str]], set]:
    """The command-line tokens the server's environment handling amounts to, one group per variable,
    in table order (arg.cpp common_params_parse_ex: env first, then argv)."""
    groups, opts = [], set()
    for opt in TABLE:
        if not opt.env:
            continue
        name, value, var = opt.names[-1], None, opt.env
        if opt.neg:
            neg_var = opt.env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_")
            if neg_var in env:
                value, var = "0", neg_var
        if value is None:
            if opt.env not in env:
                continue
            value = env[opt.env]
        opts.add(opt.names)
        if opt.kind == "void":
            if value in V.TRUTHY:
                groups.append(([name], var))
        elif opt.kind == "bool":
            try:
                on = V.bool_value(value)
            except V.BadValue as e:
                raise ConfigError(f'error while handling environment variable "{var}": {e}') from None
            groups.append(([opt.names[-1] if on else opt.neg[-1]], var))
        elif opt.kind in ("int", "string"):
            groups.append(([name, value], var))
    return groups, opts


class _ParseState:
    def __init__(self):
        self.values: dict[str, Any] = {}
        self.notes: list[str] = []
        self.unsupported: list[str] = []
        self.other: list[tuple[str, Any]] = []
        self.given: dict[str, str] = {}  # canonical name -> the spelling given, in order
        self.env_opts: set = set()

    def parse(self, toks, source: str) -> None:
        if source == "env":
            for group, var in toks:
                self._parse(group, f'error while handling environment variable "{var}"')
            return
        self._parse(toks, None)
        if self.values.get("escape", True):
            for key in ("antiprompt", "dry_sequence_breakers"):
                if key in self.values:
                    self.values[key] = tuple(process_escapes(x) for x in self.values[key])
        self.values.pop("_dry_cleared", None)

    def _parse(self, toks: list[str], where: str | None) -> None:
        i = 0
        while i < len(toks):
            arg = toks[i]
            name, eq, inline = arg.partition("=") if arg.startswith("--") else (arg, "", "")
            if name.startswith("--"):
                name = name.replace("_", "-")  # arg.cpp: --ctx_size is --ctx-size
            entry, row, legacy = FLAGS.get(name), OPTIONS.get(name), _LEGACY.get(name)
            if entry is None and row is None and legacy is None:
                raise ConfigError(f"unknown or unsupported llama-server flag: {arg} (not an option of the pinned "
                                  "llama.cpp's llama-server; see `slotlab serve --help`)")
            n = _n_values(entry, row)
            if n == 0:
                if eq:
                    raise ConfigError(f"{name} takes no value")
                raws, i = [], i + 1
            else:
                raws = ([inline] if eq else []) + toks[i + 1:i + 1 + n - (1 if eq else 0)]
                if len(raws) < n:
                    raise ConfigError(f"{name} needs a value" + ("" if n == 1 else f" ({n} values)"))
                i += 1 + n - (1 if eq else 0)
            if where is None and row is not None and row[0].names in self.env_opts:
                self.notes.append(f"warn: {row[0].env} environment variable is set, but will be overwritten by "
                                  f"command line argument {name}")
            if row is not None:
                self.given.setdefault(row[0].canonical, name)
            try:
                if entry is not None:
                    self._apply(entry, raws)
                elif legacy is not None:
                    self.notes.append(f"{name}: {legacy}")
                else:
                    self._other(name, *row, raws)
            except V.BadValue as e:
                shown = f" {raws[0]!r}" if raws else ""
                prefix = f"{where}: {name}" if where else name
                raise ConfigError(f"{prefix}: invalid value{shown} ({e})") from None

    def _apply(self, entry, raws) -> None:
        key, conv = entry
        if conv is _SWITCH_ON or conv is _SWITCH_OFF:
            self.values[key] = conv is _SWITCH_ON
        elif isinstance(conv, _Acc):
            conv(self.values, raws)
        elif isinstance(conv, int):
            self.values[key] = conv
        else:
            self.values[key] = conv(raws[0])

    def _other(self, name: str, opt: Option, positive: bool, raws) -> None:
        """A flag slotlab does not model: the server's checks on its value, then its class's line."""
        if opt.removed:
            raise ConfigError(f'error while handling argument "{name}": {opt.removed}')
        for raw in raws:
            if opt.kind in ("int", "str_str"):
                V.stoi(raw)
            elif opt.conv:
                {"float": V.stof, "int": V.stoi, "uint": V.stoul}[opt.conv](raw)
            V.check_choice(opt.names, opt.choices, raw)
        c = opt.canonical
        if c in SPEED:
            self.notes.append(f"{name}: {SPEED[c]}")
        elif c in UNMODELLED:
            if positive:  # a negation turns the feature off: nothing is missing
                self.unsupported.append(f"{name}: {UNMODELLED[c]}")
        elif c in MODEL_SOURCE:
            self.unsupported.append(f"{name}: {MODEL_SOURCE[c]}; the -m model is served")
        else:
            raise ConfigError(f"{name}: llama-server option with no slotlab class (add it to "
                              "slotlab/engine/flag_classes.py)")
        self.other.append((name, raws[0] if len(raws) == 1 else tuple(raws) if raws else positive))


def _n_values(entry, row) -> int:
    if row is not None:
        return row[0].n_values
    if entry is None:
        return 0  # a legacy switch
    conv = entry[1]
    if conv is _SWITCH_ON or conv is _SWITCH_OFF or isinstance(conv, int):
        return 0
    return conv.n_values if isinstance(conv, _Acc) else 1


# every name slotlab accepts: the table's, slotlab's own and the legacy ones
ALL_FLAGS = frozenset(OPTIONS) | frozenset(FLAGS) | frozenset(_LEGACY)
