"""Start-up lines: the server's shape (`initializing, n_slots = ...`, the prompt cache's limit, idle-slot
mode, checkpoint settings, a draft model, the library's `n_swa` / `n_ctx`) and the `init` event made
from them when the model is loaded (or when the first request shows the start-up is over).

The `init` event's flags are the ones the log implies: a value the log does not print at its level is
the server's default (`--cache-ram 8192` below -lv 4)."""

from __future__ import annotations

from dataclasses import dataclass

from slotlab.engine import event_types as T
from slotlab.engine.params import CACHE_RAM_MIB_DEFAULT
from slotlab.units import cache_ram_bytes
from slotlab.watch.logread.state import Spec

#: the server's --cache-ram default (MiB), for a log that does not print the prompt cache's limit


@dataclass
class ServerShape:
    """What the start-up lines said."""

    n_slots: int = 0
    n_ctx_slot: int = 0
    n_ctx: int = 0
    kv_unified: bool = False
    n_swa_model: int = 0
    swa_full: bool = False
    cache_ram: int | None = None  # MiB; -1 no limit; 0 disabled; None not logged
    limit_tokens: int = 0
    ckpt_max: int | None = None
    ckpt_min_step: int | None = None
    draft: bool = False
    idle_mode: str | None = None  # "save" / "clear" (`idle slots will be saved ...`); None: not logged
    cache_logged: bool = False  # a `prompt cache is enabled / disabled` line was read (-lv 4)


class Startup:
    """The start-up family (patterns.STARTUP and LIB)."""

    def __init__(self, rd):
        self.rd = rd
        self.shape = ServerShape()
        self.init_line: dict | None = None  # the `initializing, n_slots` line, until `init` is emitted
        self.init_emitted = False

    @property
    def pending(self) -> bool:
        """The start-up was read but its `init` not emitted yet (the reader holds events meanwhile)."""
        return self.init_line is not None and not self.init_emitted

    def on_init(self, m, ln, level):
        sh = self.shape
        sh.n_slots, sh.n_ctx_slot = int(m.group(1)), int(m.group(2))
        sh.kv_unified = m.group(3) == "true"
        self.init_line = {"message": ln.msg, "level": level, "t": self.rd.t}
        for i in range(sh.n_slots):
            s = self.rd.slot(i)
            if s.n_tokens is None:
                s.n_tokens = 0

    def emit_init(self) -> None:
        if self.init_line is None or self.init_emitted:
            return
        self.init_emitted = True
        p, sh = self.init_line, self.shape
        cache_ram = CACHE_RAM_MIB_DEFAULT if sh.cache_ram is None else sh.cache_ram  # not logged below -lv 4
        n_swa = 0 if sh.swa_full else sh.n_swa_model
        flags = ["-np", str(sh.n_slots)]
        if sh.n_ctx:
            flags += ["-c", str(sh.n_ctx)]
        if sh.kv_unified:
            flags.append("-kvu")
        flags += ["--cache-ram", str(cache_ram)]
        if sh.swa_full:
            flags.append("--swa-full")
        if sh.ckpt_max is not None:
            flags += ["--ctx-checkpoints", str(sh.ckpt_max), "--checkpoint-min-step", str(sh.ckpt_min_step)]
        if sh.idle_mode is None and sh.cache_ram not in (None, 0) and sh.cache_logged:
            flags.append("--no-cache-idle-slots")
        self.rd.out.append(Spec(T.INIT, p["message"], p["level"], -1, -1, {
            "n_slots": sh.n_slots, "n_ctx_slot": sh.n_ctx_slot, "kv_unified": sh.kv_unified, "n_swa": n_swa,
            "cache_ram": cache_ram, "flags": flags, "draft": sh.draft, "sps": 0.1}, p["t"]))

    def on_cache_enabled(self, m, ln, level):
        sh = self.shape
        sh.cache_logged = True
        sh.cache_ram = int(m.group(1)) if m.group(1) else -1
        sh.limit_tokens = sh.n_ctx
        self.rd.spec(T.CACHE_INIT, ln.msg, level=level, limit_size=cache_ram_bytes(sh.cache_ram),
                     limit_tokens=sh.n_ctx)

    def on_cache_disabled(self, m, ln, level):
        self.shape.cache_logged = True
        self.shape.cache_ram = 0
        self.rd.spec(T.CACHE_INIT, ln.msg, level=level)

    def on_params(self, m, ln, level):
        self.rd.spec(T.PARAMS, ln.msg, level=level)

    def on_idle_mode(self, m, ln, level):
        self.shape.idle_mode = "clear" if m.group(1) else "save"
        self.rd.plain(ln)

    def on_ckpt_config(self, m, ln, level):
        self.shape.ckpt_max, self.shape.ckpt_min_step = int(m.group(1)), int(m.group(2))
        self.rd.plain(ln)

    def on_draft(self, m, ln, level):
        self.shape.draft = True
        self.rd.plain(ln)

    def on_loaded(self, m, ln, level):
        self.rd.plain(ln)
        self.emit_init()

    def on_new_slot(self, m, ln, level):
        self.rd.slot(ln.slot).n_tokens = 0
        self.rd.plain(ln)

    def on_all_idle(self, m, ln, level):
        self.rd.plain(ln)

    # library lines (no slot / srv prefix): kept as plain lines, their numbers noted

    def on_n_swa(self, m, ln, level):
        self.shape.n_swa_model = int(m.group(1))
        self.rd.plain(ln)

    def on_swa_full(self, m, ln, level):
        self.shape.swa_full = True
        self.rd.plain(ln)

    def on_n_ctx(self, m, ln, level):
        if ln.func == "llama_context":
            self.shape.n_ctx = int(m.group(1))
        self.rd.plain(ln)

    def on_state_load_error(self, m, ln, level):
        self.rd.lifecycle.state_load_error = True
        self.rd.plain(ln)
