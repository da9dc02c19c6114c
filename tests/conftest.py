"""Shared fixtures: one real model per test session (loading it costs ~1.5 s)."""

from __future__ import annotations

import numpy as np
import pytest

from slotlab.llama import Batch, Context, Model, Sampler


@pytest.fixture(scope="session")
def model() -> Model:
    return Model()


@pytest.fixture(scope="module")
def model_of():
    """`model_of(path)`: the GGUF at `path` (a tiny hybrid / recurrent model of tests/models), loaded
    once per test module and closed after it."""
    loaded: dict = {}
    yield lambda path: loaded[path] if path in loaded else loaded.setdefault(path, Model(path))
    for m in loaded.values():
        m.close()


def greedy_run(ctx: Context, model: Model, jobs: dict[int, np.ndarray], n_gen: int, start: dict[int, int] | None = None):
    """Decode every job's prompt (seq -> tokens) in ONE batch, then generate `n_gen` greedy tokens
    per sequence, all sequences in one batch per step. `start[seq]` = position of the first prompt
    token (tokens before it are assumed to be in the KV already). Returns seq -> generated tokens."""
    start = start or {}
    b = Batch(ctx.n_batch)
    samplers = {s: Sampler(model) for s in jobs}
    idx, pos = {}, {}
    for s, toks in jobs.items():
        p0 = start.get(s, 0)
        idx[s] = b.add_seq(toks, p0, s, logits_last=True)
        pos[s] = p0 + len(toks)
    assert ctx.decode(b) == 0
    out = {s: [] for s in jobs}
    for _ in range(n_gen):
        nxt = {s: samplers[s].sample(ctx, idx[s]) for s in jobs}
        b.clear()
        for s, t in nxt.items():
            out[s].append(t)
            idx[s] = b.add(t, pos[s], s, logits=True)
            pos[s] += 1
        assert ctx.decode(b) == 0
    return out
