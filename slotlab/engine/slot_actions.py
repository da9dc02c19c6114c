"""`POST /slots/{id}?action=save|restore|erase` (spec 5): the checks every front end shares, and
the three actions on a slot through the memory.

`check_slot_action` is the single source of the request-level rules (is the feature on, is the
action known, is the file name acceptable); the engine and `slotlab serve` both call it, so an HTTP
client and a notebook get the same status and text. The actions themselves write and read the
server's file body (slot_file.py) and, when `--slot-appendices` is on, slotlab's checkpoint and
draft appendices (a slotlab extension; the pinned server writes none). With `--server-build 11549` the
checkpoints travel as that build's own appendix does (always; its reading rules and log lines)."""

from __future__ import annotations

import time
from pathlib import Path

from slotlab.engine import event_types as T
from slotlab.engine import slot_file
from slotlab.engine.emit import Emitter
from slotlab.engine.slot_file import TokensStateError, validate_filename
from slotlab.engine.task import TaskError
from slotlab.memory import Memory

ACTIONS = ("save", "restore", "erase")


def check_slot_action(slot_save_path, action: str | None, filename: str | None = None, *,
                      check_filename: bool = True) -> TaskError | None:
    """The server's checks before a slot action is queued, in its order (spec 5.1, 5.2)."""
    if slot_save_path is None:
        return TaskError(501, "This server does not support slots action. Start it with `--slot-save-path`",
                         "not_supported_error")
    if action not in ACTIONS:
        return TaskError(400, "Invalid action", "invalid_request_error")
    if check_filename and action != "erase" and (filename is None or not validate_filename(filename)):
        return TaskError(400, "Invalid filename", "invalid_request_error")
    return None


class SlotActions:
    """Save / restore / erase one slot; `prompt_clear` is the cache glue's (a failed restore and an
    erase leave the slot empty, as the server's)."""

    def __init__(self, memory: Memory, emit: Emitter, slot_save_path, appendices: bool, prompt_clear, *,
                 checkpoints_in_files: bool = False, n_ctx_checkpoints: int = 32):
        self.memory, self.emit = memory, emit
        self.dir = None if slot_save_path is None else Path(slot_save_path)
        self.appendices = appendices
        self.prompt_clear = prompt_clear
        # b11549 keeps the checkpoints in slot files itself (slot_file.read_checkpoints_b11549): always, with
        # its own reading rules and log lines, the appendix counted in the answer's n_written / n_read; the
        # slot-file-checkpoints proposal gives an older build the same rule
        self.b11549 = checkpoints_in_files
        self.n_ctx_checkpoints = n_ctx_checkpoints

    def run(self, slot, task) -> None:
        {"save": self.save, "restore": self.restore, "erase": self.erase}[task.type.value.removeprefix("slot_")](slot, task)

    def save(self, slot, task) -> None:
        t0 = time.perf_counter()
        path = self.dir / task.filename
        n = slot_file.save(self.memory, slot.id, slot.tokens.view(), path)
        if n == 0:
            task.finish(error=TaskError(500, "Unable to save slot", "server_error"))
            return
        n_app, msg = 0, ""
        if self.b11549:
            n_app = slot_file.write_appendices(path, slot.checkpoints)  # SCKP only: the draft state stays behind
            if n_app:
                msg = (f"appended {len(slot.checkpoints)} context checkpoint(s) ({n_app / 1024 / 1024:.3f} MiB) "
                       f"to '{path}'")
        elif self.appendices:
            has_dft = self.memory.info.has_draft and len(slot.tokens)
            draft_state = self.memory.state_get(slot.id, draft=True) if has_dft else b""
            n_app = slot_file.write_appendices(path, slot.checkpoints, draft_state)
        self.emit(T.SlotSaved(filename=task.filename, n_tokens=len(slot.tokens), n_bytes=n, n_bytes_appendix=n_app,
                              n_checkpoints=len(slot.checkpoints) if n_app else 0), msg, slot=slot, task=task.id)
        task.finish(result={"id_slot": task.action_slot, "filename": task.filename, "n_saved": len(slot.tokens),
                            "n_written": n + n_app if self.b11549 else n,
                            "timings": {"save_ms": (time.perf_counter() - t0) * 1e3}})

    def restore(self, slot, task) -> None:
        t0 = time.perf_counter()
        path = self.dir / task.filename
        try:
            nread, tokens = slot_file.load(self.memory, slot.id, path)
            if nread == 0:
                raise TokensStateError("No available space in KV cache or invalid slot save file")
            if len(tokens) > slot.n_ctx:
                raise TokensStateError("Restored prompt does not fit in the slot context")
            if len(tokens) and (tokens.min() < 0 or tokens.max() >= self.memory.info.n_vocab):
                raise TokensStateError("Invalid tokens in slot save file")
        except TokensStateError as e:
            self.prompt_clear(slot, reason="restore_failed")
            task.finish(error=TaskError(400, f"Unable to restore slot: {e}", "invalid_request_error"))
            return
        slot.tokens.assign(tokens)
        slot.checkpoints = []
        slot.origin = f"file {task.filename}"
        n_app, msg = 0, ""
        if self.b11549 or self.appendices:  # b11549's own appendix, or slotlab's extension
            app = (slot_file.read_checkpoints_b11549(path, nread, self.n_ctx_checkpoints, str(path)) if self.b11549
                   else slot_file.read_appendices(path, nread))
            for note in app.notes:
                self.emit(T.SlotAppendixSkipped(), note, level="WRN", slot=slot, task=task.id)
            slot.checkpoints = app.checkpoints
            n_app = app.n_bytes
            if self.memory.info.has_draft:
                self._restore_draft(slot, task, app)
            if self.b11549 and n_app:
                msg = f"restored {len(slot.checkpoints)} context checkpoint(s) from '{path}'"
        self.emit(T.SlotRestored(filename=task.filename, n_tokens=len(tokens), n_bytes=nread, n_bytes_appendix=n_app,
                                 n_checkpoints=len(slot.checkpoints)), msg, slot=slot, task=task.id)
        task.finish(result={"id_slot": task.action_slot, "filename": task.filename, "n_restored": len(tokens),
                            "n_read": nread + n_app if self.b11549 else nread,
                            "timings": {"restore_ms": (time.perf_counter() - t0) * 1e3}})

    def _restore_draft(self, slot, task, app) -> None:
        """SDFT extension: test-load the last checkpoint's draft data (PARTIAL_ONLY) and drop all
        draft checkpoint data if it does not fit this draft context; then restore the draft state."""
        mem, ck = self.memory, slot.checkpoints
        if ck and len(ck[-1].data_dft):
            ok = mem.state_set(ck[-1].data_dft, slot.id, draft=True, partial=True) == len(ck[-1].data_dft)
            self._draft_seq_rm(slot.id)
            if not ok:
                self.emit(T.SlotDraftDropped(),
                          f"draft context checkpoint data in '{task.filename}' does not match the "
                          "draft context - dropped", level="WRN", slot=slot, task=task.id)
                for c in ck:
                    c.data_dft = b""
                    c.data_spec = b""
        if len(app.draft_state):
            self._draft_seq_rm(slot.id)
            if mem.state_set(app.draft_state, slot.id, draft=True) != len(app.draft_state):
                self._draft_seq_rm(slot.id)
                self.emit(T.SlotDraftDropped(), f"draft state in '{task.filename}' does not match the draft context - "
                          "dropped", level="WRN", slot=slot, task=task.id)

    def _draft_seq_rm(self, seq: int) -> None:
        """Empty the draft side of `seq` only: a whole-sequence removal, which every memory accepts."""
        self.memory.seq_rm_draft(seq, -1, -1)

    def erase(self, slot, task) -> None:
        n = len(slot.tokens)
        self.prompt_clear(slot, reason="erase")
        task.finish(result={"id_slot": task.action_slot, "n_erased": n})


__all__ = ["ACTIONS", "SlotActions", "check_slot_action"]
