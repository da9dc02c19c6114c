"""`slotlab whatif TRACE --proposals` on a real trace (the Mooncake conversation trace's first requests):
llama-server as built, each proposal and the ideal caches, each row the same count as `slotlab simulate`'s
totals; and the cache-disk proposal's tier on its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from slotlab.engine.prompt_cache import PromptCache
from slotlab.proposals import PROPOSALS
from slotlab.sim.cli import resolve_profile
from slotlab.sim.simulate import simulate
from slotlab.sim.speed import SpeedModel
from slotlab.sim.traces import load_sim_trace

MOONCAKE = Path(__file__).resolve().parent.parent / "sim" / "data" / "mooncake_conversation_first500.jsonl"
FLAGS = ["-np", "4", "--cache-ram", "-1"]


def _whatif(*extra: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "slotlab.cli", "whatif", str(MOONCAKE), "--proposals", "--json",
                          "--profile", "llama-3.1-8b", "--limit", "200", "--jobs", "2", *FLAGS, *extra],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_whatif_proposals_prices_every_modelled_proposal_against_the_server_and_the_ideal():
    got = _whatif()
    names = [p["name"] for p in got["proposals"]]
    assert names == [n for n, p in PROPOSALS.items() if p.modelled]
    for p in got["proposals"]:
        assert {"name", "origin", "reused", "prefilled", "verified"} <= set(p)
        assert p["verified"] == PROPOSALS[p["name"]].verified
        assert p["reused"] + p["prefilled"] == p["prompt_tokens"]
    # the server's row is `slotlab simulate`'s totals on the same flags, the ideal rows its bounds
    tr = load_sim_trace(str(MOONCAKE), limit=200)
    res = simulate(tr, FLAGS, speed=SpeedModel.from_rates(8000, 60), profile=resolve_profile("llama-3.1-8b"),
                   bounds=True, hindsight=False)
    t = res.totals
    assert got["as_built"]["reused"] == t["tokens_reused"] and got["as_built"]["prompt_tokens"] == t["prompt_tokens"]
    ideal = {r["name"]: r["reused"] for r in got["ideal"]}
    assert ideal == {"ideal LRU": t["bounds"]["lru"], "ideal optimal": t["bounds"]["optimal"],
                     "infinite cache": t["bounds"]["infinite"]}
    for r in [got["as_built"], *got["proposals"], *got["ideal"]]:
        assert 0 <= r["reused"] <= r["prompt_tokens"]  # never over 100 %
    # with no byte limit the pin's aggregate token limit (n_ctx) is what keeps conversations out of the
    # cache: PR #28046's per-entry limit keeps them, and comes no further than the infinite cache
    kv = next(p for p in got["proposals"] if p["name"] == "kvcpc")
    assert got["as_built"]["reused"] < kv["reused"] <= ideal["infinite cache"]
    assert kv["prefill_seconds_saved"] > 0


def test_whatif_proposals_draws_its_table(tmp_path):
    png = tmp_path / "p.png"
    out = subprocess.run([sys.executable, "-m", "slotlab.cli", "whatif", str(MOONCAKE), "--proposals", "--png", str(png),
                          "--profile", "llama-3.1-8b", "--limit", "60", "--jobs", "2", "-np", "2"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert png.read_bytes()[:4] == b"\x89PNG"
    lines = out.stdout.splitlines()
    assert lines[2].startswith("llama-server as built") and any(ln.startswith("infinite cache") for ln in lines)
    assert any("unverified" in ln for ln in lines) and any(" verified" in ln for ln in lines)


def test_whatif_refuses_proposals_with_a_grid():
    out = subprocess.run([sys.executable, "-m", "slotlab.cli", "whatif", str(MOONCAKE), "--proposals", "--vary",
                          "-np 1,2"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "no --vary" in out.stderr and "Traceback" not in out.stderr


def test_the_disk_tier_keeps_what_ram_evicts_and_gives_it_back():
    def cache(disk: int) -> PromptCache:
        c = PromptCache(2500, 0, disk_limit=disk, record=True)
        for i in range(4):  # 1000 bytes each: RAM holds two
            c.alloc(np.arange(i * 100 + 1, i * 100 + 21), [], 1000)
        return c
    ram_only, tiered = cache(0), cache(1500)
    assert len(ram_only.entries) == len(tiered.entries) == 2
    assert [int(e.tokens[0]) for e in tiered.disk] == [101]  # 1 and 101 left RAM; the disk holds one of 1000
    assert [r.kind for r in tiered.take_events()].count("cache_disk_evict") == 1
    want = np.arange(101, 131)  # the second conversation, continued
    assert ram_only.load([], want).entry is None
    res = tiered.load([], want)
    assert res.entry is tiered.disk[0]
    assert tiered.restore(res.entry, lambda b: len(b)) and not tiered.disk and tiered.disk_size() == 0
    assert "cache_disk_load" in [r.kind for r in tiered.take_events()]


def test_a_simulation_with_the_disk_tier_reads_back_at_most_one_entry_a_request():
    """The disk tier's three events are told apart (a write is not a read) and simulate's totals count
    only the reads: at most one a request (a slot loads one entry), every one written before."""
    from collections import Counter

    seen: Counter = Counter()
    tr = load_sim_trace(str(MOONCAKE), limit=120)
    res = simulate(tr, ["-np", "4", "--cache-disk", "65536"], speed=SpeedModel.from_rates(8000, 60),
                   profile=resolve_profile("llama-3.1-8b"), listen=lambda ev: seen.update([ev.kind]), hindsight=False)
    t = res.totals
    assert seen["cache_disk_write"] > 0 and t["disk_reads"] == seen["cache_disk_load"] <= seen["cache_disk_write"]
    assert t["disk_reads"] <= t["n_requests"] and t["proposals"] == ["cache-disk"]
    assert "changed by cache-disk (PR #28092, unverified)" in "\n".join(res.lines())


def test_the_proposals_on_a_dask_cluster_price_as_serially():
    import pytest

    pytest.importorskip("dask.distributed", reason="dask is the optional extra slotlab[dask] (make install adds it)")
    from dataclasses import asdict

    from dask.distributed import Client, LocalCluster

    from slotlab.proposals.price import price

    speed = SpeedModel.from_rates(8000, 60)
    flags = ["-np", "2", "--cache-ram", "-1", "-c", "16384"]
    serial = price(str(MOONCAKE), flags, speed=speed, profile="llama-3.1-8b", limit=40, jobs=1)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with Client(cluster) as client:
            dask = price(str(MOONCAKE), flags, speed=speed, profile="llama-3.1-8b", limit=40, scheduler=client)
    assert [asdict(r) for r in dask] == [asdict(r) for r in serial]
    assert len(serial) == 1 + sum(p.modelled for p in PROPOSALS.values()) + 3  # as built, proposals, ideals
