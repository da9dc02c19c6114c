"""`slotlab watch --log FILE`: the per-request report of a finished log (`--json`: replay's schema),
`--events F`: every event as JSON lines."""

import json
from pathlib import Path

from slotlab.cli import main
from slotlab.watch.log_reader import LogReader, requests_json

DIR = Path(__file__).resolve().parent.parent / "golden" / "traces"
LOG = DIR / "example.llama-server.log"


def test_json_is_replays_schema(capsys):
    assert main(["watch", "--log", str(LOG), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"flags", "results", "build"}
    assert out["build"]["modelled"] == 11312
    assert out["results"] == requests_json(LogReader().read_file(LOG))
    first = out["results"][0]
    assert set(first) == {"status", "id_slot", "cache_n", "prompt_n", "tokens_evaluated", "tokens_cached", "content",
                          "error"}
    want = json.loads((DIR / "example.llama-server.json").read_text())["results"][0]
    assert {k: first[k] for k in first if k != "content"} == {k: want[k] for k in first if k != "content"}
    assert out["flags"][:2] == ["-np", "2"] and "-kvu" in out["flags"] and "--swa-full" in out["flags"]


def test_events_file(tmp_path, capsys):
    path = tmp_path / "events.jsonl"
    assert main(["watch", "--log", str(LOG), "--events", str(path)]) == 0
    table = capsys.readouterr().out
    assert "erase" in table and "request" in table and "lines read" in table
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["seq"] for r in rows] == list(range(len(rows)))
    assert {"seq", "t", "kind", "level", "slot", "task", "message", "data"} == set(rows[0])
    kinds = {r["kind"] for r in rows}
    assert {"init", "slot_decision", "task_done", "cache_alloc", "log"} <= kinds


def test_a_log_below_lv4_says_what_it_lacks(tmp_path, capsys):
    lines = [ln for ln in LOG.read_text().splitlines(True)
             if "selected slot" in ln or "processing task" in ln or "print_timing" in ln or "release" in ln]
    path = tmp_path / "lv3.log"
    path.write_text("".join(lines))
    assert main(["watch", "--log", str(path)]) == 0
    assert "below -lv 4" in capsys.readouterr().out


def test_a_missing_file_is_an_error(tmp_path, capsys):
    assert main(["watch", "--log", str(tmp_path / "nope.log")]) == 1
    assert "cannot read log" in capsys.readouterr().err
