"""The server's task queue (`server_queue`, tools/server/server-queue.cpp): new tasks in arrival order,
deferred tasks waiting for a slot, and cancellations of tasks already running (spec 0.5).

A task that finds no slot is deferred; each release moves ONE deferred task back to the front of the
queue, preferring one that asked for the released slot, else the oldest (SQ:90-113)."""

from __future__ import annotations

import collections

from slotlab.engine import event_types as T
from slotlab.engine.emit import Emitter
from slotlab.engine.task import Task, TaskError, TaskState, TaskType


def cancelled_error() -> TaskError:
    """The answer of a request whose client went away (one text wherever a task is cancelled)."""
    return TaskError(499, "request cancelled by the client", "cancelled")


class TaskQueue:
    def __init__(self, emit: Emitter):
        self.emit = emit
        self.queue: collections.deque[Task] = collections.deque()
        self.deferred: list[Task] = []
        self.tasks: dict[int, Task] = {}
        self.cancels: list[Task] = []  # running tasks to cancel at the next step
        self._next_id = 0

    def new_task(self, type_: TaskType, **kw) -> Task:
        t = Task(self._next_id, type_, **kw)
        self._next_id += 1
        self.tasks[t.id] = t
        return t

    def post(self, task: Task) -> None:
        self.queue.append(task)

    def pending(self) -> bool:
        return bool(self.queue)

    def pop(self) -> Task | None:
        return self.queue.popleft() if self.queue else None

    def defer(self, task: Task, why: str) -> None:
        task.state = TaskState.DEFERRED
        self.deferred.append(task)
        self.emit(T.TaskDeferred(), f"{why}, defer task, id_task = {task.id}", level="DBG", task=task.id)

    def pop_deferred_task(self, id_slot: int) -> None:
        """On a release: ONE deferred task back to the front (SQ:90-113)."""
        if not self.deferred:
            return
        pick = next((t for t in self.deferred if t.type is TaskType.COMPLETION and t.params.id_slot == id_slot),
                    self.deferred[0])
        self.deferred.remove(pick)
        pick.state = TaskState.QUEUED
        self.queue.appendleft(pick)
        self.emit(T.TaskUndeferred(id_slot=id_slot), "", task=pick.id)

    def cancel(self, task: Task) -> None:
        """Drop a queued or deferred task at once; a running one is cancelled at the next step."""
        if task.done:
            return
        task.cancelled = True
        if task in self.queue:
            self.queue.remove(task)
            task.finish(error=cancelled_error())
        elif task in self.deferred:
            self.deferred.remove(task)
            task.finish(error=cancelled_error())
        else:
            self.cancels.append(task)

    def waiting(self) -> list[Task]:
        """Every task not yet in a slot: queued, then deferred."""
        return list(self.queue) + list(self.deferred)
