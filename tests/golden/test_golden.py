"""Every golden trace recorded from the real llama-server reproduces exactly in slotlab: per request
the slot, cache_n, prompt_n, tokens_evaluated, tokens_cached, status and error; per slot action the
reply (timings excepted); and the sequence of RAM-cache decisions (saves, skips, evictions with
their reasons, loads with their f_keep / f_sim, cache state lines with bytes and token estimates,
purges, decode retries, checkpoints) read from the server's -lv 4 log.

traces/ run on the default model (the session's `model`); traces_tiny/ name their model with `-m`
(the tiny hybrid and recurrent models of tests/models/), loaded once per module."""

import json
from pathlib import Path

import pytest

from slotlab.engine.replay import load_trace, replay
from slotlab.engine.server_log import decisions
from tests.golden.replayed import replayed
from tests.golden.trace_models import split_model

DIR = Path(__file__).with_name("traces")
TRACES = sorted(p.stem for p in DIR.glob("*.json") if ".llama-server" not in p.name)
TINY_DIR = Path(__file__).with_name("traces_tiny")
TINY_TRACES = sorted(p.stem for p in TINY_DIR.glob("*.json") if ".llama-server" not in p.name)


def _strip(result: dict) -> dict:
    r = dict(result)
    r.pop("content", None)
    if isinstance(r.get("reply"), dict):
        r["reply"] = {k: v for k, v in r["reply"].items() if k != "timings"}
    return r


def _compare(name: str, trace_dir: Path, results: list, events) -> None:
    want = json.loads((trace_dir / f"{name}.llama-server.json").read_text())
    got = [_strip(r) for r in results]
    exp = [_strip(r) for r in want["results"]]
    for i, (g, w) in enumerate(zip(got, exp)):
        assert g == w, f"{name}: request {i} differs"
    assert len(got) == len(exp)
    ours = decisions(e.message for e in events if e.message)
    theirs = decisions((trace_dir / f"{name}.llama-server.log").read_text().splitlines())
    assert ours == theirs, f"{name}: RAM-cache decisions differ"


def _check(name: str, trace_dir: Path, model) -> None:
    trace = load_trace(trace_dir / f"{name}.json")
    # compare with the stock server: slotlab's slot-file appendices (an opt-in extension) stay off here
    trace.flags = [*trace.flags, "--no-slot-appendices"]
    out = replay(trace, model=model)
    try:
        _compare(name, trace_dir, out["results"], out["engine"].events.replayable())
    finally:
        out["engine"].close()


@pytest.mark.parametrize("name", TRACES)
def test_golden_trace(model, name):
    r = replayed(name, model)  # one replay per trace per session, shared with the log reader's panel test
    _compare(name, DIR, r.results, r.events)


@pytest.mark.parametrize("name", TINY_TRACES)
def test_golden_trace_tiny_model(model_of, name):
    """The hybrid (qwen35) and recurrent (mamba2) traces, each on the model its `-m` names."""
    path, _ = split_model(json.loads((TINY_DIR / f"{name}.json").read_text())["flags"])
    assert path is not None and path.exists(), f"{name}: no model {path} (make tiny-models)"
    _check(name, TINY_DIR, model_of(path))
