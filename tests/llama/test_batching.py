"""Continuous batching must not change results: the server decodes all slots in one batch.

Measured here: llama.cpp's CPU matmul switches kernels when a batch reaches 8 rows, so logits are
bit-identical between a lone and a shared decode only when both stay on the same side of that line
(the same holds inside llama-server). Both prompts are therefore >= 8 tokens; generation steps are
1 vs 2 rows, both below it."""

import pytest

from slotlab.llama import Context
from tests.conftest import greedy_run

PROMPTS = [
    "The capital of France is a city that",
    "Write a haiku about llamas and caches:\n",
]


@pytest.mark.parametrize("kv_unified", [False, True])
def test_two_slots_in_one_batch_equal_each_alone(model, kv_unified):
    ctx = Context(model, n_ctx=2048, n_parallel=2, kv_unified=kv_unified)
    toks = [model.tokenize(p) for p in PROMPTS]
    assert min(len(t) for t in toks) >= 8
    alone = []
    for s in (0, 1):
        ctx.clear()
        alone.append(greedy_run(ctx, model, {s: toks[s]}, 24)[s])
    ctx.clear()
    together = greedy_run(ctx, model, {0: toks[0], 1: toks[1]}, 24)
    assert together[0] == alone[0]
    assert together[1] == alone[1]
    assert alone[0] != alone[1]  # the two slots really hold different conversations
    # each slot's KV holds exactly its prompt + the decoded generated tokens
    for s in (0, 1):
        assert ctx.seq_pos_min(s) == 0
        assert ctx.seq_pos_max(s) == len(toks[s]) + 24 - 1


def test_decode_returns_raw_code_for_invalid_batch(model):
    """A position gap is an invalid batch: llama_decode's -1 comes back, nothing raises."""
    from slotlab.llama import Batch

    ctx = Context(model, n_ctx=512, n_parallel=1)
    b = Batch(4)
    b.add_seq(model.tokenize("hello"), 0, 0, logits_last=True)
    assert ctx.decode(b) == 0
    b.clear()
    b.add(1234, 100, 0, logits=True)  # continues at 100 although the sequence ends at 1
    assert ctx.decode(b) == -1


def test_decode_reports_a_full_kv_as_retryable(model):
    """More tokens than free cells: code 1 (the server retries with a smaller batch), not an exception."""
    import numpy as np

    from slotlab.llama import Batch

    ctx = Context(model, n_ctx=256, n_parallel=1, swa_full=True)
    b = Batch(256)
    b.add_seq(np.full(200, 1000, dtype=np.int32), 0, 0, logits_last=True)
    assert ctx.decode(b) == 0
    b.clear()
    b.add_seq(np.full(100, 1000, dtype=np.int32), 200, 0, logits_last=True)
    assert ctx.decode(b) == 1
    # a chunk larger than n_batch would be a GGML_ASSERT (process abort) in llama.cpp: refused first
    big = Batch(300)
    big.add_seq(np.full(300, 1000, dtype=np.int32), 0, 0)
    with pytest.raises(ValueError, match="exceeds n_batch"):
        ctx.decode(big)
