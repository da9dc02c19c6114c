"""The golden traces recorded on llama-server b11549 (tests/golden/traces_b11549/, `python -m
tests.golden.record_traces --build b11549 [--tiny]`) replayed by slotlab on paper under
`--server-build 11549`, each request generating the server's recorded answer: per request the slot,
cache_n, prompt_n, tokens evaluated and cached, status and error; per slot action its reply (without
timings, and without the byte counts: b11549's library writes sequence state version 4, slotlab's the
pin's version 3, so the bodies differ in size while the decisions and the appendix match), and without
the generated text (the tiny models write other text on the two libraries). CANNOT_FOLLOW names what
slotlab cannot follow (it must still differ: a fix drops it from the list).

Two rules of b11549 tell the builds apart here: its slot files carry the checkpoints (the four
hybrid / recurrent slot-file traces), and it reads message spans only from a chat session, no longer
from a /completion body's `message_delimiters` (checkpoints_message_spans, ctx_checkpoints_evict, the
branch-back and small-RAM-cache traces).

Under the pin's rules (no --server-build) the traces whose slot files carry checkpoints differ — which
is what the flag is for."""

import json
from pathlib import Path

import pytest

from slotlab.engine.replay import load_trace
from slotlab.sim.paper_replay import recorded_outputs, replay_on_paper

HERE = Path(__file__).resolve().parent
B = HERE / "traces_b11549"
RECORDED = sorted(p.name.removesuffix(".llama-server.json") for p in B.glob("*.llama-server.json")) if B.exists() else []
BYTES = ("n_written", "n_read")
#: where slotlab cannot follow b11549, and why (each must still differ, or it is dropped from here)
CANNOT_FOLLOW = {
    # b11549's library writes and reads sequence state version 4; a version-3 file (the pin's, and every
    # file slotlab writes: its state body is the pin's library's) is refused there
    "slot_file_from_slotlab": "a version-3 slot file is refused by b11549's library",
    # and the reverse: b11549's own file (state version 4) is read by b11549, refused by the pin's library,
    # on which slotlab runs (the decisions after it cannot follow: the state is not there)
    "slot_file_from_b11549": "a version-4 slot file (b11549's) is refused by the pin's library slotlab runs on",
}


def _trace_path(name: str) -> Path:
    for d in ("traces", "traces_tiny"):
        if (HERE / d / f"{name}.json").exists():
            return HERE / d / f"{name}.json"
    raise FileNotFoundError(name)


def _strip(r: dict) -> dict:
    r = dict(r)
    r.pop("content", None)  # the tiny models' text differs between the two libraries' kernels
    if isinstance(r.get("reply"), dict):
        r["reply"] = {k: v for k, v in r["reply"].items() if k != "timings" and k not in BYTES}
    return r


def _run(name: str, model, model_of, extra: list[str]):
    from tests.golden.trace_models import split_model

    want = json.loads((B / f"{name}.llama-server.json").read_text())
    trace = load_trace(_trace_path(name))
    path, rest = split_model(trace.flags)
    vocab = model if path is None else model_of(path)
    trace.flags = [*(["-m", str(path)] if path else []), *rest, "--no-slot-appendices", *extra]
    out = replay_on_paper(trace, model=vocab, outputs=recorded_outputs(want, vocab))
    try:
        got = [_strip(r) for r in out["results"]]
    finally:
        out["engine"].close()
    return [_strip(r) for r in want["results"]], got


def test_there_are_b11549_recordings():
    assert len(RECORDED) >= 20, "record them: python -m tests.golden.record_traces --build b11549 [--tiny]"


@pytest.mark.parametrize("name", RECORDED)
def test_b11549_trace_replays_exactly_under_its_rules(model, model_of, name):
    want, got = _run(name, model, model_of, ["--server-build", "11549"])
    diffs = [f"request {i}: {g} != {w}" for i, (g, w) in enumerate(zip(got, want)) if g != w]
    if name in CANNOT_FOLLOW:
        assert diffs, f"{name} now matches: drop it from CANNOT_FOLLOW"
        return
    assert len(got) == len(want) and not diffs, f"{name}: " + "; ".join(diffs[:3])


def test_the_pins_rules_differ_where_slot_files_carry_checkpoints(model, model_of):
    differ = []
    for name in RECORDED:
        if name in CANNOT_FOLLOW:
            continue
        want, got = _run(name, model, model_of, [])
        if got != want:
            differ.append(name)
    assert len(differ) >= 10, f"only {differ} tell the builds apart"
    print("differ under the pin's rules:", differ)


def _decisions(rows: list[dict]) -> list[tuple]:
    """What the server decided per request (slot, cache_n, prompt_n, status; an action's status and
    restored / saved length): no text, no byte counts (the state bodies' versions differ)."""
    out = []
    for r in rows:
        if "action" in r:
            rep = r.get("reply") or {}
            out.append((r["action"], r["status"], rep.get("n_restored"), rep.get("n_saved"), rep.get("n_erased")))
        else:
            out.append((r["status"], r.get("id_slot"), r.get("cache_n"), r.get("prompt_n")))
    return out


def _pin_answers(name: str) -> list[dict] | None:
    p = _trace_path(name).with_name(f"{name}.llama-server.json")
    return json.loads(p.read_text())["results"] if p.exists() else None


#: the recordings whose decisions b11549 made otherwise than the pin (from the two servers' answers)
BUILDS_DIFFER = [n for n in RECORDED if n not in CANNOT_FOLLOW and _pin_answers(n) is not None
                 and _decisions(_pin_answers(n)) != _decisions(json.loads((B / f"{n}.llama-server.json")
                                                                           .read_text())["results"])]


def test_some_recordings_tell_the_builds_apart():
    assert len(BUILDS_DIFFER) >= 4, BUILDS_DIFFER


@pytest.mark.parametrize("name", BUILDS_DIFFER)
def test_b11549_trace_replays_on_the_real_context_under_its_rules(model_of, name):
    """Where the two servers decided differently, slotlab's engine on a real llama_context (the pin's
    library: state version 3, so the bodies are the pin's) under `--server-build 11549` decides as
    b11549 did, request for request."""
    from slotlab.engine.replay import replay
    from tests.golden.trace_models import split_model

    want = json.loads((B / f"{name}.llama-server.json").read_text())["results"]
    trace = load_trace(_trace_path(name))
    path, rest = split_model(trace.flags)
    trace.flags = [*(["-m", str(path)] if path else []), *rest, "--no-slot-appendices", "--server-build", "11549"]
    out = replay(trace)
    try:
        got = out["results"]
    finally:
        out["engine"].close()
    assert _decisions(got) == _decisions(want)
