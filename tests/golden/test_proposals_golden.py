"""Fidelity for the proposals (issue 34 item 3): golden traces recorded on a real llama-server built from
the pin's tree with patches/proposals/*.patch applied (`make llama-server-proposals`, then
`python -m tests.golden.record_traces --traces tests/golden/traces_proposals --build proposals NAME...`).

tests/golden/traces_proposals/ holds, per proposal trace NAME, its sibling NAME_pin (the same requests,
the proposal's flag dropped) recorded on the pin's server (`--server build/llama-server/cmake/bin/
llama-server`): the pin rejects the new flags.
  * lru_idle_old_slot, lru_already_cached_touch: `--cache-ram-lru` (01-cache-ram-lru.patch);
  * kvcpc_aggregate_vs_entry, kvcpc_entry_limit, kvcpc_default: `-kvcpc N` (02-kvcpc-per-entry-limit.patch,
    from upstream PR #28046's description).

(a) every recording replays exactly on paper in slotlab (as test_b11549 does, without --server-build:
the trace's own flags select the proposal), (b) and on the real context (results and the RAM-cache
decisions read from the -lv 4 log, as test_golden does), (c) each proposal's recording decides otherwise
than its _pin sibling's on at least one request (so the golden can fail), except kvcpc_default (the flag
at its default), which answers exactly as the pin."""

import json
from pathlib import Path

import pytest

from slotlab.engine.replay import load_trace, replay
from slotlab.engine.server_log import decisions
from slotlab.sim.paper_replay import recorded_outputs, replay_on_paper

HERE = Path(__file__).resolve().parent
D = HERE / "traces_proposals"
TRACES = sorted(p.stem for p in D.glob("*.json") if ".llama-server" not in p.name)
RECORDED = [n for n in TRACES if (D / f"{n}.llama-server.json").exists()]
PROPOSALS = [n for n in TRACES if not n.endswith("_pin")]
#: the proposal's flag at its default value: the patched server must answer exactly as the pin
SAME_AS_PIN = {"kvcpc_default"}
#: the flags a proposal trace has and its _pin sibling lacks
NEW_FLAGS = {"--cache-ram-lru": 0, "-kvcpc": 1, "--kv-cache-prompt-context": 1}


def _binary():
    from bench.build_llama_server import server_binary

    return server_binary("proposals")


if not RECORDED and _binary() is None:
    pytest.skip("no proposals server and no recordings: make llama-server-proposals, then record "
                "(python -m tests.golden.record_traces --traces tests/golden/traces_proposals --build proposals)",
                allow_module_level=True)


def _want(name: str) -> dict:
    return json.loads((D / f"{name}.llama-server.json").read_text())


def _strip(r: dict) -> dict:
    r = dict(r)
    r.pop("content", None)
    if isinstance(r.get("reply"), dict):
        r["reply"] = {k: v for k, v in r["reply"].items() if k != "timings"}
    return r


def _decisions(rows: list[dict]) -> list[tuple]:
    """What the server decided per request: status, slot, cache_n, prompt_n."""
    return [(r["status"], r.get("id_slot"), r.get("cache_n"), r.get("prompt_n")) for r in rows]


def _trace(name: str):
    trace = load_trace(D / f"{name}.json")
    # compare with the stock server: slotlab's slot-file appendices (an opt-in extension) stay off here
    trace.flags = [*trace.flags, "--no-slot-appendices"]
    return trace


def test_every_trace_is_recorded():
    missing = [n for n in TRACES for ext in ("json", "log") if not (D / f"{n}.llama-server.{ext}").exists()]
    assert len(PROPOSALS) >= 5 and not missing, (
        f"record {sorted(set(m for m in missing))}: python -m tests.golden.record_traces --traces "
        "tests/golden/traces_proposals --build proposals NAME (the _pin ones with --server the pin's binary)")


@pytest.mark.parametrize("name", PROPOSALS)
def test_the_pin_sibling_is_the_trace_without_the_new_flag(name):
    t, pin = (json.loads((D / f"{n}.json").read_text()) for n in (name, f"{name}_pin"))
    assert t["requests"] == pin["requests"]
    flags, dropped = list(t["flags"]), []
    for f, n in NEW_FLAGS.items():
        while f in flags:
            i = flags.index(f)
            dropped += flags[i:i + 1 + n]
            del flags[i:i + 1 + n]
    assert dropped and flags == pin["flags"], (name, dropped)


@pytest.mark.parametrize("name", RECORDED)
def test_proposal_trace_replays_exactly_on_paper(model, name):
    want = _want(name)
    out = replay_on_paper(_trace(name), model=model, outputs=recorded_outputs(want, model))
    try:
        got = [_strip(r) for r in out["results"]]
    finally:
        out["engine"].close()
    exp = [_strip(r) for r in want["results"]]
    diffs = [f"request {i}: {g} != {w}" for i, (g, w) in enumerate(zip(got, exp)) if g != w]
    assert len(got) == len(exp) and not diffs, f"{name}: " + "; ".join(diffs[:3])


@pytest.mark.parametrize("name", RECORDED)
def test_proposal_trace_replays_on_the_real_context(model, name):
    want = _want(name)
    out = replay(_trace(name), model=model)
    eng = out["engine"]
    try:
        got = [_strip(r) for r in out["results"]]
        ours = decisions(e.message for e in eng.events.replayable() if e.message)
    finally:
        eng.close()
    exp = [_strip(r) for r in want["results"]]
    for i, (g, w) in enumerate(zip(got, exp)):
        assert g == w, f"{name}: request {i} differs: {g} != {w}"
    assert len(got) == len(exp)
    theirs = decisions((D / f"{name}.llama-server.log").read_text().splitlines())
    assert ours == theirs, f"{name}: RAM-cache decisions differ"


@pytest.mark.parametrize("name", [n for n in PROPOSALS if n in RECORDED and f"{n}_pin" in RECORDED])
def test_the_proposal_decides_otherwise_than_the_pin(name):
    got, pin = _want(name)["results"], _want(f"{name}_pin")["results"]
    if name in SAME_AS_PIN:
        # the flag at its default: the very same answers (the text too: one library, one model)
        assert [_strip(r) | {"content": r.get("content")} for r in got] == \
               [_strip(r) | {"content": r.get("content")} for r in pin]
        mine, theirs = (decisions((D / f"{n}.llama-server.log").read_text().splitlines()) for n in (name, f"{name}_pin"))
        assert mine == theirs
        return
    differ = [i for i, (a, b) in enumerate(zip(_decisions(got), _decisions(pin))) if a != b]
    assert differ, f"{name}: the proposal answered every request as the pin"
