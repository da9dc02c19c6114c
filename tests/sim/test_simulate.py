"""slotlab simulate on the paper memory: no model loaded (the 8B JSON profile, Mooncake-style requests)."""

import json

import numpy as np

from slotlab.memory.profile import ModelProfile
from slotlab.sim.simulate import simulate
from slotlab.sim.speed import SpeedModel
from slotlab.sim.traces import SimRequest, SimTrace, block_tokens, infinite_cache_bound, load_mooncake

PROFILE = ModelProfile.from_json(__import__("pathlib").Path(__file__).resolve().parents[2]
                                 / "slotlab/sim/profiles/llama-3.1-8b.json")


def _mooncake(tmp_path, rows):
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return load_mooncake(p)


def test_block_tokens_are_prefix_ids():
    a, b = block_tokens(7, 512, 10, 1000), block_tokens(8, 512, 10, 1000)
    assert (a == block_tokens(7, 512, 10, 1000)).all() and (a != b).mean() > 0.9
    assert a.min() >= 10 and a.max() < 1000


def test_speed_model_rates():
    sp = SpeedModel.from_rates(8000, 50)
    assert abs(sp.gen_rate(1) - 50) < 1e-6 and abs(sp.prefill_rate(512 * 8) - 8000) < 1e-3
    assert sp.gen_rate(8) * 8 > 7 * 50  # batching pays


def test_simulate_reuses_shared_prefixes_and_keeps_time(tmp_path):
    rows = [{"timestamp": 0, "input_length": 1500, "output_length": 20, "hash_ids": [0, 1, 2]},
            {"timestamp": 0, "input_length": 1400, "output_length": 20, "hash_ids": [0, 1, 3]},
            {"timestamp": 60000, "input_length": 2000, "output_length": 10, "hash_ids": [0, 1, 2, 4]},
            {"timestamp": 60000, "input_length": 900, "output_length": 5, "hash_ids": [5, 6]}]
    tr = _mooncake(tmp_path, rows)
    assert infinite_cache_bound(tr) == (1024 + 1536, 5800)
    sp = SpeedModel.from_rates(1000, 20)
    res = simulate(tr, "-np 1 -c 8192 --cache-ram 4096", speed=sp, profile=PROFILE)
    r = res.results
    assert [x["status"] for x in r] == [200] * 4
    assert r[1]["cache_n"] == 1024 and r[2]["cache_n"] >= 1024  # shared blocks reused
    assert r[1]["queue_wait"] > 1.0  # one slot: the second request waits for the first
    assert r[2]["arrival"] == 60.0 and r[2]["ttft"] < 5  # the clock jumped to the arrival
    t = res.totals
    assert t["tokens_reused"] == sum(x["cache_n"] for x in r) and t["tokens_prefilled"] + t["tokens_reused"] == 5800
    assert t["peak_cache_bytes"] > 0 and t["sim_seconds"] > 60


def test_simulate_scripted_outputs_and_concurrency():
    toks = np.arange(10, 1010, dtype=np.int32)
    reqs = [SimRequest(0.0, 1000, 4, prompt=toks, output=np.array([5, 6, 7, 8], np.int32)),
            SimRequest(0.0, 1000, 4, prompt=np.concatenate([toks, [5, 6, 7, 8, 11]]).astype(np.int32))]
    res = simulate(SimTrace([], reqs), "-np 2 -c 8192", speed=SpeedModel.from_rates(1000, 20), profile=PROFILE)
    a, b = res.results
    assert {a["id_slot"], b["id_slot"]} == {0, 1}  # concurrent: both slots
    assert a["queue_wait"] == 0 and b["queue_wait"] == 0


def test_peak_cache_bytes_stay_within_cache_ram():
    """The server never holds more than --cache-ram in its RAM cache: `alloc` evicts to make room
    (freeing the entries, `states.pop_front()`) before it allocates the new entry. The paper
    allocator bound to the cache counts it that way; unbound, it counted the evicted entries that
    `PromptCache.alloc` still references in a local list at that moment (the old 11.6 GiB at 8 GiB)."""
    from pathlib import Path

    data = Path(__file__).resolve().parent / "data" / "mooncake_conversation_first500.jsonl"
    res = simulate(load_mooncake(data, limit=60), "-np 2 --cache-ram 1024", speed=SpeedModel.from_rates(8000, 60),
                   profile=PROFILE)
    t = res.totals
    assert t["evictions"].get("make_room", 0) > 5
    assert 900 * 2**20 < t["peak_cache_bytes"] <= 1024 * 2**20


def test_simulate_raises_the_gc_threshold_only_while_it_runs(tmp_path):
    """simulate() runs with fewer cycle-collector passes (speed) and restores the threshold after,
    also when it raises."""
    import gc

    import pytest

    from slotlab.sim import simulate as S

    rows = [{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}]
    before = gc.get_threshold()
    seen = []
    simulate(_mooncake(tmp_path, rows), "-np 1 -c 4096", speed=SpeedModel.from_rates(1000, 20), profile=PROFILE,
             listen=lambda ev: seen.append(gc.get_threshold()))
    assert seen and all(t[0] == max(before[0], S.GC_GEN0_THRESHOLD) and t[1:] == before[1:] for t in seen)
    assert gc.get_threshold() == before

    def boom(ev):
        raise KeyboardInterrupt  # not a subscriber error: it stops the simulation

    with pytest.raises(KeyboardInterrupt):
        simulate(_mooncake(tmp_path, rows), "-np 1 -c 4096", speed=SpeedModel.from_rates(1000, 20), profile=PROFILE,
                 listen=boom)
    assert gc.get_threshold() == before
