"""The ideal caches beside a simulation (slotlab.ideal): kvcache-simulator's own figures reproduced,
and slotlab's presentation of them consistent with the simulation it stands beside.

kvcache-simulator 0.1.3 (PyPI, KVCache.AI's hit-rate simulator; a dev dependency) is run here on the
same Mooncake-format traces: the repository's 500-request slice of the Mooncake conversation trace,
the whole trace where ../shared has it, and generated traces of conversations it has never seen
(branching, repeating and interleaved prefixes, prompts cut inside a block and longer than their
blocks). At every capacity, FIFO, LRU and optimal, slotlab's rates computed that tool's way equal the
tool's to 0.1 percentage point (they are equal exactly), and a budget it reports no figure for (the
cache not full by the measured half) is None on both sides."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from slotlab import ideal as I
from slotlab.ideal.policies import run
from slotlab.sim.traces import load_mooncake

kvsim = pytest.importorskip("kvcache_sim", reason="kvcache-simulator is a dev dependency")
from kvcache_sim.plan import build_execution_plan  # noqa: E402
from kvcache_sim.policies import simulate_policy  # noqa: E402
from kvcache_sim.trace import parse_trace_file  # noqa: E402

HERE = Path(__file__).resolve().parent
SLICE = HERE / "data" / "mooncake_conversation_first500.jsonl"
WHOLE = HERE.parents[2] / "shared" / "data" / "mooncake" / "conversation_trace.jsonl"


def generated(path: Path, seed: int, n: int = 400) -> Path:
    """A Mooncake-format trace of `n` requests from conversations that grow, branch, repeat and
    interleave (block ids shared exactly where prefixes are), prompt lengths cut inside blocks."""
    rng = random.Random(seed)
    nxt = [0]

    def new(k):
        ids = list(range(nxt[0], nxt[0] + k))
        nxt[0] += k
        return ids

    convs = []
    lines = []
    for i in range(n):
        r = rng.random()
        if convs and r < 0.55:  # a turn: the conversation grows
            c = rng.choice(convs)
            c.extend(new(rng.randint(1, 4)))
            ids = list(c)
        elif convs and r < 0.7:  # a branch: back to an earlier turn, another continuation
            c = rng.choice(convs)
            ids = c[: rng.randint(1, len(c))] + new(rng.randint(1, 3))
            convs.append(list(ids))
        elif convs and r < 0.8:  # the same prompt again
            ids = list(rng.choice(convs))
        else:  # a new conversation, sometimes on a shared system prompt
            ids = ([0] if rng.random() < 0.5 and nxt[0] else []) + new(rng.randint(1, 6))
            convs.append(list(ids))
        cut = rng.randint(1, 512)
        extra = rng.choice([0, 0, 0, 300, 900])  # tokens past the blocks (slotlab's tail)
        lines.append({"timestamp": i * 100, "input_length": (len(ids) - 1) * 512 + cut + extra,
                      "output_length": rng.randint(1, 50), "hash_ids": ids})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def _traces(tmp_path):
    out = [SLICE, *(generated(tmp_path / f"gen{s}.jsonl", s) for s in range(4))]
    return out


def _theirs(path: Path, cap: int) -> dict:
    plan = build_execution_plan(parse_trace_file(path, block_size=512))
    out = {}
    for p in ("fifo", "lru", "optimal"):
        if cap > plan.unique_blocks:
            out[p] = None
            continue
        r = simulate_policy(plan, p, cap)
        out[p] = 100.0 * r.hitRate if r.measurementMode == "fixed_window" else None
    return out


def _caps(plan):
    n = plan.n_nodes
    return sorted({1, 7, 50, max(1, n // 20), max(1, n // 5), max(1, n // 2), n, n + 5})


def test_kvcache_simulators_rates_reproduced(tmp_path):
    for path in _traces(tmp_path):
        plan = I.kvsim_plan(load_mooncake(path).requests, 512)
        for cap in _caps(plan):
            mine, theirs = I.kvsim_rates(plan, cap), _theirs(path, cap)
            for p in ("fifo", "lru", "optimal"):
                if theirs[p] is None or mine[p] is None:
                    assert mine[p] is None and theirs[p] is None, (path.name, cap, p, mine, theirs)
                else:
                    assert abs(mine[p] - theirs[p]) < 0.1, (path.name, cap, p, mine, theirs)
                    assert mine[p] == pytest.approx(theirs[p], abs=1e-9)


@pytest.mark.skipif(not WHOLE.exists(), reason="the whole Mooncake trace lives in ../shared")
def test_kvcache_simulators_rates_on_the_whole_mooncake_trace():
    plan = I.kvsim_plan(load_mooncake(WHOLE).requests, 512)
    for cap in (256, 4096, 32768):
        mine, theirs = I.kvsim_rates(plan, cap), _theirs(WHOLE, cap)
        assert mine == pytest.approx(theirs, abs=1e-9)


def test_the_tools_sweep_at_a_budget_in_gib(tmp_path):
    """Its command's figures (a model from its catalog, budgets in GiB) at the capacity its bytes per
    block give: the same as slotlab's at that capacity."""
    from kvcache_sim.simulator import run_sweep

    path = generated(tmp_path / "sweep.jsonl", 11, 600)
    data = run_sweep(parse_trace_file(path, block_size=512), model_id="llama-3.1-8b", budgets_gib=[1, 2, 4],
                     policies=["fifo", "lru", "optimal"], backend="python")
    plan = I.kvsim_plan(load_mooncake(path).requests, 512)
    assert data["points"]
    for pt in data["points"]:
        mine = I.kvsim_rates(plan, pt["cacheBlocks"])
        for p, r in pt["results"].items():
            assert mine[p] == pytest.approx(100.0 * r["hitRate"], abs=1e-9), (pt["gib"], p)


def test_slotlabs_bounds_count_what_the_totals_count(tmp_path):
    """Over the requests that succeeded only, never above the prompt tokens; an unlimited budget is the
    infinite cache; a cache of no memory reuses nothing."""
    path = generated(tmp_path / "b.jsonl", 5)
    tr = load_mooncake(path)
    ok = [i % 7 != 3 for i in range(len(tr.requests))]  # some requests failed
    b = I.bounds(tr, ok, 2**30, 131072)
    total = sum(q.n_prompt for q, o in zip(tr.requests, ok) if o)
    d = b.as_json()
    assert d["prompt_tokens"] == total
    for p in ("fifo", "lru", "optimal"):
        assert 0 <= d[p] <= d["infinite"] <= total
    unl = I.bounds(tr, ok, float("inf"), 131072).as_json()
    assert unl["lru"] == unl["fifo"] == unl["optimal"] == unl["infinite"] == d["infinite"]
    assert unl["budget_gib"] is None and unl["capacity_blocks"] == -1
    plan = I.slotlab_plan(tr.requests, 512)
    assert run(plan, "lru", 0, ok).hit_tokens == 0


def test_simulate_puts_the_bounds_beside_its_own_figure():
    """`slotlab simulate --json` on the slice: `bounds` with the memory the flags give, its tokens over
    the totals' requests (never over 100 %), and the infinite bound the same in both places."""
    from slotlab.sim.simulate import simulate
    from slotlab.sim.speed import SpeedModel

    tr = load_mooncake(SLICE, limit=200)
    res = simulate(tr, ["-np", "2", "-c", "65536", "--cache-ram", "2048"], speed=SpeedModel.from_rates(8000, 60),
                   bounds=True)
    t = res.totals
    b = t["bounds"]
    assert set(b) >= {"budget_gib", "infinite", "lru", "fifo", "optimal", "kvcache_simulator"}
    assert set(b["kvcache_simulator"]) == {"fifo", "lru", "optimal"}
    assert b["prompt_tokens"] == t["prompt_tokens"] and b["infinite"] == t["infinite_cache_tokens"]
    assert t["tokens_reused"] <= b["infinite"] <= t["prompt_tokens"]
    bpt = res.engine.memory.profile.bytes_per_token()
    assert b["budget_gib"] == pytest.approx((res.engine.memory.n_ctx * bpt + 2048 * 2**20) / 2**30, abs=1e-6)
    text = "\n".join(res.lines(per_request=False))
    assert "an ideal prefix cache of the same memory" in text and "as kvcache-simulator counts it" in text


def test_the_one_pass_infinite_bound_is_the_infinite_cache_over_the_plan(tmp_path):
    """`infinite_hit_tokens` (what simulate, the fleet and the trace summary count) equals the
    infinite policy walked over `slotlab_plan`, on the traces above, with and without a mask of
    failed requests, and on requests that end inside their block list, carry no ids, have an empty
    prompt, or a block size of 0."""
    from types import SimpleNamespace

    from slotlab.ideal.policies import infinite

    rng = random.Random(7)
    cases = [(load_mooncake(p).requests, 512) for p in _traces(tmp_path)]
    odd = []
    for i in range(300):
        ids = rng.choice([None, [], [0], [0, 1, 2], [0, 1, 3, 4], [5, 6], [0, 1, 2, 7, 8, 9], [0, 10 + i]])
        odd.append(SimpleNamespace(n_prompt=rng.choice([0, 1, 511, 512, 513, 1100, 2600, 5000]), hash_ids=ids))
    cases += [(odd, 512), (odd, 256), (odd, 0)]
    for reqs, block in cases:
        mask = [rng.random() < 0.7 for _ in reqs]
        for m in (None, mask):
            want = infinite(I.slotlab_plan(reqs, block, next_use=False), m)
            assert I.infinite_hit_tokens(reqs, block, m) == (want.hit_tokens, want.total_tokens)
        assert I.infinite_hit_tokens(reqs, block)[0] > 0 or block == 0
