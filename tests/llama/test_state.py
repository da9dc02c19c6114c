"""Sequence state blobs and files: what the RAM cache and slot files are made of."""

import numpy as np
import pytest

from slotlab.llama import STATE_SEQ_FLAGS_NONE, STATE_SEQ_FLAGS_PARTIAL_ONLY, Context
from tests.conftest import greedy_run

N_GEN = 12


def _prompt(model, n_tokens: int) -> np.ndarray:
    text = " ".join(f"Fact {i}: the llama number {i} likes caches and slots." for i in range(n_tokens // 8 + 2))
    toks = model.tokenize(text)[:n_tokens]
    assert len(toks) == n_tokens
    return toks


@pytest.mark.parametrize("swa_full", [False, True])
@pytest.mark.parametrize("n_prompt", [200, 700])  # below and above Gemma 3's 512-token sliding window
def test_state_round_trip_into_another_slot(model, swa_full, n_prompt):
    ctx = Context(model, n_ctx=2048, n_parallel=2, swa_full=swa_full)
    toks = _prompt(model, n_prompt)
    head, last = toks[:-1], toks[-1:]

    # uninterrupted: the whole prompt, then greedy generation
    want = greedy_run(ctx, model, {0: toks}, N_GEN)[0]

    # interrupted: all but the last token in slot 0, state out, clear, state into slot 1, continue
    ctx.clear()
    greedy_run(ctx, model, {0: head}, 0)
    blob = ctx.state_seq_get(0).copy()
    assert len(blob) == ctx.state_seq_size(0) > 0
    ctx.clear()
    assert ctx.seq_pos_max(0) == -1
    assert ctx.state_seq_set(blob, 1) == len(blob)
    assert ctx.seq_pos_max(1) == n_prompt - 2
    if not swa_full and n_prompt > model.n_swa:
        # without --swa-full only the window survives in the SWA layers: this is why the server
        # cannot truncate such a slot and needs checkpoints
        assert ctx.seq_pos_min(1) > 0
    got = greedy_run(ctx, model, {1: last}, N_GEN, start={1: n_prompt - 1})[1]
    assert got == want


def test_partial_only_is_the_swa_part(model):
    ctx = Context(model, n_ctx=2048, n_parallel=1, swa_full=False)
    greedy_run(ctx, model, {0: _prompt(model, 300)}, 0)
    full = ctx.state_seq_size(0, STATE_SEQ_FLAGS_NONE)
    part = ctx.state_seq_size(0, STATE_SEQ_FLAGS_PARTIAL_ONLY)
    assert 0 < part < full  # 15 of 18 layers are SWA layers


def test_failed_restore_returns_zero_and_leaves_seq_empty(model):
    ctx = Context(model, n_ctx=1024, n_parallel=2)
    greedy_run(ctx, model, {0: _prompt(model, 64)}, 0)
    blob = ctx.state_seq_get(0).copy()
    assert ctx.state_seq_set(blob[: len(blob) // 2], 1) == 0  # truncated blob
    assert ctx.seq_pos_max(1) == -1


def test_state_file_round_trip(model, tmp_path):
    ctx = Context(model, n_ctx=1024, n_parallel=2)
    toks = _prompt(model, 100)
    want = greedy_run(ctx, model, {0: toks}, N_GEN)[0]
    ctx.clear()
    greedy_run(ctx, model, {0: toks[:-1]}, 0)
    path = tmp_path / "slot0.bin"
    written = ctx.state_seq_save_file(path, 0, toks[:-1])
    assert written == path.stat().st_size > 0
    ctx.clear()
    n_read, payload = ctx.state_seq_load_file(path, 1)
    assert n_read == written
    assert payload.tolist() == toks[:-1].tolist()
    got = greedy_run(ctx, model, {1: toks[-1:]}, N_GEN, start={1: len(toks) - 1})[1]
    assert got == want


def test_state_file_from_other_layout_is_refused(model, tmp_path):
    """A unified-KV file cannot load into a non-unified context (n_stream mismatch): 0, not a crash."""
    uni = Context(model, n_ctx=1024, n_parallel=2, kv_unified=True)
    greedy_run(uni, model, {0: _prompt(model, 40)}, 0)
    path = tmp_path / "uni.bin"
    assert uni.state_seq_save_file(path, 0, np.arange(40, dtype=np.int32)) > 0
    per_seq = Context(model, n_ctx=1024, n_parallel=2, kv_unified=False)
    assert per_seq.state_seq_load_file(path, 0)[0] == 0
    assert per_seq.state_seq_load_file(tmp_path / "missing.bin", 0)[0] == 0
