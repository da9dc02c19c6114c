"""Counters equal to llama-server's `/metrics` (spec 8.2)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class Metrics:
    prompt_tokens_total: int = 0  # processed prompt tokens, excluding cached ones
    prompt_tokens_cached_total: int = 0  # Σ final n_past of launched tasks
    prompt_seconds_total: float = 0.0
    tokens_predicted_total: int = 0
    n_decode_total: int = 0
    n_busy_slots_total: int = 0
    n_tokens_max: int = 0
    n_requests_done: int = 0
    spec_draft_tokens_total: int = 0  # spec_decode_num_draft_tokens_total
    spec_accepted_tokens_total: int = 0  # spec_decode_num_accepted_tokens_total

    def on_final(self, slot) -> None:
        self.n_requests_done += 1

    @property
    def hit_rate(self) -> float:
        tot = self.prompt_tokens_cached_total + self.prompt_tokens_total
        return self.prompt_tokens_cached_total / tot if tot else 0.0

    def to_json(self) -> dict:
        d = asdict(self)
        d["hit_rate"] = self.hit_rate
        return d
