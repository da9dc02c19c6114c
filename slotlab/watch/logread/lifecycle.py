"""A task's and a slot's life in the lines: `processing task` (launch_slot_with_task), `stop processing`
(release, with `task_done` made of the timing lines), idle slots saved to the RAM cache and cleared,
`clearing prompt` (prompt_clear: an erase, a purge, a failed load or restore), `send_error`, cancels,
decode failures; and the slot actions the server does not log.

The server logs nothing for a successful `POST /slots/N?action=restore` (nor for a save). A restore
shows by what follows it: an idle slot the reader holds empty gets a similarity check (an empty slot
prints `skipping, slot is empty`), a check shares more tokens than the slot holds, or a save or clear
prints a length the reader did not put there. Then an inferred `slot_restored` is emitted before the
lines that showed it, with the file name "" and the bytes read -1 (the log has neither), and the
length -1 until a line prints it."""

from __future__ import annotations

from slotlab.engine import event_types as T
from slotlab.watch.lines import LogLine
from slotlab.watch.logread.state import AwaitPrompt, SlotState, Spec, TaskState


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


class SlotLifecycle:
    """The lifecycle family (patterns.LIFECYCLE)."""

    #: origin of a slot filled by `POST /slots/N?action=restore` (the server logs nothing; the name is unknown)
    FILE_UNKNOWN = "file ?"

    def __init__(self, rd):
        self.rd = rd
        self.clear_reason: dict[int, str] = {}  # slot -> why its next `clearing prompt` happens
        self.state_load_error = False  # `error loading sequence state file` (a failed restore's clear follows)

    # ------------------------------------------------------------------ launch

    def on_launch(self, m, ln, level):
        rd, way = self.rd, self.rd.way
        slot, tid = ln.slot, ln.task
        if way.selection is not None:
            rd.selection.close((slot, tid), None)
        s = rd.slot(slot)
        t = rd.task(tid, slot)
        t.slot = slot
        s.task, s.state = tid, "started"
        s.n_past = s.prompt_n = s.n_gen = 0
        s.shifts = []
        t.launched = True
        n = t.n_tokens if t.n_tokens is not None else -1
        sp = Spec(T.TASK_LAUNCHED, ln.msg, level, slot, tid, {"n_tokens": n}, rd.t)
        rd.out.append(sp)
        if t.n_tokens is None:
            way.fixes.append(lambda n, d=sp.data: d.update(n_tokens=n))
        if way.fixes and rd.has_trc:  # ratios and the prompt length wait for the slot's `new prompt` line
            way.await_prompt = AwaitPrompt(slot, tid)
        else:
            way.fixes = []

    def launched(self, t: TaskState, n_tokens: int | None) -> None:
        """A task first seen after its launch line (reading started mid-run, or a line was lost)."""
        if t.launched:
            return
        t.launched = True
        self.rd.out.append(Spec(T.TASK_LAUNCHED, "", "INF", t.slot, t.id,
                                {"n_tokens": n_tokens if n_tokens is not None else -1}, self.rd.t))

    def slot_task(self, ln: LogLine) -> tuple[SlotState, TaskState | None]:
        """The slot and task a slot line names (a task seen running without its launch is launched)."""
        rd = self.rd
        s = rd.slot(ln.slot)
        if ln.task >= 0:
            t = rd.task(ln.task, ln.slot)
            if s.task != ln.task and not t.done and not t.errored and s.state == "idle":
                s.task, s.state = ln.task, "processing_prompt"  # reading started after the launch
            if not t.launched and not t.errored:
                self.launched(t, t.n_tokens)
            return s, t
        return s, None

    # ------------------------------------------------------------------ release

    def on_release(self, m, ln, level):
        rd = self.rd
        s = rd.slot(ln.slot)
        n = int(m.group(1))
        t = rd.tasks.get(ln.task) if ln.task >= 0 else None
        if t is not None and not t.launched and not t.errored:
            self.launched(t, t.n_tokens)
        if t is not None and not t.errored and not t.done:
            t.done = True
            pred = t.predicted_n if t.predicted_n is not None else s.n_gen
            n_eval = t.n_tokens if t.n_tokens is not None else (n - pred + 1 if t.predicted_n is not None else None)
            if t.n_tokens is None:
                t.n_tokens = n_eval
            prompt_n = t.prompt_n if t.prompt_n is not None else -1
            if t.cache_n is None:
                t.cache_n = n_eval - prompt_n if n_eval is not None and prompt_n >= 0 else -1
            rd.spec(T.TASK_DONE, "", slot=ln.slot, task=ln.task, cache_n=t.cache_n, prompt_n=prompt_n,
                    predicted_n=pred, tokens_cached=n)
        rd.spec(T.SLOT_RELEASE, ln.msg, level=level, slot=ln.slot, task=ln.task, n_tokens=n)
        s.n_tokens = n
        s.state = "idle"
        s.task_prev = ln.task if ln.task >= 0 else s.task
        s.task = -1
        s.origin = "slot"
        s.plan = None
        s.n_past = s.prompt_n = s.n_gen = 0

    # ------------------------------------------------------------------ idle slots, clears, purges

    def on_idle_save(self, m, ln, level):
        way = self.rd.way
        way.idle_slot = ln.slot
        way.cache_ctx = (ln.slot, ln.task)
        self.rd.spec(T.IDLE_SLOT_SAVE, ln.msg, level=level, slot=ln.slot, task=ln.task)

    def on_idle_saved(self, m, ln, level):
        self.rd.spec(T.IDLE_SLOT_SAVED, ln.msg, level=level, slot=ln.slot, task=ln.task)

    def on_clear(self, m, ln, level):
        rd, way = self.rd, self.rd.way
        s = rd.slot(ln.slot)
        n = int(m.group(1))
        if way.selection is None:
            self.slot_length(s, n)
        reason = self.clear_reason.pop(ln.slot, None)
        if reason is None and way.idle_slot == ln.slot:
            reason = "idle_clear"
            way.idle_slot = None
        if reason is None and self.state_load_error:
            reason = "restore_failed"
            self.state_load_error = False
        sp = rd.spec(T.SLOT_CLEAR, ln.msg, level=level, slot=ln.slot, task=ln.task, reason=reason or "erase",
                     n_tokens=n)
        if reason is None and s.state == "idle":
            way.pending_clear = sp  # an erase, unless `Unable to restore slot` follows
        elif reason is None:
            sp.data["reason"] = "clear"
        s.n_tokens, s.checkpoints, s.origin = 0, [], "slot"

    def settle_clear(self, restore_failed: bool | None) -> None:
        """The clear outside any context was an erase, or (`restore_failed`) a failed restore's."""
        way = self.rd.way
        sp, way.pending_clear = way.pending_clear, None
        if sp is not None and restore_failed:
            sp.data["reason"] = "restore_failed"

    def on_purge(self, m, ln, level):
        sid, n = int(m.group(1)), int(m.group(2))
        self.clear_reason[sid] = "purge"
        self.rd.spec(T.SLOT_PURGE, ln.msg, level=level, id_slot=sid, n_tokens=n)

    # ------------------------------------------------------------------ errors, cancels, decode

    def on_send_error(self, m, ln, level):
        rd = self.rd
        tid, text = int(m.group(1)), m.group(2)
        code, type_ = error_code(text)
        t = rd.tasks.get(tid)
        slot = t.slot if t is not None else -1
        if rd.way.pending_clear is not None:
            self.settle_clear(text.startswith("Unable to restore slot"))
        self.state_load_error = False
        if t is not None:
            if not t.launched:
                self.launched(t, t.n_tokens)
            t.errored = True
        rd.spec(T.TASK_ERROR, text, level=level, slot=slot, task=tid, code=code, type=type_)

    def on_cancel(self, m, ln, level):
        rd = self.rd
        tid = int(m.group(1))
        t = rd.tasks.get(tid)
        if t is not None and not t.done and not t.errored and rd.slot(t.slot).task == tid:
            rd.spec(T.TASK_CANCELLED, ln.msg, level=level, slot=t.slot, task=tid)
            t.errored = True
        else:
            rd.plain(ln)

    def on_decode_retry(self, m, ln, level):
        ret = int(m.group(3)) if m.group(3) is not None else 1
        self.rd.spec(T.DECODE_RETRY, ln.msg, level=level, ret=ret, off=int(m.group(1)), n_batch=int(m.group(2)))

    def on_decode_failed(self, m, ln, level):
        for s in self.rd.slots.values():
            if s.state != "idle":
                self.clear_reason[s.id] = "decode_failed"
        self.rd.spec(T.DECODE_FAILED, ln.msg, level=level, ret=int(m.group(4)), off=int(m.group(2)),
                     n_batch=int(m.group(3)))

    def on_spec_failed(self, m, ln, level):
        # the line has no numbers: -1 marks them unknown
        self.rd.spec(T.DECODE_FAILED, ln.msg, level=level, ret=-1, off=-1, n_batch=-1)

    # ------------------------------------------------------------------ restores the log does not print

    def unlogged_action(self, ln: LogLine) -> None:
        """`all_idle` right after `all_idle`: the loop ran one more time and printed nothing else, so
        it processed a task the server does not log: a successful save, a restore, or a read of
        `/slots` or `/metrics` (a cancel prints `stop: cancel task` first, an erase or a failed restore
        their clear and error: none of them makes a bare idle line). Kept at its place as an action of
        unknown kind; a restore that a later line reveals (`silent_restore`) claims the last one before it
        where results are folded (`requests_json`)."""
        self.rd.spec(T.SLOT_ACTION_UNLOGGED, "", level="TRC", slot=-1, task=-1, may_be=("save", "restore", "read"))

    def silent_restore(self, s: SlotState, n_tokens: int | None, before: Spec | None = None) -> None:
        """`POST /slots/N?action=restore` succeeded: the server logs nothing, but a later line shows the
        idle slot holding tokens no line put there. The inferred `slot_restored` goes before `before` (the
        first held event of the selection that showed it) and says what the log lacks: the file name is
        "" and the bytes read -1, the length -1 until a line gives it (`slot_length`). When `before`
        was already emitted (a launch, then the idle-slot save that showed the restore), the event's
        `task` names the task launched then: the restore came before it."""
        rd = self.rd
        sp = Spec(T.SLOT_RESTORED, "", "TRC", s.id, -1, {
            "filename": "", "n_tokens": -1 if n_tokens is None else n_tokens, "n_bytes": -1,
            "n_bytes_appendix": -1, "n_checkpoints": 0}, rd.t)
        idx = next((i for i, x in enumerate(rd.out) if x is before), None) if before is not None else None
        if before is not None and idx is None and before is rd.selection.last_first:
            sp.task = rd.selection.last_task
        rd.out.insert(len(rd.out) if idx is None else idx, sp)
        s.restored = sp if n_tokens is None else None
        s.n_tokens, s.checkpoints, s.origin = n_tokens, [], self.FILE_UNKNOWN

    def slot_length(self, s: SlotState, n: int, before: Spec | None = None) -> None:
        """A line printed the idle slot's length `n` (a save, a clear): a length other than the one the
        reader keeps is a silent restore; an inferred restore still held gets its length."""
        if s.state != "idle":
            return
        if s.n_tokens is None and s.origin == self.FILE_UNKNOWN:
            if s.restored is not None and any(x is s.restored for x in self.rd.out):
                s.restored.data["n_tokens"] = n
            s.restored, s.n_tokens = None, n
        elif s.n_tokens is not None and s.n_tokens != n:
            self.silent_restore(s, n, before)
