"""The log reader reads every build's log from b9800 to b11434 (slotlab/watch/builds.py).

* Real golden logs of the pin (b11312) rewritten to each older build's texts (`builds.render`), with
  the lines that build never prints taken out (`builds.ADDED`) and its number on the start-up line,
  still give the server's answers; where only texts change, every typed event is the same. Every text
  variant and every added line occurs in the logs used (so each is exercised, not just listed).
* The reader names the build from the start-up line (the pin's logs, built outside llama.cpp's git,
  say `build 1 (0c1e570)`: the commit names it), or without one the range its texts allow, and warns
  once when it is not the build slotlab models.
* The real b11434 logs (tests/golden/traces_b11434/, recorded by `python -m tests.golden.record_traces
  --build b11434`) give that server's answers: each request's slot, cache_n, prompt_n."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from slotlab.engine import event_types as T
from slotlab.watch import builds as B
from slotlab.watch.lines import parse_line
from slotlab.watch.log_reader import LOG, LogReader, requests_json
from slotlab.watch.patterns import match
from tests.watch.golden_rows import agrees, known, shown, strip, unlogged_fit

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
PIN_DIRS = (GOLDEN / "traces", GOLDEN / "traces_tiny")
B11434 = GOLDEN / "traces_b11434"
PIN_LOGS = sorted(p for d in PIN_DIRS for p in d.glob("*.llama-server.log"))
B11434_LOGS = sorted(B11434.glob("*.llama-server.log"))
B11549_LOGS = sorted((GOLDEN / "traces_b11549").glob("*.llama-server.log"))

#: one build on each side of every change, and the ends of the range
BUILDS = sorted({B.OLDEST, B.MODELLED, B.NEWEST} | {c.since - 1 for c in B.TEXTS} | {a.since - 1 for a in B.ADDED})
_BUILD_LINE = re.compile(r"build \d+ \([0-9A-Za-z]+\)")


def rewrite(lines: list[str], build: int, *, drop: bool = True, build_line: bool = True) -> tuple[list[str], set]:
    """A pin log as `build` would print it: old texts, no lines it never prints, its number at start-up.
    Returns the lines and the names of the variants / added lines that occurred."""
    gone = B.lines_missing(build) if drop else set()
    out, hit = [], set()
    for raw in lines:
        raw = raw.rstrip("\n")
        if build_line and _BUILD_LINE.search(raw) and "common_params_print_info" in raw:
            out.append(_BUILD_LINE.sub(f"build {build} (abc{build:04x})", raw))
            continue
        ln = parse_line(raw)
        found = match(ln.src, ln.msg) if ln.src is not None else None
        if found is not None:
            name = found[0]
            if name in gone:
                hit.add(name)
                continue
            new = B.render(ln.msg, build)
            if new != ln.msg:
                assert raw.endswith(ln.msg)
                raw = raw[: len(raw) - len(ln.msg)] + new
                hit.add(name)
        out.append(raw)
    return out, hit


def read_lines(lines: list[str]) -> tuple[LogReader, list]:
    rd = LogReader()
    events = []
    for ln in lines:
        events += rd.feed(ln)
    events += rd.flush()
    return rd, events


def _recorded(log: Path) -> tuple[dict, list[dict]]:
    """(the trace, the answers recorded beside `log`); the trace is the one of that name in traces/ or
    traces_tiny/."""
    name = log.name.split(".")[0]
    trace = next(d / f"{name}.json" for d in PIN_DIRS if (d / f"{name}.json").exists())
    res = json.loads(log.with_name(log.name.replace(".log", ".json")).read_text())["results"]
    return json.loads(trace.read_text()), res


def expected(log: Path, trace_dir: Path | None = None) -> list[dict]:
    """The answers (recorded beside `log`) the log can show (tests/watch/golden_rows.py)."""
    return shown(*_recorded(log))


def rows(log: Path, events) -> list[dict]:
    """The rows read from the log but its unlogged actions, which must fit the answers (golden_rows)."""
    got = [strip(r) for r in requests_json(events)]
    assert unlogged_fit(*_recorded(log), got) is None, f"{log.name}: {unlogged_fit(*_recorded(log), got)}"
    return known(got)


def same(got: list[dict], want: list[dict]) -> bool:
    return len(got) == len(want) and all(agrees(g, w) for g, w in zip(got, want))


def typed(events) -> list:
    return [(e.kind, e.slot, e.task, json.dumps(e.payload.as_dict(), sort_keys=True, default=str)) for e in events if e.kind != LOG]


@pytest.mark.parametrize("build", BUILDS)
def test_every_builds_texts_give_the_servers_answers(build):
    seen = set()
    for log in PIN_LOGS:
        lines, hit = rewrite(log.read_text(errors="replace").splitlines(), build)
        seen |= hit
        rd, events = read_lines(lines)
        got = rows(log, events)
        want = expected(log)
        if "sim" in B.lines_missing(build):
            # no similarity lines: a successful restore shows only where other lines reveal it; every other
            # row is the server's, and each restore the reader does show is one the server answered
            ok = lambda r: r.get("action") == "restore" and r.get("status") == 200  # noqa: E731
            assert same([r for r in got if not ok(r)], [r for r in want if not ok(r)]), f"{log.name} as b{build}"
            left = [r for r in want if ok(r)]
            for r in filter(ok, got):
                assert any(agrees(r, w) for w in left), f"{log.name} as b{build}: {r}"
        else:
            assert same(got, want), f"{log.name} as b{build}"
        assert rd.problems == []
        # where the log lacks a line (which entry a load took, which ones made room) the reader takes the
        # RAM cache's content from the next ' - cache state' listing; a log that lacks nothing never needs to
        if not hit & B.lines_missing(build):
            assert rd.n_resyncs == 0, f"{log.name} as b{build}"
        assert rd.build.build == build and rd.build.source == "start-up line"
        assert rd.build.summary()["cannot_give"] == B.missing(build)
    # every variant this build prints and every line it lacks occurred in these logs
    want = {c.line for c in B.TEXTS if build < c.since} | B.lines_missing(build)
    assert want <= seen, f"b{build}: never exercised: {sorted(want - seen)}"


def test_old_texts_give_the_same_events():
    """Only the texts changed (no line dropped): every typed event is the same as the pin's."""
    n_rewritten = 0
    for log in PIN_LOGS:
        orig = log.read_text(errors="replace").splitlines()
        lines, hit = rewrite(orig, B.OLDEST, drop=False, build_line=False)
        n_rewritten += sum(a != b for a, b in zip(orig, lines))
        _, e0 = read_lines(orig)
        _, e1 = read_lines(lines)
        assert typed(e1) == typed(e0), log.name
        # the events carry the log's own texts: the old ones
        if "by_lcp" in hit:
            assert any("similarity, sim_best = " in e.message for e in e1)
    assert n_rewritten > 0


def test_a_variant_is_read_as_the_modelled_text():
    for c in B.TEXTS:
        old_msg = {"ckpt_check": "Checking checkpoint with [0, 511] against 0...",
                   "by_lcp": "selected slot by LCP similarity, sim_best = 0.933 (> 0.100 thold), f_keep = 1.000",
                   "load_base": " - looking for better prompt, base f_keep = 0.125, sim = 0.083",
                   "load_found": " - found better prompt with f_keep = 1.000, sim = 0.917"}[c.line]
        new_msg, change = B.normalize(old_msg)
        assert change is c and B.render(new_msg, c.since - 1) == old_msg
        src = "slot" if c.line in ("ckpt_check", "by_lcp") else "srv"
        assert match(src, old_msg) is None  # the modelled patterns alone would miss it
        assert match(src, new_msg)[0] == c.line
        assert B.normalize(new_msg) == (new_msg, None)  # the modelled text is left alone


# ---------------------------------------------------------------- which build


def test_the_pins_logs_name_the_modelled_build_by_commit():
    for log in PIN_LOGS[:3]:
        rd = LogReader()
        events = rd.read_file(log)
        assert (rd.build.build, rd.build.commit, rd.build.source) == (B.MODELLED, B.MODELLED_COMMIT, "commit")
        assert rd.build.warning() is None  # the modelled build: nothing to warn about
        assert not [e for e in events if e.kind == LOG and e.message.startswith("slotlab watch: this log is from")]


def test_an_older_build_is_warned_about_once_with_what_it_changes():
    lines, _ = rewrite(PIN_LOGS[0].read_text().splitlines(), 10000)
    rd, events = read_lines(lines)
    warns = [e for e in events if e.kind == LOG and e.message.startswith("slotlab watch: this log is from b10000")]
    assert len(warns) == 1 and warns[0].level == "WRN"
    assert "slotlab models b11312" in warns[0].message and "sim_best" in warns[0].message
    assert "which slots the LCP selection skipped" in warns[0].message
    assert rd.build.line().startswith("build: reads b10000 (slotlab models b11312); this build's log cannot give:")


def test_the_old_start_up_line_and_an_unnamed_build():
    assert B.build_line("build", "9850 (1a2b3c4) with cc (Debian 12.2.0-14) 12.2.0 for x86_64-linux-gnu") == \
        (9850, "1a2b3c4", "start-up line")
    assert B.build_line("common_param", "common_params_print_info: build 3 (deadbee) with GNU 12 for Linux") == \
        (None, "deadbee", "not a build number")
    # no start-up line (a -lv 3 log, or cut): the texts bound the build
    lines, _ = rewrite(PIN_LOGS[0].read_text().splitlines(), 10100)
    lines = [ln for ln in lines if "common_params_print_info: build" not in ln]
    rd, events = read_lines(lines)
    assert rd.build.build is None and rd.build.hi == 10177
    warns = [e.message for e in events if e.kind == LOG and e.message.startswith("slotlab watch: this log is from")]
    assert warns == [warns[0]] and "a build before b10178" in warns[0]
    assert rd.build.summary()["range"] == [rd.build.lo, 10177]


def test_get_props_names_the_build_a_quiet_log_does_not():
    w = B.BuildWatch()
    assert w.on_build_info("b11434-unknown") and (w.build, w.source) == (11434, "GET /props")
    assert "from GET /props" in w.line() and "LLAMA_STATE_SEQ_VERSION" in w.warning()
    w = B.BuildWatch()
    assert w.on_build_info("b1-0c1e570") and (w.build, w.source) == (11312, "GET /props") and w.warning() is None
    assert not B.BuildWatch().on_build_info("b2-deadbee") and not B.BuildWatch().on_build_info("garbage")


# ---------------------------------------------------------------- the real b11434 server


def test_there_are_b11434_logs():
    assert len(B11434_LOGS) >= 31


@pytest.mark.parametrize("log", B11434_LOGS, ids=lambda p: p.name.split(".")[0])
def test_b11434_log_gives_that_servers_answers(log):
    rd = LogReader()
    events = rd.read_file(log)
    got = rows(log, events)
    want = expected(log)
    for i, (g, w) in enumerate(zip(got, want)):
        assert (g.get("id_slot"), g.get("cache_n"), g.get("prompt_n")) == \
            (w.get("id_slot"), w.get("cache_n"), w.get("prompt_n")), f"{log.name}: request {i}"
        assert agrees(g, w), f"{log.name}: result {i} differs: {g} != {w}"
    assert len(got) == len(want)
    assert rd.problems == [] and rd.n_resyncs == 0
    assert (rd.build.build, rd.build.source) == (11434, "start-up line")
    warns = [e for e in events if e.kind == LOG and e.message.startswith("slotlab watch: this log is from b11434")]
    assert len(warns) == 1 and "LLAMA_STATE_SEQ_VERSION" in warns[0].message
    assert {T.INIT, T.TASK_DONE} <= {e.kind for e in events}


# ---------------------------------------------------------------- the real b11549 server


@pytest.mark.parametrize("log", B11549_LOGS, ids=lambda p: p.name.split(".")[0])
def test_b11549_log_gives_that_servers_answers(log):
    """The b11549 recordings (tests/golden/traces_b11549/): every request's answer from its log, the build
    named, and its slot-file checkpoints said once, with the flag that follows them."""
    rd = LogReader()
    events = rd.read_file(log)
    got = rows(log, events)
    want = expected(log)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert agrees(g, w), f"{log.name}: result {i} differs: {g} != {w}"
    assert rd.problems == [] and (rd.build.build, rd.build.source) == (11549, "start-up line")
    warns = [e.message for e in events if e.kind == LOG and e.message.startswith("slotlab watch: this log is from b11549")]
    assert len(warns) == 1 and "--server-build 11549" in warns[0] and "LLAMA_STATE_SEQ_VERSION" in warns[0]


# ---------------------------------------------------------------- what is compared


def test_info_and_the_panel_header_name_the_modelled_build(capsys):
    from slotlab.cli import main
    from slotlab.engine.events import EventBus
    from slotlab.panel.state import PanelState
    from slotlab.panel.static import header

    assert main(["info", "-np", "1", "-c", "512"]) == 0
    assert "modelling llama-server of llama.cpp b11312 (commit 0c1e570)" in capsys.readouterr().out.splitlines()[0]
    bus = EventBus(max_log=None)
    LogReader(bus).read_file(PIN_LOGS[0])
    assert header(PanelState.from_bus(bus)).startswith("slotlab (models llama.cpp b11312) · ")
