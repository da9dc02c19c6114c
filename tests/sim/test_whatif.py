"""slotlab whatif: a grid of simulations on the Mooncake slice (tests/sim/data/), no model."""

from pathlib import Path

from slotlab.sim.speed import SpeedModel
from slotlab.cli import cmd_whatif as main
from slotlab.sim.whatif import best, grid, parse_vary, run_grid

DATA = Path(__file__).resolve().parent / "data" / "mooncake_conversation_first500.jsonl"


def test_grid_replaces_the_varied_flags():
    assert parse_vary("--cache-ram 0,4096, 16384") == ("--cache-ram", ["0", "4096", "16384"])
    g = grid(["-c", "8192", "--cache-ram", "-1", "-kvu"], [("--cache-ram", ["0", "64"]), ("-np", ["1", "2"])])
    assert [s for s, _ in g] == [{"--cache-ram": "0", "-np": "1"}, {"--cache-ram": "0", "-np": "2"},
                                 {"--cache-ram": "64", "-np": "1"}, {"--cache-ram": "64", "-np": "2"}]
    assert g[3][1] == ["-c", "8192", "-kvu", "--cache-ram", "64", "-np", "2"]


def test_whatif_grid_on_mooncake(tmp_path, capsys):
    speed = SpeedModel.from_rates(8000, 60)
    runs = run_grid(DATA, [], [("--cache-ram", ["0", "8192"]), ("-np", ["1", "2"])], speed=speed,
                    profile="llama-3.1-8b", limit=40, jobs=2)
    assert [r.setting for r in runs] == [{"--cache-ram": a, "-np": b} for a in ("0", "8192") for b in ("1", "2")]
    assert all(r.error is None and r.n_requests == 40 for r in runs), [r.error for r in runs]
    no_cache = [r for r in runs if r.setting["--cache-ram"] == "0"]
    assert all(r.peak_cache_bytes == 0 for r in no_cache)
    cached = [r for r in runs if r.setting["--cache-ram"] == "8192"]
    assert all(0 < r.peak_cache_bytes <= 8192 * 2**20 for r in cached)
    for a, b in zip(no_cache, cached):  # a RAM cache reuses at least what the slots alone reuse
        assert b.tokens_reused >= a.tokens_reused and b.bound_tokens == a.bound_tokens > 0
    assert best(runs, 0) in no_cache  # a zero budget leaves only --cache-ram 0
    pick = best(runs, None, "prefill")
    assert pick.tokens_prefilled == min(r.tokens_prefilled for r in runs)

    html = tmp_path / "w.html"
    assert main([str(DATA), "--vary", "--cache-ram 0,1024", "--limit", "20", "--profile", "llama-3.1-8b",
                 "--budget-mib", "512", "--html", str(html), "--jobs", "1", "-np", "2"]) == 0
    out = capsys.readouterr().out
    assert "--cache-ram 0" in out and "--cache-ram 1024" in out and "TTFT p50" in out
    assert "best within 512 MiB of RAM cache" in out and "plotly" in html.read_text()
