"""`slotlab whatif TRACE --vary "--fleet 1,2,4" --vary "--router ..."`: a grid over fleets (issue 35 item 4).

On the Mooncake slice (--limit, to keep it fast): every run is `simulate_fleet` with the other flags
on every server, its row the fleet's totals; `--ttft-target` names the smallest fleet meeting it with
the best reuse; `--png` draws reuse and TTFT p99 against N, one line per router."""

import json
from pathlib import Path

import pytest

from slotlab.cli import main
from slotlab.fleet import simulate_fleet
from slotlab.memory.profile import ModelProfile
from slotlab.sim.speed import SpeedModel
from slotlab.sim.traces import load_mooncake
from slotlab.sim.whatif import WhatIfRun, fleet_flags, run_grid, smallest_fleet

ROOT = Path(__file__).resolve().parents[2]
SLICE = ROOT / "tests/sim/data/mooncake_conversation_first500.jsonl"
PROFILE = "llama-3.1-8b"
SPEED = SpeedModel.from_rates(8000, 60)
BASE = ["-np", "4", "--cache-ram", "8192"]
LIMIT, SCALE = 120, 16
VARY = [("--fleet", ["1", "2", "4"]), ("--router", ["round-robin", "session", "prefix"])]


@pytest.fixture(scope="module")
def runs():
    return run_grid(str(SLICE), BASE, VARY, speed=SPEED, profile=PROFILE, limit=LIMIT, time_scale=SCALE, jobs=1)


def test_fleet_flags_are_split_off():
    assert fleet_flags(["-np", "4"]) == (None, ["-np", "4"])
    assert fleet_flags(["-np", "4", "--fleet", "3", "--router", "prefix"]) == ((3, "prefix"), ["-np", "4"])
    assert fleet_flags(["--router", "session"]) == ((1, "session"), [])
    assert fleet_flags(["--fleet", "2"]) == ((2, "round-robin"), [])


def test_each_run_is_the_fleet_simulation(runs):
    assert [r.error for r in runs] == [None] * 9
    trace = load_mooncake(SLICE, limit=LIMIT, time_scale=SCALE)
    prof = ModelProfile.from_json(ROOT / "slotlab/sim/profiles/llama-3.1-8b.json")
    for r in runs:
        n, router = int(r.setting["--fleet"]), r.setting["--router"]
        assert r.extra["fleet"]["servers"] == n and r.extra["fleet"]["router"] == router
        if (n, router) not in ((2, "session"), (4, "prefix")):
            continue  # two of them, simulated directly, suffice
        t = simulate_fleet(trace, BASE, n, router, speed=SPEED, profile=prof).totals
        assert (r.n_requests, r.n_errors, r.prompt_tokens, r.tokens_reused, r.tokens_prefilled, r.peak_cache_bytes,
                r.ttft_p50, r.ttft_p99) == (t["n_requests"], t["n_errors"], t["prompt_tokens"], t["tokens_reused"],
                                            t["tokens_prefilled"], t["peak_cache_bytes"], t["ttft_p50"], t["ttft_p99"])


def test_a_fleet_of_one_is_one_server_whatever_the_router(runs):
    one = [r for r in runs if r.setting["--fleet"] == "1"]
    plain = run_grid(str(SLICE), BASE, [("-np", ["4"])], speed=SPEED, profile=PROFILE, limit=LIMIT,
                     time_scale=SCALE, jobs=1)[0]
    key = lambda r: (r.tokens_reused, r.tokens_prefilled, r.peak_cache_bytes, r.ttft_p50, r.ttft_p99)  # noqa: E731
    assert {key(r) for r in one} == {key(plain)}


def test_more_servers_cut_the_tail(runs):
    for router in ("round-robin", "session", "prefix"):
        p99 = [r.ttft_p99 for r in runs if r.setting["--router"] == router]
        assert p99[0] > p99[1] > p99[2], (router, p99)


def test_smallest_fleet_meeting_a_target(runs):
    p99 = {(int(r.setting["--fleet"]), r.setting["--router"]): r for r in runs}
    target = max(r.ttft_p99 for (n, _), r in p99.items() if n == 2)  # every 2-server fleet meets it
    pick = smallest_fleet(runs, target)
    assert pick.extra["fleet"]["servers"] == 2
    assert pick.reuse == max(r.reuse for (n, _), r in p99.items() if n == 2)
    assert smallest_fleet(runs, 0.0) is None
    assert smallest_fleet([WhatIfRun({}, [], n_requests=1, ttft_p99=0.1)], 1.0) is None  # not a fleet run


def test_a_bad_router_fails_its_run_only():
    rs = run_grid(str(SLICE), BASE, [("--router", ["session", "nope"])], speed=SPEED, profile=PROFILE, limit=20,
                  time_scale=SCALE, jobs=1)
    assert rs[0].error is None and "unknown router" in rs[1].error


def test_the_command_line(tmp_path, capsys):
    png = tmp_path / "fleet.png"
    rc = main(["whatif", str(SLICE), "--limit", str(LIMIT), "--time-scale", str(SCALE), "--profile", PROFILE,
               *BASE, "--vary", "--fleet 1,2,4", "--vary", "--router round-robin,session,prefix",
               "--ttft-target", "1000", "--png", str(png), "--jobs", "1"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "--fleet 4 --router prefix" in out
    assert "smallest fleet with TTFT p99 <= 1000 s: 1 server (no router needed)" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rc = main(["whatif", str(SLICE), "--limit", "40", "--time-scale", str(SCALE), "--profile", PROFILE, *BASE,
               "--vary", "--fleet 1,2", "--ttft-target", "0.000001", "--json", "--jobs", "1"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["smallest_fleet"] is None and len(d["runs"]) == 2


def test_fleet_sweep_picture(runs):
    from slotlab.figures.whatif import fleet_sweep, is_fleet_sweep

    assert is_fleet_sweep(runs) and not is_fleet_sweep(runs[:1])
    pick = smallest_fleet(runs, 1000)
    fig = fleet_sweep(runs, ttft_target=1000, pick=pick, title="fleet")
    a1, a2 = fig.axes
    assert len(a1.get_lines()) >= 3 and a2.get_yscale() == "log"
    labels = {line.get_label() for line in a2.get_lines()}
    assert {"round-robin", "session", "prefix"} <= labels
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_a_grid_over_the_recorded_fleet_trace():
    """The real fleet's trace (tests/golden/traces_fleet: text prompts, tokenized with the default model)
    in a fleet grid: at 2 servers round-robin reuses less than session affinity and the prefix router,
    as the real servers did (tests/fleet/test_fleet_golden.py), and at 1 server the routers agree."""
    trace = ROOT / "tests/golden/traces_fleet/docs_chat_2_session.json"
    base = json.loads(trace.read_text())["flags"]
    rs = run_grid(str(trace), base, [("--fleet", ["1", "2"]), VARY[1]], speed=SPEED, jobs=1)
    assert [r.error for r in rs] == [None] * 6
    reuse = {(r.setting["--fleet"], r.setting["--router"]): r.reuse for r in rs}
    assert len({reuse["1", x] for x in ("round-robin", "session", "prefix")}) == 1
    assert reuse["2", "round-robin"] < min(reuse["2", "session"], reuse["2", "prefix"])
