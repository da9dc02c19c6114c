"""`--sleep-idle-seconds N`: the server sleeps after N idle seconds, as llama-server does
(server-queue.cpp start_loop, server-context.cpp handle_sleeping_state, server_routes
update_cached_responses).

What it means for the cache, and why it is modelled: entering sleep the server frees the model and
its context (`destroy()`), and waking it loads them again (`load_model`), which re-creates the slots
and the RAM prompt cache. So after a sleep every slot is empty and the prompt cache holds nothing:
the next request processes its whole prompt. slotlab keeps its engine, and clears exactly that: each
slot's tokens and KV (`slot_clear`, reason "sleep") and every RAM cache entry.

The rest of the contract:
- idle: no task queued or running for N s (a task resets the timer, a `/metrics` or `/slots` read
  does not); checked about once a second, as the server's loop wakes up;
- `GET /health`, `/props`, `/models`, `/metrics` answer while sleeping without waking it: `/props`
  with `"is_sleeping": true`, `/metrics` from the snapshot taken on entering sleep (its rate window
  is reported once, then empty);
- any other request wakes the server first (`wait_until_no_sleep`)."""

from __future__ import annotations

import dataclasses
import threading
import time

from slotlab.engine import event_types as T

#: the routes whose handler is created with bypass_sleep (create_response(true)): they never wake it
BYPASS = {("GET", "/health"), ("GET", "/v1/health"), ("GET", "/props"), ("GET", "/models"), ("GET", "/v1/models"),
          ("GET", "/metrics")}


class Sleep:
    def __init__(self, engine, seconds: int, picture=None):
        self.engine = engine
        self.picture = picture  # picture(core): what /metrics reads (the snapshot taken on falling asleep)
        self.seconds = seconds
        self.enabled = seconds >= 0
        self.sleeping = False
        self.snapshot = None  # the /metrics picture at the moment of falling asleep
        self.t_last = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None

    def start(self) -> None:
        if self.enabled and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="slotlab-sleep", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def touch(self) -> None:
        """A task was posted: the idle timer starts again."""
        self.t_last = time.monotonic()

    def wake(self) -> None:
        """wait_until_no_sleep: a request that needs the model."""
        if not self.sleeping:
            return
        with self._lock:
            if not self.sleeping:
                return
            with self.engine.locked() as core:
                core.emit(T.Log(func="start_loop"), "exiting sleeping state", level="INF")
                core.emit(T.Log(func="handle_sleeping_state"), "server is exiting sleeping state", level="INF")
            self.sleeping = False
            self.t_last = time.monotonic()

    def _loop(self) -> None:
        while not self._stop.wait(0.25):  # the server checks once a second at most; finer is harmless
            if self.sleeping:
                continue
            try:
                self._maybe_sleep()
            except Exception:  # a stopped engine at shutdown: nothing to put to sleep
                if self._stop.is_set():
                    return
                raise

    def _maybe_sleep(self) -> None:
        with self._lock, self.engine.locked() as core:
            busy = any(s.is_processing for s in core.slots) or core.tq.pending() or bool(core.tq.deferred)
            if busy:
                self.t_last = time.monotonic()
                return
            if time.monotonic() - self.t_last < self.seconds:
                return
            core.emit(T.Log(func="start_loop"), "entering sleeping state", level="INF")
            self.snapshot = self.picture(core) if self.picture else (dataclasses.replace(core.metrics), 0, 0, 0.0, 0)
            core.emit(T.Log(func="handle_sleeping_state"), "server is entering sleeping state", level="INF")
            for s in core.slots:  # destroy() + load_model(): the slots come back empty
                if len(s.tokens):
                    core.glue.prompt_clear(s, reason="sleep")
                s.task_prev = None
                s.t_last_used = -1
            core.clear_cache()  # ... and so does the RAM prompt cache
            self.sleeping = True
