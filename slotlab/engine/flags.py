"""llama-server's flag table and how each flag is read: names, aliases, negations, environment
variables, value conversions and the handlers of the flags that do more than set one field.

`ParseState` reads an argument list (and `env_tokens` the LLAMA_ARG_* variables) into the values of
`slotlab.engine.params.ServerParams`' fields; `TABLE` / `OPTIONS` are the pinned llama.cpp's argument
table (slotlab/engine/arg_table.py, generated from its common/arg.cpp), `FLAGS` slotlab's own
reading of the flags it models, `CANONICAL` / `SWITCHES` what `ServerParams.to_args` writes back."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from slotlab.engine import arg_values as V
from slotlab.engine.arg_table import ARGS as _ROWS
from slotlab.engine.arg_table import KEYS as _KEYS
from slotlab.engine.flag_classes import MODEL_SOURCE, SPEED, UNMODELLED
from slotlab.errors import ConfigError
from slotlab.sampling import SAMPLER_ALIASES, samplers_from_chars

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
CANONICAL: dict[str, str] = {}
SWITCHES: dict[str, tuple[str, str | None]] = {}


def _flag(key: str, names: str, conv) -> None:
    for n in names.split():
        FLAGS[n] = (key, conv)
    CANONICAL.setdefault(key, names.split()[-1])


def _switch(key: str, on: str, off: str | None = None) -> None:
    for n in on.split():
        FLAGS[n] = (key, _SWITCH_ON)
    for n in (off or "").split():
        FLAGS[n] = (key, _SWITCH_OFF)
    CANONICAL.setdefault(key, on.split()[-1])
    SWITCHES[key] = (on.split()[-1], off.split()[-1] if off else None)


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


def _server_build(s: str) -> int:
    """--server-build B: one of the builds slotlab knows the rules of (the pin and the newer trees)."""
    b = _int(s.lstrip("b"))
    if b not in SERVER_BUILDS:
        raise V.BadValue(f"--server-build {s}: slotlab knows the rules of builds {', '.join(map(str, SERVER_BUILDS))}")
    return b


#: the llama-server builds whose rules slotlab follows (--server-build): the pin and the newer trees
SERVER_BUILDS = (11312, 11434, 11549)


def rules_of_build(build: int | None) -> tuple[int, str | None]:
    """The `--server-build` whose rules a server of `build` follows (the newest of SERVER_BUILDS not
    after it; the pin's for an unknown or older build), and a note where that is an approximation.

    Why: `watch`, the proxy's session log and `report` learn the build of the server they read (its
    start-up line, `GET /props` `build_info`) and should decide as that server does without the user
    passing the flag; between two known trees the older one's rules are the closest slotlab has."""
    if build is None:
        return SERVER_BUILDS[0], None
    if build < SERVER_BUILDS[0]:
        return SERVER_BUILDS[0], (f"b{build} is older than b{SERVER_BUILDS[0]}: followed with the pin's rules "
                                  "(the differences slotlab knows of are listed by slotlab watch)")
    b = max(x for x in SERVER_BUILDS if x <= build)
    if b == build:
        return b, None
    return b, (f"b{build} followed with the rules of b{b}, the newest build slotlab knows not after it "
               f"(changes after b{b} are not modelled)")
_flag("server_build", "--server-build", _server_build)  # slotlab only


def _kvcpc(s: str) -> int:
    """-kvcpc N (PR #28046, a proposal): -1 legacy, 0 one slot's context, N tokens; below -1 refused."""
    n = _int(s)
    if n < -1:
        raise V.BadValue(f"-kvcpc {s}: must be -1 (the aggregate limit), 0 (one slot's context) or a token count")
    return n


def _h_proposal(values, raws) -> None:
    """--proposal NAME[,NAME]: the flagless proposals of slotlab/proposals (the others have flags)."""
    from slotlab.proposals import FLAGLESS, PROPOSALS
    names = list(filter(None, values.get("proposal", "").split(",")))
    for n in (a.strip() for a in raws[0].split(",")):
        if not n:
            continue
        if n not in PROPOSALS:
            raise V.BadValue(f"--proposal {n}: slotlab knows the proposals {', '.join(PROPOSALS)}")
        if n not in FLAGLESS:
            raise V.BadValue(f"--proposal {n}: turned on by its own flag, {' '.join(PROPOSALS[n].args)}")
        if n not in names:
            names.append(n)
    values["proposal"] = ",".join(sorted(names, key=list(PROPOSALS).index))


# proposals (slotlab/proposals): the flags of patches/proposals' llama-server, and slotlab's --proposal
_switch("cache_ram_lru", "--cache-ram-lru")
_flag("kvcpc", "-kvcpc --kv-cache-prompt-context", _kvcpc)
_flag("proposal", "--proposal", _Acc(_h_proposal))  # slotlab only
_flag("cache_disk", "--cache-disk", _int)  # PR #28092's disk tier, MiB (0: none)
_flag("cache_disk_bandwidth", "--cache-disk-bandwidth", _int)  # slotlab only: its read MB/s, for pricing
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


def env_tokens(env: Mapping[str, str]) -> tuple[list[tuple[list[str], str]], set]:
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


class ParseState:
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
