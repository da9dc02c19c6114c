"""The conversation timeline (`slotlab report TRACE --png`, slotlab.timeline + slotlab.figures.timeline) on
the golden session log recorded from the real llama-server's chat endpoint (tests/golden/sessions: one
conversation per client change kind plus a plain one, 23 calls).

With the recording's flags (-np 1 -c 8192 --swa-full) every bar is the real server's cache_n / prompt_n;
without --swa-full (Gemma 3 is an SWA model) the server's own checkpoint misses join the client's changes,
and every bar is still the replay's cache_n / prompt_n, split by cause, in the palette's colours."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from matplotlib.colors import to_hex

from slotlab.palette import CLIENT_COLORS, MISS_COLORS, NEW, REUSED

SESSIONS = Path(__file__).resolve().parents[1] / "golden" / "sessions"
LOG = SESSIONS / "chatml.jsonl"
GOLDEN = json.loads((SESSIONS / "chatml.llama-server.json").read_text())


def _run(flags, model):
    from slotlab.report import load, run

    ld = load(LOG, flags=flags, model=model)
    return run(ld)


@pytest.fixture(scope="module")
def recorded(model):
    return _run(GOLDEN["flags"], model)  # -np 1 -c 8192 --swa-full, as recorded


@pytest.fixture(scope="module")
def swa(model):
    return _run(["-np", "1", "-c", "8192"], model)


def test_bars_are_the_real_servers_numbers_and_name_each_change(recorded):
    tl, out = recorded
    bars = tl.bars()
    assert [b.request for b in bars] == list(range(len(GOLDEN["calls"]))) == list(range(23))
    for b, res, srv in zip(bars, out["results"], GOLDEN["calls"]):
        assert (b.cache_n, b.prompt_n) == (res["cache_n"], res["prompt_n"]) == (srv["cache_n"], srv["prompt_n"]), b
        assert b.session == srv["session_id"]
        made = (b.call.change, b.call.message_index) if b.call.change else None
        assert made == (tuple(srv["made"]) if srv["made"] else None), b.request
        assert sum(n for _, n in b.parts) == b.prompt_n
        if b.call.change and b.call.tokens_lost:  # the client's loss is its own part, in its kind's colour
            assert (f"client:{b.call.change}", b.call.tokens_lost) in b.parts
    # --swa-full, one slot: the server cuts back anywhere, so no server mechanism lost anything
    assert not any(c.startswith("server:") for b in bars for c, _ in b.parts)
    kinds = {b.call.change for b in bars if b.call.change}
    assert kinds == {"system_changed", "tools_changed", "message_edited", "message_inserted", "compacted",
                     "reply_not_echoed", "other"}
    assert list(tl.conversations()) == list(dict.fromkeys(c["session_id"] for c in GOLDEN["calls"]))


def test_without_swa_full_the_servers_misses_join_the_clients_changes(swa):
    tl, out = swa
    bars = tl.bars()
    for b, res in zip(bars, out["results"]):
        assert (b.cache_n, b.prompt_n) == (res["cache_n"], res["prompt_n"])
        assert sum(n for _, n in b.parts) == b.prompt_n
        if b.miss is not None:  # the server's loss lies right after what it reused: the first part
            assert b.parts[0] == (f"server:{b.miss.cause}", b.miss.lost)
    causes = {c for b in bars for c, _ in b.parts}
    assert {"server:checkpoint_early", "server:no_checkpoint", "client:system_changed", "client:message_edited",
            "client:message_inserted", "client:compacted", "new"} <= causes
    # a clock in the system prompt: the server re-processes what it held after the change, and (SWA, no
    # checkpoint that early) the 29 tokens before it too
    b5 = bars[5]
    assert b5.call.change == "system_changed" and b5.cache_n == 0
    assert [c for c, _ in b5.parts] == ["server:no_checkpoint", "client:system_changed", "new"]
    tot = tl.totals()
    assert tot["reused"] == sum(r["cache_n"] for r in out["results"])
    assert sum(v for k, v in tot.items() if k != "reused") == sum(r["prompt_n"] for r in out["results"])


def _color(cause):
    side, _, kind = cause.partition(":")
    return {"client": CLIENT_COLORS.get(kind), "server": MISS_COLORS.get(kind)}.get(side, NEW)


def test_the_figure_draws_each_part_in_its_causes_colour(swa):
    from slotlab.figures.timeline import figure, rows

    tl, _ = swa
    fig = figure(tl)
    ax = fig.axes[0]
    rects = {}
    for r in ax.patches:
        rects.setdefault(round(r.get_y() + r.get_height() / 2, 3), []).append(
            (r.get_x(), r.get_width(), to_hex(r.get_facecolor()), r.get_hatch()))
    for y, b, _ in rows(tl):
        got = sorted(rects[round(y, 3)])
        want = [(0, b.cache_n, REUSED, None)] + [(None, n, _color(c), "///" if c.startswith("client:") else None)
                                                  for c, n in b.parts]
        assert [(w, c, h) for _, w, c, h in got] == [(w, c, h) for _, w, c, h in want], b.request
        assert all(x0 + w0 == x1 for (x0, w0, *_), (x1, *_) in zip(got, got[1:]))  # contiguous
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_report_writes_a_non_trivial_png(tmp_path):
    out = tmp_path / "timeline.png"
    r = subprocess.run([sys.executable, "-m", "slotlab.cli", "report", str(LOG), "--png", str(out), "-np", "1", "-c",
                        "8192"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "conversation system_changed: 2 calls" in r.stdout and "client: system_changed at message 0" in r.stdout
    assert "server: the checkpoint restored ends at" in r.stdout
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and 20_000 < len(data) < 200_000
    import matplotlib.image as mpimg

    img = mpimg.imread(out)
    h, w = img.shape[:2]
    assert w > 700 and h > 23 * 20  # a row per call
    px = {to_hex(p) for p in np.unique((img[..., :3].reshape(-1, 3) * 255).round().astype(int), axis=0) / 255}
    for c in (REUSED, NEW, CLIENT_COLORS["system_changed"], CLIENT_COLORS["message_edited"],
              MISS_COLORS["no_checkpoint"], MISS_COLORS["checkpoint_early"]):
        assert c in px, c


def test_report_json_and_a_trace_without_messages(tmp_path):
    r = subprocess.run([sys.executable, "-m", "slotlab.cli", "report", str(LOG), "--json", *GOLDEN["flags"]],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    calls = [c for conv in doc["conversations"] for c in conv["calls"]]
    assert [(c["cache_n"], c["prompt_n"]) for c in sorted(calls, key=lambda c: c["request"])] == \
        [(s["cache_n"], s["prompt_n"]) for s in GOLDEN["calls"]]
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"flags": ["-np", "1"], "requests": [{"prompt": "Hello", "n_predict": 2}]}))
    moon = tmp_path / "moon.jsonl"
    moon.write_text(json.dumps({"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}) + "\n")
    for p in (plain, moon):
        r = subprocess.run([sys.executable, "-m", "slotlab.cli", "report", str(p), "--png", str(tmp_path / "x.png")],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert f"slotlab: error: {p}" in r.stderr and "has no chat calls" in r.stderr, r.stderr
        assert not (tmp_path / "x.png").exists()
