"""What the reader accepts as a log: every prefix style (timestamps on or off, the level letter on or
off, ANSI colours, a supervisor's prefix, CRLF, `--log-file` output) gives the same events; bad input
(a truncated line, a binary blob, a 10 MB line, invalid UTF-8, a reader bug) never stops it."""

import re
import time
from pathlib import Path

import pytest

from slotlab.engine import event_types as T
from slotlab.watch.lines import MAX_MESSAGE, parse_line
from slotlab.watch.log_reader import LOG, LogReader, requests_json

DIR = Path(__file__).resolve().parent.parent / "golden" / "traces"
EXAMPLE = DIR / "example.llama-server.log"
_TS = re.compile(r"^(\d+\.\d{2}\.\d{3}\.\d{3}) ")
_LVL = re.compile(r"^([IWED]) ")


def feed(lines):
    rd = LogReader()
    events = [e for ln in lines for e in rd.feed(ln)] + rd.flush()
    return rd, events


def typed(events):
    return [(e.kind, e.level, e.slot, e.task, e.message, {k: v for k, v in e.payload.as_dict().items() if k != "_lcp"})
            for e in events if e.kind != LOG]


def no_ts(line):
    return _TS.sub("", line)


def no_prefix(line):
    return _LVL.sub("", _TS.sub("", line))


def coloured(line):
    """common_log with colours: the timestamp in blue, the level letter in its colour."""
    m = re.match(r"^(\d+\.\d{2}\.\d{3}\.\d{3}) ([IWED]) (.*)$", line, re.S)
    if not m:
        return line
    col = {"I": "\x1b[32m", "W": "\x1b[35m", "E": "\x1b[31m", "D": "\x1b[33m"}[m.group(2)]
    return f"\x1b[34m{m.group(1)}\x1b[0m {col}{m.group(2)} \x1b[0m{m.group(3)}"


STYLES = {
    "as recorded": lambda ln: ln,
    "no timestamps": no_ts,
    "no prefix": no_prefix,
    "colours": coloured,
    "docker compose": lambda ln: "llama-server-1  | " + ln,
    "journald": lambda ln: "Jan 02 03:04:05 host llama-server[4242]: " + ln,
    "CRLF": lambda ln: ln.rstrip("\n") + "\r\n",
}


@pytest.mark.parametrize("style", STYLES)
def test_every_prefix_style_gives_the_same_events(style):
    lines = EXAMPLE.read_text().splitlines(True)
    rd0, ev0 = feed(lines)
    rd, ev = feed([STYLES[style](ln) for ln in lines])
    assert typed(ev) == typed(ev0)
    assert requests_json(ev) == requests_json(ev0)
    assert rd.problems == []


def test_timestamps_give_event_times():
    rd, ev = feed(EXAMPLE.read_text().splitlines(True))
    done = [e for e in ev if e.kind == T.TASK_DONE]
    assert done[0].t == pytest.approx(1.092407)  # 0.01.092.407: min.sec.ms.us of the release line


def test_parse_line_parts():
    ln = parse_line("0.01.092.407 I slot      release: id  1 | task 0 | "
                    "stop processing: n_tokens = 22, truncated = 0\n")
    assert (ln.src, ln.func, ln.slot, ln.task, ln.level, ln.msg) == (
        "slot", "release", 1, 0, "INF", "stop processing: n_tokens = 22, truncated = 0")
    ln = parse_line("0.01.207.064 I srv   prompt_save:  - saving prompt with length 36")
    assert (ln.src, ln.func, ln.slot, ln.msg) == ("srv", "prompt_save", -1, " - saving prompt with length 36")
    ln = parse_line("W srv  try_clear_id: purging slot 1 with 895 tokens")
    assert (ln.src, ln.level, ln.t) == ("srv", "WRN", None)
    ln = parse_line("\trepeat_last_n = 64, repeat_penalty = 1.000")
    assert ln.src is None and ln.msg.startswith("\trepeat_last_n")


BAD = [
    "0.01.2",  # a line cut right after its timestamp
    "0.01.206.619 I slot get_availabl: id  0 | task -1 | selected slot by L",  # cut inside the message
    "0.01.207.1",
    "",
    "\r",
    "\x1b[31m\x1b[0m",
]


def test_bad_lines_never_stop_the_reader(tmp_path):
    """Truncated lines, binary blobs and 10 MB lines between the real ones: each becomes a plain line
    (capped), and the requests come out as from the clean log."""
    clean = EXAMPLE.read_bytes().splitlines(True)
    blob = bytes(range(256)) * 64 + b"\x00\xff\xfe\x1b[9999999999m\n"
    huge_text = b"A" * (10 << 20) + b"\n"
    huge_server = b"0.01.206.630 I srv  get_availabl: " + b"x" * (10 << 20) + b"\n"
    mixed = []
    for i, ln in enumerate(clean):
        mixed.append(ln)
        if i % 40 == 7:
            mixed.append(BAD[(i // 40) % len(BAD)].encode() + b"\n")
        if i == 230:
            mixed += [blob, huge_text, huge_server, b"\xc3\x28 invalid utf-8 \xa0\xa1\n"]
    mixed.append(b"0.01.369.600 I slot      relea")  # the file ends inside a line
    path = tmp_path / "bad.log"
    path.write_bytes(b"".join(mixed))
    rd = LogReader()
    t0 = time.perf_counter()
    ev = rd.read_file(path)
    assert time.perf_counter() - t0 < 30
    _, ev0 = feed(EXAMPLE.read_text().splitlines(True))
    assert requests_json(ev) == requests_json(ev0)
    assert typed(ev) == typed(ev0)
    assert rd.problems == []
    plain = [e for e in ev if e.kind == LOG]
    assert max(len(e.message) for e in plain) < MAX_MESSAGE + 100
    assert any("characters not kept" in e.message for e in plain)


def test_feed_takes_bytes_and_str():
    rd = LogReader()
    ev = rd.feed(b"\xff\xfe garbage \x00\n") + rd.feed("more garbage\n") + rd.flush()
    assert [e.kind for e in ev] == [LOG, LOG] and "\ufffd" in ev[0].message and ev[1].message == "more garbage"


def test_a_reader_bug_on_one_line_is_reported_and_the_rest_is_read(monkeypatch):
    lines = EXAMPLE.read_text().splitlines(True)
    rd = LogReader()

    def boom(*a):
        raise RuntimeError("boom")

    monkeypatch.setattr(rd.selection, "on_by_lru", boom)
    ev = [e for ln in lines for e in rd.feed(ln)] + rd.flush()
    assert rd.problems and "RuntimeError: boom" in rd.problems[0]
    assert len([r for r in requests_json(ev) if "action" not in r and r["status"] == 200]) == 5


def test_a_block_whose_fields_do_not_make_its_payload_is_kept_as_plain_text(monkeypatch):
    """The payload's constructor is the schema check: a reader bug that gathers a wrong field is noted in
    `problems` and the event comes out as a `log` line with the server's text, the watch goes on."""
    lines = EXAMPLE.read_text().splitlines(True)
    rd = LogReader()
    real = rd.spec

    def typo(kind, message="", **kw):
        if kind == T.SLOT_RELEASE:
            kw["n_tokenz"] = kw.pop("n_tokens", 0)
        return real(kind, message, **kw)

    monkeypatch.setattr(rd, "spec", typo)
    ev = [e for ln in lines for e in rd.feed(ln)] + rd.flush()
    assert rd.problems and all("n_tokenz" in p and p.startswith("slot_release") for p in rd.problems)
    assert not [e for e in ev if e.kind == T.SLOT_RELEASE]
    kept = [e for e in ev if e.kind == LOG and e.message.startswith("stop processing")]
    assert len(kept) == len(rd.problems) > 0 and isinstance(kept[0].payload, T.Log)


def test_at_default_verbosity_nothing_waits_for_lines_that_will_not_come():
    """A -lv 3 log has no `new prompt` lines: a launch comes out with its own line (a live view sees it)."""
    from test_log_reader_golden import level_of

    rd = LogReader()
    for line in EXAMPLE.read_text().splitlines(True):
        if level_of(line) in ("TRC", "DBG"):
            continue
        out = rd.feed(line)
        if "processing task" in line:
            assert [e.kind for e in out if e.kind == T.TASK_LAUNCHED] == [T.TASK_LAUNCHED]
        if "stop processing" in line:
            assert {T.TASK_DONE, T.SLOT_RELEASE} <= {e.kind for e in out}
