"""The fleet seen: `simulate --fleet --png / --html`, the lanes' data and the JupyterLab view fold the
result's own rows (slotlab.figures.fleet, slotlab.panel.fleet)."""

import json
from pathlib import Path

import pytest

from slotlab.cli import main
from slotlab.figures.fleet import lane_data
from slotlab.panel.fleet import FleetView, server_rows

DATA = Path(__file__).resolve().parents[1] / "sim" / "data" / "mooncake_conversation_trace.jsonl"
pytestmark = pytest.mark.skipif(not DATA.exists(), reason="the whole Mooncake trace (tests/sim/data) is missing")
ARGS = ["simulate", str(DATA), "--limit", "60", "--profile", "llama-3.1-8b", "-np", "2", "--cache-ram", "2048",
        "--fleet", "3"]


@pytest.fixture(scope="module")
def docs():
    import contextlib
    import io

    out = {}
    for router in ("round-robin", "session"):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert main([*ARGS, "--router", router, "--json"]) == 0
        out[router] = json.loads(buf.getvalue())
    return out


def test_lanes_fold_the_rows(docs):
    for router, d in docs.items():
        L = lane_data(d)
        ok = [r for r in d["results"] if r.get("id_slot") is not None and r["id_slot"] >= 0
              and r.get("end") is not None]
        assert len(L.row) == len(ok) and L.n_failed == len(d["results"]) - len(ok)
        assert {s for s, _ in L.lanes} <= {0, 1, 2} and len(L.servers) == 3
        for r, row, share in zip(ok, L.row, L.reused):
            server = next(x["server"] for x in d["routing"] if x["i"] == r["i"])
            assert L.lanes[row] == (server, r["id_slot"])
            n = (r["cache_n"] or 0) + (r["prompt_n"] or 0)
            assert share == pytest.approx((r["cache_n"] or 0) / n if n else 0.0)
        assert all(s <= e for s, e in zip(L.start, L.end)) and all(a <= s for a, s in zip(L.arrival, L.start))
        assert [s["n_requests"] for s in L.servers] == [s["totals"]["n_requests"] for s in d["servers"]]


def test_view_shows_each_server(docs):
    d = docs["session"]
    v = FleetView(d)
    rows = server_rows(d)
    assert [r["requests"] for r in rows] == [s["totals"]["n_requests"] for s in d["servers"]]
    assert "behind the session router" in v.header.value and "server" in v.table.value
    for s in d["servers"]:
        v.pick.value = s["server"]
        mine = [r for r in d["routing"] if r["server"] == s["server"]]
        assert v.requests.value.count("<tr>") == min(len(mine), v.max_rows) + 1
        assert mine[0]["why"].split(":")[0] in v.requests.value
    assert len(v.fig.data[0].x) == len(lane_data(d).row)


def test_png_and_html(tmp_path, capsys):
    png, page = tmp_path / "f.png", tmp_path / "f.html"
    assert main([*ARGS, "--router", "session", "--png", str(png), "--html", str(page)]) == 0
    err = capsys.readouterr().err
    assert f"wrote {png}" in err and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert "plotly" in page.read_text() and "why" not in err


def test_report_reads_a_fleet_run(tmp_path, capsys, docs):
    d = docs["session"]
    run = tmp_path / "run.json"
    run.write_text(json.dumps(d))
    png = tmp_path / "r.png"
    assert main(["report", str(run), "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "3 servers behind the session router" in out
    for s in d["servers"]:
        t = s["totals"]
        assert f"server {s['server']}    {t['n_requests']} requests" in out
        assert f"{100 * t['tokens_reused'] / t['prompt_tokens']:.1f} % of {t['prompt_tokens']:,}" in out
        n = sum(1 for r in d["routing"] if r["server"] == s["server"])
        assert n == t["n_requests"]
    assert out.count("  routed    ") == 3 and "x session: blocks [..] hashes to server N" in out
    assert png.read_bytes()[:4] == b"\x89PNG"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"fleet": {}, "totals": {}}))
    assert main(["report", str(bad)]) != 0
    err = capsys.readouterr().err
    assert "not a fleet run (missing servers, routing, results" in err and "Traceback" not in err
