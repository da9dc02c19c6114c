"""Every golden trace recorded from the real llama-server reproduces exactly in slotlab: per request
the slot, cache_n, prompt_n, tokens_evaluated, tokens_cached, status and error; per slot action the
reply (timings excepted); and the sequence of RAM-cache decisions (saves, skips, evictions with
their reasons, loads with their f_keep / f_sim, cache state lines with bytes and token estimates,
purges, decode retries, checkpoints) read from the server's -lv 4 log."""

import json
from pathlib import Path

import pytest

from slotlab.engine.replay import load_trace, replay
from slotlab.engine.server_log import decisions, decisions_of_engine

DIR = Path(__file__).with_name("traces")
TRACES = sorted(p.stem for p in DIR.glob("*.json") if ".llama-server" not in p.name)


def _strip(result: dict) -> dict:
    r = dict(result)
    r.pop("content", None)
    if isinstance(r.get("reply"), dict):
        r["reply"] = {k: v for k, v in r["reply"].items() if k != "timings"}
    return r


@pytest.mark.parametrize("name", TRACES)
def test_golden_trace(model, name):
    want = json.loads((DIR / f"{name}.llama-server.json").read_text())
    trace = load_trace(DIR / f"{name}.json")
    # compare with the stock server: slotlab's slot-file appendices (an extension) stay off here
    trace.flags = [*trace.flags, "--no-slot-appendices"]
    out = replay(trace, model=model)
    got = [_strip(r) for r in out["results"]]
    exp = [_strip(r) for r in want["results"]]
    for i, (g, w) in enumerate(zip(got, exp)):
        assert g == w, f"{name}: request {i} differs"
    assert len(got) == len(exp)
    ours = decisions_of_engine(out["engine"])
    theirs = decisions((DIR / f"{name}.llama-server.log").read_text().splitlines())
    assert ours == theirs, f"{name}: RAM-cache decisions differ"
    out["engine"].close()
