"""Slot actions in real llama-server logs (issue 20, item 2): save, erase, restore and failed restores
among `id_slot` traffic, and every request after them.

The server logs an erase (`clearing prompt with N tokens`) and a failed restore (the library's error,
the clear, `send_error`), but nothing for a successful save or restore. The reader infers a restore
from what follows it (a similarity check or a save of a slot it holds empty, a length it did not
put there) and says in the row's `lacks` what the log does not give; a save leaves no trace. Checked
on every golden log (traces/ on Gemma 3, traces_tiny/ on the hybrid and recurrent tiny models),
the new `slot_actions` scenarios included (recorded by tests/golden/record_traces.py from the real
server):

* every completion exactly as the server answered it (slot, cache_n, prompt_n, tokens_evaluated,
  tokens_cached, status, error), every erase, every failed restore with its 400, every successful
  restore as a row whose fields are the server's or None and named in `lacks`; a save (or a restore
  nothing reveals) only as an "unlogged" row where its loop iteration printed a bare `all slots are
  idle`, and no more of those than the server answered such actions there (or the recorder read
  /slots there);
* with the HTTP side's answers (what the recording proxy of `slotlab watch --twin` / `--proxy-port` or
  the panel's controls see), `http_side.fill` gives every row exactly, saves included;
* `Watch.results()` does that fill with an attached recorder and with the panel's own actions.
No model, no server."""

import json
from pathlib import Path

import pytest

from slotlab.watch.http_side import fill
from slotlab.watch.log_reader import LogReader, requests_json
from tests.watch.golden_rows import agrees, known, log_can_show, shown, strip, unlogged_fit

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
DIRS = {"traces": GOLDEN / "traces", "traces_tiny": GOLDEN / "traces_tiny"}
LOGS = sorted(f"{d}/{p.name.removesuffix('.llama-server.log')}" for d, dp in DIRS.items()
              for p in dp.glob("*.llama-server.log"))
NEW = ["traces/slot_actions", "traces_tiny/hybrid_slot_actions", "traces_tiny/recurrent_slot_actions"]


def _paths(name: str) -> tuple[Path, Path]:
    d, stem = name.split("/")
    return DIRS[d] / f"{stem}.llama-server.log", DIRS[d] / f"{stem}.llama-server.json"


def trace(name: str) -> dict:
    d, stem = name.split("/")
    return json.loads((DIRS[d] / f"{stem}.json").read_text())


def answers(name: str) -> list[dict]:
    return json.loads(_paths(name)[1].read_text())["results"]


def golden(name: str) -> list[dict]:
    return [strip(r) for r in answers(name)]


def read(name: str, *, unlogged: bool = False) -> tuple[LogReader, list[dict]]:
    """The reader and its rows (`unlogged`: with the unlogged actions, which are checked here to fit
    the server's answers either way)."""
    rd = LogReader()
    got = [strip(r) for r in requests_json(rd.read_file(_paths(name)[0]))]
    assert unlogged_fit(trace(name), answers(name), got) is None, f"{name}: {unlogged_fit(trace(name), answers(name), got)}"
    return rd, got if unlogged else known(got)


def test_the_new_scenarios_are_recorded():
    for name in NEW:
        acts = [r for r in golden(name) if "action" in r]
        kinds = {(r["action"], r["status"]) for r in acts}
        assert {("save", 200), ("erase", 200), ("restore", 200), ("restore", 400)} <= kinds, name
        failed = [r["reply"]["error"]["message"] for r in acts if r["status"] == 400]
        assert len(failed) >= 3, name  # a missing file, a damaged body, not a slot file


@pytest.mark.parametrize("name", LOGS)
def test_every_row_the_log_can_show_and_nothing_invented(name):
    rd, got = read(name)
    want = shown(trace(name), answers(name))
    for i, (g, w) in enumerate(zip(got, want)):
        assert agrees(g, w), f"{name}: row {i}: {g} != {w}"
    assert len(got) == len(want), f"{name}: {len(got)} rows, the server answered {len(want)} the log can show"
    assert rd.problems == [] and rd.n_resyncs == 0
    for g in got:  # what a row lacks is None, and only that
        assert all((g["reply"][k] is None) == (k in g.get("lacks", [])) for k in g.get("reply", {})), g


@pytest.mark.parametrize("name", NEW)
def test_the_new_logs_infer_each_restore_and_read_lengths_where_printed(name):
    _, got = read(name)
    restores = [g for g in got if g.get("action") == "restore" and g["status"] == 200]
    assert restores and all(set(g["lacks"]) >= {"filename", "n_read"} for g in restores)
    assert [g for g in got if g.get("action") == "restore" and g["status"] == 400]


@pytest.mark.parametrize("name", LOGS)
def test_the_http_side_fills_every_row(name):
    """The recording proxy's rows (what the recorder answered: the golden JSON itself) fill the log's
    rows to the server's answers exactly, saves and file names and bytes included."""
    _, got = read(name, unlogged=True)
    want = golden(name)
    # what is left of the unlogged rows once the answers are in: the recorder's own /slots reads
    assert known([strip(r) for r in fill(got, want)]) == want


def test_fill_keeps_what_the_http_side_did_not_see_and_places_the_panels_actions():
    log = [{"status": 200, "id_slot": 0, "cache_n": 0, "prompt_n": 5, "content": None},
           {"action": "erase", "status": 200, "reply": {"id_slot": 0, "n_erased": 7}},
           {"action": "restore", "status": 200, "reply": {"id_slot": 1, "filename": None, "n_restored": None,
                                                          "n_read": None}, "lacks": ["filename", "n_restored", "n_read"]},
           {"status": 200, "id_slot": 1, "cache_n": 4, "prompt_n": 1, "content": None}]
    save = {"action": "save", "status": 200, "reply": {"id_slot": 0, "filename": "a.bin", "n_saved": 7, "n_written": 99}}
    rest = {"action": "restore", "status": 200, "reply": {"id_slot": 1, "filename": "a.bin", "n_restored": 7,
                                                          "n_read": 99}}
    # the panel sent the save and the restore (not the erase: another client did) after one completion
    out = fill(log, [{**save, "_after": 1}, {**rest, "_after": 1}], after=[1, 1])
    assert out == [log[0], log[1], save, rest, log[3]]
    # a proxy saw everything: completions align by order and get the content the log lacks
    comp = [{**log[0], "content": "x"}, {**log[3], "content": "y"}]
    out = fill(log, [comp[0], save, {"action": "erase", "status": 200, "reply": {"id_slot": 0, "n_erased": 7}},
                     rest, comp[1]])
    assert out == [comp[0], save, log[1], rest, comp[1]]


def test_watch_results_take_the_answers_from_an_attached_recorder(tmp_path):
    from slotlab.watch.live import Watch

    name = "traces/slot_actions"
    log, _ = _paths(name)
    want = golden(name)

    class Recorder:  # what slotlab.proxy's Recorder.trace() holds after the same traffic
        def trace(self):
            return {"results": json.loads(_paths(name)[1].read_text())["results"]}

    w = Watch(log)
    w.start()
    w.wait_for(lambda: w.reader.n_lines >= len(log.read_text().splitlines()), 30)
    w.stop()
    offline = [strip(r) for r in w.results()]
    assert len(known(offline)) == sum(log_can_show(trace(name), answers(name)))
    # the two saves whose loop iterations printed only `all slots are idle`, at their places
    assert [i for i, r in enumerate(offline) if r["action" if "action" in r else "status"] == "unlogged"] == [1, 11]
    w.attach_recorder(Recorder())
    assert [strip(r) for r in w.results()] == want
    # the panel's own controls: the answers of the actions it sent, placed among the completions
    w.recorder = None
    n = 0
    for r in json.loads(_paths(name)[1].read_text())["results"]:
        if "action" in r:
            w._sent_actions.append({**r, "_after": n})
        else:
            n += 1
    assert [strip(r) for r in w.results()] == want
