"""The server's main loop on a live context: task queue, slot selection, the RAM prompt cache,
prompt processing with continuous batching, decode retries, sampling and release.

Function names follow `tools/server/server-context.cpp` (`get_available_slot`, `launch_slot_with_task`,
`update_slots`, `pre_decode`, `post_decode`, `release`, `try_clear_idle_slots`, `prompt_save`,
`prompt_load`, `prompt_clear`) so the C++ can be read beside this file; spec section numbers are given
where a rule is subtle. One engine, two drivers: `step()` / `run_until_idle()` (deterministic, for
notebooks and tests) and `start()` (a background thread, for live use)."""

from __future__ import annotations

import collections
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from slotlab.engine.backend import Backend, load
from slotlab.engine.checkpoints import CheckpointPolicy
from slotlab.engine.events import EventBus
from slotlab.engine.messages import find_message_spans, parse_delimiters
from slotlab.engine.metrics import Metrics
from slotlab.engine.params import ServerParams
from slotlab.engine.prompt_cache import PromptCache, f32_ratio
from slotlab.engine.slot import Slot, SlotState, now_us
from slotlab.engine.speculative import Speculative
from slotlab.engine import slot_file
from slotlab.engine.cache_reuse import cache_reuse
from slotlab.engine.slot_file import TokensStateError, validate_filename
from slotlab.engine.task import Task, TaskError, TaskParams, TaskState, TaskType
from slotlab.engine.tokens import as_tokens, common_prefix
from slotlab.errors import ConfigError, SlotlabError
from slotlab.llama import Batch, Sampler

MIB = 1024.0 * 1024.0


def _scores_json(result) -> dict:
    """A LoadResult as plain data: the slot's baseline and each entry's scores, in scan order."""
    return {"lcp_base": int(result.lcp_base), "f_keep_base": float(result.f_keep_base),
            "f_sim_base": float(result.f_sim_base), "winner_id": None if result.entry is None else result.entry.id,
            "scores": [{"entry_id": sc.entry.id, "n_tokens": sc.n_tokens, "lcp": int(sc.lcp), "f_keep": float(sc.f_keep),
                        "f_sim": float(sc.f_sim), "below_floor": sc.below_floor, "improved": sc.improved,
                        "winner": sc.winner} for sc in result.scores]}


class EngineDied(SlotlabError):
    """The engine thread stopped on an error; every later call re-raises it."""


class Engine:
    def __init__(
        self,
        params: ServerParams | list[str] | str | None = None,
        *,
        backend: Backend | None = None,
        model=None,
        allocate: Callable[[int], Any] | None = None,
        **overrides,
    ):
        if params is None or isinstance(params, ServerParams):
            params = (params or ServerParams())
            if overrides:
                params = params.replace(**overrides)
        else:
            params = ServerParams.from_args(params, **overrides)
        self.params = params
        self._owns_ctx, self._owns_model = backend is None, backend is None and model is None
        self.backend = backend or load(params, model=model)
        self.model, self.ctx = self.backend.model, self.backend.ctx
        self.dctx = self.backend.dctx  # the draft context (-md), or None
        self.events = EventBus()
        self.metrics = Metrics()
        self.n_ctx_slot = self.backend.n_ctx_slot
        self.n_swa = self.ctx.n_swa
        self.slots = [Slot(i, self.n_ctx_slot) for i in range(self.ctx.n_seq_max)]
        self.cache: PromptCache | None = None
        if params.cache_ram != 0:
            kw = {"allocate": allocate} if allocate is not None else {}
            self.cache = PromptCache.from_cache_ram(params.cache_ram, self.ctx.n_ctx, on_event=self._on_cache_event, **kw)
        self.cache_idle_slots = params.cache_idle_slots_effective
        self.checkpoints = CheckpointPolicy(self)
        self.spec = Speculative(self) if self.dctx is not None else None
        self.queue: collections.deque[Task] = collections.deque()
        self.deferred: list[Task] = []
        self.tasks: dict[int, Task] = {}
        self._cancels: list[Task] = []
        self._next_task_id = 0
        self._t_last = -1
        cap = self.ctx.n_batch + len(self.slots)
        self.batch = Batch(cap)
        self._is_prompt = np.zeros(cap, dtype=bool)
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._paused = threading.Event()
        self.died: BaseException | None = None
        self._init_log()

    # ------------------------------------------------------------------ logging / events

    def _emit(self, kind: str, message: str = "", *, level: str = "TRC", slot: Slot | int | None = None,
              task: int | None = None, **data):
        sid = slot.id if isinstance(slot, Slot) else (-1 if slot is None else slot)
        if task is None:
            s = self.slots[sid] if sid >= 0 else None
            task = s.task.id if s is not None and s.task is not None else -1
        return self.events.emit(kind, message, level=level, slot=sid, task=task, **data)

    def _on_cache_event(self, kind: str, **fields):
        entry = fields.pop("entry", None)
        result = fields.pop("result", None)
        if kind == "cache_alloc" and entry is not None:
            fields.update(self._entry_json(entry))
        if result is not None:
            fields.update(_scores_json(result), preview=False)
        level = fields.pop("level", "TRC")
        message = fields.pop("message", "")
        self.events.emit(kind, message, level=level, slot=self._cache_slot, task=self._cache_task, **fields)

    _cache_slot = -1
    _cache_task = -1

    def _init_log(self) -> None:
        p = self.params
        if self.cache is not None:
            lim = "no limit" if p.cache_ram < 0 else f"{p.cache_ram} MiB"
            self._emit("cache_init", f"prompt cache is enabled, size limit: {lim}", limit_size=self.cache.limit_size,
                       limit_tokens=self.cache.limit_tokens)
        else:
            self._emit("cache_init", "prompt cache is disabled - use `--cache-ram N` to enable it")
        if p.cache_idle_slots and p.cache_ram == 0:
            self._emit("params", "--cache-idle-slots requires --cache-ram, disabling", level="WRN")
        if p.cache_reuse > 0 and not self.ctx.can_shift:
            self._emit("params", "cache_reuse is not supported by this context, it will be disabled", level="WRN")
        self.default_cache_reuse = p.cache_reuse if self.ctx.can_shift else 0
        self._emit("init", f"initializing, n_slots = {len(self.slots)}, n_ctx_slot = {self.n_ctx_slot}, "
                   f"kv_unified = '{'true' if self.ctx.kv_unified else 'false'}'", level="INF",
                   n_slots=len(self.slots), n_ctx_slot=self.n_ctx_slot, kv_unified=self.ctx.kv_unified,
                   n_swa=self.n_swa, cache_ram=p.cache_ram, flags=p.to_args(), draft=self.dctx is not None)

    # ------------------------------------------------------------------ submitting

    def _new_task(self, type_: TaskType, **kw) -> Task:
        t = Task(self._next_task_id, type_, **kw)
        self._next_task_id += 1
        self.tasks[t.id] = t
        return t

    def tokenize(self, prompt: str | list | np.ndarray) -> np.ndarray:
        """A text prompt as the server tokenizes it (BOS, special tokens parsed), or token ids as given."""
        if isinstance(prompt, str):
            return self.model.tokenize(prompt)
        toks = as_tokens(prompt)
        self.model.check_tokens(toks)
        return toks.copy()

    def submit(self, prompt: str | list | np.ndarray, *, n_predict: int | None = None, id_slot: int = -1,
               cache_prompt: bool | None = None, n_cache_reuse: int | None = None, temperature: float = 0.0,
               seed: int = 0xFFFFFFFF, ignore_eos: bool = False, message_delimiters: list | None = None,
               stop: list | None = None, on_token=None) -> Task:
        """Queue a completion (the `/completion` request fields). Returns the task; its `result` is set
        when done. In live mode `task.wait()` blocks for it."""
        self._check_alive()
        if n_predict is not None and n_predict < -1:
            raise ConfigError(f"n_predict must be >= -1, got {n_predict}")
        if n_cache_reuse is not None and n_cache_reuse < 0:
            raise ConfigError(f"n_cache_reuse must be >= 0, got {n_cache_reuse}")
        tokens = self.tokenize(prompt)
        params = TaskParams(
            n_predict=-1 if n_predict is None else int(n_predict),
            temperature=float(temperature), seed=int(seed), ignore_eos=bool(ignore_eos),
            cache_prompt=self.params.cache_prompt if cache_prompt is None else bool(cache_prompt),
            n_cache_reuse=self.default_cache_reuse if n_cache_reuse is None else int(n_cache_reuse),
            id_slot=int(id_slot), stop=list(stop or []))
        params.message_spans = find_message_spans(tokens, [
            (role, self.model.tokenize(d, add_special=False, parse_special=True))
            for role, d in parse_delimiters(message_delimiters or [])])
        with self._lock:
            task = self._new_task(TaskType.COMPLETION, tokens=tokens, params=params, on_token=on_token)
            self.queue.append(task)
            self._emit("task_queued", "", task=task.id, n_tokens=task.n_tokens, id_slot=id_slot)
        self._wake.set()
        return task

    def slot_action(self, action: str, id_slot: int, filename: str | None = None) -> Task:
        """`POST /slots/{id_slot}?action=save|restore|erase`. Validation errors come back at once as a
        finished task with the server's status code and text."""
        self._check_alive()
        types = {"save": TaskType.SLOT_SAVE, "restore": TaskType.SLOT_RESTORE, "erase": TaskType.SLOT_ERASE}
        with self._lock:
            if self.params.slot_save_path is None:
                t = self._new_task(TaskType.SLOT_ERASE, action_slot=id_slot)
                t.finish(error=TaskError(501, "This server does not support slots action. Start it with `--slot-save-path`",
                                         "not_supported_error"))
                return t
            if action not in types:
                t = self._new_task(TaskType.SLOT_ERASE, action_slot=id_slot)
                t.finish(error=TaskError(400, "Invalid action", "invalid_request_error"))
                return t
            task = self._new_task(types[action], action_slot=int(id_slot), filename=filename)
            if action != "erase" and (filename is None or not validate_filename(filename)):
                task.finish(error=TaskError(400, "Invalid filename", "invalid_request_error"))
                return task
            self.queue.append(task)
        self._wake.set()
        return task

    def serve(self, host: str = "127.0.0.1", port: int = 8080):
        """Serve this engine over llama-server's HTTP API from a background thread (notebooks); returns
        the uvicorn server (`.should_exit = True` stops it). The panel keeps showing everything."""
        from slotlab.serve import serve_in_thread

        return serve_in_thread(self, host, port)

    def cancel(self, task: Task) -> None:
        """Stop a request whose client went away: dropped if still queued or deferred; otherwise its
        slot is released at the next step, as the server's CANCEL task does (the slot keeps its KV)."""
        with self._lock:
            if task.done:
                return
            task.cancelled = True
            err = TaskError(499, "request cancelled by the client", "cancelled")
            if task in self.queue:
                self.queue.remove(task)
                task.finish(error=err)
            elif task in self.deferred:
                self.deferred.remove(task)
                task.finish(error=err)
            else:
                self._cancels.append(task)
        self._wake.set()

    def _process_cancels(self) -> None:
        while self._cancels:
            task = self._cancels.pop(0)
            for s in self.slots:
                if s.task is task:
                    self._emit("task_cancelled", f"cancel task, id_task = {task.id}", level="WRN", slot=s, task=task.id)
                    task.finish(error=TaskError(499, "request cancelled by the client", "cancelled"))
                    self.release(s)
                    break

    # ------------------------------------------------------------------ drivers

    def step(self) -> bool:
        """One iteration of the server loop: process every queued task, then `update_slots()` once.
        Returns True while there is work left (a queued task or a busy slot)."""
        self._check_alive()
        with self._lock:
            self._process_cancels()
            self.process_new_tasks()
            self.update_slots()
            self._snapshots()
            return bool(self.queue) or any(s.is_processing for s in self.slots)

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

    def start(self) -> None:
        """Live mode: the server loop in a background thread (pause()/resume() to single-step)."""
        if self._thread and self._thread.is_alive():
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
        the flag under the engine lock, so nothing submitted after this runs until `resume()`)."""
        self._paused.set()
        with self._lock:
            pass

    def resume(self) -> None:
        self._paused.clear()
        self._wake.set()

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                with self._lock:
                    paused = self._paused.is_set()
                    busy = False if paused else self.step()
                if paused:
                    time.sleep(0.02)
                    continue
                if not busy:
                    self._wake.wait(0.1)
                    self._wake.clear()
        except BaseException as e:  # noqa: BLE001 - the error is kept and re-raised to callers
            self.died = e
            for t in list(self.queue) + self.deferred + [s.task for s in self.slots if s.task]:
                if not t.done:
                    t.finish(error=TaskError(500, f"engine stopped: {e!r}", "server_error"))

    def _check_alive(self) -> None:
        if self.died is not None:
            raise EngineDied(f"the engine thread died: {self.died!r}") from self.died

    def close(self) -> None:
        """Stop the thread and free what this engine created (a model passed in stays open)."""
        self.stop()
        for s in self.slots:
            s.reset()
        if self._owns_ctx:
            self.ctx.close()
        if self._owns_model:
            self.model.close()

    # ------------------------------------------------------------------ queue (server-queue.cpp)

    def defer(self, task: Task, why: str) -> None:
        task.state = TaskState.DEFERRED
        self.deferred.append(task)
        self._emit("task_deferred", f"{why}, defer task, id_task = {task.id}", level="DBG", task=task.id)

    def pop_deferred_task(self, id_slot: int) -> None:
        """On a release: move ONE deferred task to the front of the queue, preferring one that asked
        for this slot, else the oldest (SQ:90-115)."""
        if not self.deferred:
            return
        pick = next((t for t in self.deferred if t.type is TaskType.COMPLETION and t.params.id_slot == id_slot),
                    self.deferred[0])
        self.deferred.remove(pick)
        pick.state = TaskState.QUEUED
        self.queue.appendleft(pick)
        self._emit("task_undeferred", "", task=pick.id, id_slot=id_slot)

    def process_new_tasks(self) -> None:
        while self.queue:
            self.process_single_task(self.queue.popleft())

    def get_slot_by_id(self, id_slot: int) -> Slot:
        return self.slots[(id_slot % 2**64) % len(self.slots)]

    def process_single_task(self, task: Task) -> None:
        if task.type is TaskType.COMPLETION:
            slot = self.get_available_slot(task)
            if slot is None:
                self.defer(task, "no slot is available")
                return
            if slot.is_processing:
                self.defer(task, "requested slot is unavailable")
                return
            if not self.launch_slot_with_task(slot, task):
                return
            if self.cache_idle_slots:
                for s in self.slots:
                    if s.is_processing:
                        continue
                    self._emit("idle_slot_save", "saving idle slot to prompt cache", slot=s)
                    if self.prompt_save(s):
                        self._emit("idle_slot_saved", "__TEST_TAG_CACHE_IDLE_SLOT__", level="DBG", slot=s)
                        self._cache_update(s)
                    if self.ctx.kv_unified:
                        self.prompt_clear(s, reason="idle_clear")
            return
        slot = self.get_slot_by_id(task.action_slot)
        if slot.is_processing:
            self.defer(task, "requested slot is unavailable")
            return
        {TaskType.SLOT_SAVE: self._slot_save, TaskType.SLOT_RESTORE: self._slot_restore,
         TaskType.SLOT_ERASE: self._slot_erase}[task.type](slot, task)

    # ------------------------------------------------------------------ slot selection (spec 1)

    def get_available_slot(self, task: Task) -> Slot | None:
        ret: Slot | None = None
        update_cache = False
        how = None
        n_task = task.n_tokens
        id_slot = task.params.id_slot
        f_sim_best = np.float32(0.0)
        f_keep = None
        if id_slot != -1:
            ret = self.get_slot_by_id(id_slot)
            how = "id"
            self._emit("slot_selected_by_id", f"selected slot by id ({id_slot})", level="INF", slot=ret, task=task.id)
        sps = np.float32(self.params.slot_prompt_similarity)
        if sps != 0:
            for s in self.slots:
                if id_slot != -1 and s.id != id_slot:
                    continue
                if s.is_processing:
                    self._emit("slot_skip", f" - skipping, is_processing = 1", slot=s, task=task.id)
                    continue
                if len(s.tokens) == 0:
                    self._emit("slot_skip", " - skipping, slot is empty", slot=s, task=task.id)
                    continue
                lcp = s.tokens.get_common_prefix(task.tokens)
                f_sim = f32_ratio(lcp, n_task)
                self._emit("slot_sim", f" - checking sim = {f_sim:.3f} ({lcp}/{n_task}) > {sps:.3f}", slot=s,
                           task=task.id, lcp=lcp, f_sim=float(f_sim))
                if f_sim > f_sim_best and f_sim > sps:
                    f_sim_best = f_sim
                    ret, how = s, "lcp"
            if ret is not None:
                with np.errstate(divide="ignore", invalid="ignore"):
                    f_keep = np.float32(f_sim_best * np.float32(n_task)) / np.float32(len(ret.tokens))
                if id_slot == -1:
                    self._emit("slot_selected_by_lcp",
                               f"selected slot by LCP similarity, f_sim_best = {f_sim_best:.3f} (> {sps:.3f} thold), "
                               f"f_keep = {f_keep:.3f}", level="INF", slot=ret, task=task.id,
                               f_sim=float(f_sim_best), f_keep=float(f_keep))
                if f_keep < np.float32(0.5):
                    update_cache = True
        if ret is None:
            t_last = -1
            for s in self.slots:
                if s.is_processing:
                    continue
                if ret is None or s.t_last_used <= t_last:
                    t_last = s.t_last_used
                    ret = s
            if ret is not None:
                how = "lru"
                self._emit("slot_selected_by_lru", f"selected slot by LRU, t_last = {t_last}", level="INF", slot=ret,
                           task=task.id, t_last=t_last)
                update_cache = True
        decision = {"how": how, "f_sim": float(f_sim_best), "f_keep": None if f_keep is None else float(f_keep),
                    "update_cache": bool(update_cache and self.cache is not None), "load": None}
        if ret is not None:
            update_cache = update_cache and self.cache is not None and task.type is TaskType.COMPLETION
            if update_cache:
                self._emit("cache_update_begin", "updating prompt cache", task=task.id)
                t0 = time.perf_counter()
                self.prompt_save(ret, task=task)
                loaded = self.prompt_load(ret, task)
                decision["load"] = loaded
                decision.update(getattr(ret, "_load_scores", {}))
                if loaded is False:
                    self.prompt_clear(ret, reason="load_failed")
                self._cache_update(ret, task=task)
                self._emit("cache_update_end", f"prompt cache update took {(time.perf_counter() - t0) * 1e3:.2f} ms",
                           task=task.id)
        if ret is not None and self.cache is not None and decision["load"] is None and task.type is TaskType.COMPLETION:
            preview = self.cache.load(ret.tokens.view(), task.tokens, emit=False)
            self._emit("cache_load_scores", "", slot=ret, task=task.id, preview=True, **_scores_json(preview))
        self._emit("slot_decision", "", slot=ret.id if ret else -1, task=task.id, **decision)
        task._decision = decision
        return ret

    def _entry_json(self, e) -> dict:
        return {"size_main": len(e.main), "size_dft": len(e.drft), "size_ckpt": sum(c.size() for c in e.checkpoints),
                "n_checkpoints": len(e.checkpoints), "head": self.model.detokenize(e.tokens[1:13]),
                "checkpoints": [(c.pos_min, c.pos_max, c.n_tokens, c.size()) for c in e.checkpoints]}

    # ------------------------------------------------------------------ RAM cache glue (spec 2)

    def _cache_ctx(self, slot: Slot, task: Task | None):
        self._cache_slot = slot.id
        self._cache_task = task.id if task is not None else (slot.task.id if slot.task else -1)

    def prompt_save(self, slot: Slot, task: Task | None = None) -> bool:
        if self.cache is None or len(slot.tokens) == 0:
            return False
        self._cache_ctx(slot, task)
        size_tgt = self.ctx.state_seq_size(slot.id)
        size_dft = self.dctx.state_seq_size(slot.id) if self.dctx is not None else 0
        entry = self.cache.alloc(slot.tokens.view(), slot.checkpoints, size_tgt, size_dft, id_slot=slot.id,
                                 id_task=slot.task_prev.id if slot.task_prev else -1)
        if entry is None:
            return False
        self.ctx.state_seq_get(slot.id, out=entry.main)
        if self.dctx is not None:
            self.dctx.state_seq_get(slot.id, out=entry.drft)
        return True

    def prompt_load(self, slot: Slot, task: Task):
        """True: a cache entry was restored into the slot; None: nothing better; False: restore failed."""
        slot._load_scores = {}
        self._cache_ctx(slot, task)
        res = self.cache.load(slot.tokens.view(), task.tokens)
        if res.entry is None:
            return None
        entry = res.entry
        set_dft = (lambda buf: self.dctx.state_seq_set(buf, slot.id)) if self.dctx is not None else None
        ok = self.cache.restore(entry, lambda buf: self.ctx.state_seq_set(buf, slot.id), set_dft)
        if not ok:
            self._emit("cache_load_failed", "failed to load prompt from cache", level="WRN", slot=slot, task=task.id)
            return False
        slot.tokens.assign(entry.tokens)
        slot.checkpoints = list(entry.checkpoints)
        slot.origin = f"cache #{entry.id}"
        slot._load_scores = {"f_keep_best": float(res.f_keep_best), "f_sim_best": float(res.f_sim_best),
                             "f_keep_base": float(res.f_keep_base)}
        self._emit("cache_loaded", "", slot=slot, task=task.id, entry_id=entry.id, n_tokens=len(slot.tokens),
                   f_keep=float(res.f_keep_best), f_sim=float(res.f_sim_best))
        return True

    def _cache_update(self, slot: Slot, task: Task | None = None) -> None:
        self._cache_ctx(slot, task)
        self.cache.update()

    def prompt_clear(self, slot: Slot, reason: str = "clear") -> None:
        self._emit("slot_clear", f"clearing prompt with {len(slot.tokens)} tokens", slot=slot, reason=reason,
                   n_tokens=len(slot.tokens))
        self.seq_rm(slot, -1, -1)
        slot.tokens.clear()
        slot.checkpoints = []
        slot.origin = "slot"

    def seq_rm(self, slot: Slot, p0: int, p1: int) -> None:
        """`common_memory::seq_rm` on the target and the draft context: a refusal aborts the server;
        here it is an error, never silent."""
        for ctx in (self.ctx, self.dctx):
            if ctx is not None and not ctx.seq_rm(slot.id, p0, p1):
                raise SlotlabError(f"failed to remove sequence {slot.id} with p0={p0}, p1={p1}")

    def seq_add(self, slot: Slot, p0: int, p1: int, delta: int) -> None:
        """`common_memory::seq_add` on both contexts (the cache-reuse KV move)."""
        self.ctx.seq_add(slot.id, p0, p1, delta)
        if self.dctx is not None:
            self.dctx.seq_add(slot.id, p0, p1, delta)

    def try_clear_idle_slots(self) -> bool:
        if not self.ctx.kv_unified:
            return False
        for s in self.slots:
            if s.is_processing:
                continue
            if len(s.tokens) > 0:
                self._emit("slot_purge", f"purging slot {s.id} with {len(s.tokens)} tokens", level="WRN", slot=-1,
                           task=-1, id_slot=s.id, n_tokens=len(s.tokens))
                self.prompt_clear(s, reason="purge")
                return True
        return False

    # ------------------------------------------------------------------ launch / release

    def launch_slot_with_task(self, slot: Slot, task: Task) -> bool:
        p = task.params
        slot.sampler = Sampler(self.model, temperature=p.temperature, seed=p.seed, ignore_eos=p.ignore_eos)
        slot.n_predict_max = p.n_predict if p.n_predict != -1 else self.params.n_predict
        slot.task = task
        slot.state = SlotState.STARTED
        task.state = TaskState.RUNNING
        task.id_slot = slot.id
        self._emit("task_launched", "processing task, is_child = 0", level="INF", slot=slot, task=task.id,
                   n_tokens=task.n_tokens)
        return True

    def _next_time(self) -> int:
        """`ggml_time_us()` at release; strictly increasing so LRU order equals release order."""
        self._t_last = max(now_us(), self._t_last + 1)
        return self._t_last

    def release(self, slot: Slot) -> None:
        if not slot.is_processing:
            return
        self._emit("slot_release", f"stop processing: n_tokens = {len(slot.tokens)}, truncated = {int(slot.truncated)}",
                   level="INF", slot=slot, n_tokens=len(slot.tokens))
        slot.t_last_used = self._next_time()
        slot.state = SlotState.IDLE
        slot.origin = "slot"
        slot.reset()
        self.pop_deferred_task(slot.id)

    def send_error(self, slot: Slot, message: str, type_: str = "server_error", code: int = 500, **extra) -> None:
        task = slot.task
        self._emit("task_error", message, level="ERR", slot=slot, code=code, type=type_)
        task.finish(error=TaskError(code, message, type_))

    def send_final_response(self, slot: Slot) -> None:
        task = slot.task
        content = self.model.detokenize(slot.generated)
        for w in task.params.stop or ():
            if w and w in content:
                content = content[: content.index(w)]
        result = {
            "content": content,
            "tokens": list(map(int, slot.generated)),
            "id_slot": slot.id,
            "stop": True,
            "tokens_predicted": slot.stats.n_gen,
            "tokens_evaluated": task.n_tokens,
            "tokens_cached": len(slot.tokens),
            "truncated": slot.truncated,
            "stop_type": slot.stop,
            "timings": slot.stats.timings(),
        }
        self._emit("task_done", "", slot=slot, task=task.id, cache_n=slot.stats.n_prompt_cached,
                   prompt_n=slot.stats.n_prompt_processed, predicted_n=slot.stats.n_gen, tokens_cached=len(slot.tokens),
                   why=slot.why, prov=[k for _, _, k in slot.prov])
        self.metrics.on_final(slot)
        task.finish(result=result)

    # ------------------------------------------------------------------ update_slots (spec 3)

    def update_slots(self) -> None:
        if not any(s.is_processing for s in self.slots):
            return
        b = self.batch
        b.clear()
        self._is_prompt[:] = False
        self.pre_decode()
        n_batch = self.ctx.n_batch
        off = 0
        while off < b.n_tokens:
            n = min(n_batch, b.n_tokens - off)
            ok, n_batch = self.decode(n_batch, off, n)
            if ok is None:
                return  # fatal: every processing slot got the error
            if not ok:
                continue
            self.post_decode(n, off)
            off += n
            n_batch = self.ctx.n_batch

    def pre_decode(self) -> None:
        b = self.batch
        for s in self.slots:  # generating slots first: their sampled token (+ drafts) at pos_next
            if s.state is not SlotState.GENERATING:
                continue
            s.spec_draft = self.spec.draft(s) if self.spec is not None else []
            pos = s.tokens.pos_next()
            s.i_batch = b.add(s.sampled, pos, s.id, logits=True)
            for j, t in enumerate(s.spec_draft):
                b.add(t, pos + 1 + j, s.id, logits=True)
            s.tokens.push_back(s.sampled)
            s.tokens.extend(s.spec_draft)
        if self.params.cont_batching or b.n_tokens == 0:
            for s in self.slots:
                if b.n_tokens >= self.ctx.n_batch:
                    return
                if s.state in (SlotState.STARTED, SlotState.PROCESSING_PROMPT):
                    self._process_prompt(s)

    def _process_prompt(self, slot: Slot) -> None:
        b, ctx, task = self.batch, self.ctx, slot.task
        n_batch, n_ubatch = ctx.n_batch, ctx.n_ubatch
        inp = task.tokens
        n_tokens_prev = b.n_tokens
        if slot.state is SlotState.STARTED:
            slot.stats.t_start = now_us()
            slot.state = SlotState.PROCESSING_PROMPT
            self._emit("prompt_start", f"new prompt, n_ctx_slot = {slot.n_ctx}, n_keep = 0, task.n_tokens = {task.n_tokens}",
                       slot=slot)
            if task.n_tokens == 0:
                self._emit("prompt_empty", "empty prompt - releasing slot", level="WRN", slot=slot)
                self.send_final_response(slot)
                self.release(slot)
                return
            if task.n_tokens >= slot.n_ctx:
                self.send_error(slot, f"request ({task.n_tokens} tokens) exceeds the available context size "
                                      f"({slot.n_ctx} tokens), try increasing it", "exceed_context_size_error", 400)
                self.release(slot)
                return
            n_past = 0
            slot.shifts = []
            lcp = slot.tokens.get_common_prefix(inp)
            if task.params.cache_prompt:
                n_past = lcp
                n_past = cache_reuse(self, slot, n_past)
            pos_next = slot.tokens.pos_next(n_past)
            has_new = n_past < task.n_tokens
            pos_min_thold = max(0, pos_next - self.n_swa - (0 if has_new else 1))
            ckpt_mode = None
            if 0 < n_past <= len(slot.tokens):
                pos_min = ctx.seq_pos_min(slot.id)
                if pos_min == -1:
                    raise SlotlabError(f"pos_min == -1, but n_past = {n_past} > 0 (slot {slot.id}): tokens and KV disagree")
                if pos_min >= pos_min_thold:
                    n_past, pos_next = self.checkpoints.restore(slot, n_past, pos_next, pos_min_thold)
                    ckpt_mode = "restored" if n_past > 0 else "forced"
            self.checkpoints.erase_invalidated(slot, pos_next)
            if n_past == task.n_tokens and n_past > 0:
                self._emit("prompt_full_match", f"need to evaluate at least 1 token for each active slot (n_past = {n_past}, "
                           f"task.n_tokens() = {task.n_tokens})", level="WRN", slot=slot)
                n_past -= 1
                self._emit("prompt_full_match", f"n_past was set to {n_past}", level="WRN", slot=slot)
            slot.stats.n_prompt_cached = n_past
            slot.stats.n_prompt_processed = 0
            self.metrics.prompt_tokens_cached_total += n_past
            slot.tokens.keep_first(n_past)
            self._provenance(slot, lcp, n_past, ckpt_mode)
            self._emit("prompt_n_past", "", slot=slot, n_past=n_past, n_tokens=task.n_tokens)
        p0 = slot.tokens.pos_next()
        self._emit("prompt_seq_rm", f"cached n_tokens = {len(slot.tokens)}, memory_seq_rm [{p0}, end)", slot=slot)
        self.seq_rm(slot, p0, -1)
        do_checkpoint = self.checkpoints.gate(task)
        n_have = len(slot.tokens)
        # how many prompt tokens go into this batch: up to the batch end, cut at the tail offsets
        room = n_batch - b.n_tokens
        n_add = min(task.n_tokens - n_have, room)
        spans = task.params.message_spans
        if do_checkpoint and n_add > 0:
            n_add = self.checkpoints.cut(slot, spans, task.n_tokens, n_have, n_add)
        if n_add > 0:
            i0 = b.n_tokens
            b.add_seq(inp[n_have:n_have + n_add], p0, slot.id)
            self._is_prompt[i0:i0 + n_add] = True
            slot.tokens.extend(inp[n_have:n_have + n_add])
        n_tokens_cur = b.n_tokens - n_tokens_prev
        n_tokens_start = len(slot.tokens) - n_tokens_cur
        near_prompt_end = task.n_tokens < len(slot.tokens) + n_ubatch
        is_user_start = spans.is_user_start(n_tokens_start)
        is_last_user_message = n_tokens_start == spans.last_user_message_pos()
        if len(slot.tokens) == task.n_tokens:
            slot.state = SlotState.DONE_PROMPT
            b.logits[b.n_tokens - 1] = 1
            slot.stats.n_gen = 0
            slot.i_batch = b.n_tokens - 1
        elif not is_user_start and not near_prompt_end:
            do_checkpoint = False
        self._emit("prompt_batch", "", slot=slot, n_added=n_tokens_cur, n_tokens=len(slot.tokens),
                   n_prompt=task.n_tokens)
        if do_checkpoint:
            self.checkpoints.maybe_create(slot, n_tokens_cur, n_tokens_start, near_prompt_end or is_last_user_message)

    def _provenance(self, slot: Slot, lcp: int, n_past: int, ckpt_mode: str | None) -> None:
        """Where the request's first n_past tokens come from, and the plain-words "why" line."""
        task, origin = slot.task, slot.origin
        kind = "cache" if origin.startswith("cache") else "file" if origin.startswith("file") else "kept"
        prov: list[tuple[int, int, str]] = []
        if ckpt_mode == "restored":
            prov.append((0, n_past, "checkpoint"))
        elif ckpt_mode is None:
            if min(lcp, n_past) > 0:
                prov.append((0, min(lcp, n_past), kind))
            prov += [(c, min(d, n_past), "shifted") for a, b, c, d in slot.shifts if c < n_past]
        prov.append((n_past, task.n_tokens, "prefill"))
        slot.prov, slot.n_prompt = prov, task.n_tokens
        slot.divergence = lcp if lcp < task.n_tokens else -1
        slot.div_text = self.model.token_to_piece(int(task.tokens[lcp])).decode("utf-8", "replace") if lcp < task.n_tokens else ""
        d = getattr(task, "_decision", {}) or {}
        how = {"id": f"by id_slot {task.params.id_slot}", "lru": "by LRU",
               "lcp": f"by LCP similarity (f_sim {d.get('f_sim', 0):.2f} > {self.params.slot_prompt_similarity:.2f})"}
        parts = [f"slot {slot.id} chosen {how.get(d.get('how'), '?')}"]
        if d.get("load") is True:
            parts.append(f"RAM entry {origin.removeprefix('cache ')} restored (f_keep {d.get('f_keep_best', 0):.2f}, "
                         f"f_sim {d.get('f_sim_best', 0):.2f} beat baseline {d.get('f_keep_base', 0):.2f})")
        elif d.get("load") is False:
            parts.append("RAM entry restore failed: slot cleared")
        elif d.get("update_cache"):
            parts.append("RAM cache searched: nothing better than the slot")
        elif d.get("how") == "lcp":
            parts.append(f"slot kept (f_keep {d.get('f_keep', 0):.2f} >= 0.50)")
        if slot.shifts:
            parts.append(f"cache reuse shifted {len(slot.shifts)} chunk(s), {sum(b - a for a, b, _, _ in slot.shifts)} tokens")
        if ckpt_mode == "restored":
            parts.append(f"checkpoint restored (n_past {n_past})")
        elif ckpt_mode == "forced":
            parts.append("no usable checkpoint: full re-processing forced")
        parts.append(f"{n_past} tokens reused, {task.n_tokens - n_past} prefilled")
        slot.why = "; ".join(parts)
        self._emit("request_why", slot.why, slot=slot, n_past=n_past, n_prompt=task.n_tokens, origin=origin,
                   how=d.get("how"), ckpt=ckpt_mode)

    def _snapshots(self) -> None:
        """One `slot_snapshot` event per slot whose picture changed since the last one: what a view
        needs to redraw the slot without reading engine state (and what scrubbing replays)."""
        for s in self.slots:
            sig = (s.state, len(s.tokens), len(s.checkpoints), s.task.id if s.task else -1, s.stats.n_gen, s.origin)
            if sig == s.last_sig:
                continue
            s.last_sig = sig
            t = s.task or s.task_prev
            prov = [p for p in s.prov if p[0] < len(s.tokens)] if t is not None else []
            prov = [(a, min(b, len(s.tokens)), k) for a, b, k in prov]
            if t is not None and len(s.tokens) > s.n_prompt:
                prov.append((s.n_prompt, len(s.tokens), "generated"))
            if t is None or s.n_prompt == 0:
                prov = [(0, len(s.tokens), "kept")] if len(s.tokens) else []
            self._emit("slot_snapshot", "", slot=s, task=t.id if t else -1, state=s.state.value, n_tokens=len(s.tokens),
                       n_prompt=s.n_prompt, n_past=s.stats.n_prompt_cached, prompt_n=s.stats.n_prompt_processed,
                       n_gen=s.stats.n_gen, prov=prov, divergence=s.divergence, div_text=s.div_text, origin=s.origin,
                       shifts=list(s.shifts), why=s.why,
                       checkpoints=[(c.pos_min, c.pos_max, c.n_tokens, c.size(), c.id_task) for c in s.checkpoints])

    def decode(self, n_batch: int, off: int, n: int):
        """Returns (ok, n_batch): ok True = decoded, False = retry at the same offset with n_batch,
        None = fatal (every processing slot got the error, was released and cleared)."""
        b = self.batch
        t0 = time.perf_counter()
        ret = self.ctx.decode(b, off, n)
        if ret != 0:
            err = None
            if n_batch == 1 and ret == 1:
                err = "Context size has been exceeded."
            if ret == -1:
                err = "Invalid input batch."
            if ret < -1:
                err = "Compute error."
            if err:
                self._emit("decode_failed", f"{err} off = {off}, n_batch = {n_batch}, ret = {ret}", level="ERR",
                           ret=ret, off=off, n_batch=n_batch)
                for s in self.slots:
                    if s.is_processing:
                        self.send_error(s, err)
                        self.release(s)
                        self.prompt_clear(s, reason="decode_failed")
                return None, n_batch
            if not self.try_clear_idle_slots():
                n_batch //= 2
            self._emit("decode_retry", "failed to find free space in the KV cache, retrying with smaller batch size, "
                       f"off = {off}, n_batch = {n_batch}, ret = {ret}", level="WRN", ret=ret, off=off, n_batch=n_batch)
            return False, n_batch
        if self.spec is not None and not self.spec.process(off, n):
            self._emit("decode_failed", "failed to process speculative batch", level="ERR")
            for s in self.slots:
                if s.is_processing:
                    self.send_error(s, "decode() failed: failed to process speculative batch")
                    self.release(s)
            return None, n_batch
        dt = time.perf_counter() - t0
        # metrics_post_decode: prompt tokens of this chunk are counted per slot
        self.metrics.n_decode_total += 1
        self.metrics.n_busy_slots_total += sum(1 for s in self.slots if s.is_processing)
        self.metrics.n_tokens_max = max([self.metrics.n_tokens_max] + [len(s.tokens) for s in self.slots])
        prompt_mask = self._is_prompt[off:off + n]
        n_prompt = int(prompt_mask.sum())
        if n_prompt:
            seqs = b.seq[off:off + n][prompt_mask]
            counts = np.bincount(seqs, minlength=len(self.slots))
            for s in self.slots:
                if counts[s.id] and s.stats.is_set():
                    s.stats.n_prompt_processed += int(counts[s.id])
            self.metrics.prompt_tokens_total += n_prompt
            self.metrics.prompt_seconds_total += dt
        self._emit("decode", "", off=off, n_tokens=n, n_prompt=n_prompt, ms=dt * 1e3)
        return True, n_batch

    def post_decode(self, n: int, off: int) -> None:
        for s in self.slots:
            if not (off <= s.i_batch < off + n):
                continue
            if s.state is SlotState.DONE_PROMPT:
                s.state = SlotState.GENERATING
            elif s.state is not SlotState.GENERATING:
                continue
            if s.spec_draft:
                self.spec.verify(s, off)
            else:
                tok = s.sampler.sample(self.ctx, s.i_batch - off)
                s.i_batch = -1
                self._on_sampled(s, tok)
                self.process_token(s, tok)
            if not s.has_next_token:
                self.send_final_response(s)
                self.release(s)

    def _on_sampled(self, s: Slot, tok: int) -> None:
        t = now_us()
        s.stats.n_gen += 1
        if s.stats.n_gen == 1:
            s.stats.t_prompt_last = t
        s.stats.t_gen_last = t
        self.metrics.tokens_predicted_total += 1

    def process_token(self, slot: Slot, tok: int) -> bool:
        slot.sampled = tok
        slot.generated.append(tok)
        cb = slot.task.on_token
        if cb is not None:
            try:
                cb(slot.task, tok)
            except Exception:
                pass
        slot.has_next_token = True
        if len(slot.tokens) + 1 >= slot.n_ctx:
            slot.truncated, slot.stop, slot.has_next_token = True, "limit", False
        if slot.stats.n_gen > 0 and slot.has_next_token and not slot.has_budget():
            slot.stop, slot.has_next_token = "limit", False
        if self.model.is_eog(tok):
            slot.stop, slot.has_next_token = "eos", False
        stops = slot.task.params.stop
        if stops and slot.has_next_token:
            text = self.model.detokenize(slot.generated[-64:])
            if any(w and w in text for w in stops):
                slot.stop, slot.has_next_token = "word", False
        return slot.has_next_token

    # ------------------------------------------------------------------ slot files (spec 5)

    def _slot_path(self, filename: str) -> Path:
        return Path(self.params.slot_save_path) / filename

    def _slot_save(self, slot: Slot, task: Task) -> None:
        t0 = time.perf_counter()
        path = self._slot_path(task.filename)
        n = slot_file.save(self.ctx, slot.id, slot.tokens.view(), path)
        if n == 0:
            task.finish(error=TaskError(500, "Unable to save slot", "server_error"))
            return
        n_app = 0
        if self.params.slot_appendices:
            draft_state = self.dctx.state_seq_get(slot.id) if self.dctx is not None and len(slot.tokens) else b""
            n_app = slot_file.write_appendices(path, slot.checkpoints, draft_state)
        self._emit("slot_saved", "", slot=slot, task=task.id, filename=task.filename, n_tokens=len(slot.tokens),
                   n_bytes=n, n_bytes_appendix=n_app, n_checkpoints=len(slot.checkpoints) if n_app else 0)
        task.finish(result={"id_slot": task.action_slot, "filename": task.filename, "n_saved": len(slot.tokens),
                            "n_written": n, "timings": {"save_ms": (time.perf_counter() - t0) * 1e3}})

    def _slot_restore(self, slot: Slot, task: Task) -> None:
        t0 = time.perf_counter()
        path = self._slot_path(task.filename)
        try:
            nread, tokens = slot_file.load(self.ctx, slot.id, path)
            if nread == 0:
                raise TokensStateError("No available space in KV cache or invalid slot save file")
            if len(tokens) > slot.n_ctx:
                raise TokensStateError("Restored prompt does not fit in the slot context")
            if len(tokens) and (tokens.min() < 0 or tokens.max() >= self.model.n_vocab):
                raise TokensStateError("Invalid tokens in slot save file")
        except TokensStateError as e:
            self.prompt_clear(slot, reason="restore_failed")
            task.finish(error=TaskError(400, f"Unable to restore slot: {e}", "invalid_request_error"))
            return
        slot.tokens.assign(tokens)
        slot.checkpoints = []
        slot.origin = f"file {task.filename}"
        n_app = 0
        if self.params.slot_appendices:
            app = slot_file.read_appendices(path, nread)
            for note in app.notes:
                self._emit("slot_appendix_skipped", note, level="WRN", slot=slot, task=task.id)
            slot.checkpoints = app.checkpoints
            n_app = app.n_bytes
            if self.dctx is not None:
                self._restore_draft(slot, task, app)
        self._emit("slot_restored", "", slot=slot, task=task.id, filename=task.filename, n_tokens=len(tokens),
                   n_bytes=nread, n_bytes_appendix=n_app, n_checkpoints=len(slot.checkpoints))
        task.finish(result={"id_slot": task.action_slot, "filename": task.filename, "n_restored": len(tokens),
                            "n_read": nread, "timings": {"restore_ms": (time.perf_counter() - t0) * 1e3}})

    def _restore_draft(self, slot: Slot, task: Task, app) -> None:
        """SDFT extension: test-load the last checkpoint's draft data (PARTIAL_ONLY) and drop all
        draft checkpoint data if it does not fit this draft context; then restore the draft state."""
        ck = slot.checkpoints
        if ck and len(ck[-1].data_dft):
            from slotlab.llama import STATE_SEQ_FLAGS_PARTIAL_ONLY

            ok = self.dctx.state_seq_set(ck[-1].data_dft, slot.id, STATE_SEQ_FLAGS_PARTIAL_ONLY) == len(ck[-1].data_dft)
            self.dctx.seq_rm(slot.id, -1, -1)
            if not ok:
                self._emit("slot_draft_dropped", f"draft context checkpoint data in '{task.filename}' does not match the "
                           "draft context - dropped", level="WRN", slot=slot, task=task.id)
                for c in ck:
                    c.data_dft = b""
                    c.data_spec = b""
        if len(app.draft_state):
            self.dctx.seq_rm(slot.id, -1, -1)
            if self.dctx.state_seq_set(app.draft_state, slot.id) != len(app.draft_state):
                self.dctx.seq_rm(slot.id, -1, -1)
                self._emit("slot_draft_dropped", f"draft state in '{task.filename}' does not match the draft context - "
                           "dropped", level="WRN", slot=slot, task=task.id)

    def _slot_erase(self, slot: Slot, task: Task) -> None:
        n = len(slot.tokens)
        self.prompt_clear(slot, reason="erase")
        task.finish(result={"id_slot": task.action_slot, "n_erased": n})

    # ------------------------------------------------------------------ introspection (spec 8)

    def clear_cache(self) -> int:
        """Empty the RAM prompt cache (a lab control; the server has no such endpoint)."""
        if self.cache is None:
            return 0
        with self._lock:
            n = len(self.cache.entries)
            for e in list(self.cache.entries):
                self.cache.entries.remove(e)
                self._emit("cache_evict", "", entry_id=e.id, reason="cleared", n_tokens=e.n_tokens(), size=e.size())
            self.cache.update()
        return n

    def cache_json(self) -> dict:
        """Beyond the server: the RAM cache's entries (oldest first), bytes and token limits."""
        c = self.cache
        if c is None:
            return {"enabled": False}
        return {
            "enabled": True, "size": c.size(), "n_tokens": c.n_tokens(), "limit_size": c.limit_size,
            "limit_tokens": c.limit_tokens, "limit_tokens_cur": c.limit_tokens_cur,
            "entries": [{"id": e.id, "n_tokens": e.n_tokens(), "size": e.size(), "size_main": len(e.main),
                         "n_checkpoints": len(e.checkpoints), "id_slot": e.id_slot, "id_task": e.id_task,
                         "head": self.model.detokenize(e.tokens[1:9])} for e in c.entries],
        }

    def slots_json(self) -> list[dict]:
        """`GET /slots`."""
        out = []
        for s in self.slots:
            d: dict[str, Any] = {"id": s.id, "n_ctx": s.n_ctx, "speculative": False, "is_processing": s.is_processing}
            t = s.task or s.task_prev
            if t is not None:
                d.update({
                    "id_task": t.id, "n_prompt_tokens": len(s.tokens),
                    "n_prompt_tokens_processed": s.stats.n_prompt_processed,
                    "n_prompt_tokens_cache": s.stats.n_prompt_cached,
                    "params": {"n_predict": t.params.n_predict, "temperature": t.params.temperature,
                               "seed": t.params.seed, "ignore_eos": t.params.ignore_eos},
                    "next_token": [{"has_next_token": s.has_next_token, "has_new_line": False,
                                    "n_remain": s.n_remaining(), "n_decoded": s.stats.n_gen}],
                })
            out.append(d)
        return out
