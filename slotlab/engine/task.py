"""Tasks (what a request becomes in the server's queue) and their results."""

from __future__ import annotations

import enum
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

log = logging.getLogger("slotlab.engine")
_EVENT_LOCK = threading.Lock()  # one waiter makes Task._done (see there)


class TaskType(enum.Enum):
    COMPLETION = "completion"
    SLOT_SAVE = "slot_save"
    SLOT_RESTORE = "slot_restore"
    SLOT_ERASE = "slot_erase"


class TaskState(enum.Enum):
    QUEUED = "queued"
    DEFERRED = "deferred"
    RUNNING = "running"  # launched into a slot
    DONE = "done"


@dataclass
class TaskParams:
    """The request fields slotlab models (names as in the server's JSON)."""

    n_predict: int = -1
    temperature: float = 0.0
    seed: int = 0xFFFFFFFF
    ignore_eos: bool = False
    cache_prompt: bool = True
    n_cache_reuse: int = 0
    id_slot: int = -1
    message_spans: object = None  # MessageSpans from the request's message_delimiters
    stop: list = field(default_factory=list)  # stop strings
    # slotlab.sampling.SamplingParams when the request set the server's sampling fields (logit_bias,
    # n_probs, grammar, ...): the memory then builds the server's sampler chain; None = the plain one
    sampling: object = None


@dataclass
class TaskError:
    code: int
    message: str
    type: str

    def to_json(self) -> dict:
        return {"code": self.code, "message": self.message, "type": self.type}


@dataclass(eq=False)
class Task:
    id: int
    type: TaskType
    tokens: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int32))
    params: TaskParams = field(default_factory=TaskParams)
    # slot actions
    action_slot: int = -1
    filename: str | None = None
    # lifecycle
    state: TaskState = TaskState.QUEUED
    id_slot: int = -1  # the slot it ran in
    result: dict | None = None
    error: TaskError | None = None
    # made by the first `wait` (live mode; under _EVENT_LOCK, after which it reads the state): a
    # simulation makes a task per request and never waits, and an Event is a Condition and a lock
    _done: threading.Event | None = field(default=None, repr=False)
    # called from the engine thread: on_token(task, token_id) per sampled token; done callbacks at the end
    on_token: object = field(default=None, repr=False)
    _callbacks: list = field(default_factory=list, repr=False)
    cancelled: bool = False
    index: int = 0  # which of a request's n choices this task answers (the server's task.index)
    # per sampled token, the sampler's TokenProbs when params.sampling.n_probs > 0 (generated_token_probs)
    token_probs: list = field(default_factory=list, repr=False)
    callback_errors: int = 0  # done callbacks that raised (each logged on "slotlab.engine")

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def done(self) -> bool:
        return self.state is TaskState.DONE

    def finish(self, result: dict | None = None, error: TaskError | None = None) -> None:
        if self.state is TaskState.DONE:
            return
        self.result, self.error = result, error
        self.state = TaskState.DONE
        ev = self._done  # read after the state is DONE: a waiter making it now sees DONE and sets it
        if ev is not None:
            ev.set()
        for cb in self._callbacks:
            try:
                cb(self)
            except Exception:  # a listener must not break the engine: logged with its traceback
                log.exception("done callback of task %d failed", self.id)
                self.callback_errors += 1

    def add_done_callback(self, fn) -> None:
        """`fn(task)` when the task finishes (immediately if it already has)."""
        self._callbacks.append(fn)
        if self.state is TaskState.DONE:
            fn(self)

    def wait(self, timeout: float | None = None) -> dict:
        """Block until done (live mode); returns the result or raises the task's error."""
        with _EVENT_LOCK:
            if self._done is None:
                self._done = threading.Event()
                if self.state is TaskState.DONE:  # finished before anyone waited
                    self._done.set()
        if not self._done.wait(timeout):
            raise TimeoutError(f"task {self.id} not done after {timeout} s")
        if self.error is not None:
            from slotlab.errors import SlotlabError

            raise SlotlabError(f"task {self.id}: {self.error.message} ({self.error.type}, HTTP {self.error.code})")
        return self.result  # type: ignore[return-value]

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "type": self.type.value, "state": self.state.value, "id_slot": self.id_slot,
                "n_tokens": self.n_tokens, "result": self.result,
                "error": None if self.error is None else self.error.to_json()}
