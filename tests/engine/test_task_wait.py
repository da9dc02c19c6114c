"""`Task.wait` (live mode) returns once the engine thread finishes the task, whether it finished
before the wait began or while it blocks: the Event is made by the first wait, not with every task
(a simulation makes a task per request and never waits)."""

import threading
import time

import pytest

from slotlab.engine.task import Task, TaskError, TaskType
from slotlab.errors import SlotlabError


def test_a_task_finished_before_the_wait_returns_at_once():
    t = Task(1, TaskType.COMPLETION)
    t.finish(result={"content": "x"})
    assert t._done is None  # nobody waited: no Event was made
    assert t.wait(timeout=0.01) == {"content": "x"}


def test_a_wait_returns_when_another_thread_finishes_the_task():
    for delay in (0.0, 0.001, 0.02):  # before, about when, and after the waiter makes its Event
        t = Task(2, TaskType.COMPLETION)
        th = threading.Thread(target=lambda: (time.sleep(delay), t.finish(result={"n": 1})))
        th.start()
        assert t.wait(timeout=5) == {"n": 1}
        th.join()


def test_a_wait_times_out_and_an_error_is_raised():
    t = Task(3, TaskType.COMPLETION)
    with pytest.raises(TimeoutError):
        t.wait(timeout=0.01)
    t.finish(error=TaskError(400, "bad", "invalid_request_error"))
    with pytest.raises(SlotlabError, match="bad"):
        t.wait(timeout=1)
