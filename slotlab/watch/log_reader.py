"""llama-server's log as slotlab's typed events: the same kinds and data fields the engine emits
(`slotlab.engine.event_types`), so the panel, the "why" lines and the replay report fold a real
server's run the way they fold slotlab's.

`LogReader.feed(line)` takes one line and returns the events it completed (often none: some decisions
need the next lines, see below); `flush()` ends the stream (end of file); `read_file(path)` does both
for a file. The reader keeps the state the lines refer to: each slot's task, tokens and checkpoint
chain, the RAM cache's FIFO list (entries get ids 0, 1, ... in allocation order, as the engine's do),
the selection under way. It never raises on input: a line it does not know (a library line, a
continuation line, a truncated line, a binary blob, a 10 MB line) becomes a plain `log` event.

How lines become events (the texts are the server's, see `slotlab/watch/README.md` for the list and
which need `-lv 4`):

* a line maps to the kind the engine emits with that text in `message`; slot and task come from the
  line's `id N | task T` prefix, except for the lines of a slot selection: the server prints them
  before the task is bound to the slot (`task -1`, or the busy slot's task), so they are held until
  `processing task` names the task, then emitted with it (as the engine does);
* what the server does not log but the engine reports is inferred where the log implies it, with an
  empty `message` (the engine's own convention for such events): `cache_alloc` (a save that was not
  skipped), `cache_evict` reason `loaded` and `cache_loaded` (a `found better prompt` not followed by a
  restore failure), `cache_load_scores`, `slot_decision`, `prompt_plan`, `task_done`, `slot_snapshot`;
* sizes are printed in MiB with 3 decimals: bytes are `round(MiB * 2**20)` (within 512 bytes); an
  entry's size is the one its `update` listing prints when there is one (the events of a cache update
  are held until its listing is read, so the `cache_alloc` carries that size);
* numbers the log never has: a `-1` where an int is required (`n_tokens` of an eviction whose entry the
  reader never saw, `entry_id` of a duplicate skip), `head` "" and `div_text` "" (no token text), the
  slot-file name (a restore into an empty slot is recognised from its tokens, origin `file ?`)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from slotlab.engine import event_types as T
from slotlab.engine.events import Event
from slotlab.engine.prompt_cache import f32_ratio
from slotlab.units import MIB
from slotlab.watch.lines import LogLine, parse_line
from slotlab.watch.patterns import ALLOC_CHAIN, CACHE, NEUTRAL, SELECTION, match

#: the kind of a line the reader keeps as text (not in event_types yet: see README)
LOG = "log"
#: origin of a slot filled by `POST /slots?action=restore` (the server logs nothing; the name is unknown)
FILE_UNKNOWN = "file ?"
#: the reason of a `cache_evict` / the note of a RAM-cache entry the listing showed but the reader missed
RESYNC = "resync"
#: a launch waits at most this many lines for its slot's `new prompt` line (which gives the prompt length)
AWAIT_MAX_LINES = 200
#: finished tasks kept (a live watch runs for days; only running tasks are needed)
KEEP_TASKS = 4096


def _f(s: str) -> float:
    return float(s)


def _b(mib: str) -> int:
    return int(round(float(mib) * MIB))


# ------------------------------------------------------------------------------------------- reader state

@dataclass
class _Spec:
    """An event not yet numbered (held while the lines that complete it are read)."""

    kind: str
    message: str
    level: str
    slot: int
    task: int
    data: dict
    t: float
    new_task: bool = False  # the task is the one being selected: set when `processing task` names it


@dataclass
class _Slot:
    id: int
    state: str = "idle"
    task: int = -1
    task_prev: int = -1
    n_tokens: int | None = 0  # None: not known (reading started mid-run)
    n_prompt: int = 0
    n_past: int = 0
    prompt_n: int = 0
    n_gen: int = 0
    origin: str = "slot"
    shifts: list = field(default_factory=list)
    checkpoints: list = field(default_factory=list)  # [pos_min, pos_max, n_tokens, size, id_task]
    plan: dict | None = None  # the prompt start under way (from `new prompt` to the first `cached n_tokens`)
    lcp_hint: int | None = None  # lcp with the prompt of the task being launched, from its selection
    sig: tuple | None = None
    restored: "_Spec | None" = None  # the inferred `slot_restored` whose length a later line may still give


@dataclass
class _Task:
    id: int
    slot: int
    n_tokens: int | None = None
    cache_n: int | None = None
    prompt_n: int | None = None
    predicted_n: int | None = None
    launched: bool = False  # task_launched emitted
    errored: bool = False
    done: bool = False


@dataclass
class _Entry:
    id: int
    n_tokens: int
    size: int
    size_dft: int
    checkpoints: list  # [pos_min, pos_max, n_tokens, size, id_task]
    id_slot: int = -1
    id_task: int = -1
    addr: str | None = None


@dataclass
class _Selection:
    specs: list = field(default_factory=list)
    id_requested: int = -1
    seen: set = field(default_factory=set)
    checks: dict = field(default_factory=dict)  # slot -> (lcp, n_task, f_sim)
    n_held: dict = field(default_factory=dict)  # slot -> its length when checked (None: not known)
    scores: list | None = None  # the RAM-cache entries the load listed (entry_id, n_tokens, lcp, ...)
    thold: float | None = None  # -sps, as the similarity lines print it
    chosen: int | None = None
    how: str | None = None
    f_sim_best: float = 0.0
    f_keep: float | None = None  # printed on `selected slot by LCP similarity`
    sps_on: bool = False  # a skip / check line was printed: -sps is not 0
    n_task: int | None = None
    update_cache: bool = False
    load: bool | None = None
    load_result: dict | None = None


class LogReader:
    """Stateful reader of one llama-server log. `bus`: an `EventBus` that also gets every event of a
    kind in `event_types` (with its own numbering; plain `log` lines only once that kind is registered)."""

    def __init__(self, bus=None):
        self.bus = bus
        self._seq = 0
        self._t = 0.0
        self._out: list[_Spec] = []
        self.slots: dict[int, _Slot] = {}
        self.tasks: dict[int, _Task] = {}
        self.entries: list[_Entry] = []  # the RAM cache, FIFO (oldest first)
        self._next_entry = 0
        # server shape (startup lines)
        self.n_slots = 0
        self.n_ctx_slot = 0
        self.n_ctx = 0
        self.kv_unified = False
        self.n_swa_model = 0
        self.swa_full = False
        self.cache_ram: int | None = None  # MiB; -1 no limit; 0 disabled; None not logged
        self.limit_tokens = 0
        self.ckpt_max = None
        self.ckpt_min_step = None
        self.draft = False
        self.idle_mode: str | None = None
        self._cache_logged = False  # a `prompt cache is enabled / disabled` line was read (-lv 4)
        self._init_pending: dict | None = None
        self._init_done = False
        # blocks under way
        self._sel: _Selection | None = None
        self._idle: int | None = None  # the idle slot being saved / cleared
        self._ctx = (-1, -1)  # (slot, task) of the RAM-cache call under way
        self._alloc: dict | None = None
        self._load: dict | None = None
        self._listing: dict | None = None
        self._alloc_specs: dict[int, _Spec] = {}  # entry id -> its cache_alloc, until a listing gave its size
        self._shrink = False  # byte-limit evictions after a failed allocation
        self._clear_reason: dict[int, str] = {}
        self._pending_clear: _Spec | None = None  # a clear outside any context: an erase, or a failed restore
        self._state_load_error = False
        self._launch_first: _Spec | None = None  # the first event of the last selection (a silent restore goes before)
        self._launch_task = -1  # the task that selection launched
        self._sps_on = False  # a similarity line was printed: -sps is not 0 (fixed for the server's life)
        # values that need the prompt length, which the server prints after the launch (`new prompt`)
        self._fixes: list = []
        self._await: tuple[int, int] | None = None
        self._await_lines = 0
        self._has_trc = False  # the log has TRC lines (-lv 4): `new prompt` lines will come
        # what the reader noticed about the log itself
        self.n_lines = 0
        self.n_plain = 0
        self.n_resyncs = 0
        self.problems: list[str] = []  # internal errors on a line (the line was kept as plain text)

    # ------------------------------------------------------------------ public API

    def feed(self, line: str | bytes) -> list[Event]:
        """One log line in; the events it completed out (in order; possibly none yet)."""
        self.n_lines += 1
        ln = parse_line(line)
        if ln.t is not None:
            self._t = ln.t
        try:
            self._handle(ln)
        except Exception as exc:  # a reader bug must not stop the watch: keep the line, note the problem
            self.problems.append(f"line {self.n_lines}: {type(exc).__name__}: {exc}")
            self._plain(ln)
        if self._busy():
            return []
        return self._flush()

    def flush(self) -> list[Event]:
        """End of the stream: finish whatever waits for a next line and return the last events."""
        try:
            self._settle(None)
            self._close_idle()
            if self._sel is not None:
                self._close_selection(None, None)
            self._settle_clear(None)
            self._end_await(None)
            self._emit_init()
        except Exception as exc:
            self.problems.append(f"flush: {type(exc).__name__}: {exc}")
        self._alloc_specs.clear()
        return self._flush()

    def read_file(self, path) -> list[Event]:
        """Every event of a log file (read as bytes: invalid UTF-8, NULs and huge lines are fine)."""
        out: list[Event] = []
        with open(path, "rb") as f:
            for raw in f:
                out += self.feed(raw)
        out += self.flush()
        return out

    # ------------------------------------------------------------------ emitting

    def _spec(self, kind: str, message: str = "", *, level: str = "TRC", slot: int = -1, task: int = -1,
              new_task: bool = False, **data: Any) -> _Spec:
        sp = _Spec(kind, message, level, slot, task, data, self._t, new_task)
        self._out.append(sp)
        if self._sel is not None and kind != LOG:
            self._sel.specs.append(sp)
        return sp

    def _busy(self) -> bool:
        return (self._sel is not None or self._idle is not None or self._alloc is not None or self._load is not None
                or self._listing is not None or bool(self._alloc_specs) or self._pending_clear is not None
                or self._await is not None or (self._init_pending is not None and not self._init_done))

    def _flush(self) -> list[Event]:
        out = []
        for sp in self._out:
            out.append(self._event(sp))
        self._out = []
        for s in sorted(self.slots.values(), key=lambda s: s.id):
            ev = self._snapshot(s)
            if ev is not None:
                out.append(ev)
        return out

    def _event(self, sp: _Spec) -> Event:
        ev = Event(self._seq, sp.t, sp.kind, sp.level, sp.message, sp.slot, sp.task, sp.data)
        self._seq += 1
        if self.bus is not None and sp.kind in T.REGISTRY:
            try:
                self.bus.emit(sp.kind, sp.message, level=sp.level, slot=sp.slot, task=sp.task, **sp.data)
            except Exception as exc:  # a strict bus refusing an event must not stop the reader
                self.problems.append(f"bus: {type(exc).__name__}: {exc}")
        return ev

    def _snapshot(self, s: _Slot) -> Event | None:
        ck = [tuple(c) for c in s.checkpoints]
        sig = (s.state, s.n_tokens, s.task, s.task_prev, s.n_prompt, s.n_past, s.prompt_n, s.n_gen, s.origin,
               tuple(map(tuple, s.shifts)), tuple(ck))
        if sig == s.sig:
            return None
        s.sig = sig
        t = s.task if s.task >= 0 else s.task_prev
        return self._event(_Spec(T.SLOT_SNAPSHOT, "", "TRC", s.id, t, {
            "state": s.state, "n_tokens": s.n_tokens or 0, "n_prompt": s.n_prompt if t >= 0 else 0,
            "n_past": s.n_past, "prompt_n": s.prompt_n, "n_gen": s.n_gen, "origin": s.origin,
            "shifts": [tuple(x) for x in s.shifts], "checkpoints": ck}, self._t))

    def _plain(self, ln: LogLine) -> None:
        self.n_plain += 1
        data = {"func": ln.func} if ln.func else {}
        self._spec(LOG, ln.msg, level=ln.level or "INF", slot=ln.slot, task=ln.task, **data)

    # ------------------------------------------------------------------ helpers

    def slot(self, i: int) -> _Slot:
        s = self.slots.get(i)
        if s is None:
            s = self.slots[i] = _Slot(i, n_tokens=0 if self._init_done or self._init_pending else None)
        return s

    def task(self, tid: int, slot: int = -1) -> _Task:
        t = self.tasks.get(tid)
        if t is None:
            if len(self.tasks) >= KEEP_TASKS:
                for old in [k for k, x in self.tasks.items() if x.done or x.errored][: KEEP_TASKS // 4]:
                    del self.tasks[old]
            t = self.tasks[tid] = _Task(tid, slot)
        return t

    def _entry_index(self, entry_id: int) -> int:
        for i, e in enumerate(self.entries):
            if e.id == entry_id:
                return i
        return -1

    # ------------------------------------------------------------------ restores the log does not print

    def _silent_restore(self, s: _Slot, n_tokens: int | None, before: _Spec | None = None) -> None:
        """`POST /slots/N?action=restore` succeeded: the server logs nothing, but a later line shows the
        idle slot holding tokens no line put there. The inferred `slot_restored` goes before `before` (the
        first held event of the selection that showed it) and says what the log lacks: the file name is
        "" and the bytes read -1, the length -1 until a line gives it (`_slot_length`). When `before`
        was already emitted (a launch, then the idle-slot save that showed the restore), the event's
        `task` names the task launched then: the restore came before it."""
        sp = _Spec(T.SLOT_RESTORED, "", "TRC", s.id, -1, {
            "filename": "", "n_tokens": -1 if n_tokens is None else n_tokens, "n_bytes": -1,
            "n_bytes_appendix": -1, "n_checkpoints": 0}, self._t)
        idx = next((i for i, x in enumerate(self._out) if x is before), None) if before is not None else None
        if before is not None and idx is None and before is self._launch_first:
            sp.task = self._launch_task
        self._out.insert(len(self._out) if idx is None else idx, sp)
        s.restored = sp if n_tokens is None else None
        s.n_tokens, s.checkpoints, s.origin = n_tokens, [], FILE_UNKNOWN

    def _slot_length(self, s: _Slot, n: int, before: _Spec | None = None) -> None:
        """A line printed the idle slot's length `n` (a save, a clear): a length other than the one the
        reader keeps is a silent restore; an inferred restore still held gets its length."""
        if s.state != "idle":
            return
        if s.n_tokens is None and s.origin == FILE_UNKNOWN:
            if s.restored is not None and any(x is s.restored for x in self._out):
                s.restored.data["n_tokens"] = n
            s.restored, s.n_tokens = None, n
        elif s.n_tokens is not None and s.n_tokens != n:
            self._silent_restore(s, n, before)

    # ------------------------------------------------------------------ dispatch

    def _handle(self, ln: LogLine) -> None:
        hit = match(ln.src, ln.msg) if ln.src is not None else None
        if hit is None:
            self._plain(ln)
            return
        name, m, lvl = hit
        if ln.src == "lib":
            self._lib(name, m, ln)
            return
        # the server's macro gives the level (TRC prints with the letter I); a W / E letter wins (a line
        # logged at two levels, e.g. `failed to restore state`: ERR for the target, WRN for the draft)
        level = ln.level if ln.level in ("WRN", "ERR") else lvl
        if lvl == "TRC":
            self._has_trc = True
        if self._await is not None:
            self._await_lines += 1
            if ln.src == "slot" and (ln.slot, ln.task) == self._await:
                self._end_await(int(m.group(3)) if name == "new_prompt" else None)
            elif self._await_lines > AWAIT_MAX_LINES:
                self._end_await(None)
        self._settle(name, ln)
        getattr(self, "_on_" + name)(m, ln, level)

    def _end_await(self, n_prompt: int | None) -> None:
        fixes, self._fixes, self._await = self._fixes, [], None
        if n_prompt is not None and n_prompt > 0:
            for fix in fixes:
                fix(n_prompt)

    def _lib(self, name: str, m: re.Match, ln: LogLine) -> None:
        if name == "n_swa":
            self.n_swa_model = int(m.group(1))
        elif name == "swa_full":
            self.swa_full = True
        elif name == "n_ctx" and ln.func == "llama_context":
            self.n_ctx = int(m.group(1))
        elif name == "state_load_error":
            self._state_load_error = True
        self._plain(ln)

    def _settle(self, name: str | None, ln: LogLine | None = None) -> None:
        """Finish what the line `name` does not continue: a pending allocation, load, listing, selection,
        idle-slot save or unexplained clear."""
        if self._alloc is not None and name not in ALLOC_CHAIN:
            self._finish_alloc()
        if self._load is not None and name not in ("load_score", "load_found", "restore_failed"):
            self._finish_load(failed=False)
        if self._listing is not None and name != "state_entry":
            self._finish_listing()
        if self._alloc_specs and name not in CACHE:  # no listing came for the new entries: stop waiting
            self._alloc_specs.clear()
        if name is None:
            return
        if self._pending_clear is not None and name != "send_error":
            self._settle_clear(None)
        if self._idle is not None and not (name in CACHE - {"load_failed"} or name == "idle_saved"
                                           or (name == "clear" and ln is not None and ln.slot == self._idle)):
            self._close_idle()
        if self._sel is not None:
            if name in SELECTION or name in CACHE or name in ("launch", "defer"):
                pass
            elif name == "clear" and ln is not None and self._clear_reason.get(ln.slot) == "load_failed":
                pass
            elif name in NEUTRAL:
                pass
            else:
                self._close_selection(None, None)

    # ------------------------------------------------------------------ start-up

    def _on_init(self, m, ln, level):
        self.n_slots, self.n_ctx_slot = int(m.group(1)), int(m.group(2))
        self.kv_unified = m.group(3) == "true"
        self._init_pending = {"message": ln.msg, "level": level, "t": self._t}
        for i in range(self.n_slots):
            s = self.slot(i)
            if s.n_tokens is None:
                s.n_tokens = 0

    def _emit_init(self) -> None:
        if self._init_pending is None or self._init_done:
            return
        self._init_done = True
        p = self._init_pending
        if self.cache_ram is None:
            cache_ram = 8192  # not logged below -lv 4: the server's default
        else:
            cache_ram = self.cache_ram
        n_swa = 0 if self.swa_full else self.n_swa_model
        flags = ["-np", str(self.n_slots)]
        if self.n_ctx:
            flags += ["-c", str(self.n_ctx)]
        if self.kv_unified:
            flags.append("-kvu")
        flags += ["--cache-ram", str(cache_ram)]
        if self.swa_full:
            flags.append("--swa-full")
        if self.ckpt_max is not None:
            flags += ["--ctx-checkpoints", str(self.ckpt_max), "--checkpoint-min-step", str(self.ckpt_min_step)]
        if self.idle_mode is None and self.cache_ram not in (None, 0) and self._cache_logged:
            flags.append("--no-cache-idle-slots")
        sp = _Spec(T.INIT, p["message"], p["level"], -1, -1,
                   {"n_slots": self.n_slots, "n_ctx_slot": self.n_ctx_slot, "kv_unified": self.kv_unified,
                    "n_swa": n_swa, "cache_ram": cache_ram, "flags": flags, "draft": self.draft, "sps": 0.1}, p["t"])
        self._out.append(sp)

    def _on_cache_enabled(self, m, ln, level):
        self._cache_logged = True
        self.cache_ram = int(m.group(1)) if m.group(1) else -1
        self.limit_tokens = self.n_ctx
        self._spec(T.CACHE_INIT, ln.msg, level=level, limit_size=max(0, self.cache_ram) * 1024 * 1024,
                   limit_tokens=self.n_ctx)

    def _on_cache_disabled(self, m, ln, level):
        self._cache_logged = True
        self.cache_ram = 0
        self._spec(T.CACHE_INIT, ln.msg, level=level)

    def _on_params(self, m, ln, level):
        self._spec(T.PARAMS, ln.msg, level=level)

    def _on_idle_mode(self, m, ln, level):
        self.idle_mode = "clear" if m.group(1) else "save"
        self._plain(ln)

    def _on_ckpt_config(self, m, ln, level):
        self.ckpt_max, self.ckpt_min_step = int(m.group(1)), int(m.group(2))
        self._plain(ln)

    def _on_draft(self, m, ln, level):
        self.draft = True
        self._plain(ln)

    def _on_loaded(self, m, ln, level):
        self._plain(ln)
        self._emit_init()

    def _on_new_slot(self, m, ln, level):
        s = self.slot(ln.slot)
        s.n_tokens = 0
        self._plain(ln)

    def _on_all_idle(self, m, ln, level):
        self._plain(ln)

    # ------------------------------------------------------------------ slot selection

    def _selection(self) -> _Selection:
        self._emit_init()
        if self._sel is None:
            self._sel = _Selection()
        return self._sel

    def _new_selection_if_seen(self, slot: int) -> _Selection:
        """A skip / check line for a slot this selection already scanned starts the next selection."""
        sel = self._sel
        if sel is not None and (slot in sel.seen or sel.update_cache or sel.how in ("lcp", "lru")):
            self._close_selection(None, None)
        return self._selection()

    def _on_by_id(self, m, ln, level):
        if self._sel is not None:
            self._close_selection(None, None)
        sel = self._selection()
        sel.id_requested = int(m.group(1))
        sel.chosen, sel.how = ln.slot, "id"
        self._spec(T.SLOT_SELECTED_BY_ID, ln.msg, level=level, slot=ln.slot, new_task=True)

    def _on_skip_busy(self, m, ln, level):
        sel = self._new_selection_if_seen(ln.slot)
        sel.seen.add(ln.slot)
        sel.sps_on = self._sps_on = True
        self._spec(T.SLOT_SKIP, ln.msg, level=level, slot=ln.slot, new_task=True)

    def _on_skip_empty(self, m, ln, level):
        sel = self._new_selection_if_seen(ln.slot)
        sel.seen.add(ln.slot)
        sel.sps_on = self._sps_on = True
        s = self.slot(ln.slot)
        # a slot the reader holds full, emptied without a line (a failed restore and an erase print
        # `clearing prompt`): a restore of a file saved from an empty slot, or reading from the middle;
        # no golden log has one, so no restore is inferred from it
        s.n_tokens, s.checkpoints, s.origin = 0, [], "slot"
        self._spec(T.SLOT_SKIP, ln.msg, level=level, slot=ln.slot, new_task=True)

    def _on_sim(self, m, ln, level):
        sel = self._new_selection_if_seen(ln.slot)
        sel.seen.add(ln.slot)
        sel.sps_on = self._sps_on = True
        lcp, n = int(m.group(2)), int(m.group(3))
        f_sim = float(f32_ratio(lcp, n)) if n > 0 else _f(m.group(1))
        sel.n_task = n
        sel.checks[ln.slot] = (lcp, n, f_sim)
        s = self.slot(ln.slot)
        sel.n_held[ln.slot] = s.n_tokens
        if s.state == "idle" and s.n_tokens is not None and (s.n_tokens == 0 or lcp > s.n_tokens):
            # the slot holds tokens no line put there (an empty slot prints `skipping, slot is empty`; no
            # slot shares more than it holds): `POST /slots/N?action=restore`, which the server does not log
            self._silent_restore(s, None, before=sel.specs[0] if sel.specs else None)
        thold = np.float32(_f(m.group(4)))
        sel.thold = float(thold)
        if np.float32(f_sim) > np.float32(sel.f_sim_best) and np.float32(f_sim) > thold:
            sel.f_sim_best = f_sim
            if sel.id_requested != -1:  # the requested slot passed step B: the engine calls that "lcp"
                sel.how = "lcp"
        self._spec(T.SLOT_SIM, ln.msg, level=level, slot=ln.slot, new_task=True, lcp=lcp, f_sim=f_sim)

    def _on_by_lcp(self, m, ln, level):
        sel = self._selection()
        sel.chosen, sel.how = ln.slot, "lcp"
        chk = sel.checks.get(ln.slot)
        f_sim = chk[2] if chk is not None else _f(m.group(1))
        sel.f_sim_best = f_sim
        f_keep = _f(m.group(3))
        s = self.slot(ln.slot)
        if chk is not None and s.n_tokens:
            with np.errstate(divide="ignore", invalid="ignore"):
                exact = np.float32(np.float32(f_sim) * np.float32(chk[1])) / np.float32(s.n_tokens)
            if f"{float(exact):.3f}" == m.group(3):
                f_keep = float(exact)
        sel.f_keep = f_keep
        self._spec(T.SLOT_SELECTED_BY_LCP, ln.msg, level=level, slot=ln.slot, new_task=True, f_sim=f_sim,
                   f_keep=f_keep)

    def _on_by_lru(self, m, ln, level):
        sel = self._selection()
        sel.chosen, sel.how = ln.slot, "lru"
        self._spec(T.SLOT_SELECTED_BY_LRU, ln.msg, level=level, slot=ln.slot, new_task=True, t_last=int(m.group(1)))

    def _on_update_begin(self, m, ln, level):
        sel = self._selection()
        sel.update_cache = True
        self._ctx = (sel.chosen if sel.chosen is not None else -1, -1)
        self._spec(T.CACHE_UPDATE_BEGIN, ln.msg, level=level, new_task=True)

    def _on_update_end(self, m, ln, level):
        self._selection()
        self._spec(T.CACHE_UPDATE_END, ln.msg, level=level, new_task=True)

    def _on_defer(self, m, ln, level):
        if self._sel is not None:
            self._close_selection(None, int(m.group(2)), message=ln.msg, level=level)
        else:
            self._spec(T.TASK_DEFERRED, ln.msg, level=level, task=int(m.group(2)))

    def _decision(self, sel: _Selection, slot: int) -> dict:
        s = self.slots.get(slot) if slot >= 0 else None
        f_keep: float | None = None
        if sel.how == "lcp":
            if sel.f_keep is not None:
                f_keep = sel.f_keep
            else:  # chosen by id, and the requested slot passed the similarity check
                chk = sel.checks.get(slot)
                n_slot = s.n_tokens if s is not None else None
                f_keep = math.nan  # the slot's length is not known (a restore from a file, which logs nothing)
                if chk is not None and n_slot:
                    with np.errstate(divide="ignore", invalid="ignore"):
                        f_keep = float(np.float32(np.float32(chk[2]) * np.float32(chk[1])) / np.float32(n_slot))
        elif sel.how == "id" and (sel.sps_on or self._sps_on):
            f_keep = 0.0 if s is None or s.n_tokens != 0 else math.nan
        d = {"how": sel.how if slot >= 0 else None, "f_sim": float(sel.f_sim_best), "f_keep": f_keep,
             "update_cache": sel.update_cache, "load": sel.load, "id_requested": sel.id_requested,
             "held": self._held(sel), "sps": sel.thold}
        if sel.load is True and sel.load_result is not None:
            d.update({k: v for k, v in sel.load_result.items() if not k.startswith("_")})
        return d

    @staticmethod
    def _held(sel: _Selection) -> dict | None:
        """The longest common prefix the log shows the server held for this prompt: each idle slot's
        `lcp` from its similarity line (-lv 4) and each RAM entry's from the load's listing (printed only
        when the cache was searched). The engine's `held` also scans busy slots and every entry, and
        knows what was dropped (`lost`); a log shows neither, so misses of those kinds stay unexplained
        here. Same order as the engine (slots, then entries; the first longest wins)."""
        cands = [(lcp, "slot", sid, sel.n_held.get(sid) or lcp) for sid, (lcp, _n, _f) in sel.checks.items()]
        cands += [(sc["lcp"], "entry", sc["entry_id"], sc["n_tokens"]) for sc in sel.scores or []]
        best = max(cands, key=lambda c: c[0], default=None)
        if best is None or best[0] <= 0:
            return None
        return {"where": best[1], "id": best[2], "lcp": int(best[0]), "n_held": int(best[3]),
                "prompt_text": "", "held_text": ""}

    def _close_selection(self, launch: tuple[int, int] | None, deferred_task: int | None, *, message: str = "",
                         level: str = "DBG") -> None:
        """The selection ended: `launch` = (slot, task) launched, or deferred (task id if a DBG line said)."""
        sel = self._sel
        self._sel = None
        if self._alloc is not None:
            self._finish_alloc()
        if self._load is not None:
            sel.scores = self._load["scores"]
            self._finish_load(failed=False)
        if self._listing is not None:
            self._finish_listing()
        if launch is not None:
            slot, task = launch
        else:
            slot = sel.chosen if sel.chosen is not None else -1
            task = deferred_task if deferred_task is not None else -1
        for sp in sel.specs:
            if sp.new_task:
                sp.task = task
        if launch is None:
            self._fixes = []
        if not sel.specs and launch is None:
            return
        dec = _Spec(T.SLOT_DECISION, "", "TRC", slot, task, self._decision(sel, slot), self._t)
        self._out.append(dec)
        self._launch_first = sel.specs[0] if sel.specs else dec
        self._launch_task = task
        if sel.load is True and sel.n_task is None and self._fixes:
            lcp = (sel.load_result or {}).get("_lcp")
            self._fixes.append(lambda n, d=dec.data: d.update(f_sim_best=float(f32_ratio(lcp, n))))
        if launch is None:
            self._out.append(_Spec(T.TASK_DEFERRED, message, level, -1, task, {}, self._t))
        elif sel.chosen is not None and sel.chosen == slot:
            s = self.slot(slot)
            chk = sel.checks.get(slot)
            if sel.load is True:
                s.lcp_hint = (sel.load_result or {}).get("_lcp")
            elif chk is not None:
                s.lcp_hint = chk[0]
            elif s.n_tokens == 0:
                s.lcp_hint = 0
            else:
                s.lcp_hint = None
            if sel.n_task is not None:
                self.task(task, slot).n_tokens = sel.n_task

    # ------------------------------------------------------------------ launch, prompt, release

    def _on_launch(self, m, ln, level):
        slot, tid = ln.slot, ln.task
        if self._sel is not None:
            self._close_selection((slot, tid), None)
        s = self.slot(slot)
        t = self.task(tid, slot)
        t.slot = slot
        s.task, s.state = tid, "started"
        s.n_past = s.prompt_n = s.n_gen = 0
        s.shifts = []
        t.launched = True
        n = t.n_tokens if t.n_tokens is not None else -1
        sp = _Spec(T.TASK_LAUNCHED, ln.msg, level, slot, tid, {"n_tokens": n}, self._t)
        self._out.append(sp)
        if t.n_tokens is None:
            self._fixes.append(lambda n, d=sp.data: d.update(n_tokens=n))
        if self._fixes and self._has_trc:  # ratios and the prompt length wait for the slot's `new prompt` line
            self._await, self._await_lines = (slot, tid), 0
        else:
            self._fixes = []

    def _launched(self, t: _Task, n_tokens: int | None) -> None:
        """A task first seen after its launch line (reading started mid-run, or a line was lost)."""
        if t.launched:
            return
        t.launched = True
        self._out.append(_Spec(T.TASK_LAUNCHED, "", "INF", t.slot, t.id,
                               {"n_tokens": n_tokens if n_tokens is not None else -1}, self._t))

    def _slot_task(self, ln: LogLine) -> tuple[_Slot, _Task | None]:
        s = self.slot(ln.slot)
        if ln.task >= 0:
            t = self.task(ln.task, ln.slot)
            if s.task != ln.task and not t.done and not t.errored and s.state == "idle":
                s.task, s.state = ln.task, "processing_prompt"  # reading started after the launch
            if not t.launched and not t.errored:
                self._launched(t, t.n_tokens)
            return s, t
        return s, None

    def _on_new_prompt(self, m, ln, level):
        s = self.slot(ln.slot)
        n = int(m.group(3))
        t = self.task(ln.task, ln.slot) if ln.task >= 0 else None
        if t is not None:
            t.n_tokens = n
            self._launched(t, n)
            if s.task != ln.task:
                s.task = ln.task
        s.state = "processing_prompt"
        s.n_prompt = n
        s.n_past = s.prompt_n = s.n_gen = 0
        s.shifts = []
        s.plan = {"lcp": s.lcp_hint, "ckpt": None, "full_match": None, "reuse_n_past": None,
                  "checkpoints": [(c[0], c[1], c[2]) for c in s.checkpoints], "pos_min_thold": None}
        s.lcp_hint = None
        self._spec(T.PROMPT_START, ln.msg, level=level, slot=ln.slot, task=ln.task)

    def _on_empty_prompt(self, m, ln, level):
        s, _ = self._slot_task(ln)
        s.plan = None
        self._spec(T.PROMPT_EMPTY, ln.msg, level=level, slot=ln.slot, task=ln.task)

    def _on_full_match(self, m, ln, level):
        s, _ = self._slot_task(ln)
        if s.plan is not None:
            s.plan["full_match"] = int(m.group(1))
        self._spec(T.PROMPT_FULL_MATCH, ln.msg, level=level, slot=ln.slot, task=ln.task)

    def _on_n_past_set(self, m, ln, level):
        self._slot_task(ln)
        self._spec(T.PROMPT_FULL_MATCH, ln.msg, level=level, slot=ln.slot, task=ln.task)

    def _on_reuse_unsupported(self, m, ln, level):
        self._slot_task(ln)
        self._spec(T.CACHE_REUSE_UNSUPPORTED, ln.msg, level=level, slot=ln.slot, task=ln.task)

    def _on_reuse_begin(self, m, ln, level):
        s, _ = self._slot_task(ln)
        if s.plan is not None:
            s.plan["reuse_n_past"] = int(m.group(2))
        self._spec(T.CACHE_REUSE_BEGIN, ln.msg, level=level, slot=ln.slot, task=ln.task)

    def _on_shift(self, m, ln, level):
        s, _ = self._slot_task(ln)
        a, b, c, d = (int(m.group(i)) for i in range(2, 6))
        s.shifts.append((a, b, c, d))
        self._spec(T.CACHE_REUSE_SHIFT, ln.msg, level=level, slot=ln.slot, task=ln.task, src=[a, b], dst=[c, d])

    def _on_reuse_end(self, m, ln, level):
        self._slot_task(ln)
        self._spec(T.CACHE_REUSE_END, ln.msg, level=level, slot=ln.slot, task=ln.task)

    def _on_ckpt_check(self, m, ln, level):
        s, _ = self._slot_task(ln)
        if s.plan is not None:
            s.plan["pos_min_thold"] = int(m.group(3))
        self._spec(T.CHECKPOINT_CHECK, ln.msg, level=level, slot=ln.slot, task=ln.task)

    def _on_ckpt_restored(self, m, ln, level):
        s, _ = self._slot_task(ln)
        n_past = int(m.group(4))
        if s.plan is not None:
            s.plan["ckpt"] = "restored" if n_past > 0 else "forced"
        self._spec(T.CHECKPOINT_RESTORED, ln.msg, level=level, slot=ln.slot, task=ln.task, n_tokens=int(m.group(3)),
                   n_past=n_past, pos_min=int(m.group(1)), pos_max=int(m.group(2)),
                   size=_b(m.group(5)) if m.group(5) else -1)

    def _on_ckpt_none(self, m, ln, level):
        s, _ = self._slot_task(ln)
        if s.plan is not None:
            s.plan["ckpt"] = "forced"
        self._spec(T.CHECKPOINT_NONE, ln.msg, level=level, slot=ln.slot, task=ln.task)

    def _remove_ckpt(self, s: _Slot, pos_min: int | None, pos_max: int | None, n_tokens: int) -> list | None:
        for c in s.checkpoints:
            if c[2] == n_tokens and (pos_min is None or (c[0] == pos_min and c[1] == pos_max)):
                s.checkpoints.remove(c)
                return c
        return None

    def _on_ckpt_invalidated(self, m, ln, level):
        s, _ = self._slot_task(ln)
        if m.group(4) is not None and not self.swa_full:
            self.n_swa_model = int(m.group(4))
        n = int(m.group(3))
        self._remove_ckpt(s, int(m.group(1)), int(m.group(2)), n)
        self._spec(T.CHECKPOINT_EVICT, ln.msg, level=level, slot=ln.slot, task=ln.task, reason="invalidated",
                   n_tokens=n, pos_min=int(m.group(1)), pos_max=int(m.group(2)))

    def _on_ckpt_created(self, m, ln, level):
        s, _ = self._slot_task(ln)
        pmin, pmax, n, size = int(m.group(3)), int(m.group(4)), int(m.group(5)), _b(m.group(6))
        self.ckpt_max = int(m.group(2))
        s.checkpoints.append([pmin, pmax, n, size, ln.task])
        if s.n_tokens is not None and s.n_tokens < n:
            s.n_tokens = n
        self._spec(T.CHECKPOINT_CREATED, ln.msg, level=level, slot=ln.slot, task=ln.task, n_tokens=n, pos_min=pmin,
                   pos_max=pmax, size=size)

    def _ckpt_evict(self, m, ln, level, reason):
        s, _ = self._slot_task(ln)
        pmin, pmax, n = int(m.group(1)), int(m.group(2)), int(m.group(3))
        self._remove_ckpt(s, pmin, pmax, n)
        self._spec(T.CHECKPOINT_EVICT, ln.msg, level=level, slot=ln.slot, task=ln.task, reason=reason, n_tokens=n,
                   pos_min=pmin, pos_max=pmax)

    def _on_ckpt_fifo(self, m, ln, level):
        self._ckpt_evict(m, ln, level, "fifo")

    def _on_ckpt_too_close(self, m, ln, level):
        self._ckpt_evict(m, ln, level, "too_close")

    def _on_ckpt_supersede(self, m, ln, level):
        s, _ = self._slot_task(ln)
        n = int(m.group(1))
        c = self._remove_ckpt(s, None, None, n)
        # the line has no positions: they come from the chain the reader keeps (-1 when it never saw it)
        data = {"reason": "supersede", "n_tokens": n, "pos_min": c[0] if c is not None else -1,
                "pos_max": c[1] if c is not None else -1}
        self._spec(T.CHECKPOINT_EVICT, ln.msg, level=level, slot=ln.slot, task=ln.task, **data)

    def _on_seq_rm(self, m, ln, level):
        s, t = self._slot_task(ln)
        n = int(m.group(1))
        if s.plan is not None:
            self._plan(s, t, n, ln)
        if s.n_tokens is None or s.state != "idle":
            s.n_tokens = n
        s.prompt_n = max(0, n - s.n_past)
        self._spec(T.PROMPT_SEQ_RM, ln.msg, level=level, slot=ln.slot, task=ln.task)

    def _plan(self, s: _Slot, t: _Task | None, n_past: int, ln: LogLine) -> None:
        p, s.plan = s.plan, None
        n_prompt = s.n_prompt
        if p["reuse_n_past"] is not None:
            lcp = p["reuse_n_past"]
        elif p["lcp"] is not None:
            lcp = p["lcp"]
        elif p["full_match"] is not None:
            lcp = p["full_match"]
        else:  # no selection line said (-sps 0): n_past is the common prefix unless a rule cut it
            lcp = n_past
        s.n_past = n_past
        if t is not None:
            t.cache_n = n_past
        div = lcp if lcp < n_prompt else -1
        self._spec(T.PROMPT_PLAN, "", slot=s.id, task=ln.task, n_past=n_past, n_prompt=n_prompt, lcp=lcp,
                   ckpt=p["ckpt"], origin=s.origin, shifts=[tuple(x) for x in s.shifts], divergence=div,
                   div_text="", checkpoints=p["checkpoints"], pos_min_thold=p["pos_min_thold"])

    def _on_init_sampler(self, m, ln, level):
        s, _ = self._slot_task(ln)
        if s.plan is not None:  # prompt start without a `cached n_tokens` line
            s.plan = None
        s.state = "generating"
        s.n_tokens = s.n_prompt
        s.prompt_n = max(0, s.n_prompt - s.n_past)
        self._plain(ln)

    def _on_pp_progress(self, m, ln, level):
        s, _ = self._slot_task(ln)
        s.prompt_n = int(m.group(1))
        self._plain(ln)

    def _on_gen_progress(self, m, ln, level):
        s, _ = self._slot_task(ln)
        s.n_gen = int(m.group(1))
        self._plain(ln)

    def _on_t_prompt(self, m, ln, level):
        _, t = self._slot_task(ln)
        if t is not None:
            t.prompt_n = int(m.group(1))
        self._plain(ln)

    def _on_t_eval(self, m, ln, level):
        s, t = self._slot_task(ln)
        if t is not None:
            t.predicted_n = int(m.group(1))
        s.n_gen = int(m.group(1))
        self._plain(ln)

    def _on_t_total(self, m, ln, level):
        self._slot_task(ln)
        self._plain(ln)

    def _on_release(self, m, ln, level):
        s = self.slot(ln.slot)
        n = int(m.group(1))
        t = self.tasks.get(ln.task) if ln.task >= 0 else None
        if t is not None and not t.launched and not t.errored:
            self._launched(t, t.n_tokens)
        if t is not None and not t.errored and not t.done:
            t.done = True
            pred = t.predicted_n if t.predicted_n is not None else s.n_gen
            n_eval = t.n_tokens if t.n_tokens is not None else (n - pred + 1 if t.predicted_n is not None else None)
            if t.n_tokens is None:
                t.n_tokens = n_eval
            prompt_n = t.prompt_n if t.prompt_n is not None else -1
            if t.cache_n is None:
                t.cache_n = n_eval - prompt_n if n_eval is not None and prompt_n >= 0 else -1
            self._spec(T.TASK_DONE, "", slot=ln.slot, task=ln.task, cache_n=t.cache_n, prompt_n=prompt_n,
                       predicted_n=pred, tokens_cached=n)
        self._spec(T.SLOT_RELEASE, ln.msg, level=level, slot=ln.slot, task=ln.task, n_tokens=n)
        s.n_tokens = n
        s.state = "idle"
        s.task_prev = ln.task if ln.task >= 0 else s.task
        s.task = -1
        s.origin = "slot"
        s.plan = None
        s.n_past = s.prompt_n = s.n_gen = 0

    # ------------------------------------------------------------------ idle slots, clears, purges

    def _on_idle_save(self, m, ln, level):
        self._close_idle()
        self._idle = ln.slot
        self._ctx = (ln.slot, ln.task)
        self._spec(T.IDLE_SLOT_SAVE, ln.msg, level=level, slot=ln.slot, task=ln.task)

    def _on_idle_saved(self, m, ln, level):
        self._spec(T.IDLE_SLOT_SAVED, ln.msg, level=level, slot=ln.slot, task=ln.task)

    def _close_idle(self) -> None:
        self._idle = None

    def _on_clear(self, m, ln, level):
        s = self.slot(ln.slot)
        n = int(m.group(1))
        if self._sel is None:
            self._slot_length(s, n)
        reason = self._clear_reason.pop(ln.slot, None)
        if reason is None and self._idle == ln.slot:
            reason = "idle_clear"
            self._close_idle()
        if reason is None and self._state_load_error:
            reason = "restore_failed"
            self._state_load_error = False
        sp = self._spec(T.SLOT_CLEAR, ln.msg, level=level, slot=ln.slot, task=ln.task, reason=reason or "erase",
                        n_tokens=n)
        if reason is None and s.state == "idle":
            self._pending_clear = sp  # an erase, unless `Unable to restore slot` follows
        elif reason is None:
            sp.data["reason"] = "clear"
        s.n_tokens, s.checkpoints, s.origin = 0, [], "slot"

    def _settle_clear(self, restore_failed: bool | None) -> None:
        sp, self._pending_clear = self._pending_clear, None
        if sp is not None and restore_failed:
            sp.data["reason"] = "restore_failed"

    def _on_purge(self, m, ln, level):
        sid, n = int(m.group(1)), int(m.group(2))
        self._clear_reason[sid] = "purge"
        self._spec(T.SLOT_PURGE, ln.msg, level=level, id_slot=sid, n_tokens=n)

    # ------------------------------------------------------------------ errors, cancels, decode

    def _on_send_error(self, m, ln, level):
        tid, text = int(m.group(1)), m.group(2)
        code, type_ = error_code(text)
        t = self.tasks.get(tid)
        slot = t.slot if t is not None else -1
        if self._pending_clear is not None:
            self._settle_clear(text.startswith("Unable to restore slot"))
        self._state_load_error = False
        if t is not None:
            if not t.launched:
                self._launched(t, t.n_tokens)
            t.errored = True
        self._spec(T.TASK_ERROR, text, level=level, slot=slot, task=tid, code=code, type=type_)

    def _on_cancel(self, m, ln, level):
        tid = int(m.group(1))
        t = self.tasks.get(tid)
        if t is not None and not t.done and not t.errored and self.slot(t.slot).task == tid:
            self._spec(T.TASK_CANCELLED, ln.msg, level=level, slot=t.slot, task=tid)
            t.errored = True
        else:
            self._plain(ln)

    def _on_decode_retry(self, m, ln, level):
        ret = int(m.group(3)) if m.group(3) is not None else 1
        self._spec(T.DECODE_RETRY, ln.msg, level=level, ret=ret, off=int(m.group(1)), n_batch=int(m.group(2)))

    def _on_decode_failed(self, m, ln, level):
        for s in self.slots.values():
            if s.state != "idle":
                self._clear_reason[s.id] = "decode_failed"
        self._spec(T.DECODE_FAILED, ln.msg, level=level, ret=int(m.group(4)), off=int(m.group(2)),
                   n_batch=int(m.group(3)))

    def _on_spec_verify(self, m, ln, level):
        self._slot_task(ln)
        self._spec(T.SPEC_VERIFY, ln.msg, level=level, slot=ln.slot, task=ln.task, n_draft=int(m.group(2)),
                   n_accepted=int(m.group(1)))

    def _on_spec_failed(self, m, ln, level):
        # the line has no numbers: -1 marks them unknown
        self._spec(T.DECODE_FAILED, ln.msg, level=level, ret=-1, off=-1, n_batch=-1)

    # ------------------------------------------------------------------ the RAM cache

    def _cache_ctx(self, ln: LogLine) -> tuple[int, int]:
        if self._sel is not None:
            return (self._sel.chosen if self._sel.chosen is not None else -1, -1)
        if self._idle is not None:
            return self._ctx
        return (-1, -1)

    def _cspec(self, kind: str, ln: LogLine, level: str, func: str | None = None, **data) -> _Spec:
        slot, task = self._cache_ctx(ln)
        new = self._sel is not None
        if func or ln.func:
            data["func"] = func or ln.func
        return self._spec(kind, ln.msg, level=level, slot=slot, task=task, new_task=new, **data)

    def _on_save(self, m, ln, level):
        n, total, dft = int(m.group(1)), _b(m.group(2)), _b(m.group(3))
        slot, _ = self._cache_ctx(ln)
        s = self.slots.get(slot)
        id_task = s.task_prev if s is not None and s.task < 0 else (s.task if s is not None else -1)
        if s is not None and self._sel is not None and s.task >= 0:  # a busy slot requested by id
            id_task = s.task_prev
        if s is not None:
            self._slot_length(s, n, before=self._sel.specs[0] if self._sel is not None and self._sel.specs
                              else self._launch_first)
        self._cspec(T.CACHE_SAVE, ln, level, n_tokens=n, size_tgt=total - dft, size_dft=dft, id_slot=slot,
                    id_task=id_task)
        ck = [list(c) for c in s.checkpoints] if s is not None else []
        self._alloc = {"n_tokens": n, "size_tgt": total - dft, "size_dft": dft, "id_slot": slot, "id_task": id_task,
                       "checkpoints": ck, "ln": ln, "obsolete": 0}

    def _on_skip_duplicate(self, m, ln, level):
        a, self._alloc = self._alloc, None
        self._cspec(T.CACHE_SKIP_DUPLICATE, ln, level, entry_id=-1, n_tokens=a["n_tokens"] if a else -1)

    def _on_skip_over_limit(self, m, ln, level):
        a, self._alloc = self._alloc, None
        self._cspec(T.CACHE_SKIP_OVER_LIMIT, ln, level, size=_b(m.group(1)), limit_size=_b(m.group(2)),
                    n_tokens=a["n_tokens"] if a else -1)

    def _evict(self, idx: int | None, reason: str, ln: LogLine, level: str, size_mib: str | None = None) -> None:
        e = self.entries.pop(idx) if idx is not None and 0 <= idx < len(self.entries) else None
        if e is None:
            self._cspec(T.CACHE_EVICT, ln, level, reason=reason, entry_id=-1, n_tokens=-1,
                        size=_b(size_mib) if size_mib else -1)
            return
        self._alloc_specs.pop(e.id, None)
        self._cspec(T.CACHE_EVICT, ln, level, reason=reason, entry_id=e.id, n_tokens=e.n_tokens, size=e.size)

    def _on_evict_obsolete(self, m, ln, level):
        n = int(m.group(1))
        idx = next((i for i, e in enumerate(self.entries) if e.n_tokens == n), None)
        self._evict(idx, "obsolete_prefix", ln, level)

    def _on_evict_make_room(self, m, ln, level):
        self._evict(0, "make_room", ln, level, m.group(1))

    def _on_evict_byte_limit(self, m, ln, level):
        self._evict(0, "shrink" if self._shrink else "byte_limit", ln, level, m.group(1))

    def _on_evict_token_limit(self, m, ln, level):
        self._evict(0, "token_limit", ln, level, m.group(3))

    def _on_alloc_failed(self, m, ln, level):
        a, self._alloc = self._alloc, None
        self._shrink = True
        self._cspec(T.CACHE_ALLOC_FAILED, ln, level, size_tgt=a["size_tgt"] if a else -1,
                    size_dft=a["size_dft"] if a else -1, error=m.group(1))

    def _on_limit_reduced(self, m, ln, level):
        new = _b(m.group(1))
        old = max(0, self.cache_ram or 0) * 1024 * 1024
        if self.cache_ram is not None and self.cache_ram > 0:
            self.cache_ram = max(1, int(round(new / MIB)))
        self._cspec(T.CACHE_LIMIT_REDUCED, ln, level, limit_size=new, limit_size_old=old)

    def _finish_alloc(self) -> None:
        a, self._alloc = self._alloc, None
        ck = a["checkpoints"]
        size_ckpt = sum(c[3] for c in ck)
        e = _Entry(self._next_entry, a["n_tokens"], a["size_tgt"] + a["size_dft"] + size_ckpt, a["size_dft"], ck,
                   a["id_slot"], a["id_task"])
        self._next_entry += 1
        self.entries.append(e)
        sp = self._cspec(T.CACHE_ALLOC, a["ln"], "TRC", func="alloc", entry_id=e.id, n_tokens=e.n_tokens, size=e.size,
                         id_slot=e.id_slot, id_task=e.id_task, size_main=a["size_tgt"], size_dft=a["size_dft"],
                         size_ckpt=size_ckpt, n_checkpoints=len(ck), head="",
                         checkpoints=[tuple(c[:4]) for c in ck])
        sp.message = ""
        self._alloc_specs[e.id] = sp

    def _on_load_base(self, m, ln, level):
        slot, _ = self._cache_ctx(ln)
        s = self.slots.get(slot)
        f_keep, f_sim = _f(m.group(1)), _f(m.group(2))
        sel = self._sel
        n_slot = s.n_tokens if s is not None and s.n_tokens is not None else -1
        chk = sel.checks.get(slot) if sel is not None else None
        if f_keep < 0:
            lcp = 0
            n_slot = 0 if n_slot < 0 else n_slot
        elif chk is not None:
            lcp = chk[0]
        elif sel is not None and sel.n_task:
            lcp = int(round(f_sim * sel.n_task))
        elif n_slot > 0:
            lcp = int(round(f_keep * n_slot))
        else:
            lcp = -1
        n_task = sel.n_task if sel is not None else None
        if lcp >= 0 and n_task:
            f_sim = float(f32_ratio(lcp, n_task))
        if lcp >= 0 and n_slot > 0:  # exact when the slot's length the reader keeps agrees with the print
            exact = float(f32_ratio(lcp, n_slot))
            if f"{exact:.3f}" == m.group(1):
                f_keep = exact
        self._load = {"lcp_base": lcp, "f_keep_base": f_keep, "f_sim_base": f_sim, "scores": [], "winner": None,
                      "found": None, "n_task": n_task}
        sp = self._cspec(T.CACHE_LOAD_BASE, ln, level, lcp=lcp, f_keep=f_keep, f_sim=f_sim, n_tokens=n_slot)
        if not n_task and lcp >= 0:
            self._fixes.append(lambda n, d=sp.data: d.update(f_sim=float(f32_ratio(lcp, n))))

    def _on_load_score(self, m, ln, level):
        ld = self._load
        if ld is None:
            self._load = ld = {"lcp_base": -1, "f_keep_base": -1.0, "f_sim_base": 0.0, "scores": [], "winner": None,
                               "found": None, "n_task": None}
        i = len(ld["scores"])
        e = self.entries[i] if i < len(self.entries) else None
        n, lcp = int(m.group(1)), int(m.group(2))
        f_keep, f_sim = float(f32_ratio(lcp, n)) if n else _f(m.group(3)), _f(m.group(4))
        if ld["n_task"]:
            f_sim = float(f32_ratio(lcp, ld["n_task"]))
        eid = e.id if e is not None else -1
        ld["scores"].append({"entry_id": eid, "n_tokens": n, "lcp": lcp, "f_keep": f_keep, "f_sim": f_sim,
                             "printed": (m.group(3), m.group(4))})
        sp = self._cspec(T.CACHE_LOAD_SCORE, ln, level, entry_id=eid, n_tokens=n, lcp=lcp, f_keep=f_keep, f_sim=f_sim)
        if not ld["n_task"]:
            self._fixes.append(lambda n, d=sp.data: d.update(f_sim=float(f32_ratio(lcp, n))))

    def _on_load_found(self, m, ln, level):
        ld = self._load or {"lcp_base": -1, "f_keep_base": -1.0, "f_sim_base": 0.0, "scores": [], "winner": None,
                            "found": None, "n_task": None}
        self._load = ld
        pk, ps = m.group(1), m.group(2)
        # the winner is the last entry that beat the running best on both ratios (as the server scans)
        best_k, best_s, win = np.float32(ld["f_keep_base"]), np.float32(ld["f_sim_base"]), None
        for i, sc in enumerate(ld["scores"]):
            k, s = np.float32(sc["f_keep"]), np.float32(sc["f_sim"])
            if not k < np.float32(0.25) and best_k < k and best_s < s:
                best_k, best_s, win = k, s, i
        if win is None or ld["scores"][win]["printed"] != (pk, ps):
            cands = [i for i, sc in enumerate(ld["scores"]) if sc["printed"] == (pk, ps)]
            win = cands[-1] if cands else win
        ld["winner"] = win
        sc = ld["scores"][win] if win is not None else None
        f_keep = sc["f_keep"] if sc is not None else _f(pk)
        f_sim = sc["f_sim"] if sc is not None else _f(ps)
        ld["found"] = (f_keep, f_sim)
        sp = self._cspec(T.CACHE_LOAD_FOUND, ln, level, entry_id=sc["entry_id"] if sc is not None else -1,
                         f_keep=f_keep, f_sim=f_sim)
        if not ld["n_task"] and sc is not None:
            self._fixes.append(lambda n, d=sp.data, lcp=sc["lcp"]: d.update(f_sim=float(f32_ratio(lcp, n))))

    def _on_restore_failed(self, m, ln, level):
        ld = self._load
        size = int(m.group(1))
        eid = -1
        if ld is not None and ld["winner"] is not None:
            eid = ld["scores"][ld["winner"]]["entry_id"]
        self._finish_load(failed=True)
        self._cspec(T.CACHE_RESTORE_FAILED, ln, level, entry_id=eid, which="tgt" if level == "ERR" else "dft",
                    size=size)

    def _on_load_failed(self, m, ln, level):
        self._clear_reason[ln.slot] = "load_failed"
        if self._sel is not None:
            self._sel.load = False
        slot, task = self._cache_ctx(ln)
        self._spec(T.CACHE_LOAD_FAILED, ln.msg, level=level, slot=ln.slot, task=ln.task, new_task=self._sel is not None)

    def _finish_load(self, failed: bool) -> None:
        ld, self._load = self._load, None
        slot, _ = self._ctx if self._sel is None else (self._sel.chosen if self._sel.chosen is not None else -1, -1)
        win = ld["winner"]
        new = self._sel is not None
        table = _Spec(T.CACHE_LOAD_SCORES, "", "TRC", slot, -1, _scores_table(ld, None), self._t, new)
        self._out.append(table)
        if new:
            self._sel.specs.append(table)
        if not ld["n_task"]:
            self._fixes.append(lambda n, d=table.data, ld=ld: d.update(_scores_table(ld, n)))
        if new:
            self._sel.scores = ld["scores"]
        if win is None or failed:
            return
        sc = ld["scores"][win]
        idx = self._entry_index(sc["entry_id"])
        e = self.entries.pop(idx) if idx >= 0 else None
        if e is not None:
            self._alloc_specs.pop(e.id, None)
            sp = _Spec(T.CACHE_EVICT, "", "TRC", slot, -1, {"func": "load", "reason": "loaded", "entry_id": e.id,
                                                               "n_tokens": e.n_tokens, "size": e.size}, self._t, new)
            self._out.append(sp)
            if new:
                self._sel.specs.append(sp)
        s = self.slot(slot) if slot >= 0 else None
        if s is not None:
            s.n_tokens = e.n_tokens if e is not None else sc["n_tokens"]
            s.checkpoints = [list(c) for c in e.checkpoints] if e is not None else []
            s.origin = f"cache #{sc['entry_id']}"
        sp = _Spec(T.CACHE_LOADED, "", "TRC", slot, -1, {"entry_id": sc["entry_id"], "n_tokens": sc["n_tokens"],
                                                        "f_keep": sc["f_keep"], "f_sim": sc["f_sim"]}, self._t, new)
        self._out.append(sp)
        if not ld["n_task"]:
            self._fixes.append(lambda n, d=sp.data, lcp=sc["lcp"]: d.update(f_sim=float(f32_ratio(lcp, n))))
        if new:
            sel = self._sel
            sel.specs.append(sp)
            sel.load = True
            sel.load_result = {"f_keep_best": sc["f_keep"], "f_sim_best": sc["f_sim"],
                               "f_keep_base": ld["f_keep_base"], "_lcp": sc["lcp"]}

    def _on_state(self, m, ln, level):
        self._shrink = False
        n, mib, lim_mib, lim_tok, est = int(m.group(1)), m.group(2), m.group(3), int(m.group(4)), int(m.group(5))
        self._listing = {"ln": ln, "level": level, "n": n, "size": _b(mib), "limit_size": _b(lim_mib),
                         "limit_tokens": lim_tok, "est": est, "rows": []}
        if n == 0:
            self._finish_listing()

    def _on_state_entry(self, m, ln, level):
        L = self._listing
        if L is None:
            self._plain(ln)
            return
        L["rows"].append((m.group(1), int(m.group(2)), int(m.group(3)), _b(m.group(4)), ln, level))
        if len(L["rows"]) >= L["n"]:
            self._finish_listing()

    def _finish_listing(self) -> None:
        L, self._listing = self._listing, None
        rows = L["rows"]
        self._resync(rows)
        ln = L["ln"]
        self._cspec(T.CACHE_STATE, ln, L["level"], n_entries=L["n"], size=L["size"],
                    n_tokens=sum(r[1] for r in rows), limit_size=L["limit_size"], limit_tokens=L["limit_tokens"],
                    limit_tokens_cur=L["est"])
        for (addr, n, n_ck, size, rln, lvl), e in zip(rows, self.entries):
            self._cspec(T.CACHE_STATE_ENTRY, rln, lvl, entry_id=e.id, n_tokens=n, n_checkpoints=n_ck, size=size)
        self._alloc_specs.clear()

    def _resync(self, rows: list) -> None:
        """Make the reader's FIFO list agree with a listing (each row: address, tokens, checkpoints, bytes)."""
        same = len(rows) == len(self.entries) and all(r[1] == e.n_tokens for r, e in zip(rows, self.entries))
        if not same:
            by_addr = {e.addr: e for e in self.entries if e.addr is not None}
            keep: list[_Entry] = []
            for r in rows:
                e = by_addr.get(r[0])
                if e is None or e.n_tokens != r[1] or any(x is e for x in keep):
                    e = next((x for x in self.entries if x.n_tokens == r[1] and not any(y is x for y in keep)), None)
                if e is None:
                    e = _Entry(self._next_entry, r[1], r[3], 0, [], -1, -1)
                    self._next_entry += 1
                    self._spec(T.CACHE_ALLOC, "", slot=-1, task=-1, func="alloc", entry_id=e.id, n_tokens=e.n_tokens,
                               size=e.size, id_slot=-1, id_task=-1, size_main=e.size, size_dft=0, size_ckpt=0,
                               n_checkpoints=r[2], head="", checkpoints=[])
                keep.append(e)
            for e in self.entries:
                if not any(x is e for x in keep):
                    self._alloc_specs.pop(e.id, None)
                    self._spec(T.CACHE_EVICT, "", slot=-1, task=-1, reason=RESYNC, entry_id=e.id,
                               n_tokens=e.n_tokens, size=e.size)
            self.n_resyncs += 1
            self.entries = keep
        for r, e in zip(rows, self.entries):
            e.addr = r[0]
            if e.size != r[3]:  # the listing's MiB is the entry's own total: take it
                e.size = r[3]
                sp = self._alloc_specs.get(e.id)
                if sp is not None:  # the checkpoints' bytes: the entry's total minus the state it saved
                    sp.data["size"] = r[3]
                    if sp.data["n_checkpoints"]:
                        sp.data["size_ckpt"] = max(0, r[3] - sp.data["size_main"] - sp.data["size_dft"])
                    else:
                        sp.data["size_main"] = max(0, r[3] - sp.data["size_dft"])


def _scores_table(ld: dict, n_task: int | None) -> dict:
    """`cache_load_scores` data of a load: the baseline and each entry's ratios (recomputed exactly once
    the prompt length `n_task` is known), and which entries were below the floor / improved / won."""
    win = ld["winner"]
    f_sim_base = ld["f_sim_base"]
    if n_task and ld["lcp_base"] >= 0:
        f_sim_base = float(f32_ratio(ld["lcp_base"], n_task))
    best_k, best_s = np.float32(ld["f_keep_base"]), np.float32(f_sim_base)
    scores = []
    for i, sc in enumerate(ld["scores"]):
        f_sim = float(f32_ratio(sc["lcp"], n_task)) if n_task else sc["f_sim"]
        k, s = np.float32(sc["f_keep"]), np.float32(f_sim)
        below = bool(k < np.float32(0.25))
        improved = (not below) and bool(best_k < k) and bool(best_s < s)
        if improved:
            best_k, best_s = k, s
        scores.append({"entry_id": sc["entry_id"], "n_tokens": sc["n_tokens"], "lcp": sc["lcp"], "f_keep": sc["f_keep"],
                       "f_sim": f_sim, "below_floor": below, "improved": improved, "winner": i == win})
    return {"func": "load", "preview": False, "lcp_base": ld["lcp_base"], "f_keep_base": ld["f_keep_base"],
            "f_sim_base": f_sim_base, "winner_id": ld["scores"][win]["entry_id"] if win is not None else None,
            "scores": scores}


def error_code(text: str) -> tuple[int, str]:
    """(HTTP status, error type) the server answers with for an error text of `send_error`."""
    if "exceeds the available context size" in text:
        return 400, "exceed_context_size_error"
    if text.startswith(("Unable to restore slot", "Invalid slot ID", "Invalid filename", "Invalid action",
                        "Prompt contains invalid tokens")):
        return 400, "invalid_request_error"
    if text.startswith("This server does not support slots action"):
        return 501, "not_supported_error"
    return 500, "server_error"


# ------------------------------------------------------------------------------------------- the results fold

def requests_json(events: Iterable) -> list[dict]:
    """What each request got, in `slotlab replay --json`'s schema, folded from events (a log reader's or
    the engine's): completions in task-id order (= arrival order) with slot, cache_n, prompt_n,
    tokens_evaluated, tokens_cached, status and error (`content` is None: the log has no text); slot
    actions where the events show them: erase (`slot_clear` reason `erase`), save / restore
    (`slot_saved` / `slot_restored`) and their errors (a `task_error` of a task that never ran in a slot).

    The server logs nothing for a successful save or restore: a log reader infers a restore from what
    follows it (`slot_restored` with filename ""), and its row holds None where the log has no value,
    with those fields named in `lacks` (`slotlab.watch.http_side.fill` takes them from the HTTP
    answers); a successful save leaves no trace in the log at all, so it has no row here."""
    comps: dict[int, dict] = {}
    rows: list[tuple[float, int, dict]] = []  # (order key, position, result)
    max_task = -1
    pos = 0

    def add(key: float, r: dict) -> None:
        nonlocal pos
        rows.append((key, pos, r))
        pos += 1

    for e in events:
        k, d = e.kind, e.data
        if k == T.TASK_LAUNCHED:
            if e.task not in comps:
                c = comps[e.task] = {"status": None, "id_slot": e.slot, "cache_n": None, "prompt_n": None,
                                     "tokens_evaluated": d.get("n_tokens"), "tokens_cached": None, "content": None,
                                     "error": None}
                add(e.task, c)
            else:
                comps[e.task]["tokens_evaluated"] = d.get("n_tokens")
        elif k == T.TASK_DONE and e.task in comps:
            c = comps[e.task]
            n_eval = c["tokens_evaluated"]
            if n_eval is None or n_eval < 0:
                n_eval = d["tokens_cached"] - d["predicted_n"] + 1
            c.update(status=200, id_slot=e.slot, cache_n=d["cache_n"], prompt_n=d["prompt_n"], tokens_evaluated=n_eval,
                     tokens_cached=d["tokens_cached"])
        elif k in (T.TASK_ERROR, T.TASK_CANCELLED):
            code, type_ = (d["code"], d["type"]) if k == T.TASK_ERROR else (499, "cancelled")
            err = {"code": code, "message": e.message if k == T.TASK_ERROR else "request cancelled by the client",
                   "type": type_}
            if e.task in comps:
                comps[e.task].update(status=code, id_slot=None, cache_n=None, prompt_n=None, tokens_evaluated=None,
                                     tokens_cached=None, content=None, error=err)
            else:
                action = ("restore" if e.message.startswith("Unable to restore slot") else
                          "save" if e.message.startswith("Unable to save slot") else None)
                if action is not None:
                    add(e.task, {"action": action, "status": code, "reply": {"error": err}})
        elif k == T.SLOT_CLEAR and d.get("reason") == "erase":
            add(max_task + 0.5, {"action": "erase", "status": 200,
                                 "reply": {"id_slot": e.slot, "n_erased": d["n_tokens"]}})
        elif k == T.SLOT_SAVED:
            add(e.task, {"action": "save", "status": 200, "reply": {
                "id_slot": e.slot, "filename": d["filename"], "n_saved": d["n_tokens"], "n_written": d["n_bytes"]}})
        elif k == T.SLOT_RESTORED and not d["filename"]:  # inferred from a log: the server printed nothing
            reply = {"id_slot": e.slot, "filename": None, "n_restored": d["n_tokens"] if d["n_tokens"] >= 0 else None,
                     "n_read": None}
            # before the task it names (the one whose launch showed it), else after what was seen so far
            add(e.task - 0.5 if e.task >= 0 else max_task + 0.5,
                {"action": "restore", "status": 200, "reply": reply, "lacks": [f for f, v in reply.items() if v is None]})
        elif k == T.SLOT_RESTORED:
            add(e.task, {"action": "restore", "status": 200, "reply": {
                "id_slot": e.slot, "filename": d["filename"], "n_restored": d["n_tokens"], "n_read": d["n_bytes"]}})
        if e.task > max_task and (k in (T.TASK_LAUNCHED, T.TASK_ERROR, T.TASK_DONE, T.SLOT_SAVED)
                                  or (k == T.SLOT_RESTORED and d["filename"])):
            max_task = e.task
    rows.sort(key=lambda r: (r[0], r[1]))
    return [r for _, _, r in rows]


def read_log(path, bus=None) -> list[Event]:
    """`LogReader(bus).read_file(path)`."""
    return LogReader(bus).read_file(Path(path))


def flags_of(events: Iterable) -> list[str]:
    """The flags the `init` event reconstructs from the log (empty when the log has no start-up)."""
    for e in events:
        if e.kind == T.INIT:
            return list(e.data.get("flags", []))
    return []
