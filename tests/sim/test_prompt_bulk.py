"""The simulator's prompt fast path (slotlab/sim/fastforward.py `_advance_prompt`, over
`PaperMemory.advance_steps`) decides nothing the step-by-step engine would not:

* `advance_steps` leaves a paper memory exactly as the same batches decoded one `decode` at a time
  (cells, positions, free cells, stats, the rows a sampler reads), on a plain KV cache (the bulk
  path, unified or not, stopping where the pool is full) and on a sliding-window memory (step by
  step);
* a simulation whose prompts span many `-b` chunks beside generating slots gives, request by request
  and decision by decision, what plain stepping gives, also where a prompt's first token ends the
  request (n_predict 0 / 1, a scripted end-of-generation token, a prompt one token short of the
  context) and where several prompts are processed at once; and on slots that make checkpoints
  (user messages inside long prompts), checkpoint by checkpoint.
No model is loaded (JSON / GGUF-header profiles)."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from slotlab.engine.server_log import decisions
from slotlab.memory.base import Batch
from slotlab.memory.paper import PaperMemory
from slotlab.memory.paper.window import CellCache
from slotlab.memory.profile import ModelProfile
from slotlab.sim.simulate import simulate
from slotlab.sim.speed import SpeedModel
from slotlab.sim.traces import SimRequest, SimTrace

ROOT = Path(__file__).resolve().parents[2]
LLAMA = ModelProfile.from_json(ROOT / "slotlab/sim/profiles/llama-3.1-8b.json")
SPEED = SpeedModel.from_rates(8000, 60)


def _state(mem: PaperMemory, n_seq: int):
    out = []
    for q in range(n_seq):
        p, t = mem.tgt.caches[0].written(q)
        out.append((mem.pos_min(q), mem.pos_max(q), p.tolist(), t.tolist(), mem.state_size(q)))
    for c in mem.tgt.caches:  # a window cache's layout: every cell, the heads, the used counts
        if isinstance(c, CellCache):
            out.append((c.pos.tolist(), c.seq.tolist(), c.tok.tolist(), list(c.head), list(c.used)))
    rows = mem.last_rows()
    last = None if rows is None else [a.tolist() for a in rows]
    return out, last, mem.stats["decode"], mem.stats["decode_tokens"]


def _steps(rng, have: list[int], n_steps: int, gen: list[int], prompt: list[int], chunk: int):
    """Steps with one token per `gen` sequence, then a chunk of each `prompt` sequence."""
    steps, logits = [], []
    for _ in range(n_steps):
        runs = []
        for q in gen:
            runs.append((q, [int(rng.integers(10, 1000))], have[q]))
            have[q] += 1
        for q in prompt:
            n = int(rng.integers(1, chunk))
            runs.append((q, rng.integers(10, 1000, n).astype(np.int32), have[q]))
            have[q] += n
        steps.append(runs)
        logits.append(list(range(len(gen))))
    return steps, logits


@pytest.mark.parametrize("profile, kw, gen, prompt", [
    ("llama", dict(n_ctx=4096, n_slots=3), [0, 2], [1]),  # a stream per sequence: bulk path
    ("llama", dict(n_ctx=2048, n_slots=3, kv_unified=True, n_batch=256, n_ubatch=256), [1], [0, 2]),  # fills up
    ("gemma", dict(n_ctx=4096, n_slots=2), [1], [0]),  # sliding window, a stream per sequence: bulk window path
    ("gemma", dict(n_ctx=2048, n_slots=2), [0], [1]),  # ... where the full half fills up
    ("gpt-oss-20b", dict(n_ctx=8192, n_slots=3), [0, 2], [1]),  # a 128-token window: reuse and purges
    ("gpt-oss-20b", dict(n_ctx=8192, n_slots=3, n_batch=512, n_ubatch=64), [2], [0, 1]),  # many ubatches a step
    ("gemma", dict(n_ctx=4096, n_slots=2, swa_full=True, kv_unified=True), [0], [1]),  # one stream: step by step
])
def test_advance_steps_is_decode_after_decode(profile, kw, gen, prompt):
    prof = {"llama": LLAMA, "gemma": ModelProfile.default()}.get(profile) or \
        ModelProfile.from_json(ROOT / f"slotlab/sim/profiles/{profile}.json")
    rng = np.random.default_rng(7)
    a, b = PaperMemory(prof, **kw), PaperMemory(prof, **kw)
    n_seq = kw["n_slots"]
    have = [0] * n_seq
    # some cells first, the same on both
    warm, wl = _steps(rng, have, 2, gen + prompt, [], 2)
    assert a.advance_steps(warm, wl) == 2
    for runs, want in zip(warm, wl):
        bt = Batch(512)
        for q, t, p0 in runs:
            bt.add_seq(t, p0, q)
        bt.logits[want] = 1
        assert b.decode(bt, 0, bt.n_tokens) == 0
    assert _state(a, n_seq) == _state(b, n_seq)
    steps, logits = _steps(rng, have, 24, gen, prompt, min(150, (a.n_batch - len(gen)) // len(prompt)))
    m = a.advance_steps(steps, logits)
    n_ok = 0
    for runs, want in zip(steps, logits):
        bt = Batch(a.n_batch + 8)
        for q, t, p0 in runs:
            bt.add_seq(t, p0, q)
        bt.logits[want] = 1
        if b.decode(bt, 0, bt.n_tokens) != 0:
            break
        n_ok += 1
    assert m == n_ok and m > 0
    if n_ok < len(steps):  # b also made the refused decode (the caller's plain step makes it)
        b.stats["decode"] -= 1
    assert _state(a, n_seq) == _state(b, n_seq)
    if profile == "llama" or kw["n_ctx"] == 2048:
        assert m < len(steps)  # a stream filled up: the bulk stopped where decode refuses
    # a step that does not continue its sequence: nothing is applied, as decode would refuse it
    bad = [[(gen[0], [11], a.pos_max(gen[0]) + 5)]]
    before = _state(a, n_seq)
    assert a.advance_steps(bad, [[0]]) == 0 and _state(a, n_seq) == before


# ---------------------------------------------------------------------------- whole simulations

def _trace(rng, n_ctx_slot: int, eog: int):
    """Requests arriving in bursts (several prompts start together), prompts of many chunks, and the
    first-token edge cases."""
    base = rng.integers(10, 50_000, 3000).astype(np.int32)
    reqs = []
    for i in range(36):
        n = int(rng.integers(150, 1400))
        toks = np.concatenate([base[:int(rng.integers(0, 900))], rng.integers(10, 50_000, n)]).astype(np.int32)
        n_predict = int(rng.integers(2, 120))
        out = None
        if i % 9 == 1:
            n_predict = int(i % 2)  # 0 or 1: the first token ends it
        if i % 9 == 2:
            out = np.array([eog, 5, 6], dtype=np.int32)  # a scripted end of generation as the first token
        if i % 9 == 3:
            out = rng.integers(10, 50_000, 30).astype(np.int32)
        if i % 9 == 4:
            toks = rng.integers(10, 50_000, n_ctx_slot - 1).astype(np.int32)  # one short of the context
        reqs.append(SimRequest(arrival=float(i // 4) * 1.5, n_prompt=len(toks), n_predict=n_predict, prompt=toks,
                               output=out))
    return SimTrace([], reqs)


def _run(flags, profile, fast, seed):
    msgs, kinds = [], []
    prefilled = {"plain": 0, "bulk": 0}  # prompt tokens decoded by plain steps / by fast-forwards

    def listen(ev):
        if ev.message:
            msgs.append(ev.message)
        kinds.append(ev.kind)
        if ev.kind == "decode":
            prefilled["bulk" if ev.payload._steps is not None else "plain"] += ev.payload.n_prompt

    rng = np.random.default_rng(seed)
    eog = profile.n_vocab - 1
    res = simulate(_trace(rng, 2048, eog), flags, speed=SPEED, profile=profile, fast=fast, listen=listen)
    metrics = {k: v for k, v in res.engine.core.metrics.to_json().items() if k != "prompt_seconds_total"}
    totals = {k: v for k, v in res.totals.items() if k not in ("wall_seconds", "fast_forwards", "fast_forward_steps")}
    slots = [s.tokens.copy().tolist() for s in res.engine.core.slots]
    res.prefilled = prefilled
    return res, decisions(msgs), metrics, totals, slots, kinds


@pytest.mark.parametrize("flags, profile", [
    ("-np 4 -c 8192 -b 256 -ub 128 --cache-ram 64", "llama"),
    ("-np 3 -kvu -c 6144 -b 192 -ub 64 --cache-ram 64", "llama"),  # a shared pool that fills up
    ("-np 3 -c 6144 -b 256 -ub 128 --swa-full --cache-ram 64", "gemma"),  # a sliding-window memory, step by step
])
def test_prompt_fast_path_is_plain_stepping(flags, profile):
    prof = LLAMA if profile == "llama" else ModelProfile.default()
    plain = _run(flags, prof, False, 5)
    fast = _run(flags, prof, True, 5)
    (rp, dp, mp, tp, sp, kp), (rf, df, mf, tf, sf, kf) = plain, fast
    for a, b in zip(rp.results, rf.results):
        assert a == b, f"request {a['i']}: {a} != {b}"
    assert dp == df and mp == mf and tp == tf and sp == sf
    summarized = {"decode", "slot_snapshot", "task_queued", "slot_skip", "slot_decision", "task_deferred",
                  "task_undeferred"}
    assert [k for k in kp if k not in summarized] == [k for k in kf if k not in summarized]
    # most prompt tokens were decoded by the fast path (the first chunk of each prompt is a plain step)
    assert kp.count("prompt_batch") > 100 and rp.prefilled["bulk"] == 0
    assert rf.prefilled["bulk"] > 0.5 * (rf.prefilled["bulk"] + rf.prefilled["plain"])
    statuses = {r["status"] for r in rp.results}
    assert 200 in statuses and any(r["status"] == 200 and r["predicted_n"] <= 1 for r in rp.results)


class _DelimVocab:
    """A paper vocabulary that tokenizes "<n><m>..." (what PaperVocab detokenizes to) into ids, so a
    request's message_delimiters can name token ids."""

    def __init__(self, n_vocab):
        from slotlab.memory.paper import PaperVocab
        self._v = PaperVocab(n_vocab)

    def __getattr__(self, name):
        return getattr(self._v, name)

    def tokenize(self, text, *, add_special=True, parse_special=True):
        return np.array([int(x) for x in text.strip("<>").split("><") if x], dtype=np.int32)


@pytest.mark.parametrize("t_byte", [0.0, 2e-8])  # with a copy cost, the checkpoint's copy moves the clock
def test_prompt_fast_path_with_checkpoints_is_plain_stepping(t_byte):
    """Slots that make checkpoints (Gemma 3's sliding window): their chunks are fast-forwarded only
    where `_process_prompt` decides nothing, so every checkpoint is created (or not) where plain
    stepping creates it: user messages (message_delimiters) start inside long prompts, at and away
    from chunk borders, the last one near the end, and prompts end within n_ubatch of a border. A
    chunk that makes a checkpoint may be a fast-forward's first step (the checkpoint is made on the
    memory before that step's decode, and its copy is charged to that step's time)."""
    prof = ModelProfile.default()
    USER = 7  # the user-message delimiter token
    rng = np.random.default_rng(5)

    def trace():
        reqs = []
        base = rng.integers(10, 50_000, 2000).astype(np.int32)
        for i in range(24):
            n = int(rng.integers(300, 2600))
            toks = np.concatenate([base[:int(rng.integers(0, 1500))], rng.integers(10, 50_000, n)]).astype(np.int32)
            for p in rng.choice(len(toks) - 1, int(rng.integers(0, 6)), replace=False):
                toks[p] = USER
            if i % 4 == 0:
                toks[(len(toks) // 128) * 128] = USER  # at a chunk border
            reqs.append(SimRequest(arrival=float(i // 3) * 2.0, n_prompt=len(toks), n_predict=int(rng.integers(2, 60)),
                                   prompt=toks, fields={"message_delimiters": [{"role": "user", "delimiter": f"<{USER}>"}]}))
        return SimTrace([], reqs)

    def run(fast):
        msgs, kinds, bulk = [], [], [0, 0]
        made = [False]

        def listen(ev):
            if ev.message:
                msgs.append(ev.message)
            kinds.append(ev.kind)
            if ev.kind == "checkpoint_created":
                made[0] = True
            if ev.kind == "decode":
                if ev.payload._steps is not None:
                    bulk[0] += ev.payload.n_prompt
                    bulk[1] += made[0]  # a checkpoint made in a fast-forward's first step
                made[0] = False

        nonlocal rng
        rng = np.random.default_rng(5)
        speed = dataclasses.replace(SPEED, t_byte=t_byte)
        res = simulate(trace(), "-np 3 -c 12288 -b 256 -ub 128 --cache-ram 64", speed=speed, profile=prof,
                       vocab=_DelimVocab(prof.n_vocab), fast=fast, listen=listen)
        return res, msgs, kinds, bulk

    (rp, mp, kp, (bp, cp)), (rf, mf, kf, (bf, cf)) = run(False), run(True)
    for a, b in zip(rp.results, rf.results):
        assert a == b, f"request {a['i']}: {a} != {b}"
    ck = [m for m in mp if "context checkpoint" in m]
    assert ck == [m for m in mf if "context checkpoint" in m] and len(ck) > 30
    assert any("created context checkpoint" in m for m in ck)
    summarized = {"decode", "slot_snapshot", "task_queued", "slot_skip", "slot_decision", "task_deferred",
                  "task_undeferred"}
    assert [k for k in kp if k not in summarized] == [k for k in kf if k not in summarized]
    assert bp == 0 and bf > 0  # the fast run did fast-forward prompt chunks of checkpointing slots
    assert cp == 0 and cf > 5  # and made checkpoints in the first step of fast-forwards
