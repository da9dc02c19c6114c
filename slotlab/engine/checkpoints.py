"""Context checkpoints (`--ctx-checkpoints`, `--checkpoint-min-step`; spec 3.5 and 4).

A memory that cannot be truncated (Gemma 3's sliding window without `--swa-full`, recurrent models)
loses the states needed to continue from an earlier position. The server therefore snapshots the
non-rewindable part (PARTIAL_ONLY state) while processing a prompt, before the batch is decoded, and
restores the newest usable snapshot when a later request diverges inside the slot."""

from __future__ import annotations

from slotlab.engine import event_types as T
from slotlab.engine.emit import Emitter
from slotlab.units import MIB
from slotlab.engine.prompt_cache import Checkpoint
from slotlab.engine.task import Task, TaskType
from slotlab.memory import Memory


class CheckpointPolicy:
    """The checkpoint rules of one server, over its memory; `emit` reports each decision."""

    def __init__(self, memory: Memory, n_max: int, min_step: int, emit: Emitter):
        self.memory, self.emit = memory, emit
        # whether an event kind is kept (`Emitter.wanted`, which numbers a refused one): the lines below
        # are built only then (a simulation keeps none of them, and makes ~7 a request)
        self.wanted = getattr(emit, "wanted", None) or (lambda kind: True)
        self.n_max = n_max
        self.min_step = min_step
        info = memory.info
        self.memory_needs = info.needs_checkpoints
        self.n_swa = info.n_swa
        # the server's function-static offsets, fixed with the n_ubatch of the first use
        self.offsets = (min(info.n_batch, 4 + info.n_ubatch), min(info.n_batch, 4))

    @property
    def enabled(self) -> bool:
        """`--ctx-checkpoints` > 0 on a memory that needs them (spec 4.2 steps 1 and 3)."""
        return self.n_max > 0 and self.memory_needs

    def gate(self, task: Task) -> bool:
        """`do_checkpoint` before the token loop (spec 4.2 steps 1-3): checkpoints only for completion tasks."""
        return self.enabled and task.type is TaskType.COMPLETION

    def cut(self, slot, spans, n_prompt: int, n_have: int, n_add: int) -> int:
        """The two early breaks of the token loop, checked after each pushed token (spec 4.2): at a
        user-message start (if it is the last user message, or there is no checkpoint yet, or it is
        more than `checkpoint_min_step` past the last one), and when exactly `4 + n_ubatch` or `4`
        prompt tokens remain. Returns how many tokens to add before the first break."""
        best = n_add
        for off in self.offsets:
            p = n_prompt - off
            if n_have < p <= n_have + n_add:
                best = min(best, p - n_have)
        starts = spans.user_starts()
        if len(starts):
            last_user = spans.last_user_message_pos()
            ck = slot.checkpoints
            for p in starts[(starts > n_have) & (starts <= n_have + best)]:
                if p == last_user or not ck or p > ck[-1].n_tokens + self.min_step:
                    best = min(best, int(p) - n_have)
                    break
        return best

    def maybe_create(self, slot, n_tokens_cur: int, n_tokens_start: int, near_end_or_last_user: bool) -> None:
        """The spacing rule after the token loop (`would_create`), then `create_checkpoint`."""
        if self.would_create(slot, n_tokens_start, near_end_or_last_user):
            self.create_checkpoint(slot, n_tokens_cur, self.memory.pos_min(slot.id), self.memory.pos_max(slot.id))

    def would_create(self, slot, n_tokens_start: int, near_end_or_last_user: bool) -> bool:
        """The spacing rule: create if the memory holds the sequence and there is no checkpoint yet, it
        is the last user message or near the prompt end, or more than `checkpoint_min_step` after the
        last one. (The simulator's fast-forward asks it to price the state copy beforehand.)"""
        if self.memory.pos_min(slot.id) < 0:
            return False
        ck = slot.checkpoints
        return not ck or near_end_or_last_user or n_tokens_start > ck[-1].n_tokens + self.min_step

    def create_checkpoint(self, slot, n_tokens_cur: int, pos_min: int, pos_max: int) -> None:
        """`create_checkpoint` (spec 4.3): too-close eviction, FIFO cap, supersede, append."""
        emit, ck, id_task, wanted = self.emit, slot.checkpoints, slot.task.id, self.wanted
        last = -1
        i = 0
        while len(ck) + 1 >= self.n_max and i < len(ck):
            c = ck[i]
            if c.id_task != id_task and last >= 0 and c.n_tokens <= last + self.min_step:
                if wanted(T.CHECKPOINT_EVICT):
                    emit(T.CheckpointEvict(reason="too_close", n_tokens=c.n_tokens, pos_min=c.pos_min, pos_max=c.pos_max),
                         "erasing context checkpoint too close to an earlier one (pos_min = "
                            f"{c.pos_min}, pos_max = {c.pos_max}, n_tokens = {c.n_tokens}, size = {c.size() / MIB:.3f} MiB)",
                         slot=slot)
                del ck[i]
                continue
            last = c.n_tokens
            i += 1
        while len(ck) >= self.n_max:
            c = ck.pop(0)
            if wanted(T.CHECKPOINT_EVICT):
                emit(T.CheckpointEvict(reason="fifo", n_tokens=c.n_tokens, pos_min=c.pos_min, pos_max=c.pos_max),
                     f"erasing old context checkpoint (pos_min = {c.pos_min}, pos_max = {c.pos_max}, "
                        f"n_tokens = {c.n_tokens}, size = {c.size() / MIB:.3f} MiB)", level="WRN", slot=slot)
        n_new = len(slot.tokens) - n_tokens_cur
        for c in [c for c in ck if c.n_tokens == n_new]:
            if wanted(T.CHECKPOINT_EVICT):
                emit(T.CheckpointEvict(reason="supersede", n_tokens=c.n_tokens, pos_min=c.pos_min, pos_max=c.pos_max),
                     f"superseding context checkpoint at n_tokens = {c.n_tokens}", slot=slot)
            ck.remove(c)
        mem = self.memory
        data = mem.state_get(slot.id, partial=True).copy()
        data_dft = mem.state_get(slot.id, draft=True, partial=True).copy() if mem.info.has_draft else b""
        c = Checkpoint(n_tokens=n_new, pos_min=pos_min, pos_max=pos_max, id_task=id_task, data_tgt=data,
                       data_dft=data_dft)
        ck.append(c)
        if wanted(T.CHECKPOINT_CREATED):
            emit(T.CheckpointCreated(n_tokens=n_new, pos_min=pos_min, pos_max=pos_max, size=c.size()),
                 f"created context checkpoint {len(ck)} of {self.n_max} (pos_min = {pos_min}, "
                    f"pos_max = {pos_max}, n_tokens = {n_new}, size = {c.size() / MIB:.3f} MiB)", slot=slot)

    def restore(self, slot, n_past: int, pos_next: int, pos_min_thold: int) -> tuple[int, int]:
        """The memory no longer holds what `n_past` needs: restore the newest usable checkpoint or
        force full re-processing (spec 3.5). Returns (n_past, pos_next)."""
        emit, found, wanted = self.emit, None, self.wanted
        for c in reversed(slot.checkpoints):
            if wanted(T.CHECKPOINT_CHECK):
                emit(T.CheckpointCheck(), f"checking checkpoint with [{c.pos_min}, {c.pos_max}] against {pos_min_thold}...",
                     slot=slot)
            if c.pos_max > pos_next:
                continue
            if c.pos_min < pos_min_thold or c.pos_min == 0:
                found = c
                break
        if found is None:
            emit(T.CheckpointNone(), "forcing full prompt re-processing due to lack of cache data (likely due to SWA "
                    "or hybrid/recurrent memory, see https://github.com/ggml-org/llama.cpp/pull/13194#issuecomment-2868343055)",
                 slot=slot)
            return 0, 0
        for draft, data in ((False, found.data_tgt), (True, found.data_dft)):
            if (draft and not self.memory.info.has_draft) or not len(data):  # load_tgt / load_dft: no-op
                continue
            n = self.memory.state_set(data, slot.id, draft=draft, partial=True)
            if n != len(data):
                raise RuntimeError(f"checkpoint size mismatch: expected {len(data)}, got {n}")
        pos_next = min(pos_next, max(found.pos_min + 1, found.pos_max))
        n_past = min(slot.tokens.size_up_to_pos(pos_next), found.n_tokens)
        if wanted(T.CHECKPOINT_RESTORED):
            emit(T.CheckpointRestored(n_tokens=found.n_tokens, n_past=n_past, pos_min=found.pos_min,
                                      pos_max=found.pos_max, size=found.size()),
                 f"restored context checkpoint (pos_min = {found.pos_min}, pos_max = {found.pos_max}, "
                    f"n_tokens = {found.n_tokens}, n_past = {n_past}, size = {found.size() / MIB:.3f} MiB)", slot=slot)
        return n_past, pos_next

    def erase_invalidated(self, slot, pos_next: int) -> None:
        keep = []
        for c in slot.checkpoints:
            if c.pos_max > pos_next:
                if self.wanted(T.CHECKPOINT_EVICT):
                    self.emit(T.CheckpointEvict(reason="invalidated", n_tokens=c.n_tokens, pos_min=c.pos_min,
                                                pos_max=c.pos_max),
                              f"erased invalidated context checkpoint (pos_min = {c.pos_min}, pos_max = "
                              f"{c.pos_max}, n_tokens = {c.n_tokens}, n_swa = {self.n_swa}, pos_next = {pos_next}, "
                              f"size = {c.size() / MIB:.3f} MiB)", slot=slot)
            else:
                keep.append(c)
        slot.checkpoints = keep
