"""llama-server's log as slotlab's typed events: the same kinds and data fields the engine emits
(`slotlab.engine.event_types`), so the panel, the "why" lines and the replay report fold a real
server's run the way they fold slotlab's.

`LogReader.feed(line)` takes one line and returns the events it completed (often none: some decisions
need the next lines, see below); `flush()` ends the stream (end of file); `read_file(path)` does both
for a file. It never raises on input: a line it does not know (a library line, a continuation line, a
truncated line, a binary blob, a 10 MB line) becomes a plain `log` event.

The reader is cut along the families of lines it reads (`slotlab.watch.patterns` has one table per
family, `slotlab.watch.logread` one module):

    logread/startup.py       Startup           the server's shape, the `init` event
    logread/selection.py     SlotSelection     get_available_slot: by id / LCP / LRU, skips, checks
    logread/prompt.py        PromptLines       the prompt's start, reuse, n_past, progress, timings
    logread/checkpoints.py   Checkpoints       context checkpoints
    logread/prompt_cache.py  PromptCacheLines  the RAM cache: saves, evictions, loads, listings
    logread/lifecycle.py     SlotLifecycle     launch, release, idle slots, clears, errors, slot files
    logread/results.py       requests_json     what each request got (replay --json's schema)
    logread/state.py         the state kept between lines; `UnderWay`: the blocks of lines under way

`LogReader` matches each line, finishes the blocks the line does not continue, hands the line to its
family, and numbers the events once no block holds them. The state it keeps: each slot's task, tokens
and checkpoint chain, the RAM cache's FIFO list (entries get ids 0, 1, ... in allocation order, as the
engine's), the selection under way.

How lines become events (the texts are the server's, see `slotlab/watch/README.md` for the list and
which need `-lv 4`):

* a line maps to the kind the engine emits with that text in `message`; slot and task come from the
  line's `id N | task T` prefix, except for the lines of a slot selection: the server prints them
  before the task is bound to the slot (`task -1`, or the busy slot's task), so they are held until
  `processing task` names the task, then emitted with it (as the engine does);
* what the server does not log but the engine reports is inferred where the log implies it, with an
  empty `message` (the engine's own convention for such events): `cache_alloc` (a save that was not
  skipped), `cache_evict` reason `loaded` and `cache_loaded` (a `found better prompt` not followed by a
  restore failure), `cache_load_scores`, `slot_decision`, `prompt_plan`, `task_done`, `slot_snapshot`,
  `slot_restored` (a restore from a file, which the server does not log: lifecycle.py);
* sizes are printed in MiB with 3 decimals: bytes are `round(MiB * 2**20)` (within 512 bytes); an
  entry's size is the one its `update` listing prints when there is one (the events of a cache update
  are held until its listing is read, so the `cache_alloc` carries that size);
* numbers the log never has: a `-1` where an int is required (`n_tokens` of an eviction whose entry the
  reader never saw, `entry_id` of a duplicate skip, the bytes of a restore), `head` "" and `div_text` ""
  (no token text), the slot-file name "" (a restore is recognised from what follows it, origin `file ?`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slotlab.engine import event_types as T
from slotlab.engine.events import Event
from slotlab.watch import patterns
from slotlab.watch.builds import BuildWatch
from slotlab.watch.lines import LogLine, parse_line
from slotlab.watch.logread.checkpoints import Checkpoints
from slotlab.watch.logread.lifecycle import SlotLifecycle, error_code
from slotlab.watch.logread.prompt import PromptLines
from slotlab.watch.logread.prompt_cache import RESYNC, PromptCacheLines
from slotlab.watch.logread.results import flags_of, requests_json
from slotlab.watch.logread.selection import SlotSelection
from slotlab.watch.logread.startup import ServerShape, Startup
from slotlab.watch.logread.state import SlotState, Spec, TaskState, UnderWay

__all__ = ["LOG", "FILE_UNKNOWN", "RESYNC", "LogReader", "read_log", "requests_json", "flags_of", "error_code"]

#: the kind of a line the reader keeps as text
LOG = "log"
#: origin of a slot filled by `POST /slots?action=restore` (the server logs nothing; the name is unknown)
FILE_UNKNOWN = SlotLifecycle.FILE_UNKNOWN
#: a launch waits at most this many lines for its slot's `new prompt` line (which gives the prompt length)
AWAIT_MAX_LINES = 200
#: finished tasks kept (a live watch runs for days; only running tasks are needed)
KEEP_TASKS = 4096


class LogReader:
    """Stateful reader of one llama-server log. `bus`: an `EventBus` that also gets every event of a
    kind in `event_types` (with its own numbering; plain `log` lines only once that kind is registered)."""

    def __init__(self, bus=None, *, unlogged: bool = True):
        self.bus = bus
        # a loop iteration that printed only `all slots are idle` is a task the server logs nothing for
        # (a save, an unrevealed restore, a /slots or /metrics read): reported as `slot_action_unlogged`
        # unless whoever reads the log polls the server itself (`Watch` with a URL: its own reads)
        self.unlogged = unlogged
        self._prev = None  # the name of the last line a pattern matched (library lines aside)
        # `stop: cancel task` lines since the last launch or release: the HTTP thread prints them, and
        # the cancel task's iteration may come after a bare idle line of its own (spent one each)
        self._cancels = 0
        self._seq = 0
        self.t = 0.0  # the last line's timestamp (s)
        self.out: list[Spec] = []  # events not numbered yet
        self.slots: dict[int, SlotState] = {}
        self.tasks: dict[int, TaskState] = {}
        self.way = UnderWay()
        # the families, each reading its table of patterns (patterns.FAMILIES)
        self.startup = Startup(self)
        self.selection = SlotSelection(self)
        self.prompt = PromptLines(self)
        self.checkpoints = Checkpoints(self)
        self.prompt_cache = PromptCacheLines(self)
        self.lifecycle = SlotLifecycle(self)
        # each line's family: its handler is the family's `on_<name>`
        self._family = {name: getattr(self, family) for family, rows in patterns.FAMILIES.items() for name, *_ in rows}
        self._family.update({name: self.startup for name, *_ in patterns.LIB})
        self.has_trc = False  # the log has TRC lines (-lv 4): `new prompt` lines will come
        # what the reader noticed about the log itself
        self.n_lines = 0
        self.n_plain = 0
        self.problems: list[str] = []  # internal errors on a line (the line was kept as plain text)
        self.build = BuildWatch()  # the llama.cpp build that wrote the log, and its texts (builds.py)

    # ------------------------------------------------------------------ public API

    def feed(self, line: str | bytes) -> list[Event]:
        """One log line in; the events it completed out (in order; possibly none yet)."""
        self.n_lines += 1
        ln = parse_line(line)
        if ln.t is not None:
            self.t = ln.t
        try:
            self._handle(ln)
        except Exception as exc:  # a reader bug must not stop the watch: keep the line, note the problem
            self.problems.append(f"line {self.n_lines}: {type(exc).__name__}: {exc}")
            self.plain(ln)
        if self.busy():
            return []
        return self._flush()

    def flush(self) -> list[Event]:
        """End of the stream: finish whatever waits for a next line and return the last events."""
        try:
            self._settle(None)
            self.way.idle_slot = None
            if self.way.selection is not None:
                self.selection.close(None, None)
            self.lifecycle.settle_clear(None)
            self._end_await(None)
            self.startup.emit_init()
        except Exception as exc:
            self.problems.append(f"flush: {type(exc).__name__}: {exc}")
        self.way.new_entries.clear()
        return self._flush()

    def read_file(self, path) -> list[Event]:
        """Every event of a log file (read as bytes: invalid UTF-8, NULs and huge lines are fine)."""
        out: list[Event] = []
        with open(path, "rb") as f:
            for raw in f:
                out += self.feed(raw)
        out += self.flush()
        return out

    # ------------------------------------------------------------------ what the lines left

    @property
    def shape(self) -> ServerShape:
        """The server's shape, as its start-up lines said."""
        return self.startup.shape

    @property
    def n_slots(self) -> int:
        return self.startup.shape.n_slots

    @property
    def startup_seen(self) -> bool:
        """The log showed the server's start-up (`initializing, n_slots = ...`)."""
        return self.startup.init_line is not None

    @property
    def entries(self):
        """The RAM cache as the lines left it (FIFO, oldest first)."""
        return self.prompt_cache.entries

    @property
    def n_resyncs(self) -> int:
        """Listings that disagreed with the FIFO list the reader kept (it then took the listing's)."""
        return self.prompt_cache.n_resyncs

    def busy(self) -> bool:
        """A block of lines is under way: its events may still change."""
        return self.way.busy() or self.startup.pending

    def slot(self, i: int) -> SlotState:
        s = self.slots.get(i)
        if s is None:
            s = self.slots[i] = SlotState(i, n_tokens=0 if self.startup_seen else None)
        return s

    def task(self, tid: int, slot: int = -1) -> TaskState:
        t = self.tasks.get(tid)
        if t is None:
            if len(self.tasks) >= KEEP_TASKS:
                for old in [k for k, x in self.tasks.items() if x.done or x.errored][: KEEP_TASKS // 4]:
                    del self.tasks[old]
            t = self.tasks[tid] = TaskState(tid, slot)
        return t

    # ------------------------------------------------------------------ emitting

    def spec(self, kind: str, message: str = "", *, level: str = "TRC", slot: int = -1, task: int = -1,
             new_task: bool = False, **data: Any) -> Spec:
        """An event (held until no block is under way); one of a selection under way is also its own."""
        sp = Spec(kind, message, level, slot, task, data, self.t, new_task)
        self.out.append(sp)
        if self.way.selection is not None and kind != LOG:
            self.way.selection.specs.append(sp)
        return sp

    def plain(self, ln: LogLine) -> None:
        """The line as a plain `log` event."""
        self.n_plain += 1
        data = {"func": ln.func} if ln.func else {}
        self.spec(LOG, ln.msg, level=ln.level or "INF", slot=ln.slot, task=ln.task, **data)

    def _flush(self) -> list[Event]:
        out = [self._event(sp) for sp in self.out]
        self.out = []
        for s in sorted(self.slots.values(), key=lambda s: s.id):
            ev = self._snapshot(s)
            if ev is not None:
                out.append(ev)
        return out

    def _event(self, sp: Spec) -> Event:
        """The spec, complete now, as an event: its fields make the kind's payload (the schema check)."""
        try:
            payload = T.REGISTRY[sp.kind](**sp.data)
        except TypeError as exc:  # a reader bug must not stop the watch: the line stays, as plain text
            self.problems.append(f"{sp.kind}: {exc}")
            payload = T.Log()
        ev = Event(self._seq, sp.t, payload.KIND, sp.level, sp.message, sp.slot, sp.task, payload)
        self._seq += 1
        if self.bus is not None:
            self.bus.emit(payload, sp.message, level=sp.level, slot=sp.slot, task=sp.task)
        return ev

    def _snapshot(self, s: SlotState) -> Event | None:
        ck = [tuple(c) for c in s.checkpoints]
        sig = (s.state, s.n_tokens, s.task, s.task_prev, s.n_prompt, s.n_past, s.prompt_n, s.n_gen, s.origin,
               tuple(map(tuple, s.shifts)), tuple(ck))
        if sig == s.sig:
            return None
        s.sig = sig
        t = s.task if s.task >= 0 else s.task_prev
        return self._event(Spec(T.SLOT_SNAPSHOT, "", "TRC", s.id, t, {
            "state": s.state, "n_tokens": s.n_tokens or 0, "n_prompt": s.n_prompt if t >= 0 else 0,
            "n_past": s.n_past, "prompt_n": s.prompt_n, "n_gen": s.n_gen, "origin": s.origin,
            "shifts": [tuple(x) for x in s.shifts], "checkpoints": ck}, self.t))

    # ------------------------------------------------------------------ dispatch

    def _handle(self, ln: LogLine) -> None:
        if self.build.build is None and ln.src in ("cmn", "lib") and self.build.on_build_line(ln.func, ln.msg):
            self.plain(ln)
            self._warn_build()
            return
        # an older build's text is matched as the modelled one (the event keeps the log's own text)
        hit = patterns.match(ln.src, self.build.normalize(ln.msg, self._warn_build)) if ln.src is not None else None
        if hit is None:
            self.plain(ln)
            return
        name, m, lvl = hit
        self.build.saw(name)
        if ln.src == "lib":  # library lines note numbers and stay plain; they continue no block
            getattr(self._family[name], "on_" + name)(m, ln, lvl)
            return
        # the server's macro gives the level (TRC prints with the letter I); a W / E letter wins (a line
        # logged at two levels, e.g. `failed to restore state`: ERR for the target, WRN for the draft)
        level = ln.level if ln.level in ("WRN", "ERR") else lvl
        if lvl == "TRC":
            self.has_trc = True
        aw = self.way.await_prompt
        if aw is not None:
            aw.n_lines += 1
            if ln.src == "slot" and (ln.slot, ln.task) == (aw.slot, aw.task):
                self._end_await(int(m.group(3)) if name == "new_prompt" else None)
            elif aw.n_lines > AWAIT_MAX_LINES:
                self._end_await(None)
        self._settle(name, ln)
        prev, self._prev = self._prev, name
        if name == "cancel":  # the cancel's own task will make a loop iteration that prints nothing else
            self._cancels += 1
        elif name in ("launch", "release"):
            self._cancels = 0
        elif name == "all_idle" and prev == "all_idle" and self.unlogged:
            if self._cancels:
                self._cancels -= 1
            else:
                self.lifecycle.unlogged_action(ln)
        getattr(self._family[name], "on_" + name)(m, ln, level)

    def _warn_build(self) -> None:
        """Once: the log is from another build than the one slotlab models, and what that changes."""
        w = self.build.warning()
        if w is not None:
            self.spec(LOG, w, level="WRN")

    def _end_await(self, n_prompt: int | None) -> None:
        """The launch's `new prompt` came (`n_prompt`) or will not: the values that needed it are fixed."""
        way = self.way
        fixes, way.fixes, way.await_prompt = way.fixes, [], None
        if n_prompt is not None and n_prompt > 0:
            for fix in fixes:
                fix(n_prompt)

    def _settle(self, name: str | None, ln: LogLine | None = None) -> None:
        """Finish what the line `name` does not continue: a pending allocation, load, listing, selection,
        idle-slot save or unexplained clear."""
        way, cache = self.way, self.prompt_cache
        if way.alloc is not None and name not in patterns.ALLOC_CHAIN:
            cache.finish_alloc()
        if way.load is not None and name not in ("load_score", "load_found", "restore_failed"):
            cache.finish_load(failed=False)
        if way.listing is not None and name != "state_entry":
            cache.finish_listing()
        if way.new_entries and name not in patterns.CACHE_LINES:  # no listing came for the new entries
            way.new_entries.clear()
        if name is None:
            return
        if way.pending_clear is not None and name != "send_error":
            self.lifecycle.settle_clear(None)
        if way.idle_slot is not None and not (name in patterns.CACHE_LINES - {"load_failed"} or name == "idle_saved"
                                              or (name == "clear" and ln is not None and ln.slot == way.idle_slot)):
            way.idle_slot = None
        if way.selection is not None:
            if name in patterns.SELECTION_LINES or name in patterns.CACHE_LINES or name in ("launch", "defer"):
                pass
            elif name == "clear" and ln is not None and self.lifecycle.clear_reason.get(ln.slot) == "load_failed":
                pass
            elif name in patterns.NEUTRAL:
                pass
            else:
                self.selection.close(None, None)


def read_log(path, bus=None) -> list[Event]:
    """`LogReader(bus).read_file(path)`."""
    return LogReader(bus).read_file(Path(path))
