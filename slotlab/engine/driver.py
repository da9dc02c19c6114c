"""How the server loop is driven: step by step (deterministic, for notebooks, tests and replay) or
in a background thread (live mode, for the panel and `slotlab serve`).

The driver owns the one lock that guards the core: every step, and everything a front end reads or
submits, runs under it, so a panel or an HTTP handler never sees a half-made decision. A loop that
dies keeps its error: each later call re-raises it and every waiting task gets it as its answer."""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

from slotlab.engine.core import ServerCore
from slotlab.engine.task import TaskError
from slotlab.errors import SlotlabError

log = logging.getLogger("slotlab.engine")


class EngineDied(SlotlabError):
    """The engine thread stopped on an error; every later call re-raises it."""


class YieldingLock:
    """The core's lock, fair to front ends: the live loop lets every waiting reader in before its next
    step. A plain lock is not fair: the loop releases it and takes it back at once, so an HTTP `/slots`
    or a panel refresh could wait for a whole 400-token generation (seen as a 5 s client timeout in CI).
    The server has the same guarantee by design: `/slots` is a task its loop answers between two batches.

    Front ends use it as a context manager (re-entrant, like the RLock it wraps); the loop takes its turn
    with `loop_turn()`, which first waits, briefly, until no front end is queued."""

    def __init__(self):
        self._lock = threading.RLock()
        self._count = threading.Lock()
        self._waiting = 0
        self._none_waiting = threading.Event()
        self._none_waiting.set()

    def __enter__(self) -> "YieldingLock":
        with self._count:
            self._waiting += 1
            self._none_waiting.clear()
        try:
            self._lock.acquire()
        finally:
            with self._count:
                self._waiting -= 1
                if self._waiting == 0:
                    self._none_waiting.set()
        return self

    def __exit__(self, *exc) -> None:
        self._lock.release()

    @contextmanager
    def loop_turn(self, patience: float = 1.0) -> Iterator[None]:
        """The loop's acquisition: after every queued front end has had the lock (or `patience` s)."""
        self._none_waiting.wait(patience)
        with self._lock:
            yield


class Driver:
    def __init__(self, core: ServerCore):
        self.core = core
        self.lock = YieldingLock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._paused = threading.Event()
        self.died: BaseException | None = None

    def wake(self) -> None:
        self._wake.set()

    def check_alive(self) -> None:
        if self.died is not None:
            raise EngineDied(f"the engine thread died: {self.died!r}") from self.died

    # -- step mode -------------------------------------------------------------------------------

    def step(self) -> bool:
        """One iteration of the server loop; True while work is left."""
        self.check_alive()
        with self.lock:
            return self.core.step()

    def run_until_idle(self, max_steps: int = 10_000_000) -> None:
        for _ in range(max_steps):
            if not self.step():
                return
        raise SlotlabError(f"engine still busy after {max_steps} steps")

    def run_until(self, pred: Callable[[], bool], max_steps: int = 10_000_000) -> None:
        for _ in range(max_steps):
            if pred():
                return
            if not self.step() and pred():
                return
        if not pred():
            raise SlotlabError("condition not reached")

    # -- live mode -------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """The server loop in a background thread (pause()/resume() to single-step)."""
        if self.running:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="slotlab-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread:
            self._thread.join(timeout)
            self._thread = None

    def pause(self) -> None:
        """Stop the live loop between two steps; returns once no step is running (the loop checks
        the flag under the lock, so nothing submitted after this runs until `resume()`)."""
        self._paused.set()
        with self.lock:
            pass

    def resume(self) -> None:
        self._paused.clear()
        self._wake.set()

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                with self.lock.loop_turn():
                    paused = self._paused.is_set()
                    busy = False if paused else self.core.step()
                if paused:
                    time.sleep(0.02)
                    continue
                if not busy:
                    self._wake.wait(0.1)
                    self._wake.clear()
        except BaseException as e:  # noqa: BLE001 - kept, logged, re-raised to callers and tasks
            self.died = e
            log.exception("the engine loop died")
            with self.lock:
                self.core.fail_all(TaskError(500, f"engine stopped: {e!r}", "server_error"))
