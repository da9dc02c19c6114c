"""The server's decisions, over any `Memory`: one iteration of llama-server's loop at a time.

`ServerCore.step()` is `process_new_tasks()` followed by `update_slots()` (spec 0.5, 3.1). Function
names follow `tools/server/server-context.cpp` (`get_available_slot`, `launch_slot_with_task`,
`update_slots`, `release`, `try_clear_idle_slots`, `send_final_response`) so the C++ can be read
beside this file. Each decision is made by a small rule module and carried out through the memory:

* selection.py      which slot a task gets (pure: a `SlotSelection`);
* cache_glue.py     the RAM prompt cache's save / load / update for that slot (prompt_cache.py decides);
* cache_reuse.py    `--cache-reuse` chunk shifts (pure plan, then applied);
* checkpoints.py    when to create, which to restore, which to erase;
* speculative.py    draft-then-verify with `-md`;
* slot_actions.py   slot save / restore / erase;
* task_queue.py     queue, deferral, cancellation.

The core imports no ctypes and no llama function: the real context, a paper memory and the fake of
the unit tests all run the same code. Nothing here knows about threads (driver.py) or HTTP (serve/)."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import numpy as np

from slotlab.engine import event_types as T
from slotlab.engine.cache_glue import CacheGlue
from slotlab.engine.cache_reuse import apply_cache_reuse
from slotlab.engine.checkpoints import CheckpointPolicy
from slotlab.engine.emit import Emitter
from slotlab.engine.events import EventBus
from slotlab.engine.hindsight import Hindsight
from slotlab.engine.messages import find_message_spans, parse_delimiters
from slotlab.engine.metrics import Metrics
from slotlab.engine.params import ServerParams
from slotlab.engine.prompt_cache import PromptCache
from slotlab.engine.selection import SlotSelection, get_available_slot, slot_index
from slotlab.engine.slot import Slot, SlotState, now_us
from slotlab.engine.slot_actions import SlotActions, check_slot_action
from slotlab.engine.speculative import Speculative
from slotlab.engine.task import Task, TaskError, TaskParams, TaskState, TaskType
from slotlab.engine.task_queue import TaskQueue, cancelled_error
from slotlab.engine.tokens import as_tokens
from slotlab.errors import ConfigError, SlotlabError
from slotlab.memory import Batch, Memory, check_memory, require_seq_rm
from slotlab.proposals import describe as describe_proposals

log = logging.getLogger("slotlab.engine")

#: each slot state's `.value` (what a snapshot reports), without the enum's property per snapshot
_STATE_VALUE = {st: st.value for st in SlotState}


# the kinds `_emit_selection` emits (steps A-C of the slot selection)
_SELECTION_KINDS = frozenset({T.SLOT_SELECTED_BY_ID, T.SLOT_SKIP, T.SLOT_SIM, T.SLOT_SELECTED_BY_LCP, T.SLOT_SELECTED_BY_LRU})


class ServerCore:
    """The slots, the queue, the RAM cache and the rules of one llama-server, over `memory`."""

    def __init__(self, params: ServerParams, memory: Memory, *, events: EventBus | None = None,
                 allocate: Callable[[int], Any] | None = None, hindsight: bool = True):
        check_memory(memory)
        self.params, self.memory = params, memory
        info = memory.info
        self.vocab = memory.vocab
        self.events = events or EventBus()
        self.metrics = Metrics()
        self.n_ctx_slot = info.n_ctx_slot
        self.n_swa = info.n_swa
        self.slots = [Slot(i, self.n_ctx_slot) for i in range(info.n_seq_max)]
        self.emit = Emitter(self.events, self.slots)
        self.cache: PromptCache | None = None
        if params.cache_ram != 0:
            kw = {"allocate": allocate} if allocate is not None else {}
            # -kvcpc (proposal, PR #28046): the token limit moves from the whole cache to each entry
            per_entry = params.kvcpc >= 0
            self.cache = PromptCache.from_cache_ram(
                params.cache_ram, 0 if per_entry else info.n_ctx, record=True, lru=params.cache_ram_lru,
                limit_tokens_entry=(params.kvcpc or info.n_ctx_slot) if per_entry else 0,
                disk_limit=max(0, params.cache_disk) * 2**20, **kw)
        # what the server held and dropped lately, for explanations only (engine/hindsight.py); None:
        # nobody will ask why (the decisions are the same, slot_decision's held / lost stay None)
        self.hindsight = Hindsight(self.vocab) if hindsight else None
        self.glue = CacheGlue(self.cache, memory, self.emit, hindsight=self.hindsight)
        self.cache_idle_slots = params.cache_idle_slots_effective
        # proposal no-sps-idle (PR #22083): no similarity selection with idle-slot caching or one slot
        self.sps = params.slot_prompt_similarity
        if params.has_proposal("no-sps-idle") and (self.cache_idle_slots or len(self.slots) == 1):
            self.sps = 0.0
        self.find_better = params.has_proposal("find-better")  # proposal find-better (PR #28992)
        # a final response's text and token list; a simulation that reads only its counts turns them off
        # (slotlab.sim.simulate: detokenizing every request's placeholders was ~2 % of its time)
        self.response_text = True
        self.checkpoints = CheckpointPolicy(memory, params.ctx_checkpoints, params.checkpoint_min_step, self.emit)
        self.spec = Speculative(memory, self.emit, params.draft_max, params.draft_min) if info.has_draft else None
        self.actions = SlotActions(memory, self.emit, params.slot_save_path, params.slot_appendices,
                                   self.glue.prompt_clear,
                                   checkpoints_in_files=(params.server_build >= 11549
                                                         or params.has_proposal("slot-file-checkpoints")),
                                   n_ctx_checkpoints=params.ctx_checkpoints)
        self.tq = TaskQueue(self.emit)
        self._t_last = -1
        cap = info.n_batch + len(self.slots)
        self.batch = Batch(cap)
        self._is_prompt = np.zeros(cap, dtype=bool)
        self.default_cache_reuse = params.cache_reuse if info.can_shift else 0
        self._init_log()

    # ------------------------------------------------------------------ start-up lines

    def _init_log(self) -> None:
        p, info, emit = self.params, self.memory.info, self.emit
        if self.cache is not None:
            lim = "no limit" if p.cache_ram < 0 else f"{p.cache_ram} MiB"
            emit(T.CacheInit(limit_size=self.cache.limit_size, limit_tokens=self.cache.limit_tokens),
                 f"prompt cache is enabled, size limit: {lim}")
        else:
            emit(T.CacheInit(), "prompt cache is disabled - use `--cache-ram N` to enable it")
        for line in describe_proposals(p):  # a proposal is a visible choice from the first event on
            emit(T.Params(), line, level="INF")
        if p.cache_idle_slots and p.cache_ram == 0:
            emit(T.Params(), "--cache-idle-slots requires --cache-ram, disabling", level="WRN")
        if p.cache_reuse > 0 and not info.can_shift:
            emit(T.Params(), "cache_reuse is not supported by this context, it will be disabled", level="WRN")
        emit(T.Init(n_slots=len(self.slots), n_ctx_slot=self.n_ctx_slot, kv_unified=info.kv_unified, n_swa=self.n_swa,
                    cache_ram=p.cache_ram, flags=p.to_args(), draft=info.has_draft,
                    sps=float(self.sps)),
             f"initializing, n_slots = {len(self.slots)}, n_ctx_slot = {self.n_ctx_slot}, "
             f"kv_unified = '{'true' if info.kv_unified else 'false'}'", level="INF")

    # ------------------------------------------------------------------ tasks in

    def tokenize(self, prompt: str | list | np.ndarray) -> np.ndarray:
        """A prompt in any form the server takes (`tokenize_mixed`): a text (BOS added, special tokens
        parsed), token ids as given, a one-element array of either, or a mixed array of texts and ids
        (only the first text gets BOS). Token ids outside the vocabulary are refused."""
        v = self.vocab
        if isinstance(prompt, str):
            return v.tokenize(prompt)
        if isinstance(prompt, np.ndarray):
            toks = as_tokens(prompt)
            v.check_tokens(toks)
            return toks.copy()
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            return self.tokenize(prompt[0])
        if isinstance(prompt, list):
            out: list[int] = []
            for i, x in enumerate(prompt):
                if isinstance(x, str):
                    out.extend(v.tokenize(x, add_special=i == 0).tolist())
                elif isinstance(x, (int, np.integer)) and not isinstance(x, bool):
                    out.append(int(x))
                else:
                    raise ValueError("prompt array elements must be strings or token ids")
            toks = np.asarray(out, dtype=np.int32)
            v.check_tokens(toks)
            return toks
        raise ValueError("\"prompt\" must be a string or an array of token ids")

    def completion_task(self, prompt, *, n_predict: int | None = None, id_slot: int = -1,
                        cache_prompt: bool | None = None, n_cache_reuse: int | None = None, temperature: float = 0.0,
                        seed: int = 0xFFFFFFFF, ignore_eos: bool = False, message_delimiters: list | None = None,
                        stop: list | None = None, on_token=None, sampling=None, chat: bool = False) -> Task:
        """A `/completion` request as a task (validated, tokenized); `post` queues it. `sampling`:
        a slotlab.sampling.SamplingParams for the server's sampler chain (None = the plain one). `chat`:
        the request came through a chat endpoint, its `message_delimiters` the template's — from b11549
        (`--server-build 11549`) the only ones read: a /completion body's are ignored there
        (server-task.h apply_chat_session, docs/server-behaviour.md 5.4a)."""
        if not chat and self.params.server_build >= 11549:
            message_delimiters = None
        if n_predict is not None and n_predict < -1:
            raise ConfigError(f"n_predict must be >= -1, got {n_predict}")
        if n_cache_reuse is not None and n_cache_reuse < 0:
            raise ConfigError(f"n_cache_reuse must be >= 0, got {n_cache_reuse}")
        tokens = self.tokenize(prompt)
        tokens.flags.writeable = False  # a task's prompt never changes (the memory checks its ids once)
        params = TaskParams(
            n_predict=-1 if n_predict is None else int(n_predict),
            temperature=float(temperature), seed=int(seed), ignore_eos=bool(ignore_eos),
            cache_prompt=self.params.cache_prompt if cache_prompt is None else bool(cache_prompt),
            n_cache_reuse=self.default_cache_reuse if n_cache_reuse is None else int(n_cache_reuse),
            id_slot=int(id_slot), stop=list(stop or []), sampling=sampling)
        params.message_spans = find_message_spans(tokens, [
            (role, self.vocab.tokenize(d, add_special=False, parse_special=True))
            for role, d in parse_delimiters(message_delimiters or [])])
        return self.tq.new_task(TaskType.COMPLETION, tokens=tokens, params=params, on_token=on_token)

    def post(self, task: Task) -> None:
        self.tq.post(task)
        if task.type is TaskType.COMPLETION:
            if self.emit.wanted(T.TASK_QUEUED):
                self.emit(T.TaskQueued(n_tokens=task.n_tokens, id_slot=task.params.id_slot), "", task=task.id)

    def slot_action_task(self, action: str, id_slot: int, filename: str | None = None) -> Task:
        """A slot action as a task; request-level errors come back as a finished task."""
        types = {"save": TaskType.SLOT_SAVE, "restore": TaskType.SLOT_RESTORE, "erase": TaskType.SLOT_ERASE}
        task = self.tq.new_task(types.get(action, TaskType.SLOT_ERASE), action_slot=int(id_slot), filename=filename)
        err = check_slot_action(self.params.slot_save_path, action, filename)
        if err is not None:
            task.finish(error=err)
        return task

    def cancel(self, task: Task) -> None:
        self.tq.cancel(task)

    def _process_cancels(self) -> None:
        while self.tq.cancels:
            task = self.tq.cancels.pop(0)
            for s in self.slots:
                if s.task is task:
                    self.emit(T.TaskCancelled(), f"cancel task, id_task = {task.id}", level="WRN", slot=s, task=task.id)
                    task.finish(error=cancelled_error())
                    self.release(s)
                    break

    # ------------------------------------------------------------------ one loop iteration

    def step(self) -> bool:
        """One iteration of the server loop: every queued task, then `update_slots()` once.
        Returns True while there is work left (a queued task or a busy slot)."""
        self._process_cancels()
        self.process_new_tasks()
        self.update_slots()
        self.emit_snapshots()
        return self.tq.pending() or any(s.is_processing for s in self.slots)

    def process_new_tasks(self) -> None:
        while (task := self.tq.pop()) is not None:
            self.process_single_task(task)

    def get_slot_by_id(self, id_slot: int) -> Slot:
        return self.slots[slot_index(id_slot, len(self.slots))]

    def process_single_task(self, task: Task) -> None:
        if task.type is TaskType.COMPLETION:
            slot = self.get_available_slot(task)
            if slot is None:
                self.tq.defer(task, "no slot is available")
                return
            if slot.is_processing:
                self.tq.defer(task, "requested slot is unavailable")
                return
            if not self.launch_slot_with_task(slot, task):
                return  # "failed to launch slot with task": the task got its error and is dropped
            if self.cache_idle_slots:  # spec 1.6
                for s in self.slots:
                    if s.is_processing:
                        continue
                    self.emit(T.IdleSlotSave(), "saving idle slot to prompt cache", slot=s)
                    if self.glue.prompt_save(s):
                        self.emit(T.IdleSlotSaved(), "__TEST_TAG_CACHE_IDLE_SLOT__", level="DBG", slot=s)
                        self.glue.update(s)
                    if self.memory.info.kv_unified:
                        self.glue.prompt_clear(s, reason="idle_clear")
            return
        slot = self.get_slot_by_id(task.action_slot)
        if slot.is_processing:
            self.tq.defer(task, "requested slot is unavailable")
            return
        self.actions.run(slot, task)

    # ------------------------------------------------------------------ slot selection (spec 1)

    def _emit_selection(self, sel: SlotSelection, task: Task) -> None:
        """The server's log lines of steps A-C, from the decision. Where none of their kinds is
        wanted (`slotlab simulate`), they are only numbered: a line per slot per request, and the
        decisions never read them."""
        emit = self.emit
        only = emit.bus.only
        if only is not None and only.isdisjoint(_SELECTION_KINDS):
            emit.bus.skip((sel.id_requested != -1) + len(sel.checks)
                          + ((sel.how == "lcp" and sel.id_requested == -1) or sel.how == "lru"))
            return
        if sel.id_requested != -1:
            emit(T.SlotSelectedById(), f"selected slot by id ({sel.id_requested})", level="INF",
                 slot=self.get_slot_by_id(sel.id_requested), task=task.id)
        sps = np.float32(self.sps)
        for c in sel.checks:
            if c.skipped == "is_processing":
                emit(T.SlotSkip(), " - skipping, is_processing = 1", slot=c.id_slot, task=task.id)
            elif c.skipped == "empty":
                emit(T.SlotSkip(), " - skipping, slot is empty", slot=c.id_slot, task=task.id)
            else:
                emit(T.SlotSim(lcp=c.lcp, f_sim=c.f_sim),
                     f" - checking sim = {c.f_sim:.3f} ({c.lcp}/{task.n_tokens}) > {sps:.3f}", slot=c.id_slot,
                     task=task.id)
        if sel.how == "lcp" and sel.id_requested == -1:
            emit(T.SlotSelectedByLcp(f_sim=float(sel.f_sim_best), f_keep=float(sel.f_keep)),
                 f"selected slot by LCP similarity, f_sim_best = {sel.f_sim_best:.3f} "
                 f"(> {sps:.3f} thold), f_keep = {sel.f_keep:.3f}", level="INF", slot=sel.id_slot, task=task.id)
        elif sel.how == "lru":
            emit(T.SlotSelectedByLru(t_last=sel.t_last), f"selected slot by LRU, t_last = {sel.t_last}", level="INF",
                 slot=sel.id_slot, task=task.id)

    def get_available_slot(self, task: Task) -> Slot | None:
        """Steps A-C (selection.py), then step D: the RAM-cache save / load / update (spec 1.4)."""
        if self.cache is None:
            return self._get_available_slot(task)
        with self.cache.one_prompt(task.tokens):  # each entry's lcp with the prompt is computed once
            return self._get_available_slot(task)

    def _get_available_slot(self, task: Task) -> Slot | None:
        slot_lcps = [s.tokens.get_common_prefix(task.tokens) for s in self.slots]  # shared by both scans
        held, lost = (None, None) if self.hindsight is None else self.hindsight.held(task.tokens, self.slots,
                                                                                     slot_lcps, self.cache)
        sel = get_available_slot(self.slots, task.tokens, task.params.id_slot, self.sps,
                                 lcps=slot_lcps)
        self._emit_selection(sel, task)
        ret = None if sel.id_slot is None else self.slots[sel.id_slot]
        update_cache = bool(sel.update_cache and self.cache is not None)
        flipped = None
        if not update_cache and self.find_better and ret is not None and self.cache is not None:
            # proposal find-better (PR #28992): the cache is looked up when the slot keeps its context
            # too, and updated when an entry would beat the slot by load()'s own rule
            if self.cache.load(ret.tokens.view(), task.tokens, emit=False).entry is not None:
                update_cache, flipped = True, "find-better"
        loaded = res = None
        if ret is not None and update_cache:
            if self.emit.wanted(T.CACHE_UPDATE_BEGIN):
                self.emit(T.CacheUpdateBegin(), "updating prompt cache", task=task.id)
            t0 = time.perf_counter()
            self.glue.prompt_save(ret, task)
            loaded, res = self.glue.prompt_load(ret, task)
            if loaded is False:
                self.glue.prompt_clear(ret, reason="load_failed")
            self.glue.update(ret, task)
            if self.emit.wanted(T.CACHE_UPDATE_END):
                self.emit(T.CacheUpdateEnd(), f"prompt cache update took {(time.perf_counter() - t0) * 1e3:.2f} ms",
                          task=task.id)
        if ret is not None and self.cache is not None and loaded is None and self.hindsight is not None:
            self.glue.preview(ret, task)
        won = loaded is True
        if not self.emit.wanted(T.SLOT_DECISION):
            return ret
        self.emit(T.SlotDecision(how=sel.how, f_sim=float(sel.f_sim_best),
                                 f_keep=None if sel.f_keep is None else float(sel.f_keep), update_cache=update_cache,
                                 load=loaded, id_requested=sel.id_requested, held=held, lost=lost,
                                 checks=[(c.id_slot, c.skipped, c.lcp, c.f_sim) for c in sel.checks],
                                 f_keep_best=float(res.f_keep_best) if won else T.UNSET,
                                 f_sim_best=float(res.f_sim_best) if won else T.UNSET,
                                 f_keep_base=float(res.f_keep_base) if won else T.UNSET,
                                 proposal=flipped or T.UNSET),
                  "", slot=ret.id if ret else -1, task=task.id)
        return ret

    # ------------------------------------------------------------------ launch / release

    def launch_slot_with_task(self, slot: Slot, task: Task) -> bool:
        """The task takes `slot`; False when its sampler cannot be built (the task got its error)."""
        p = task.params
        if p.sampling is None:
            slot.sampler = self.memory.sampler(temperature=p.temperature, seed=p.seed, ignore_eos=p.ignore_eos)
        else:  # the server's chain, fed the prompt as init_sampler does (equivalent here: nothing samples before)
            try:
                slot.sampler = self.memory.sampler(temperature=p.temperature, seed=p.seed, ignore_eos=p.ignore_eos,
                                                   sampling=p.sampling, prompt=task.tokens)
            except ValueError as ex:  # common_sampler_init threw (a grammar that does not parse, ...)
                msg = f"Failed to initialize samplers: {ex}"
                self.emit(T.TaskFailed(code=400, type="invalid_request_error"), msg, level="ERR", slot=slot,
                          task=task.id)
                task.finish(error=TaskError(400, msg, "invalid_request_error"))
                return False
        slot.n_predict_max = p.n_predict if p.n_predict != -1 else self.params.n_predict
        slot.task = task
        slot.state = SlotState.STARTED
        task.state = TaskState.RUNNING
        task.id_slot = slot.id
        self.emit(T.TaskLaunched(n_tokens=task.n_tokens), "processing task, is_child = 0", level="INF", slot=slot,
                  task=task.id)
        return True

    def _next_time(self) -> int:
        """`ggml_time_us()` at release; strictly increasing so LRU order equals release order."""
        self._t_last = max(now_us(), self._t_last + 1)
        return self._t_last

    def release(self, slot: Slot) -> None:
        if not slot.is_processing:
            return
        if self.emit.wanted(T.SLOT_RELEASE):
            self.emit(T.SlotRelease(n_tokens=len(slot.tokens)),
                      f"stop processing: n_tokens = {len(slot.tokens)}, truncated = {int(slot.truncated)}", level="INF",
                      slot=slot)
        slot.t_last_used = self._next_time()
        slot.state = SlotState.IDLE
        slot.origin = "slot"
        slot.reset()
        self.tq.pop_deferred_task(slot.id)

    def try_clear_idle_slots(self) -> bool:
        """Purge one idle slot to make room in a unified KV pool (spec 6.2)."""
        if not self.memory.info.kv_unified:
            return False
        for s in self.slots:
            if s.is_processing:
                continue
            if len(s.tokens) > 0:
                self.emit(T.SlotPurge(id_slot=s.id, n_tokens=len(s.tokens)),
                          f"purging slot {s.id} with {len(s.tokens)} tokens", level="WRN", slot=-1, task=-1)
                self.glue.prompt_clear(s, reason="purge")
                return True
        return False

    def abort_all_slots(self, reason: str) -> None:
        """`abort_all_slots`: every processing slot's task gets `reason` (a server_error); the slot is released."""
        for s in self.slots:
            if s.is_processing:
                self.send_error(s, reason)
                self.release(s)

    def iterate(self, slots, fn, *args) -> None:
        """`iterate` (SC:2711-2732): `fn(slot, *args)` for each slot; an exception in
        one slot's part ends that slot's task with "got exception: ..." and releases the slot, and
        the other slots go on. (Where the server calls GGML_ABORT instead of throwing, as for
        `pos_min == -1` or a checkpoint of the wrong size, slotlab raises and lands here: the lab
        keeps serving instead of ending the process.)"""
        for s in slots:
            try:
                fn(s, *args)
            except Exception as ex:  # noqa: BLE001 - the server catches std::exception here
                log.exception("slot %d: got exception", s.id)
                msg = f"got exception: {ex}"
                self.emit(T.SlotException(error=repr(ex)), msg, level="ERR", slot=s)
                if s.task is not None and not s.task.done:
                    self.send_error(s, msg)
                self.release(s)

    def _phase_failed(self, phase: str, ex: Exception) -> None:
        """An exception out of a whole phase of `update_slots`: the server's SRV_ERR line, then
        `abort_all_slots` with the same text; the loop goes on with the next iteration."""
        log.exception("%s() failed", phase)
        reason = f"{phase}() failed: {ex}"
        self.emit(T.PhaseFailed(phase=phase, error=repr(ex)), reason, level="ERR")
        self.abort_all_slots(reason)

    def send_error(self, slot: Slot, message: str, type_: str = "server_error", code: int = 500) -> None:
        self.emit(T.TaskFailed(code=code, type=type_), message, level="ERR", slot=slot)
        slot.task.finish(error=TaskError(code, message, type_))

    def send_final_response(self, slot: Slot) -> None:
        task = slot.task
        content, tokens = "", []
        if self.response_text:
            # the server's text_to_send renders without special tokens: an ending EOG adds no text
            content = self.vocab.detokenize(slot.generated[:-1] if slot.stop == "eos" else slot.generated)
            for w in task.params.stop or ():
                if w and w in content:
                    content = content[: content.index(w)]
            tokens = list(map(int, slot.generated))
        result = {
            "content": content,
            "tokens": tokens,
            "id_slot": slot.id,
            "stop": True,
            "tokens_predicted": slot.stats.n_gen,
            "tokens_evaluated": task.n_tokens,
            "tokens_cached": len(slot.tokens),
            "truncated": slot.truncated,
            "stop_type": slot.stop,
            "timings": slot.stats.timings(),
        }
        if self.emit.wanted(T.TASK_DONE):
            self.emit(T.TaskDone(cache_n=slot.stats.n_prompt_cached, prompt_n=slot.stats.n_prompt_processed,
                                 predicted_n=slot.stats.n_gen, tokens_cached=len(slot.tokens)), "", slot=slot,
                      task=task.id)
        self.metrics.on_final(slot)
        task.finish(result=result)

    # ------------------------------------------------------------------ update_slots (spec 3)

    def update_slots(self) -> None:
        """The server's `update_slots` (SC:2773-2886, spec 6.5): pre_decode, then decode and
        post_decode chunk by chunk. An exception of a phase aborts the processing slots with the
        phase's error (`abort_all_slots`) and ends this iteration; the loop goes on serving."""
        if not any(s.is_processing for s in self.slots):
            return
        b = self.batch
        b.clear()
        self._is_prompt[:] = False
        try:
            self.pre_decode()
        except Exception as ex:  # noqa: BLE001 - "the batch is half-built and not rendered"
            self._phase_failed("pre_decode", ex)
            return
        n_batch = self.memory.info.n_batch
        off = 0
        while off < b.n_tokens:
            n = min(n_batch, b.n_tokens - off)
            try:
                ok, n_batch = self.decode(n_batch, off, n)
            except Exception as ex:  # noqa: BLE001 - a fatal decode error, or a memory that raised
                self._phase_failed("decode", ex)
                break
            if not ok:
                continue  # retry with the updated n_batch
            try:
                self.post_decode(n, off)
            except Exception as ex:  # noqa: BLE001
                self._phase_failed("post_decode", ex)
                break
            off += n
            n_batch = self.memory.info.n_batch

    def pre_decode(self) -> None:
        """Generating slots first (their draft, then `handle_last_sampled_token`), then the prompts
        that fit into the batch; each slot's part under `iterate`."""
        b = self.batch
        generating = [s for s in self.slots if s.state is SlotState.GENERATING]
        if self.spec is not None:
            self.iterate(generating, self._draft)
        self.iterate(generating, Slot.handle_last_sampled_token, b)
        if self.params.cont_batching or b.n_tokens == 0:
            self.iterate(self.slots, self._batch_prompt, self.memory.info.n_batch)

    def _draft(self, slot: Slot) -> None:
        slot.spec_draft = self.spec.draft(slot)

    def _batch_prompt(self, slot: Slot, n_batch: int) -> None:
        if self.batch.n_tokens >= n_batch:
            return  # the batch is full: skip the remaining slots
        if slot.state in (SlotState.STARTED, SlotState.PROCESSING_PROMPT):
            self._process_prompt(slot)

    def _start_prompt(self, slot: Slot) -> bool:
        """Entering STARTED (spec 3.2-3.6): the context checks, then n_past from the common prefix,
        `--cache-reuse` shifts, the checkpoint rewind when the memory cannot be cut back, and the
        full-match rule. Emits the facts as `prompt_plan`. False when the task ended here."""
        task = slot.task
        slot.stats.t_start = now_us()
        slot.state = SlotState.PROCESSING_PROMPT
        if self.emit.wanted(T.PROMPT_START):
            self.emit(T.PromptStart(),
                      f"new prompt, n_ctx_slot = {slot.n_ctx}, n_keep = 0, task.n_tokens = {task.n_tokens}", slot=slot)
        if task.n_tokens == 0:
            self.emit(T.PromptEmpty(), "empty prompt - releasing slot", level="WRN", slot=slot)
            self.send_final_response(slot)
            self.release(slot)
            return False
        if task.n_tokens >= slot.n_ctx:
            self.send_error(slot, f"request ({task.n_tokens} tokens) exceeds the available context size "
                                  f"({slot.n_ctx} tokens), try increasing it", "exceed_context_size_error", 400)
            self.release(slot)
            return False
        inp = task.tokens
        n_past = 0
        slot.shifts = []
        lcp = slot.tokens.get_common_prefix(inp)
        if task.params.cache_prompt:
            n_past = lcp
            n_past = apply_cache_reuse(self.memory, self.emit, slot, n_past, task.params.n_cache_reuse)
        pos_next = slot.tokens.pos_next(n_past)
        has_new = n_past < task.n_tokens
        pos_min_thold = max(0, pos_next - self.n_swa - (0 if has_new else 1))
        ckpt_mode = None
        ckpts_before = [(c.pos_min, c.pos_max, c.n_tokens) for c in slot.checkpoints]
        pos_min = None
        if 0 < n_past <= len(slot.tokens):
            pos_min = self.memory.pos_min(slot.id)
            if pos_min == -1:
                raise SlotlabError(f"pos_min == -1, but n_past = {n_past} > 0 (slot {slot.id}): tokens and KV disagree")
            if pos_min >= pos_min_thold:
                n_past, pos_next = self.checkpoints.restore(slot, n_past, pos_next, pos_min_thold)
                ckpt_mode = "restored" if n_past > 0 else "forced"
        self.checkpoints.erase_invalidated(slot, pos_next)
        if n_past == task.n_tokens and n_past > 0:
            self.emit(T.PromptFullMatch(),
                      f"need to evaluate at least 1 token for each active slot (n_past = {n_past}, "
                      f"task.n_tokens() = {task.n_tokens})", level="WRN", slot=slot)
            n_past -= 1
            self.emit(T.PromptFullMatch(), f"n_past was set to {n_past}", level="WRN", slot=slot)
        if n_past < len(slot.tokens) and self.hindsight is not None:  # the rest is overwritten, unsaved
            self.hindsight.slot_dropped(slot, "overwritten", self.events.n_events, by_task=task.id)
        slot.stats.n_prompt_cached = n_past
        slot.stats.n_prompt_processed = 0
        self.metrics.prompt_tokens_cached_total += n_past
        slot.tokens.keep_first(n_past)
        slot.n_prompt = task.n_tokens
        if self.emit.wanted(T.PROMPT_PLAN):
            div = lcp if lcp < task.n_tokens else -1
            div_text = self.vocab.token_to_piece(int(inp[lcp])).decode("utf-8", "replace") if div >= 0 else ""
            self.emit(T.PromptPlan(n_past=n_past, n_prompt=task.n_tokens, lcp=lcp, ckpt=ckpt_mode, origin=slot.origin,
                                   shifts=list(slot.shifts), divergence=div, div_text=div_text, checkpoints=ckpts_before,
                                   pos_min=pos_min, pos_min_thold=pos_min_thold, cache_prompt=task.params.cache_prompt,
                                   n_cache_reuse=task.params.n_cache_reuse), "", slot=slot)
        return True

    def _process_prompt(self, slot: Slot) -> None:
        b, task, info = self.batch, slot.task, self.memory.info
        n_batch, n_ubatch = info.n_batch, info.n_ubatch
        inp = task.tokens
        n_tokens_prev = b.n_tokens
        if slot.state is SlotState.STARTED and not self._start_prompt(slot):
            return
        p0 = slot.tokens.pos_next()
        self.emit(T.PromptSeqRm(), f"cached n_tokens = {len(slot.tokens)}, memory_seq_rm [{p0}, end)", slot=slot)
        require_seq_rm(self.memory, slot.id, p0, -1)
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
        self.emit(T.PromptBatch(n_added=n_tokens_cur, n_tokens=len(slot.tokens), n_prompt=task.n_tokens), "", slot=slot)
        if do_checkpoint:
            self.checkpoints.maybe_create(slot, n_tokens_cur, n_tokens_start, near_prompt_end or is_last_user_message)

    def emit_snapshots(self) -> None:
        """One `slot_snapshot` event per slot whose picture changed since the last one: what a view
        needs to redraw the slot without reading engine state (and what scrubbing replays).

        Runs after every step and fast-forward (~4 events per request step), so the bus is called
        directly with the slot's id and the task (what the Emitter would pass), each checkpoint's
        entry is its remembered `Checkpoint.summary()`, and each field is read once."""
        if not self.emit.bus.wants(T.SLOT_SNAPSHOT):
            return
        emit, snap, value = self.emit.bus.emit, T.SlotSnapshot, _STATE_VALUE
        for s in self.slots:
            task, st, ck, n = s.task, s.stats, s.checkpoints, len(s.tokens)
            state, n_gen, origin = s.state, st.n_gen, s.origin
            sig = (state, n, len(ck), task.id if task else -1, n_gen, origin)
            if sig == s.last_sig:
                continue
            s.last_sig = sig
            t = task or s.task_prev
            emit(snap(state=value[state], n_tokens=n, n_prompt=s.n_prompt if t is not None else 0,
                      n_past=st.n_prompt_cached, prompt_n=st.n_prompt_processed, n_gen=n_gen, origin=origin,
                      shifts=list(s.shifts), checkpoints=[c.summary() for c in ck]),
                 "", slot=s.id, task=t.id if t else -1)

    def decode(self, n_batch: int, off: int, n: int) -> tuple[bool, int]:
        """Returns (ok, n_batch): ok True = decoded, False = retry at the same offset with n_batch.
        A fatal error raises (as the server throws), after every processing slot got the error and
        was released and cleared."""
        b = self.batch
        t0 = time.perf_counter()
        ret = self.memory.decode(b, off, n)
        if ret != 0:
            err = None
            if n_batch == 1 and ret == 1:
                err = "Context size has been exceeded."
            if ret == -1:
                err = "Invalid input batch."
            if ret < -1:
                err = "Compute error."
            if err:
                self.emit(T.DecodeFailed(ret=ret, off=off, n_batch=n_batch),
                          f"{err} off = {off}, n_batch = {n_batch}, ret = {ret}", level="ERR")
                for s in self.slots:
                    if s.is_processing:
                        self.send_error(s, err)
                        self.release(s)
                        self.glue.prompt_clear(s, reason="decode_failed")
                raise RuntimeError(err)  # stop, do not retry with a smaller batch
            if not self.try_clear_idle_slots():
                n_batch //= 2
            self.emit(T.DecodeRetry(ret=ret, off=off, n_batch=n_batch),
                      "failed to find free space in the KV cache, retrying with smaller batch size, "
                      f"off = {off}, n_batch = {n_batch}, ret = {ret}", level="WRN")
            return False, n_batch
        dt = time.perf_counter() - t0
        n_prompt = self.metrics_post_decode(off, n, dt)
        if self.spec is not None and (ret := self.spec.process(b, off, n)) != 0:
            self.emit(T.DecodeFailed(ret=ret, off=off, n_batch=n_batch), "failed to process speculative batch",
                      level="ERR")
            raise RuntimeError("failed to process speculative batch")  # update_slots aborts every slot
        if self.emit.wanted(T.DECODE):
            self.emit(T.Decode(off=off, n_tokens=n, n_prompt=n_prompt, ms=dt * 1e3), "")
        return True, n_batch

    def metrics_post_decode(self, off: int, n: int, dt: float) -> int:
        """`metrics_post_decode` after a successful decode of rows [off, off + n) that took `dt`
        seconds: the decode counters, and the chunk's prompt tokens counted per slot (timing the
        slots' prompt progress). Returns the chunk's number of prompt tokens."""
        b = self.batch
        self.metrics.on_decode(self.slots)
        prompt_mask = self._is_prompt[off:off + n]
        n_prompt = int(prompt_mask.sum())
        if n_prompt:
            seqs = b.seq[off:off + n][prompt_mask]
            counts = np.bincount(seqs, minlength=len(self.slots))
            t_now = now_us()
            for s in self.slots:
                if counts[s.id] and s.stats.is_set():
                    s.stats.n_prompt_processed += int(counts[s.id])
                    s.stats.t_prompt_last = t_now  # set_prompt_last: prompt timing advances per batch
            self.metrics.on_prompt(n_prompt, dt)
        return n_prompt

    def post_decode(self, n: int, off: int) -> None:
        """Each slot whose output row is in [off, off + n): sample (or verify the draft), accept,
        stop rules; each slot's part under `iterate`."""
        self.iterate(self.slots, self._post_decode_slot, n, off)

    def _post_decode_slot(self, s: Slot, n: int, off: int) -> None:
        if not (off <= s.i_batch < off + n):
            return
        if s.state is SlotState.DONE_PROMPT:
            s.state = SlotState.GENERATING
        elif s.state is not SlotState.GENERATING:
            return
        if s.spec_draft:
            n_draft, n_acc = self.spec.verify(s, off, self.accept_token)
            self.metrics.spec_draft_tokens_total += n_draft
            self.metrics.spec_accepted_tokens_total += n_acc
        else:
            tok = s.sampler.sample(s.i_batch - off)
            s.i_batch = -1
            self.accept_token(s, tok)
        if not s.has_next_token:
            self.send_final_response(s)
            self.release(s)

    def accept_token(self, s: Slot, tok: int) -> bool:
        """A sampled token (`common_sampler_accept` done): timings, then the stop rules (`process_token`)."""
        t = now_us()
        s.stats.n_gen += 1
        if s.stats.n_gen == 1:
            s.stats.t_prompt_last = t
        s.stats.t_gen_last = t
        self.metrics.tokens_predicted_total += 1
        return self.process_token(s, tok)

    def process_token(self, slot: Slot, tok: int) -> bool:
        """Record the token, tell the task's listener, and apply the stop rules (spec 3.7)."""
        slot.sampled = tok
        slot.generated.append(tok)
        if slot.task.params.sampling is not None and slot.task.params.sampling.n_probs > 0:
            slot.task.token_probs.append(slot.sampler.last_probs)  # populate_token_probs
        cb = slot.task.on_token
        if cb is not None:
            try:
                cb(slot.task, tok)
            except Exception as ex:  # a broken listener (a closed stream, a notebook callback) must not stop the server
                log.exception("on_token callback of task %d failed", slot.task.id)
                self.emit(T.CallbackError(error=repr(ex)), f"on_token callback failed: {ex!r}", level="ERR", slot=slot)
        slot.has_next_token = True
        if len(slot.tokens) + 1 >= slot.n_ctx:
            slot.truncated, slot.stop, slot.has_next_token = True, "limit", False
        if slot.stats.n_gen > 0 and slot.has_next_token and not slot.has_budget():
            slot.stop, slot.has_next_token = "limit", False
        if self.vocab.is_eog(tok):
            slot.stop, slot.has_next_token = "eos", False
        stops = slot.task.params.stop
        if stops and slot.has_next_token:
            text = self.vocab.detokenize(slot.generated[-64:])
            if any(w and w in text for w in stops):
                slot.stop, slot.has_next_token = "word", False
        return slot.has_next_token

    # ------------------------------------------------------------------ lab controls

    def clear_cache(self) -> int:
        """Empty the RAM prompt cache (a lab control; the server has no such endpoint)."""
        return self.glue.clear_cache()

    def fail_all(self, error: TaskError) -> None:
        """Finish every task not yet done with `error` (the loop died)."""
        for t in self.tq.waiting() + [s.task for s in self.slots if s.task]:
            if not t.done:
                t.finish(error=error)
