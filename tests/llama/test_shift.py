"""`llama_memory_seq_add`: the KV move behind `--cache-reuse`."""

import numpy as np
import pytest

from slotlab.errors import ShiftNotSupported
from slotlab.llama import Context
from tests.conftest import greedy_run


def test_shift_moves_positions_when_supported(model):
    ctx = Context(model, n_ctx=1024, n_parallel=1, swa_full=True)
    assert ctx.can_shift
    toks = model.tokenize("one two three four five six seven eight nine ten eleven twelve")
    greedy_run(ctx, model, {0: toks}, 0)
    n = len(toks)
    # drop [2, 6) and move [6, n) down by 4, as the cache-reuse chunk loop does
    assert ctx.seq_rm(0, 2, 6)
    ctx.seq_add(0, 6, n, -4)
    assert ctx.seq_pos_min(0) == 0
    assert ctx.seq_pos_max(0) == n - 5
    # the shifted cache is usable: decoding continues at the new end
    out = greedy_run(ctx, model, {0: model.tokenize(" and", add_special=False)}, 4, start={0: n - 4})
    assert len(out[0]) == 4


def test_shift_gives_the_same_continuation_as_a_fresh_prefill(model):
    """After removing a middle chunk and shifting, K is re-roped: the continuation should match a
    fresh prefill of the same tokens (the property cache reuse relies on)."""
    ctx = Context(model, n_ctx=1024, n_parallel=2, swa_full=True)
    a = model.tokenize("The weather today is sunny and warm.")
    junk = model.tokenize(" Unrelated filler words go here now.", add_special=False)
    b = model.tokenize(" Tomorrow it will probably be", add_special=False)
    greedy_run(ctx, model, {0: np.concatenate([a, junk, b])}, 0)
    ctx.seq_rm(0, len(a), len(a) + len(junk))
    ctx.seq_add(0, len(a) + len(junk), -1, -len(junk))
    ctx.seq_rm(0, len(a) + len(b) - 1, -1)  # re-evaluate the last token to get logits
    shifted = greedy_run(ctx, model, {0: b[-1:]}, 8, start={0: len(a) + len(b) - 1})[0]
    fresh = greedy_run(ctx, model, {1: np.concatenate([a, b])}, 8)[1]
    assert np.mean(np.array(shifted) == np.array(fresh)) >= 0.75


def test_shift_refused_without_swa_full(model):
    # the iSWA memory can shift only when its SWA cache is as large as the base cache; with
    # n_ctx 1024 and one sequence it already is (512 window + 512 ubatch), so use a larger context
    ctx = Context(model, n_ctx=4096, n_parallel=1, swa_full=False)
    assert not ctx.can_shift
    with pytest.raises(ShiftNotSupported, match="--swa-full"):
        ctx.seq_add(0, 0, 10, -2)
