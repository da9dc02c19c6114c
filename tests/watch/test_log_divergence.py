"""`watch --why` shows the text around each prompt's divergence where the server's log has it
(LLAMA_SERVER_SLOTS_DEBUG=1; LLAMA_SERVER_SLOTS_N_DIFF sets how many tokens before it).

Golden: tests/watch/data/divergence.* (tests/watch/record_divergence_log.py: the real llama-server's chat
endpoint, -np 1 --swa-full, LLAMA_SERVER_SLOTS_N_DIFF=8; a clock changed in the system prompt, then the
first question edited), and any golden session log kept with its server log (tests/golden/sessions). For
every call the recorder changed, the server printed the token ids around where it stopped reusing; they
must be slotlab's own tokens of that call at slotlab's divergence position, and `watch --why` must print
that request's text with the mark."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slotlab.watch.divergence import MARK, read_divergences, short
from slotlab.watch.report import diverged, read, read_log_divergences

HERE = Path(__file__).resolve().parent
SESSIONS = HERE.parent / "golden" / "sessions"
LOGS = {"divergence": HERE / "data"} | {p.name.removesuffix(".llama-server.log"): SESSIONS
                                        for p in sorted(SESSIONS.glob("*.llama-server.log"))}
NAMES = sorted(LOGS)
N_DIFF = 8  # LLAMA_SERVER_SLOTS_N_DIFF of the recordings


def _golden(name):
    d = LOGS[name]
    lines = [json.loads(x) for x in (d / f"{name}.jsonl").read_text().splitlines() if x.strip()]
    rec = json.loads((d / f"{name}.llama-server.json").read_text())
    return lines, rec


@pytest.mark.parametrize("name", NAMES)
def test_the_servers_tokens_around_each_change_are_slotlabs(model, name):
    from slotlab.conversation import Call, Renderer, client_changes
    from slotlab.engine.params import ServerParams

    lines, rec = _golden(name)
    log = LOGS[name] / f"{name}.llama-server.log"
    _, events = read(log)
    by_request = dict(diverged(events, read_log_divergences(log)))
    root = Path(__file__).resolve().parents[2]
    r = Renderer(model, ServerParams.from_args([str(root / f) if f.endswith(".jinja") else f for f in rec["flags"]]))
    calls = [Call(i, x["messages"], x.get("tools"), x.get("reply"), None, x["session_id"]) for i, x in enumerate(lines)]
    changes = {c.request: c for c in client_changes(calls, r)}
    checked, prev = 0, {}
    for i, srv in enumerate(rec["calls"]):
        j, prev[calls[i].session] = prev.get(calls[i].session), i
        if not srv["made"] or srv["cache_n"] == 0 or j is None:
            continue
        ch = changes[i]
        # a change inside the previous prompt (past it, in the reply, the server's ids are the generated ones,
        # which slotlab re-tokenizes from the text; a branch back leaves nothing past the divergence)
        if ch.position >= min(len(r.tokens(calls[j].messages, calls[j].tools)), srv["cache_n"] + srv["prompt_n"] - 1):
            continue
        d = by_request[i]
        toks = [int(t) for t in r.tokens(calls[i].messages, calls[i].tools)]
        k = min(N_DIFF, srv["cache_n"])  # ids shown before the mark
        at = srv["cache_n"] - k
        assert d.prompt_ids == toks[at:at + len(d.prompt_ids)], (name, i)
        # the held and the new ids agree up to the mark and differ right after it: the divergence
        assert d.held_ids[:k] == d.prompt_ids[:k] and d.held_ids[k] != d.prompt_ids[k], (name, i)
        assert ch.position == srv["cache_n"], (name, i)
        assert MARK in d.prompt and MARK in d.held
        checked += 1
    # every change inside the previous prompt shows its text (the golden sessions: system, edit, insertion,
    # compaction; divergence: the clock and the edit)
    assert checked >= (2 if name == "divergence" else 4), (name, checked)


@pytest.mark.parametrize("name", NAMES)
def test_watch_why_prints_the_text_around_the_divergence(name):
    log = LOGS[name] / f"{name}.llama-server.log"
    out = subprocess.run([sys.executable, "-m", "slotlab.cli", "watch", "--log", str(log), "--why"],
                         capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    _, events = read(log)
    shown = diverged(events, read_log_divergences(log))
    assert shown
    for i, d in shown:
        row = next(ln for ln in lines if ln.startswith(f"#{i} "))
        assert short(d.prompt) in row or repr(d.prompt) in row, (i, row)
    assert not any("LLAMA_SERVER_SLOTS_DEBUG" in ln for ln in lines)  # the log has the lines: no note
    doc = json.loads(subprocess.run([sys.executable, "-m", "slotlab.cli", "watch", "--log", str(log), "--why",
                                     "--json"], capture_output=True, text=True, check=True).stdout)
    assert [(x["request"], x["prompt"]) for x in doc["divergences"]] == [(i, d.prompt) for i, d in shown]


def test_a_log_without_the_lines_says_how_to_get_them():
    log = Path(__file__).resolve().parents[1] / "golden" / "traces" / "two_axis_order_ab.llama-server.log"
    out = subprocess.run([sys.executable, "-m", "slotlab.cli", "watch", "--log", str(log), "--why"],
                         capture_output=True, text=True, check=True).stdout
    assert any(ln.startswith("note: ") and "LLAMA_SERVER_SLOTS_DEBUG=1" in ln for ln in out.splitlines())


def test_a_piece_with_a_newline_goes_on_on_the_next_raw_line():
    """The server prints a piece's newline as it is: the text goes on over a line with no prefix."""
    raw = ["1.45.823.306 W slot   operator(): id  0 | task 3 | old: ...  is 09:1 | 4:05.", "Be brief",
           "1.45.823.306 W slot   operator(): id  0 | task 3 | new: ...  is 09:1 | 5:41.", "Be brief",
           "1.45.823.306 W slot   operator(): id  0 | task 3 |      563  236743",
           "1.45.823.307 W slot   operator(): id  0 | task 3 |      563  236744",
           "1.45.823.312 I slot   operator(): id  0 | task 3 | cached n_tokens = 17, memory_seq_rm [17, end)"]
    d = read_divergences(raw)[3]
    assert (d.held, d.prompt) == (" is 09:1 | 4:05.\nBe brief", " is 09:1 | 5:41.\nBe brief")
    assert (d.held_ids, d.prompt_ids, d.slot) == ([563, 236743], [563, 236744], 0)
