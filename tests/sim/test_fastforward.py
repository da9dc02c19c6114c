"""The fast mode of the simulator (the generation fast-forward, slotlab/sim/fastforward.py, and the
hold-back of requests the server would only defer, simulate._post_order) changes nothing but the wall
time and the events named below: on the
first requests of the Mooncake trace (tests/sim/data/), a simulation with it and one stepping every
token give the same per-request results (slot, cache_n, prompt_n, predicted_n, status, error, queue
wait, TTFT, end), the same sequence of RAM-cache decisions (the server's log texts, as
`slotlab.engine.server_log.decisions` reads them), the same totals and the same `/metrics` counters
(wall-clock timings excepted). No model is loaded (the Llama 3.1 8B JSON profile)."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from slotlab.engine.server_log import decisions
from slotlab.memory.paper import PaperVocab
from slotlab.memory.profile import ModelProfile
from slotlab.sim.simulate import simulate
from slotlab.sim.speed import SpeedModel
from slotlab.sim.traces import SimRequest, SimTrace, load_mooncake

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data" / "mooncake_conversation_first500.jsonl"
PROFILE = ModelProfile.from_json(ROOT / "slotlab/sim/profiles/llama-3.1-8b.json")
SPEED = SpeedModel.from_rates(8000, 60)
# state copies and attention that cost time (SPEED charges neither): where the fast-forward charges
# a copy or a step's depth, its clock must be the plain one
COSTLY = dataclasses.replace(SPEED, t_byte=2e-9, t_ctx=3e-9, t_kv=5e-8)
WALL = {"wall_seconds", "fast_forwards", "fast_forward_steps"}
WALL_METRICS = {"prompt_seconds_total"}


def _run(trace_fn, flags, fast, profile=PROFILE, speed=SPEED):
    msgs, kinds = [], []

    def listen(ev):
        if ev.message:
            msgs.append(ev.message)
        kinds.append(ev.kind)

    res = simulate(trace_fn(), flags, speed=speed, profile=profile, fast=fast, listen=listen)
    metrics = {k: v for k, v in res.engine.core.metrics.to_json().items() if k not in WALL_METRICS}
    totals = {k: v for k, v in res.totals.items() if k not in WALL}
    slots = [(len(s.tokens), s.tokens.copy().tolist()) for s in res.engine.core.slots]
    return res, decisions(msgs), metrics, totals, slots, kinds


def _compare(trace_fn, flags, profile=PROFILE, speed=SPEED):
    plain = _run(trace_fn, flags, fast=False, profile=profile, speed=speed)
    fast = _run(trace_fn, flags, fast=True, profile=profile, speed=speed)
    (rp, dp, mp, tp, sp, kp), (rf, df, mf, tf, sf, kf) = plain, fast
    assert rf.totals["fast_forward_steps"] > 0.5 * rf.totals["n_steps"]  # it did fast-forward most steps
    assert len(rp.results) == len(rf.results)
    for a, b in zip(rp.results, rf.results):
        assert a == b, f"request {a['i']}: {a} != {b}"
    assert len(dp) > 20
    for i, (a, b) in enumerate(zip(dp, df)):
        assert a == b, f"decision {i}: {a} != {b}"
    assert len(dp) == len(df)
    assert mp == mf and tp == tf and sp == sf
    # the event stream differs only in decode / slot_snapshot events (summarized by a fast-forward) and
    # in the deferral passes of requests that arrived while every slot was busy (held back, not posted)
    summarized = {"decode", "slot_snapshot", "task_queued", "slot_skip", "slot_decision", "task_deferred",
                  "task_undeferred"}
    assert [k for k in kp if k not in summarized] == [k for k in kf if k not in summarized]
    return rp, rf


@pytest.mark.parametrize("flags", ["-np 4 --cache-ram 8192", "-np 2 -kvu -c 65536 --cache-ram 4096"])
def test_fast_forward_is_plain_stepping_on_mooncake(flags):
    """300 Mooncake requests, including a unified KV pool small enough to fill (purges, retries)."""
    rp, _ = _compare(lambda: load_mooncake(DATA, limit=300), flags)
    assert sum(r["status"] == 200 for r in rp.results) > 200


@pytest.mark.parametrize("name, flags", [
    ("default", "-np 4 --cache-ram 8192"),  # Gemma 3 270M's header: iSWA, a 1024-cell window cache a slot
    ("gpt-oss-20b", "-np 2 --cache-ram 2048"),  # a 128-token window
    ("qwen3.5-27b", "-np 4 --cache-ram 8192"),  # hybrid (M-RoPE attention, delta-net recurrent layers)
    ("granite-4.0-h-small", "-np 2 -kvu --cache-ram 4096"),  # hybrid (Mamba-2), a unified pool
])
def test_fast_forward_is_plain_stepping_on_every_memory_kind(name, flags):
    """The same comparison on a sliding-window and on hybrid memories (their generation is applied
    in bulk by PaperContext.advance_tokens, their prompts chunk by chunk)."""
    prof = ModelProfile.default() if name == "default" else ModelProfile.from_json(ROOT / f"slotlab/sim/profiles/{name}.json")
    hi = min(120_000, PaperVocab(prof.n_vocab).gen_lo)  # as `slotlab simulate` keeps the ids in the vocabulary
    rp, _ = _compare(lambda: load_mooncake(DATA, limit=120, hi=hi), flags, profile=prof)
    assert sum(r["status"] == 200 for r in rp.results) > 40


def test_fast_forward_under_kv_pressure_and_limits():
    """A unified pool that runs out while slots generate (decode would return 1: purges / batch
    halving happen in plain steps), requests that stop at the context limit, and scripted outputs."""
    rng = np.random.default_rng(3)
    base = np.arange(10, 3010, dtype=np.int32)

    def trace():
        reqs = []
        for i in range(40):
            n = int(rng.integers(200, 2500))
            toks = np.concatenate([base[:int(rng.integers(0, 2000))], rng.integers(10, 100_000, n)]).astype(np.int32)
            out = rng.integers(10, 100_000, int(rng.integers(0, 40))).astype(np.int32) if i % 3 == 0 else None
            reqs.append(SimRequest(arrival=float(i) * 0.7, n_prompt=len(toks), n_predict=int(rng.integers(1, 900)),
                                   prompt=toks, output=out))
        return SimTrace([], reqs)

    flags = "-np 3 -kvu -c 6144 --cache-ram 256"
    state = rng.bit_generator.state
    plain = _run(trace, flags, fast=False)
    rng.bit_generator.state = state
    fast = _run(trace, flags, fast=True)
    assert plain[0].results == fast[0].results
    assert plain[1] == fast[1] and plain[2] == fast[2] and plain[3] == fast[3] and plain[4] == fast[4]
    kinds = [d[0] for d in plain[1]]
    assert "purge" in kinds or "decode_retry" in kinds  # the pool did run out
    assert fast[0].totals["fast_forward_steps"] > 0


def test_a_mooncake_prompts_tail_without_making_it():
    """`SimRequest.tail()` (where the precomputed placeholders start) is the made prompt's last token
    and length, for every request of the slice (blocks cut short, prompts longer than their blocks)."""
    tr = load_mooncake(DATA, limit=500)
    for q in tr.requests:
        t = q.tokens()
        assert q.tail() == (int(t[-1]), len(t))
    assert SimRequest(arrival=0.0, n_prompt=3, n_predict=4, prompt=np.array([5, 6, 7], np.int32)).tail() == (7, 3)
    assert SimRequest(arrival=0.0, n_prompt=0, n_predict=4, prompt="text").tail() is None


def test_precomputed_placeholders_are_used_only_where_provable():
    """`Prechains` gives request i's chain only for the prompt it was computed from (last token and
    length), and the fast-forward only where the slot's token at the position is the chain's: any
    other start is refused (None), so the caller computes it token by token."""
    from slotlab.sim.fastforward import FastForward, Prechains

    v = PaperVocab(PROFILE.n_vocab)
    tr = load_mooncake(DATA, limit=20)
    pre = Prechains(v, tr.requests, lambda q: (*q.tail(), q.n_predict), block=8)
    q = tr.requests[11]
    last, n = q.tail()
    g = pre.get(11, 3, last, n)
    assert g.tolist() == v.chain(last, n - 1, 3, q.n_predict)
    assert pre.get(11, 3, last + 1, n) is None and pre.get(11, 3, last, n + 1) is None and pre.get(99, 3, last, n) is None

    class Task:
        id, done, n_tokens = 5, False, n
        tokens = q.tokens()

    ff = FastForward.__new__(FastForward)
    ff.pre, ff.index_of, ff._pre = pre, lambda task: 11, {}
    assert ff._prechain(Task, last, n - 1, 3, 4) == g[:4].tolist()  # the first tokens, after the prompt
    assert ff._prechain(Task, int(g[9]), n + 9, 3, 5) == g[10:15].tolist()  # mid-way: token at its position
    assert ff._prechain(Task, int(g[9]) ^ 1, n + 9, 3, 5) is None  # another token there
    assert ff._prechain(Task, int(g[9]), n + 10, 3, 5) is None  # ... or at another position (a shift)
    assert ff._prechain(Task, int(g[9]), n + 9, 4, 5) is None  # another seed
    assert ff._prechain(Task, int(g[-2]), n + len(g) - 2, 3, 5) is None  # past n_predict


def test_most_requests_need_no_plain_step():
    """The fast-forward covers the step that ends a slot (beside generation only) and the step that
    starts a prompt (the core's own start, then the chunks): on the Mooncake slice a plain step is left
    for fewer than one request in three (120 for 500: where two prompts start or end in one step, or
    a slot ends beside a prompt), not the one a request for its start that it once was."""
    res = simulate(load_mooncake(DATA), "-np 4 --cache-ram 8192", speed=SPEED, profile=PROFILE, hindsight=False)
    t = res.totals
    assert t["n_steps"] - t["fast_forward_steps"] < 0.33 * t["n_requests"]


def test_starts_that_fail_shift_or_restore_inside_a_fast_forward():
    """The starts the fast-forward now runs, in every outcome, beside generating slots: prompts longer
    than a slot's context (the start ends the task with an error), prompts the RAM cache or the slot
    holds in part (state copied at launch, charged to the step), `--cache-reuse` shifting cached
    chunks into place, and on a sliding-window model checkpoints restored at the start. Fast and
    plain stepping agree on every request, decision and event."""
    def trace():
        rng = np.random.default_rng(21)
        base = rng.integers(10, 100_000, 3000).astype(np.int32)
        reqs = []
        for i in range(36):
            kind = i % 4
            if kind == 0:  # longer than a slot's context (-c 12288 over 3 slots: 4096 each)
                toks = rng.integers(10, 100_000, int(rng.integers(4100, 4600))).astype(np.int32)
            elif kind == 1:  # a shared prefix, then new tokens: the cache and the slots hold part of it
                toks = np.concatenate([base[:int(rng.integers(500, 3000))], rng.integers(10, 100_000, 200)])
            elif kind == 2:  # the prefix with a chunk cut out of it: --cache-reuse shifts the rest
                a = int(rng.integers(100, 600))
                toks = np.concatenate([base[:a], base[a + 300:2800], rng.integers(10, 100_000, 50)])
            else:
                toks = rng.integers(10, 100_000, int(rng.integers(100, 1500)))
            reqs.append(SimRequest(arrival=float(i) * 0.4, n_prompt=len(toks), n_predict=int(rng.integers(20, 300)),
                                   prompt=toks.astype(np.int32)))
        return SimTrace([], reqs)

    for prof, flags, shown in ((PROFILE, "-np 3 -c 12288 --cache-ram 4096 --cache-reuse 64", ("cache_reuse_shift", "cache_load_found")),
                               (ModelProfile.default(), "-np 3 -c 12288 --cache-ram 1024", ("checkpoint_restored",))):
        rp, rf = _compare(trace, flags, profile=prof, speed=COSTLY)
        assert sum(r["status"] != 200 for r in rp.results) >= 5  # the over-long prompts failed at their start
        assert sum(r["cache_n"] > 0 for r in rp.results if r["status"] == 200) >= 5
        assert rf.totals["n_steps"] - rf.totals["fast_forward_steps"] < len(rp.results) / 3
        kinds = set(_run(trace, flags, fast=True, profile=prof)[5])
        assert set(shown) <= kinds, set(shown) - kinds


def test_requests_deferred_before_the_step_that_frees_slots():
    """Two slots finish in the same step, which a fast-forward covers, while requests that arrived
    during the generation wait: the server deferred each when it arrived (every slot busy), so they
    come back newest first, ahead of anything arriving during that last step. Fast and plain stepping
    give every request the same slot (issue 33: the fast-forwarded final step once posted them as new
    arrivals, oldest first, and swapped their slots)."""
    def trace(seed):
        rng = np.random.default_rng(seed)
        reqs = []
        for i, (t, n_out) in enumerate([(0.0, 60), (0.0, 60), (0.1, 40), (0.3, 40), (0.5, 30), (2.5, 20),
                                        (2.6, 20), (2.7, 20), (2.8, 20)]):
            toks = rng.integers(10, 100_000, 300 if i < 2 else int(rng.integers(100, 900))).astype(np.int32)
            reqs.append(SimRequest(arrival=t, n_prompt=len(toks), n_predict=n_out, prompt=toks))
        return SimTrace(flags=[], requests=reqs)

    for seed in (11, 12, 13):
        rp, rf = _compare(lambda: trace(seed), "-np 2 -c 8192")
        assert [r["id_slot"] for r in rp.results] == [r["id_slot"] for r in rf.results]
