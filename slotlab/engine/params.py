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
import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from slotlab.engine.flag_classes import MODEL_SOURCE
from slotlab.engine.flags import CANONICAL, REASONING_FORMATS, SPEC_TYPES, SWITCHES, ParseState, env_tokens
from slotlab.errors import ConfigError
from slotlab.sampling import SAMPLER_CHARS

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
    # slotlab only: the llama-server build whose rules to follow where builds differ (11312, the pin, by
    # default). 11549 keeps context checkpoints in slot files (its SCKP appendix, always on: slot_file.py).
    server_build: int = 11312
    # proposals (slotlab/proposals/): changes to llama-server no flag of the pin makes. --cache-ram-lru and
    # -kvcpc are the flags of the patched server (patches/proposals/); --proposal names the others
    cache_ram_lru: bool = False  # --cache-ram-lru: RAM-cache entries ordered by last use
    kvcpc: int = -1  # -kvcpc / --kv-cache-prompt-context (PR #28046): -1 aggregate token limit, 0 / N per entry
    proposal: str = ""  # --proposal NAME[,NAME] (slotlab only), in registry order
    cache_disk: int = 0  # --cache-disk MiB (PR #28092): a disk tier below the RAM cache; 0 none
    cache_disk_bandwidth: int = 2000  # --cache-disk-bandwidth MB/s: what a read from it costs (pricing only)
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
    # request defaults (common_params / common_params_sampling names); slotlab.serve.defaults maps them
    # to the request's field names
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
    def proposal_names(self) -> tuple[str, ...]:
        """The flagless proposals `--proposal` turned on (see slotlab.proposals.active for all)."""
        return tuple(filter(None, self.proposal.split(",")))

    def has_proposal(self, name: str) -> bool:
        return name in self.proposal_names

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
        st = ParseState()
        if env:
            env_toks, env_opts = env_tokens(env)
            st.parse(env_toks, source="env")
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
        for key, flag in CANONICAL.items():
            if key == "api_key":
                continue  # never echo a secret into logs or the panel
            v, d = getattr(self, key), getattr(default, key)
            if v == d and key not in self.explicit:
                continue
            if isinstance(v, bool):
                on, off = SWITCHES[key]
                if off or v:
                    out.append(on if v else off)
            elif isinstance(v, (int, float, str)):
                out += [flag, str(v)]
            # tuples and dicts (aliases, keys, kwargs, logit biases...) are not echoed back
        return out
