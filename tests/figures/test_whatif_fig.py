"""slotlab.figures.whatif: the what-if pictures draw slotlab's own results (runs, timelines) as small PNGs,
and `whatif.cache_timeline` adds the RAM cache's bytes up exactly as the simulation's peak counts them."""

from pathlib import Path

import pytest

from slotlab.figures import png
from slotlab.figures.whatif import cache_over_time, labels_of, overview, sweep
from slotlab.sim.speed import SpeedModel
from slotlab.cli import cmd_whatif as main
from slotlab.sim.whatif import WhatIfRun, best, cache_timeline, run_grid

DATA = Path(__file__).resolve().parents[1] / "sim" / "data" / "mooncake_conversation_first500.jsonl"
SPEED = SpeedModel.from_rates(8000, 60)
PNG = b"\x89PNG\r\n\x1a\n"


def _run(setting, flags, **kw):
    base = dict(n_requests=10, prompt_tokens=1000, tokens_reused=100, tokens_prefilled=900, bound_tokens=400,
                peak_cache_bytes=2**30, ttft_p50=1.5, ttft_p99=4.0)
    base.update(kw)
    return WhatIfRun(setting, flags, **base)


def test_labels_tell_settings_of_several_grids_apart():
    a = _run({"--cache-ram": "0"}, ["-c", "4096", "-np", "4", "--cache-ram", "0"])
    b = _run({"--cache-ram": "8192"}, ["-c", "4096", "-np", "4", "--no-cache-idle-slots", "--cache-ram", "8192"])
    c = _run({"-np": "2"}, ["-c", "4096", "--cache-ram", "-1", "-np", "2"])
    assert labels_of([a]) == ["--cache-ram 0"]  # one run: its setting
    assert labels_of([a, b, c]) == ["-np 4 --cache-ram 0", "-np 4 --no-cache-idle-slots --cache-ram 8192",
                                    "--cache-ram -1 -np 2"]


def test_overview_and_sweep_draw_runs_and_json_rows():
    runs = [_run({"--cache-ram": v}, ["--cache-ram", v], tokens_reused=100 + i, peak_cache_bytes=i * 3 * 2**29,
                 ttft_p50=2.0 - i / 2) for i, v in enumerate(["0", "1024", "4096"])]  # the fastest is over budget
    runs.append(_run({"--cache-ram": "-1"}, ["--cache-ram", "-1"], n_errors=3, ttft_p50=3.0))
    runs.append(WhatIfRun({"--cache-ram": "x"}, ["--cache-ram", "x"], error="ValueError: bad"))
    pick = best(runs, 2048)
    assert pick is runs[1]
    fig = overview(runs, pick=pick, budget_mib=2048, title="t")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["--cache-ram 0", "--cache-ram 1024", "--cache-ram 4096",
                                                            "--cache-ram -1", "--cache-ram x"]
    widths = sorted(round(p.get_width(), 2) for p in ax.patches)  # reuse %: the failed run has no bar
    assert widths == [10.0, 10.0, 10.1, 10.2]
    assert png.to_png(fig).startswith(PNG)
    rows = [{**r.__dict__} for r in runs[:3]]  # `whatif --json` rows, as dicts
    assert png.to_png(overview({"runs": rows}, pick=rows[1])).startswith(PNG)
    fig = sweep({"a": runs[:3]}, "--cache-ram", refs={"off": runs[0]})
    ys = [round(y, 2) for y in fig.axes[0].lines[0].get_ydata()]
    assert ys == [10.0, 10.1, 10.2]
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["a", "off: 10.00 %", "infinite-cache bound: 40.0 %"]
    assert png.to_png(sweep({"a": runs[:3]}, "--cache-ram", metric="ttft")).startswith(PNG)
    with pytest.raises(ValueError):
        sweep({"a": runs[:3]}, "--cache-ram", metric="nope")


def test_cache_timeline_adds_up_to_the_simulated_peak(tmp_path):
    flags = ["-c", "65536", "-kvu", "-np", "2", "--cache-ram", "2048"]
    tl = cache_timeline(DATA, flags, speed=SPEED, profile="llama-3.1-8b", limit=60, time_scale=16)
    run, = run_grid(DATA, flags, [("--cache-ram", ["2048"])], speed=SPEED, profile="llama-3.1-8b", limit=60,
                    time_scale=16, jobs=1)
    assert tl.limit_bytes == 2048 * 2**20 and tl.saves and tl.evictions
    assert tl.peak == run.peak_cache_bytes <= tl.limit_bytes  # every byte counted, none twice
    assert tl.totals["tokens_reused"] == run.tokens_reused  # the same decisions as the whatif run
    assert tl.t == sorted(tl.t) and 0 < tl.t[0] and tl.t[-1] <= tl.totals["sim_seconds"]
    assert len(tl.held) == len(tl.t) == len(tl.saves) + len(tl.evictions) and min(tl.held) >= 0
    assert tl.evicted() == len(tl.evictions) == sum(tl.evicted(r) for r in {e[1] for e in tl.evictions})
    assert "make_room" in {e[1] for e in tl.evictions}
    data = png.to_png(cache_over_time([tl], title="t"))
    assert data.startswith(PNG) and len(data) < png.MAX_BYTES

    out = tmp_path / "grid.png"
    assert main([str(DATA), "--vary", "--cache-ram 0,1024", "--limit", "20", "--profile", "llama-3.1-8b",
                 "--budget-mib", "512", "--png", str(out), "--jobs", "1", "-np", "2"]) == 0
    assert out.read_bytes().startswith(PNG)
