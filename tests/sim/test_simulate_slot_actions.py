"""`slotlab simulate` and `whatif` on traces with slot actions (save / restore / erase), checked against
the real servers' recordings: the pin's (tests/golden/traces*, b11312) and b11549's
(tests/golden/traces_b11549, the build that keeps context checkpoints in slot files).

A slotlab trace without arrivals is sent as `slotlab replay` and the recorder send it: in order, each
request after the earlier ones it waits for ("wait", default true). So on every recorded trace whose
requests all wait, simulate must answer what the server answered: per completion the slot, cache_n and
prompt_n, per action its status (and, for the b11549 recordings, under `--server-build 11549`). And
`whatif --vary "--server-build 11312,11549"` must price the upgrade as the two real servers differ:
the tokens b11549 did not prefill, from the two recordings, not from slotlab."""

import json
from pathlib import Path

import pytest

from slotlab.sim.paper_replay import recorded_outputs
from slotlab.sim.simulate import simulate
from slotlab.sim.speed import SpeedModel
from slotlab.sim.traces import load_sim_trace
from slotlab.sim.whatif import WhatIfRun, build_lines

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
PIN_DIRS = (GOLDEN / "traces", GOLDEN / "traces_tiny")
B11549 = GOLDEN / "traces_b11549"
SPEED = SpeedModel.from_rates(8000, 60)


def _with_actions() -> list[Path]:
    out = []
    for d in PIN_DIRS:
        for p in sorted(d.glob("*.json")):
            if p.name.endswith(".llama-server.json"):
                continue
            reqs = json.loads(p.read_text()).get("requests", [])
            if any("action" in r for r in reqs) and all(r.get("wait", True) for r in reqs):
                out.append(p)
    return out


TRACES = _with_actions()
#: where a b11549 recording cannot be followed (tests/golden/test_b11549.py says why)
from tests.golden.test_b11549 import CANNOT_FOLLOW  # noqa: E402


def _sim(path: Path, answers: Path, model, model_of, extra=()):
    from tests.golden.trace_models import split_model

    tr = load_sim_trace(path)
    mpath, _ = split_model(tr.flags)
    vocab = model if mpath is None else model_of(mpath)
    want = json.loads(answers.read_text())["results"]
    for q, o in zip(tr.requests, recorded_outputs({"results": want}, vocab)):
        if o is not None:
            q.output = o  # the server's generation (its text goes into the slots' KV)
    res = simulate(tr, [*tr.flags, *extra], speed=SPEED, vocab=vocab)
    return res, want


def _rows(results):
    return [(r["action"], r["status"]) if "action" in r else (r["status"], r["id_slot"], r["cache_n"], r["prompt_n"])
            for r in results]


def test_there_are_traces_with_slot_actions():
    assert len(TRACES) >= 6, [p.name for p in TRACES]


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.stem)
def test_simulate_answers_what_the_pin_answered(path, model, model_of):
    res, want = _sim(path, path.with_name(path.stem + ".llama-server.json"), model, model_of)
    assert _rows(res.results) == _rows(want)
    acts = [r for r in want if "action" in r]
    assert res.totals["n_actions"] == len(acts)
    assert res.totals["action_errors"] == sum(1 for r in acts if r["status"] != 200)


@pytest.mark.parametrize("path", [p for p in TRACES if (B11549 / f"{p.stem}.llama-server.json").exists()
                                  and p.stem not in CANNOT_FOLLOW], ids=lambda p: p.stem)
def test_simulate_answers_what_b11549_answered_under_its_rules(path, model, model_of):
    res, want = _sim(path, B11549 / f"{path.stem}.llama-server.json", model, model_of, ["--server-build", "11549"])
    assert _rows(res.results) == _rows(want)


def _prefilled(results) -> int:
    return sum(r["prompt_n"] for r in results if "action" not in r and r["status"] == 200)


def test_whatif_prices_the_upgrade_as_the_two_servers_differ(model, model_of):
    """hybrid_slot_files: save -> erase -> restore on a hybrid model; b11549 restores the checkpoints
    from the file and reuses up to them, the pin re-processes. The upgrade's price is the recorded
    difference."""
    path = GOLDEN / "traces_tiny" / "hybrid_slot_files.json"
    pin = json.loads(path.with_name("hybrid_slot_files.llama-server.json").read_text())["results"]
    new = json.loads((B11549 / "hybrid_slot_files.llama-server.json").read_text())["results"]
    fewer = _prefilled(pin) - _prefilled(new)
    assert fewer > 0  # what the two real servers did
    runs = []
    for b in ("11312", "11549"):
        res, _ = _sim(path, path.with_name("hybrid_slot_files.llama-server.json"), model, model_of,
                      ["--server-build", b])
        t = res.totals
        runs.append(WhatIfRun({"--server-build": b}, [], prompt_tokens=t["prompt_tokens"],
                              tokens_reused=t["tokens_reused"], tokens_prefilled=t["tokens_prefilled"]))
    (line,) = build_lines(runs)
    assert line.startswith("build: on this traffic b11549 would reuse") and f"({fewer:,} tokens fewer to prefill)" in line
    assert line.endswith("than b11312")
