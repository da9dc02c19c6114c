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

    def on_decode(self, slots, steps: int = 1) -> None:
        """`metrics_post_decode`'s counters for `steps` successful decodes over `slots` as they stand
        (the simulator's fast-forward counts k alike steps at once): decodes, busy slots per decode,
        the most tokens a slot held."""
        self.n_decode_total += steps
        self.n_busy_slots_total += steps * sum(1 for s in slots if s.is_processing)
        self.n_tokens_max = max([self.n_tokens_max] + [len(s.tokens) for s in slots])

    def on_prompt(self, n_prompt: int, seconds: float) -> None:
        """Prompt tokens processed by decodes that took `seconds` (`metrics.add_prompt`)."""
        if n_prompt:
            self.prompt_tokens_total += n_prompt
            self.prompt_seconds_total += seconds

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
