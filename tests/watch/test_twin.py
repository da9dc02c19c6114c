"""The twin view's comparison: slotlab's engine beside a real server's log.

* the comparator alone (no model): a golden log against itself has no difference; the same log with one
  line changed or gone reports that decision first (an eviction, a checkpoint restore, a slot, a cache_n);
* on golden traces (model): a `Twin` with the trace's flags, fed the trace's requests, reports no
  difference from the server's recorded log; with a deliberately different flag it reports the first
  decision that differs."""

from __future__ import annotations

from pathlib import Path

import pytest

from slotlab.engine.replay import install_files, load_trace
from slotlab.watch.log_reader import LogReader
from slotlab.watch.twin import Twin, compare

DIR = Path(__file__).resolve().parent.parent / "golden" / "traces"


def read(name: str, edit=None) -> list:
    lines = (DIR / f"{name}.llama-server.log").read_text().splitlines(True)
    if edit is not None:
        lines = edit(lines)
    rd = LogReader()
    evs = []
    for ln in lines:
        evs += rd.feed(ln)
    return evs + rd.flush()


def drop_first(text: str):
    def edit(lines):
        i = next(i for i, ln in enumerate(lines) if text in ln)
        return lines[:i] + lines[i + 1:]
    return edit


def replace_first(text: str, new: str):
    def edit(lines):
        i = next(i for i, ln in enumerate(lines) if text in ln)
        return lines[:i] + [lines[i].replace(text, new)] + lines[i + 1:]
    return edit


@pytest.mark.parametrize("name", ["cache_ram_fifo_bytes", "defaults_chat_checkpoints", "example", "id_slot"])
def test_a_log_against_itself_has_no_difference(name):
    assert compare(read(name), read(name)) is None


def test_the_first_changed_decision_is_reported():
    base = read("cache_ram_fifo_bytes")
    d = compare(base, read("cache_ram_fifo_bytes", drop_first("making room for prompt cache entry")))
    assert d is not None and d.kind == "evict_make_room" and d.request == 3
    assert "the server made a RAM-cache eviction (make room)" in str(d)
    d = compare(read("defaults_chat_checkpoints"),
                read("defaults_chat_checkpoints", replace_first("restored context checkpoint (pos_min = 0",
                                                                "restored context checkpoint (pos_min = 1")))
    assert d is not None and d.kind == "checkpoint_restored" and "checkpoint restore differs" in str(d)
    d = compare(base, read("cache_ram_fifo_bytes", replace_first("cached n_tokens = 3,", "cached n_tokens = 2,")))
    assert d is not None and d.kind == "cache_n" and d.request == 1


@pytest.mark.slow
@pytest.mark.parametrize("name,extra,want", [
    ("example", [], None),
    ("cache_ram_fifo_bytes", [], None),
    ("example", ["--cache-ram", "0"], (2, "save")),  # no RAM cache: the server's first save is missing
    ("cache_ram_fifo_bytes", ["--cache-ram", "12"], (3, "evict_make_room")),  # more room: no eviction at 3
])
def test_twin_on_a_golden_trace(model, name, extra, want):
    trace = load_trace(DIR / f"{name}.json")
    twin = Twin([*trace.flags, "--no-slot-appendices", *extra], model=model)
    try:
        install_files(trace, twin._tmp.name)
        for r in trace.requests:
            twin.request(r)
        assert twin.wait(600) and twin.error is None
        d = twin.diff(read(name))
        assert twin._n_compared == sum(1 for r in trace.requests if "action" not in r)
        if want is None:
            assert d is None, str(d)
        else:
            assert d is not None and (d.request, d.kind) == want, str(d)
            assert d.real is not None and d.real.kind == want[1]
    finally:
        twin.close()
