"""slotlab.fleet: N servers on paper behind a router (each an unchanged slotlab simulation)."""

import heapq
import json
from pathlib import Path

import pytest

from slotlab.fleet import ROUTERS, simulate_fleet
from slotlab.fleet.keys import session_key, stable_hash
from slotlab.fleet.servers import Setup, run_part
from slotlab.memory.profile import ModelProfile
from slotlab.sim.simulate import simulate
from slotlab.sim.speed import SpeedModel
from slotlab.sim.traces import SimTrace, load_mooncake

ROOT = Path(__file__).resolve().parents[2]
SLICE = ROOT / "tests/sim/data/mooncake_conversation_first500.jsonl"
PROFILE = ModelProfile.from_json(ROOT / "slotlab/sim/profiles/llama-3.1-8b.json")
SPEED = SpeedModel.from_rates(8000, 60)
FLAGS = "-np 4 --cache-ram 8192"


def _no_wall(t: dict) -> dict:
    return {k: v for k, v in t.items() if k != "wall_seconds"}


@pytest.fixture(scope="module")
def slice120():
    return load_mooncake(SLICE, limit=120, time_scale=16)


def _conversations(tmp_path, n_conv=6, turns=4, shared_first=False, gap_ms=4000, name="conv.jsonl", first=2, grow=2):
    """Mooncake rows of `n_conv` conversations, each turn extending the previous turn's blocks; with
    `shared_first` every prompt begins with block 0 (a common system prompt, as in Mooncake's trace),
    else the conversations share no block. Turns interleave in time."""
    rows, nxt = [], 1
    own = {c: [] for c in range(n_conv)}
    for t in range(turns):
        for c in range(n_conv):
            k = first if t == 0 else grow
            own[c] += list(range(nxt, nxt + k))
            nxt += k
            ids = ([0] if shared_first else []) + own[c]
            rows.append({"timestamp": t * gap_ms + c * 300, "input_length": 512 * len(ids) - 100,
                         "output_length": 20 + 7 * c, "hash_ids": ids, "_conv": c})
    p = tmp_path / name
    p.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "_conv"}) + "\n" for r in rows))
    return p, [r["_conv"] for r in rows]


@pytest.mark.parametrize("router", list(ROUTERS))
def test_fleet_of_one_is_simulate(slice120, router):
    base = simulate(slice120, FLAGS, speed=SPEED, profile=PROFILE, hindsight=False)
    f = simulate_fleet(slice120, FLAGS, 1, router, speed=SPEED, profile=PROFILE)
    assert f.results == base.results
    assert _no_wall(f.totals) == _no_wall(base.totals)
    assert f.servers[0]["totals"]["n_requests"] == 120 and {r["server"] for r in f.routing} == {0}


def test_fleet_of_one_keeps_the_bounds(slice120):
    base = simulate(slice120, FLAGS, speed=SPEED, profile=PROFILE, hindsight=False, bounds=True)
    f = simulate_fleet(slice120, FLAGS, 1, "prefix", speed=SPEED, profile=PROFILE, bounds=True)
    assert f.results == base.results and _no_wall(f.totals) == _no_wall(base.totals)


def test_session_fleet_is_separate_simulations_of_the_parts(tmp_path):
    p, conv = _conversations(tmp_path, n_conv=7)
    trace = load_mooncake(p)
    f = simulate_fleet(trace, FLAGS, 3, "session", speed=SPEED, profile=PROFILE)
    by_server = {}
    for r, c in zip(f.routing, conv):
        by_server.setdefault(c, set()).add(r["server"])
    assert all(len(s) == 1 for s in by_server.values())  # a conversation stays on one server
    assert len({next(iter(s)) for s in by_server.values()}) > 1  # and the fleet is used
    lines = p.read_text().splitlines()
    for s in range(3):  # each server's part as a trace of its own, loaded from its own file
        idx = [r["i"] for r in f.routing if r["server"] == s]
        q = tmp_path / f"part{s}.jsonl"
        q.write_text("".join(lines[i] + "\n" for i in idx))
        alone = simulate(load_mooncake(q), FLAGS, speed=SPEED, profile=PROFILE, hindsight=False)
        assert [{**r, "i": idx[r["i"]]} for r in alone.results] == [f.results[i] for i in idx]
        assert _no_wall(alone.totals) == _no_wall(f.servers[s]["totals"])
    assert f.totals["tokens_reused"] == sum(x["totals"]["tokens_reused"] for x in f.servers)
    assert f.totals["peak_cache_bytes"] == sum(x["totals"]["peak_cache_bytes"] for x in f.servers)


def test_session_key_is_the_conversation_else_the_first_blocks(slice120):
    q = slice120.requests[0]
    assert session_key(q) == ("blocks", tuple(q.hash_ids[:2]))
    assert stable_hash(("blocks", (0, 1))) == stable_hash(("blocks", (0, 1)))


def test_prefix_router_follows_the_conversation(tmp_path):
    p, conv = _conversations(tmp_path, n_conv=7, turns=5, shared_first=True, first=3, grow=1)
    f = simulate_fleet(load_mooncake(p), FLAGS, 3, "prefix", speed=SPEED, profile=PROFILE)
    first = {}
    for r, c in zip(f.routing, conv):
        first.setdefault(c, r["server"])
        assert r["server"] == first[c], (r, c)  # every later turn where the first one went
        if r["i"] >= 7:
            assert r["matched_blocks"] > 1  # by the match in its own index, not by chance
    assert len(set(first.values())) == 3  # new conversations spread (smallest index)
    # more reuse than the blind router on the same fleet (7 conversations: round-robin moves them)
    rr = simulate_fleet(load_mooncake(p), FLAGS, 3, "round-robin", speed=SPEED, profile=PROFILE)
    assert f.totals["tokens_reused"] > rr.totals["tokens_reused"]


def _in_flight(routing, results, n):
    """Per request, the in-flight counts at its arrival as the router knows them: sent before it, and
    not back (end) by its arrival."""
    out, heaps = [], [[] for _ in range(n)]
    for r in routing:
        for h in heaps:  # a reply at the instant of its request's arrival: seen from the next arrival time
            while h and h[0][0] <= r["arrival"] and h[0][1] < r["arrival"]:
                heapq.heappop(h)
        out.append([len(h) for h in heaps])
        heapq.heappush(heaps[r["server"]], (results[r["i"]]["end"], r["arrival"]))
    return out


def test_least_loaded_never_picks_a_busier_server(slice120):
    f = simulate_fleet(slice120, FLAGS, 3, "least-loaded", speed=SPEED, profile=PROFILE)
    counts = _in_flight(f.routing, f.results, 3)
    for r, c in zip(f.routing, counts):
        assert c[r["server"]] == min(c), (r, c)
        assert r["in_flight"] == c  # what it saw is what the final simulations say
    assert len({r["server"] for r in f.routing}) == 3


@pytest.mark.parametrize("case", ["conversations", "slice"])
def test_least_loaded_is_the_step_by_step_lockstep(tmp_path, case):
    """Brute force: decide each request by simulating every server on what it has been sent so far
    (the slice: requests arriving together, and refusals answered at once)."""
    if case == "slice":
        trace, n = load_mooncake(SLICE, limit=40, time_scale=1), 3  # overloaded: the first guess is wrong
    else:
        trace, n = load_mooncake(_conversations(tmp_path, n_conv=5, turns=3, gap_ms=1500)[0]), 2
    f = simulate_fleet(trace, FLAGS, n, "least-loaded", speed=SPEED, profile=PROFILE)
    assert case != "slice" or f.stats["changed_choices"] > 0
    setup = Setup(FLAGS.split(), SPEED, PROFILE)
    sent = [[] for _ in range(n)]
    for k, q in enumerate(trace.requests):
        c = []
        for s in range(n):
            rows = run_part(trace, sent[s], setup, s).results if sent[s] else []
            c.append(sum(1 for r in rows if r["end"] > q.arrival or r["arrival"] == q.arrival))
        s = c.index(min(c))
        assert f.routing[k]["server"] == s and f.routing[k]["in_flight"] == c
        sent[s].append(k)


@pytest.mark.parametrize("router", ["prefix", "least-loaded"])
def test_dask_and_serial_give_the_same_fleet(slice120, router):
    distributed = pytest.importorskip("dask.distributed")
    serial = simulate_fleet(slice120, FLAGS, 3, router, speed=SPEED, profile=PROFILE)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as cl, \
            distributed.Client(cl) as client:
        sent = simulate_fleet(slice120, FLAGS, 3, router, speed=SPEED, profile=PROFILE, scheduler=client)
        loaded = simulate_fleet(slice120, FLAGS, 3, router, speed=SPEED, profile=PROFILE, scheduler=client,
                                source={"path": str(SLICE), "limit": 120, "time_scale": 16})
    for d in (sent, loaded):
        assert d.results == serial.results and d.routing == serial.routing
        assert _no_wall(d.totals) == _no_wall(serial.totals)
        assert [_no_wall(s["totals"]) for s in d.servers] == [_no_wall(s["totals"]) for s in serial.servers]


def test_capacity_warning_names_a_larger_fleet(tmp_path):
    rows = [{"timestamp": 100 * i, "input_length": 4000, "output_length": 200,
             "hash_ids": list(range(10 * i, 10 * i + 8))} for i in range(60)]
    p = tmp_path / "burst.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    f = simulate_fleet(load_mooncake(p), "-np 2", 1, "round-robin", speed=SPEED, profile=PROFILE)
    w = f.warning()
    assert f.capacity["overloaded"] and f.capacity["min_servers"] > 1 and w and "would keep up" in w
    ok = simulate_fleet(load_mooncake(p), "-np 2", f.capacity["min_servers"] * 2, "least-loaded", speed=SPEED,
                        profile=PROFILE)
    assert ok.totals["queue_wait_p99"] < f.totals["queue_wait_p99"]


def test_fleet_json_and_errors(capsys):
    from slotlab.cli import main

    assert main(["simulate", str(SLICE), "--limit", "40", "--fleet", "2", "--router", "session", "--json",
                 "--profile", "llama-3.1-8b", "--prefill-tps", "8000", "--gen-tps", "60", "-np", "2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["fleet"]["router"] == "session" and len(doc["servers"]) == 2 and len(doc["routing"]) == 40
    assert set(doc["servers"][0]["totals"]) >= {"tokens_reused", "ttft_p50", "queue_wait_p99"}
    assert set(doc["routing"][0]) >= {"i", "server", "why"}
    for bad, said in ((["--fleet", "0"], "--fleet 0"), (["--fleet", "x"], "--fleet x"),
                      (["--fleet", "2", "--router", "random"], "--router random")):
        assert main(["simulate", str(SLICE), *bad]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("slotlab: error: " + said) and "Traceback" not in err[0]


def test_scheduler_address_on_the_command_line(capsys):
    distributed = pytest.importorskip("dask.distributed")
    argv = ["simulate", str(SLICE), "--limit", "30", "--fleet", "2", "--router", "round-robin", "--json",
            "--profile", "llama-3.1-8b", "--prefill-tps", "8000", "--gen-tps", "60", "-np", "2", "--no-bounds"]
    from slotlab.cli import main

    def doc(extra=()):
        assert main(argv + list(extra)) == 0
        d = json.loads(capsys.readouterr().out)
        d["totals"].pop("wall_seconds")
        for s in d["servers"]:
            s["totals"].pop("wall_seconds"), s.pop("wall_seconds")
        d["fleet"].pop("how")
        return d

    serial = doc()
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp",
                                  dashboard_address=":0") as cl:
        assert cl.scheduler_address.startswith("tcp://")
        assert doc(["--scheduler", cl.scheduler_address]) == serial


def test_least_loaded_strategies_agree_under_load():
    """Re-predicting the rest after a changed choice only saves runs: the routing is the same."""
    from slotlab.fleet.lockstep import route_least_loaded
    from slotlab.fleet.routers import LeastLoaded
    from slotlab.fleet.servers import Runner

    trace = load_mooncake(SLICE, limit=80, time_scale=1)  # overloaded: many near-ties in flight
    out = []
    for rp in (True, False):
        with Runner(trace, Setup(FLAGS.split(), SPEED, PROFILE)) as run:
            ch, runs, st = route_least_loaded(trace, LeastLoaded(3), run, SPEED, repredict=rp)
        out.append(([c.server for c in ch], [r.results for r in runs], st))
    assert out[0][0] == out[1][0] and out[0][1] == out[1][1]
    assert out[0][2]["changed_choices"] > 0  # the first guess was wrong somewhere: the pass corrected it
