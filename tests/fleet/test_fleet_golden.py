"""The fleet simulation against real llama-servers behind a real router (issue 35).

tests/golden/record_fleet.py recorded N real servers (the pin, the default model) behind a Python HTTP
router (round-robin, session affinity, prefix), three document-chat conversations sent through it
in order. Here `simulate_fleet` runs the same trace (tests/golden/traces_fleet/NAME.json: the flags,
the prompts, the fleet's size and router, nothing else) on paper, and per request it must choose the
same server as the real router did and that server must decide as the real one did: status,
id_slot, cache_n, prompt_n. The generated tokens are the server's recorded answers (as test_golden's
`recorded_outputs`): the model, having read the scripted answer in its context, writes its first
tokens again, so a turn's prompt continues what the server generated and cache_n counts those tokens
(with the paper sampler's placeholders instead, the later turns reuse 7 tokens fewer: round-robin's
requests 9-11, session's 6-11). The prompts themselves are the trace's. No server runs here."""

import json
from pathlib import Path

import pytest

from slotlab.fleet import simulate_fleet
from slotlab.sim.paper_replay import recorded_outputs
from slotlab.sim.speed import SpeedModel
from slotlab.sim.traces import load_sim_trace

DIR = Path(__file__).resolve().parents[1] / "golden" / "traces_fleet"
NAMES = sorted(p.name.removesuffix(".fleet.json") for p in DIR.glob("*.fleet.json"))
SPEED = SpeedModel.from_rates(2000, 50)  # the requests are sequential: no decision depends on the clock
KEYS = ("status", "id_slot", "cache_n", "prompt_n")


def _load(name):
    return json.loads((DIR / f"{name}.json").read_text()), json.loads((DIR / f"{name}.fleet.json").read_text())


def _fleet(name, model, scripted=True):
    spec, want = _load(name)
    trace = load_sim_trace(DIR / f"{name}.json")
    if scripted:
        for q, out in zip(trace.requests, recorded_outputs(want, model)):
            q.output = out
    fl = spec["fleet"]
    return simulate_fleet(trace, None, fl["servers"], fl["router"], speed=SPEED, vocab=model), want


def test_there_are_fleet_recordings():
    routers = {_load(n)[0]["fleet"]["router"] for n in NAMES}
    assert {"round-robin", "session", "prefix"} <= routers, "record them: python -m tests.golden.record_fleet"


@pytest.mark.parametrize("name", NAMES)
def test_fleet_simulation_decides_as_the_real_fleet(model, name):
    f, want = _fleet(name, model)
    rec = want["results"]
    assert len(f.results) == len(rec)
    got = [(f.routing[i]["server"], *(f.results[i][k] for k in KEYS)) for i in range(len(rec))]
    exp = [(r["server"], *(r[k] for k in KEYS)) for r in rec]
    diffs = [f"request {i}: (server, {', '.join(KEYS)}) {g} != {w}" for i, (g, w) in enumerate(zip(got, exp))
             if g != w]
    assert not diffs, f"{name}: " + "; ".join(diffs[:4])


@pytest.mark.parametrize("name", NAMES)
def test_the_router_saw_what_the_server_evaluated(model, name):
    """The real router tokenized each prompt through /tokenize; its count is the server's
    cache_n + prompt_n and slotlab's tokenization of the trace's prompt (so the simulation's router
    reads the same tokens off the trace)."""
    spec, want = _load(name)
    for r, line, q in zip(want["results"], want["router_log"], spec["requests"]):
        assert line["server"] == r["server"]
        assert line["n_tokens"] == r["cache_n"] + r["prompt_n"] == len(model.tokenize(q["prompt"]))


@pytest.mark.parametrize("servers", sorted({_load(n)[0]["fleet"]["servers"] for n in NAMES}))
def test_the_recordings_show_what_the_router_costs(servers):
    """On the real servers: round-robin sends a conversation's consecutive turns to different servers
    and reuses less than session affinity and the prefix router, which keep each conversation on one
    (a conversation: its document, the prompt's first line)."""
    reuse, moved = {}, {}
    for n in NAMES:
        spec, want = _load(n)
        if spec["fleet"]["servers"] != servers:
            continue
        r = spec["fleet"]["router"]
        last: dict = {}
        moved[r] = 0
        for q, x in zip(spec["requests"], want["results"]):
            c = q["prompt"].split("\n", 1)[0]
            moved[r] += c in last and last[c] != x["server"]
            last[c] = x["server"]
        reuse[r] = sum(x["cache_n"] for x in want["results"]) / sum(x["cache_n"] + x["prompt_n"]
                                                                      for x in want["results"])
    assert {"round-robin", "session", "prefix"} <= set(reuse), f"{servers} servers: record all three routers"
    assert moved["round-robin"] > 0 and moved["session"] == moved["prefix"] == 0, moved
    assert reuse["round-robin"] < min(reuse["session"], reuse["prefix"]), reuse


@pytest.mark.parametrize("name", NAMES)
def test_each_servers_ram_cache_decisions_follow_its_log(model, name):
    """Each server's part, as the fleet simulation routed it, replayed on paper (`replay_on_paper`, the
    recorded answers generated) makes that real server's RAM-cache decisions, read from its -lv 4 log
    (saves, skips, loads with f_keep / f_sim, evictions, cache state lines), and gives its answers'
    text."""
    from slotlab.engine.replay import Trace
    from slotlab.engine.server_log import decisions, decisions_of_engine
    from slotlab.sim.paper_replay import replay_on_paper

    spec, want = _load(name)
    f, _ = _fleet(name, model)
    outs = recorded_outputs(want, model)
    for k in range(spec["fleet"]["servers"]):
        idx = [i for i, r in enumerate(f.routing) if r["server"] == k]
        part = Trace([*spec["flags"], "--no-slot-appendices"], [spec["requests"][i] for i in idx])
        out = replay_on_paper(part, model=model, outputs=[outs[i] for i in idx])
        try:
            ours = decisions_of_engine(out["engine"])
        finally:
            out["engine"].close()
        theirs = decisions((DIR / f"{name}.server{k}.log").read_text().splitlines())
        assert ours == theirs, f"{name}: server {k}'s RAM-cache decisions differ"
        rec = [want["results"][i] for i in idx]
        assert [(r["id_slot"], r["cache_n"], r["prompt_n"], r["content"]) for r in out["results"]] == \
            [(r["id_slot"], r["cache_n"], r["prompt_n"], r["content"]) for r in rec]
