"""Greedy draft-then-verify speculative decoding with a draft model (`-md`, `--draft-max`,
`--draft-min`), so the draft context and its ledger (RAM-cache `drft` bytes, checkpoint `data_dft`,
the SDFT slot-file appendix) are really exercised.

A simplification of llama-server's `draft-simple` implementation (common/speculative.cpp), named
after it: the draft context decodes every batch the target decodes (`process`), drafts up to
`n_draft_max` tokens greedily from the last sampled token (`draft`), the target verifies them in its
next batch and keeps the longest matching prefix plus one token of its own (`verify`). With greedy
target sampling the output equals plain decoding. Not modelled: p_min cut-off, EAGLE/MTP types."""

from __future__ import annotations

from slotlab.llama import Batch, Sampler


class Speculative:
    def __init__(self, engine):
        self.engine = engine
        self.dctx = engine.dctx
        p = engine.params
        self.n_max, self.n_min = p.draft_max, p.draft_min
        self.batch = Batch(max(len(engine.slots), 1))
        self.samplers = [Sampler(engine.backend.dmodel) for _ in engine.slots]

    def n_draft_max(self, slot) -> int:
        """`get_n_draft_max`: leave room for the sampled token and one more; respect n_predict."""
        n = min(self.n_max, slot.n_ctx - len(slot.tokens) - 2)
        if slot.n_remaining() > 0:
            n = min(n, slot.n_remaining() - 1)
        return n

    def draft(self, slot) -> list[int]:
        """Draft tokens after `slot.sampled`, then drop them from the draft KV again: the verify batch
        re-decodes them on both contexts."""
        n_max = self.n_draft_max(slot)
        if n_max < max(1, self.n_min):
            return []
        e, b, pos = self.engine, self.batch, slot.tokens.pos_next()
        smpl = self.samplers[slot.id]
        out: list[int] = []
        b.clear()
        b.add(slot.sampled, pos, slot.id, logits=True)
        if self.dctx.decode(b) == 0:
            while len(out) < n_max:
                t = smpl.sample(self.dctx, 0)
                out.append(t)
                if len(out) == n_max:
                    break
                b.clear()
                b.add(t, pos + len(out), slot.id, logits=True)
                if self.dctx.decode(b) != 0:
                    break
        self.dctx.seq_rm(slot.id, pos, -1)
        if len(out) < self.n_min:
            out = []
        if out:
            e._emit("spec_draft", f"drafted {len(out)} tokens", level="DBG", slot=slot, n_draft=len(out))
        return out

    def process(self, off: int, n: int) -> bool:
        """The draft context decodes the same chunk the target just decoded."""
        return self.dctx.decode(self.engine.batch, off, n) == 0

    def verify(self, slot, off: int) -> None:
        """Sample along the verified positions; keep the matching prefix; drop the rest from both KVs."""
        e = self.engine
        draft = slot.spec_draft
        p0 = slot.tokens.pos_next() - 1 - len(draft)  # position of slot.sampled in this batch
        m = 0
        for j in range(len(draft) + 1):
            tok = slot.sampler.sample(e.ctx, slot.i_batch - off + j)
            m += 1
            e._on_sampled(slot, tok)
            if not e.process_token(slot, tok):
                break
            if j < len(draft) and tok == draft[j]:
                continue
            break
        accepted = m - 1  # every sampled token but the last matched its draft
        slot.stats.n_draft_tokens += len(draft)
        slot.stats.n_draft_accepted += accepted
        e.metrics.spec_draft_tokens_total += len(draft)
        e.metrics.spec_accepted_tokens_total += accepted
        keep = p0 + m
        if keep < len(slot.tokens):
            e.seq_rm(slot, keep, -1)
            slot.tokens.keep_first(keep)
        e._emit("spec_verify", f"accepted {accepted}/{len(draft)} draft tokens", level="DBG", slot=slot,
                n_draft=len(draft), n_accepted=accepted)
        slot.spec_draft = []
        slot.i_batch = -1
