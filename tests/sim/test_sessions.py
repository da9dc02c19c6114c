"""OpenAI-messages session logs: tokenized through the real model's chat template, simulated on the paper
memory; follow-up turns reuse what the previous turn left in a slot or in the RAM cache (its prompt and
the reply the next turn repeats). The sample (`data/sessions_sample.jsonl`, hand-written) interleaves
three conversations of 3-4 turns."""

import json
from pathlib import Path

import numpy as np
import pytest

from slotlab.serve.chat import ChatTemplate
from slotlab.sim.cli import simulate_main
from slotlab.sim.simulate import simulate
from slotlab.sim.speed import SpeedModel
from slotlab.sim.traces import TraceError, load_sessions, load_sim_trace, trace_kind
from slotlab.sim.whatif import run_grid

SAMPLE = Path(__file__).with_name("data") / "sessions_sample.jsonl"
SPEED = SpeedModel.from_rates(1000, 20)


@pytest.fixture(scope="module")
def trace(model):
    return load_sim_trace(SAMPLE, model=model)


def _lcp(a, b) -> int:
    n = min(len(a), len(b))
    d = np.nonzero(np.asarray(a[:n]) != np.asarray(b[:n]))[0]
    return int(d[0]) if len(d) else n


def _follow_ups(trace, results):
    """(request, its result, the session's previous request) for every turn after a session's first."""
    prev, out = {}, []
    for q, d in zip(trace.requests, results):
        if q.session in prev:
            out.append((q, d, prev[q.session]))
        prev[q.session] = q
    return out


def _held(p):
    """What a finished request leaves in its slot: the prompt and the tokens generated (the last one is
    sampled, never decoded)."""
    gen = p.output[:p.n_predict - 1] if p.output is not None else np.zeros(0, np.int32)
    return np.concatenate([p.tokens(), gen])


def test_sessions_are_rendered_through_the_chat_template(trace, model):
    rows = [json.loads(x) for x in SAMPLE.read_text().splitlines() if x.strip()]
    assert trace_kind(SAMPLE) == "sessions" and len(trace.requests) == len(rows) == 11
    tmpl = ChatTemplate(model)
    by_session = {}
    for q in trace.requests:
        by_session.setdefault(q.session, []).append(q)
    assert sorted(by_session) == ["42", "bakery-1", "trip-7"]
    # arrivals: each gap counts from the session's previous call
    assert [q.arrival for q in by_session["bakery-1"]] == [0.0, 20.0, 55.0, 85.0]
    assert [q.arrival for q in trace.requests] == sorted(q.arrival for q in trace.requests)
    rows_by_session = {}
    for r in rows:
        rows_by_session.setdefault(str(r["session_id"]), []).append(r)
    for sid, qs in by_session.items():
        for k, (q, r) in enumerate(zip(qs, rows_by_session[sid])):
            assert list(q.tokens()) == list(model.tokenize(tmpl.apply(r["messages"])))
            assert q.fields["message_delimiters"] == tmpl.delimiters()
            nxt = rows_by_session[sid][k + 1] if k + 1 < len(qs) else None
            if nxt is None:  # a session's last call: the log's output_length, no reply to replay
                assert q.output is None and q.n_predict == r["output_length"]
                continue
            reply = nxt["messages"][len(r["messages"])]
            assert reply["role"] == "assistant"
            assert list(q.output) == list(model.tokenize(reply["content"], add_special=False, parse_special=False))
            assert q.n_predict == r.get("output_length", r.get("max_tokens", len(q.output)))
    assert by_session["bakery-1"][1].n_predict == 64  # max_tokens, longer than its reply


def test_follow_up_turns_reuse_the_previous_turn(trace):
    # --swa-full: the whole common prefix is reused, the replayed reply included
    res = simulate(trace, "-np 2 -c 4096 --swa-full", speed=SPEED)
    fu = _follow_ups(trace, res.results)
    assert len(fu) == 8 and all(d["status"] == 200 for d in res.results)
    for q, d, p in fu:
        lcp = _lcp(_held(p), q.tokens())
        assert lcp > len(p.tokens())  # the reply, tokenized, is what the next turn repeats
        assert d["cache_n"] == lcp and d["prompt_n"] == len(q.tokens()) - lcp
    # Gemma 3's sliding window (no --swa-full): back to a checkpoint, but never nothing
    res = simulate(trace, "-np 2 -c 4096", speed=SPEED)
    for q, d, p in _follow_ups(trace, res.results):
        assert 0 < d["cache_n"] <= _lcp(_held(p), q.tokens())
    # one slot and no RAM cache: the interleaved conversations overwrite each other; a turn reuses only
    # what it shares with the request before it (another session's: the template's first tokens)
    res = simulate(trace, "-np 1 -c 4096 --cache-ram 0 --swa-full", speed=SPEED)
    reqs = trace.requests
    for i in range(1, len(reqs)):
        assert res.results[i]["cache_n"] == _lcp(_held(reqs[i - 1]), reqs[i].tokens())
    assert all(d["cache_n"] < 20 < len(p.tokens()) for _, d, p in _follow_ups(trace, res.results))


def test_whatif_and_simulate_read_session_logs(capsys):
    runs = run_grid(SAMPLE, ["-np", "1", "-c", "4096", "--swa-full"], [("--cache-ram", ["0", "64"])],
                    speed=SPEED, jobs=1)
    assert [r.error for r in runs] == [None, None]
    assert runs[1].n_requests == 11 and runs[1].tokens_reused > 3 * runs[0].tokens_reused  # the RAM cache pays
    assert simulate_main([str(SAMPLE), "--json", "--prefill-tps", "1000", "--gen-tps", "20", "-np", "2", "-c", "4096",
                          "--swa-full"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["totals"]["n_ok"] == 11 and out["totals"]["tokens_reused"] > 0


def _line(**kw):
    d = {"session_id": "s", "messages": [{"role": "user", "content": "hi"}], "output_length": 4, "gap": 0}
    d.update(kw)
    return json.dumps({k: v for k, v in d.items() if v is not ...})


@pytest.mark.parametrize("bad, field", [
    (_line(session_id=[1]), "session_id"),  # optional (told by content where missing), never a list
    (_line(messages=[]), "messages"),
    (_line(messages=[{"content": "hi"}]), "messages[0].role"),
    (_line(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), "messages[0].content"),
    (_line(output_length=-3), "output_length"),
    (_line(output_length=..., max_tokens="many"), "max_tokens"),
    (_line(output_length=...), "output_length"),  # the last call: no reply shows its length
    (_line(gap=...), "gap"),
    (_line(timestamp=3.0), "gap"),  # both
    (_line(gap="soon"), "gap"),
])
def test_a_malformed_line_names_file_line_and_field(tmp_path, bad, field):
    p = tmp_path / "log.jsonl"
    p.write_text(_line() + "\n\n" + bad + "\n")
    with pytest.raises(TraceError) as ei:
        load_sim_trace(p)  # every line is checked before a model is loaded
    msg = str(ei.value)
    assert str(p) in msg and "line 3" in msg and f"field '{field}'" in msg, msg


def test_bad_json_lines(tmp_path):
    p = tmp_path / "log.jsonl"
    p.write_text(_line() + "\n" + '{"session_id": "s", "messages": [\n')
    with pytest.raises(TraceError, match=r"log\.jsonl, line 2: not JSON"):
        load_sessions(p)
    p.write_text("[1, 2]\n")
    with pytest.raises(TraceError, match=r"line 1: not a known trace line"):
        load_sim_trace(p)
    m = tmp_path / "mooncake.jsonl"
    m.write_text('{"timestamp": 0, "input_length": 600, "hash_ids": [1, 2]}\n{"timestamp": 5, "hash_ids": [1]}\n')
    with pytest.raises(TraceError, match=r"mooncake\.jsonl, line 2, field 'input_length': missing"):
        load_sim_trace(m)


def test_a_session_log_header_gives_the_flags_and_simulate_says_so(tmp_path, capsys):
    """What `slotlab proxy --record x.jsonl` writes first: the server's flags and /props; `simulate` takes
    the flags from it (and says so), a log without one says that defaults are simulated, a bad header
    names its field. Without session ids the conversations are told by content."""
    from slotlab.sim.cli import flags_of_log
    from slotlab.sim.traces import load_sessions, session_log_header

    head = {"slotlab_session_log": 1, "flags": ["-np", "2", "-c", "4096"], "server": {"build": "b11312-x"}}
    calls = [{"messages": [{"role": "user", "content": "hi"}], "output_length": 3, "gap": 0},
             {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                           {"role": "user", "content": "more"}], "output_length": 3, "gap": 1}]
    p = tmp_path / "log.jsonl"
    p.write_text("\n".join(json.dumps(x) for x in [head, *calls]) + "\n")
    assert session_log_header(p) == head
    assert flags_of_log(p, [], "t") == ["-np", "2", "-c", "4096"]
    assert "the server's flags from the session log: -np 2 -c 4096 (build b11312-x)" in capsys.readouterr().err
    assert flags_of_log(p, ["-np", "1"], "t") == ["-np", "1"]
    assert "not the recorded -np 2 -c 4096" in capsys.readouterr().err
    st = load_sessions(p)
    assert st.flags == ["-np", "2", "-c", "4096"] and len(st.requests) == 2
    assert st.requests[0].session == st.requests[1].session  # told by content: one conversation
    bare = tmp_path / "bare.jsonl"
    bare.write_text("\n".join(json.dumps(x) for x in calls) + "\n")
    assert flags_of_log(bare, [], "t") == [] and "simulating llama-server's defaults" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({**head, "flags": "-np 2"}) + "\n" + json.dumps(calls[0]) + "\n")
    with pytest.raises(TraceError, match="field 'flags'"):
        load_sessions(bad)
