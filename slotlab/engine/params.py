"""llama-server's flags, with the server's names, aliases and defaults (spec section 9).

A user pastes the flags they run in production (`ServerParams.from_args([...])`) or passes keyword
arguments named after the long flag (`ServerParams(cache_ram=128, n_parallel=2)`). Anything unknown
or out of range is a ConfigError that names the flag."""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from slotlab.errors import ConfigError

AUTO = -1


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
    cache_ram: int = 8192  # --cache-ram MiB; -1 no byte limit; 0 disabled
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
    verbosity: int = 3  # -lv; -v = 4 (TRC)
    # slotlab's extension, opt-in: --slot-appendices appends the slot's context checkpoints (SCKP) and draft
    # state (SDFT) to slot files and reads them back on restore. Off (the default, --no-slot-appendices),
    # slot files are written and read exactly as llama-server does: no checkpoints travel with them.
    slot_appendices: bool = False
    # the HTTP front (`slotlab serve`)
    host: str = "127.0.0.1"  # --host
    port: int = 8080  # --port
    api_key: str | None = None  # --api-key
    metrics: bool = False  # --metrics
    slots_endpoint: bool = True  # --slots / --no-slots
    webui: bool = True  # --webui / --no-webui (slotlab serves no web UI; accepted for compatibility)
    notes: tuple = ()  # flags accepted only for compatibility (performance-only), one line each
    explicit: frozenset = field(default_factory=frozenset, repr=False, compare=False)

    def __post_init__(self) -> None:
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
        bad = [t for t in types if t not in ("none", "draft-simple")]
        need(not bad, "--spec-type", f"slotlab models only draft-simple (and none), not {', '.join(bad)}")
        need("draft-simple" not in types or bool(self.model_draft), "--spec-type",
             "draft-simple needs a draft model (-md)")
        if self.slot_save_path is not None:
            need(Path(self.slot_save_path).is_dir(), "--slot-save-path", f"{self.slot_save_path!r} is not an existing directory")

    def replace(self, **kw) -> "ServerParams":
        return dataclasses.replace(self, explicit=self.explicit | set(kw), **kw)

    # --- parsing ----------------------------------------------------------------------------------

    @classmethod
    def from_args(cls, args: list[str] | str, **overrides) -> "ServerParams":
        """Parse a llama-server argument list (or one shell-quoted string)."""
        if isinstance(args, str):
            args = shlex.split(args)
        values: dict[str, Any] = {}
        notes: list[str] = []
        i = 0
        while i < len(args):
            arg = args[i]
            name, eq, inline = arg.partition("=") if arg.startswith("--") else (arg, "", "")
            spec = FLAGS.get(name)
            if spec is None and name in _PERF_ONLY:
                takes_value = _PERF_ONLY[name]
                notes.append(f"{name}: only affects performance in llama-server; ignored by slotlab")
                i += 1 + (1 if takes_value and not eq else 0)
                continue
            if spec is None:
                hint = " (slotlab models only the slot and cache flags; see `slotlab info --help`)"
                raise ConfigError(f"unknown or unsupported llama-server flag: {arg}{hint}")
            key, conv = spec
            if isinstance(conv, int):
                values[key] = conv
                i += 1
                continue
            if conv is _SWITCH_ON or conv is _SWITCH_OFF:
                if eq:
                    raise ConfigError(f"{name} takes no value")
                values[key] = conv is _SWITCH_ON
                i += 1
                continue
            if eq:
                raw = inline
                i += 1
            else:
                if i + 1 >= len(args):
                    raise ConfigError(f"{name} needs a value")
                raw = args[i + 1]
                i += 2
            try:
                values[key] = conv(raw)
            except ValueError:
                raise ConfigError(f"{name}: invalid value {raw!r}") from None
        values.update(overrides)
        if notes:
            values["notes"] = tuple(notes)
        return cls(explicit=frozenset(values), **values)

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
            elif v is not None:
                out += [flag, str(v)]
        return out


_SWITCH_ON = object()
_SWITCH_OFF = object()


def _int(s: str) -> int:
    return int(s, 0) if s.lower().startswith(("0x",)) else int(s)


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


_flag("model", "-m --model", str)
_flag("n_ctx", "-c --ctx-size", _int)
_flag("n_parallel", "-np --parallel", _int)
_flag("n_batch", "-b --batch-size", _int)
_flag("n_ubatch", "-ub --ubatch-size", _int)
_flag("n_threads", "-t --threads", _int)
_flag("n_threads_batch", "-tb --threads-batch", _int)
_flag("n_gpu_layers", "-ngl --gpu-layers --n-gpu-layers", _int)
_switch("no_repack", "-nr --no-repack", "--repack")
_flag("cache_ram", "-cram --cache-ram", _int)
_flag("slot_prompt_similarity", "-sps --slot-prompt-similarity", float)
_switch("kv_unified", "-kvu --kv-unified", "-no-kvu --no-kv-unified")
_flag("kv_unified_per_slot", "--kv-unified-per-slot", _int)
_switch("cache_idle_slots", "--cache-idle-slots", "--no-cache-idle-slots")
_switch("swa_full", "--swa-full")
_switch("cache_prompt", "--cache-prompt", "--no-cache-prompt")
_flag("cache_reuse", "--cache-reuse", _int)
_flag("ctx_checkpoints", "-ctxcp --swa-checkpoints --ctx-checkpoints", _int)
_flag("checkpoint_min_step", "-cms --checkpoint-min-step", _int)
_flag("slot_save_path", "--slot-save-path", str)
_flag("n_predict", "-n --n-predict", _int)
_switch("cont_batching", "-cb --cont-batching", "-nocb --no-cont-batching")
_flag("model_draft", "-md --model-draft --spec-draft-model", str)
# this llama.cpp renamed --draft-max / --draft-min (it now rejects them); slotlab accepts both spellings
_flag("draft_max", "--draft-max --draft-n --spec-draft-n-max", _int)
_flag("draft_min", "--draft-min --draft-n-min --spec-draft-n-min", _int)
_flag("spec_type", "--spec-type", str)
_flag("verbosity", "-lv --verbosity --log-verbosity", _int)
_switch("slot_appendices", "--slot-appendices", "--no-slot-appendices")  # slotlab only (opt-in extension)
FLAGS["-v"] = FLAGS["--verbose"] = ("verbosity", 4)  # a switch that sets a value
_flag("host", "--host", str)
_flag("port", "--port", _int)
_flag("api_key", "--api-key", str)
_switch("metrics", "--metrics")
_switch("slots_endpoint", "--slots", "--no-slots")
_switch("webui", "--webui", "--no-webui")
# accepted so a llama-server command line runs unchanged; they change speed, not decisions
_PERF_ONLY = {"--mlock": False, "--no-mmap": False, "-fa": True, "--flash-attn": True, "--threads-http": True,
              "-ctk": True, "--cache-type-k": True, "-ctv": True, "--cache-type-v": True, "--prio": True,
              "--poll": True, "-dev": True, "--device": True, "--no-warmup": False, "--log-timestamps": False,
              "--log-prefix": False, "--log-colors": True, "-a": True, "--alias": True}
