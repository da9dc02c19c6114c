"""Greedy draft-then-verify speculative decoding with a draft model (`-md`, `--draft-max`,
`--draft-min`), so the draft context and its ledger (RAM-cache `drft` bytes, checkpoint `data_dft`,
the SDFT slot-file appendix) are really exercised.

A simplification of llama-server's `draft-simple` implementation (common/speculative.cpp), named
after it: the draft context decodes every batch the target decodes (`process`), drafts up to
`n_draft_max` tokens greedily from the last sampled token (`draft`), the target verifies them in its
next batch and keeps the longest matching prefix plus one token of its own (`verify`). With greedy
target sampling the output equals plain decoding. Not modelled: p_min cut-off, EAGLE/MTP types."""

from __future__ import annotations

from typing import Callable

from slotlab.engine import event_types as T
from slotlab.engine.emit import Emitter
from slotlab.memory import Memory, require_seq_rm


class Speculative:
    def __init__(self, memory: Memory, emit: Emitter, n_max: int, n_min: int):
        self.memory, self.emit = memory, emit
        self.n_max, self.n_min = n_max, n_min

    def n_draft_max(self, slot) -> int:
        """`get_n_draft_max`: leave room for the sampled token and one more; respect n_predict."""
        n = min(self.n_max, slot.n_ctx - len(slot.tokens) - 2)
        if slot.n_remaining() > 0:
            n = min(n, slot.n_remaining() - 1)
        return n

    def draft(self, slot) -> list[int]:
        """Draft tokens after `slot.sampled` (the draft KV keeps none of them: the verify batch
        re-decodes them on both contexts)."""
        n_max = self.n_draft_max(slot)
        if n_max < max(1, self.n_min):
            return []
        out = self.memory.draft(slot.id, slot.sampled, slot.tokens.pos_next(), n_max)
        if len(out) < self.n_min:
            out = []
        if out:
            self.emit(T.SpecDraft(n_draft=len(out)), f"drafted {len(out)} tokens", level="DBG", slot=slot)
        return out

    def process(self, batch, off: int, n: int) -> int:
        """The draft context decodes the same chunk the target just decoded (llama_decode's code)."""
        return self.memory.decode_draft(batch, off, n)

    def verify(self, slot, off: int, accept: Callable[[object, int], bool]) -> tuple[int, int]:
        """Sample along the verified positions (`accept(slot, token)` takes each sampled token and
        says whether generation goes on); keep the matching prefix; drop the rest from both KVs.
        Returns (drafted, accepted)."""
        draft = slot.spec_draft
        p0 = slot.tokens.pos_next() - 1 - len(draft)  # position of slot.sampled in this batch
        m = 0
        for j in range(len(draft) + 1):
            tok = slot.sampler.sample(slot.i_batch - off + j)
            m += 1
            if not accept(slot, tok):
                break
            if j < len(draft) and tok == draft[j]:
                continue
            break
        accepted = m - 1  # every sampled token but the last matched its draft
        slot.stats.n_draft_tokens += len(draft)
        slot.stats.n_draft_accepted += accepted
        keep = p0 + m
        if keep < len(slot.tokens):
            require_seq_rm(self.memory, slot.id, keep, -1)
            slot.tokens.keep_first(keep)
        self.emit(T.SpecVerify(n_draft=len(draft), n_accepted=accepted),
                  f"accepted {accepted}/{len(draft)} draft tokens", level="DBG", slot=slot)
        slot.spec_draft = []
        slot.i_batch = -1
        return len(draft), accepted
