"""`Engine`: one llama-server in a Python object — its flags, a memory, the decision core and a driver.

    eng = Engine("-np 2 -c 4096 --cache-ram 128")          # llama-server flags
    t = eng.submit("Hello", n_predict=8); eng.run_until_idle()  # or eng.start() and t.wait()

The engine only assembles and guards: the flags are parsed as the server parses them (params.py),
the memory is the real llama context unless one is given (`memory=`: a fake or a paper memory), the
decisions are `ServerCore`'s (core.py) and the loop is the `Driver`'s (driver.py), whose lock every
public call takes. Front ends (the panel, `slotlab serve`, replay) use this class and the event
stream; none of them reaches into the core."""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import numpy as np

from slotlab.engine.core import ServerCore
from slotlab.engine.events import EventBus
from slotlab.engine.driver import Driver, EngineDied
from slotlab.engine.observe import cache_json, slots_json
from slotlab.engine.params import ServerParams
from slotlab.engine.task import Task

if TYPE_CHECKING:
    from slotlab.engine.backend import Backend

__all__ = ["Engine", "EngineDied"]


class Engine:
    def __init__(
        self,
        params: ServerParams | list[str] | str | None = None,
        *,
        backend: Backend | None = None,
        model=None,
        memory=None,
        allocate: Callable[[int], Any] | None = None,
        observers: Sequence[Callable[[EventBus], Any]] = (),
        hindsight: bool = True,
        **overrides,
    ):
        if params is None or isinstance(params, ServerParams):
            params = (params or ServerParams())
            if overrides:
                params = params.replace(**overrides)
        else:
            params = ServerParams.from_args(params, **overrides)
        self.params = params
        self.backend: Backend | None = None
        self._owns_backend = False
        if memory is None:  # the real llama context (imported here: a given memory needs no llama build)
            from slotlab.engine.backend import load

            self._owns_backend = backend is None
            self._owns_model = backend is None and model is None
            self.backend = backend or load(params, model=model)
            memory = self.backend.memory()
        self.memory = memory
        bus = EventBus()
        # views that must see every event from the first (e.g. `slotlab.explain.attach`, whose
        # request_miss events then ride the same stream) subscribe before the core emits; the engine
        # imports no view, so each front end passes its own. `attached[i]` is what observer i returned.
        self.attached = [fn(bus) for fn in observers]
        self.core = ServerCore(params, memory, allocate=allocate, events=bus, hindsight=hindsight)
        self.driver = Driver(self.core)

    # ------------------------------------------------------------------ what views read

    @property
    def model(self):
        """The llama model (None on a memory without one)."""
        return self.backend.model if self.backend is not None else None

    @property
    def ctx(self):
        return self.backend.ctx if self.backend is not None else None

    @property
    def dctx(self):
        return self.backend.dctx if self.backend is not None else None

    @property
    def vocab(self):
        return self.memory.vocab

    events = property(lambda self: self.core.events)
    metrics = property(lambda self: self.core.metrics)
    slots = property(lambda self: self.core.slots)
    cache = property(lambda self: self.core.cache)
    tasks = property(lambda self: self.core.tq.tasks)
    n_ctx_slot = property(lambda self: self.core.n_ctx_slot)
    n_swa = property(lambda self: self.core.n_swa)
    died = property(lambda self: self.driver.died)

    @property
    def queue(self) -> list[Task]:
        with self.driver.lock:
            return list(self.core.tq.queue)

    @property
    def deferred(self) -> list[Task]:
        with self.driver.lock:
            return list(self.core.tq.deferred)

    @contextmanager
    def locked(self) -> Iterator[ServerCore]:
        """Hold the engine still while reading several things at once (no step runs meanwhile)."""
        with self.driver.lock:
            yield self.core

    def slots_json(self) -> list[dict]:
        """`GET /slots`."""
        with self.driver.lock:
            return slots_json(self.core)

    def cache_json(self) -> dict:
        """Beyond the server: the RAM cache's entries (oldest first), bytes and token limits."""
        with self.driver.lock:
            return cache_json(self.core)

    # ------------------------------------------------------------------ requests in

    def tokenize(self, prompt: str | list | np.ndarray) -> np.ndarray:
        return self.core.tokenize(prompt)

    def submit(self, prompt: str | list | np.ndarray, **fields) -> Task:
        """Queue a completion (the `/completion` request fields: n_predict, id_slot, cache_prompt,
        n_cache_reuse, temperature, seed, ignore_eos, message_delimiters, stop, on_token). Returns the
        task; its `result` is set when done. In live mode `task.wait()` blocks for it."""
        self.driver.check_alive()
        with self.driver.lock:
            task = self.core.completion_task(prompt, **fields)
            self.core.post(task)
        self.driver.wake()
        return task

    def slot_action(self, action: str, id_slot: int, filename: str | None = None) -> Task:
        """`POST /slots/{id_slot}?action=save|restore|erase`. Validation errors come back at once as a
        finished task with the server's status code and text."""
        self.driver.check_alive()
        with self.driver.lock:
            task = self.core.slot_action_task(action, id_slot, filename)
            if not task.done:
                self.core.post(task)
        self.driver.wake()
        return task

    def cancel(self, task: Task) -> None:
        """Stop a request whose client went away: dropped if still queued or deferred; otherwise its
        slot is released at the next step, as the server's CANCEL task does (the slot keeps its KV)."""
        with self.driver.lock:
            self.core.cancel(task)
        self.driver.wake()

    def clear_cache(self) -> int:
        """Empty the RAM prompt cache (a lab control; the server has no such endpoint)."""
        with self.driver.lock:
            return self.core.clear_cache()

    # ------------------------------------------------------------------ driving

    def step(self) -> bool:
        return self.driver.step()

    def run_until_idle(self, max_steps: int = 10_000_000) -> None:
        self.driver.run_until_idle(max_steps)

    def run_until(self, pred: Callable[[], bool], max_steps: int = 10_000_000) -> None:
        self.driver.run_until(pred, max_steps)

    def start(self) -> None:
        self.driver.start()

    def stop(self, timeout: float = 30) -> None:
        self.driver.stop(timeout)

    def pause(self) -> None:
        self.driver.pause()

    def resume(self) -> None:
        self.driver.resume()

    def close(self) -> None:
        """Stop the thread and free what this engine created (a model passed in stays open)."""
        self.stop()
        for s in self.core.slots:
            s.reset()
        self.memory.close()
        if self._owns_backend and self.backend is not None:
            self.backend.ctx.close()
            if self.backend.dctx is not None:
                self.backend.dctx.close()
            if self._owns_model:
                self.backend.model.close()
                if self.backend.dmodel is not None and self.backend.dmodel is not self.backend.model:
                    self.backend.dmodel.close()
