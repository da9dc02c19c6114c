"""One server slot (`server_slot`): a sequence id in the context, its cached prompt and its task."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from slotlab.engine.prompt_cache import Checkpoint
from slotlab.engine.task import Task
from slotlab.engine.tokens import ServerTokens


class SlotState(enum.Enum):
    IDLE = "idle"
    STARTED = "started"
    PROCESSING_PROMPT = "processing_prompt"
    DONE_PROMPT = "done_prompt"
    GENERATING = "generating"


def now_us() -> int:
    return time.perf_counter_ns() // 1000


@dataclass
class SlotStats:
    """`server_slot_stats`: zeroed at every release."""

    n_prompt_cached: int = 0
    n_prompt_processed: int = 0
    n_gen: int = 0
    t_start: int = 0
    t_prompt_last: int = 0
    t_gen_last: int = 0
    n_draft_tokens: int = 0
    n_draft_accepted: int = 0

    def is_set(self) -> bool:
        return self.t_start != 0

    def t_prompt_ms(self) -> float:
        return 0.0 if self.t_prompt_last == 0 else (self.t_prompt_last - self.t_start) / 1000.0

    def t_gen_ms(self) -> float:
        return 0.0 if self.t_gen_last == 0 else max(1, self.t_gen_last - self.t_prompt_last) / 1000.0

    def timings(self) -> dict:
        """The per-response `timings` object (spec 8.3)."""
        n_steps = max(0, self.n_gen - 1)
        tp, tg = self.t_prompt_ms(), self.t_gen_ms()
        return {
            "cache_n": self.n_prompt_cached,
            "prompt_n": self.n_prompt_processed,
            "prompt_ms": tp,
            "prompt_per_token_ms": tp / self.n_prompt_processed if self.n_prompt_processed else 0.0,
            "prompt_per_second": 1e3 / tp * self.n_prompt_processed if tp > 0 else 0.0,
            "predicted_n": self.n_gen,
            "predicted_ms": tg,
            "predicted_per_token_ms": tg / n_steps if n_steps else 0.0,
            "predicted_per_second": 1e3 / tg * n_steps if tg > 0 else 0.0,
        }


@dataclass(eq=False)
class Slot:
    id: int
    n_ctx: int
    state: SlotState = SlotState.IDLE
    t_last_used: int = -1
    tokens: ServerTokens = field(default_factory=ServerTokens)
    checkpoints: list[Checkpoint] = field(default_factory=list)
    task: Task | None = None
    task_prev: Task | None = None
    stats: SlotStats = field(default_factory=SlotStats)
    # generation
    sampler: object | None = None
    sampled: int = -1
    i_batch: int = -1
    n_predict_max: int = -1
    generated: list = field(default_factory=list)
    truncated: bool = False
    stop: str = "none"
    has_next_token: bool = True
    spec_draft: list = field(default_factory=list)  # draft tokens in the batch being verified
    # facts the events report (provenance and the "why" line are folded from them: slotlab.explain)
    origin: str = "slot"  # where the slot's tokens came from: "slot", "cache #id", "file NAME"
    shifts: list = field(default_factory=list)  # cache-reuse moves [(a, b, c, d)]: [a,b) -> [c,d)
    n_prompt: int = 0
    last_sig: tuple = ()

    @property
    def is_processing(self) -> bool:
        return self.state is not SlotState.IDLE

    def n_remaining(self) -> int:
        return -1 if self.n_predict_max == -1 else self.n_predict_max - self.stats.n_gen

    def has_budget(self) -> bool:
        return self.n_predict_max == -1 or self.n_remaining() > 0

    def handle_last_sampled_token(self, batch) -> None:
        """`server_slot::handle_last_sampled_token`: the sampled token (then the draft, if any) into
        `batch` at the next position, with logits, and into the slot's tokens."""
        pos = self.tokens.pos_next()
        self.i_batch = batch.add(self.sampled, pos, self.id, logits=True)
        for j, t in enumerate(self.spec_draft):
            batch.add(t, pos + 1 + j, self.id, logits=True)
        self.tokens.push_back(self.sampled)
        self.tokens.extend(self.spec_draft)

    def reset(self) -> None:
        """`server_slot::reset` at release: stats zeroed, task moved to task_prev."""
        self.stats = SlotStats()
        self.n_predict_max = -1  # server_slot::reset: an idle slot's n_remain is -1 (/slots next_token)
        self.generated = []
        self.truncated = False
        self.stop = "none"
        self.has_next_token = True
        self.spec_draft = []
        self.i_batch = -1
        if self.sampler is not None:
            self.sampler.close()
            self.sampler = None
        self.task_prev, self.task = self.task, None
