"""Sizes and capabilities reported as the server computes them (spec 4.2, 6.4)."""

import pytest

from slotlab.engine.backend import load
from slotlab.engine.params import ServerParams
from slotlab.llama import Context, Sampler, SeqRmType
from tests.conftest import greedy_run


@pytest.mark.parametrize(
    "n_ctx,n_parallel,unified,want_ctx,want_seq",
    [
        (4096, 4, True, 4096, 4096),
        (4000, 4, True, 4096, 4096),  # padded up to 256
        (8192, 3, False, 8448, 2816),  # spec 6.4's example: "rounding down" that rounds up
        (4096, 2, False, 4096, 2048),
    ],
)
def test_context_sizes_follow_the_library(model, n_ctx, n_parallel, unified, want_ctx, want_seq):
    ctx = Context(model, n_ctx=n_ctx, n_parallel=n_parallel, kv_unified=unified)
    assert (ctx.n_ctx, ctx.n_ctx_seq, ctx.n_seq_max) == (want_ctx, want_seq, n_parallel)
    assert ctx.n_ctx_slot() == want_seq
    assert ctx.n_ctx_slot(kv_unified_per_slot=1000) == min(want_seq, 1000)


def test_server_defaults_resolve_like_llama_server(model):
    b = load(ServerParams(n_ctx=8192), model=model)
    assert b.ctx.n_seq_max == 4 and b.ctx.kv_unified  # auto -np: 4 slots, unified
    assert b.n_ctx_slot == 8192
    assert b.ctx.n_swa == 512 and not b.ctx.can_shift and b.needs_checkpoints
    b2 = load(ServerParams.from_args("-np 2 -c 4096 --swa-full"), model=model)
    assert not b2.ctx.kv_unified and b2.ctx.n_swa == 0 and b2.ctx.can_shift and not b2.needs_checkpoints
    b3 = load(ServerParams.from_args("-np 2 --kv-unified-per-slot 1024"), model=model)
    assert b3.ctx.n_ctx == 2048 and b3.n_ctx_slot == 1024  # pool sized n_parallel * per_slot


def test_seq_rm_probe_and_context_is_clean_afterwards(model):
    ctx = Context(model, n_ctx=1024, n_parallel=2)
    assert ctx.seq_rm_type is SeqRmType.PART
    assert ctx.seq_pos_max(0) == -1  # the probe cleared what it decoded
    # PART: a suffix can be removed
    greedy_run(ctx, model, {0: model.tokenize("a b c d e f g h i j")}, 0)
    assert ctx.seq_rm(0, 5, -1) and ctx.seq_pos_max(0) == 4


def test_seeded_sampling_is_reproducible(model):
    ctx = Context(model, n_ctx=1024, n_parallel=1)
    toks = model.tokenize("Once upon a time in a land of llamas,")

    def run(seed):
        ctx.clear()
        s = Sampler(model, temperature=1.0, seed=seed)
        from slotlab.llama import Batch

        b = Batch(64)
        i = b.add_seq(toks, 0, 0, logits_last=True)
        assert ctx.decode(b) == 0
        out, pos = [], len(toks)
        for _ in range(16):
            t = s.sample(ctx, i)
            out.append(t)
            b.clear()
            i = b.add(t, pos, 0, logits=True)
            pos += 1
            assert ctx.decode(b) == 0
        return out

    a, b_, c = run(42), run(42), run(7)
    assert a == b_
    assert a != c


def test_ignore_eos_never_samples_an_end_token(model):
    from slotlab.llama.sampling import _eog_tokens

    assert set(_eog_tokens(model)) >= {1, 106}
    ctx = Context(model, n_ctx=1024, n_parallel=1)
    s = Sampler(model, ignore_eos=True)
    from slotlab.llama import Batch

    b = Batch(64)
    i = b.add_seq(model.tokenize("<start_of_turn>user\nSay hi<end_of_turn>\n<start_of_turn>model\nHi!"), 0, 0, logits_last=True)
    assert ctx.decode(b) == 0
    assert not model.is_eog(s.sample(ctx, i))
