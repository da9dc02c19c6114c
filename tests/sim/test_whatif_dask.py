"""slotlab whatif's grid three ways — serial, a process pool (--jobs 2) and a Dask cluster
(--scheduler, here a LocalCluster of two worker processes started by the test) — gives the same runs in
grid order, figure for figure (only each run's own wall time differs). No model: the paper memory on
the Mooncake slice (tests/sim/data/)."""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from slotlab.errors import ConfigError
from slotlab.sim.speed import SpeedModel
from slotlab.sim.whatif import run_grid

DATA = Path(__file__).resolve().parent / "data" / "mooncake_conversation_first500.jsonl"
PROFILES = Path(__file__).resolve().parents[2] / "slotlab" / "sim" / "profiles"
VARIES = [("--cache-ram", ["0", "256", "8192"]), ("-np", ["1", "2"])]
SPEED = SpeedModel.from_rates(8000, 60)


def _figures(runs) -> list[dict]:
    out = []
    for r in runs:
        d = asdict(r)
        d.pop("wall_seconds")  # the machine's time, not the simulation's
        out.append(d)
    return out


@pytest.fixture(scope="module")
def serial():
    runs = run_grid(DATA, ["-c", "32768"], VARIES, speed=SPEED, profile="llama-3.1-8b", limit=60, jobs=1)
    assert all(r.error is None and r.n_requests == 60 for r in runs), [r.error for r in runs]
    assert len({(r.tokens_reused, r.peak_cache_bytes, r.ttft_p50) for r in runs}) > 2  # the settings differ
    return runs


def test_the_pool_gives_the_serial_runs(serial):
    seen = []
    runs = run_grid(DATA, ["-c", "32768"], VARIES, speed=SPEED, profile="llama-3.1-8b", limit=60, jobs=2,
                    progress=lambda i, n: seen.append((i, n)))
    assert _figures(runs) == _figures(serial)
    assert seen == [(i, 6) for i in range(1, 7)]  # one bar, every run counted once


def test_a_dask_cluster_gives_the_serial_runs(serial, tmp_path):
    pytest.importorskip("dask.distributed", reason="dask is the optional extra slotlab[dask] (make install adds it)")
    from dask.distributed import LocalCluster

    # a profile file only this machine has: its fields travel to the workers
    prof = tmp_path / "mine.json"
    shutil.copy(PROFILES / "llama-3.1-8b.json", prof)
    seen = []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        runs = run_grid(DATA, ["-c", "32768"], VARIES, speed=SPEED, profile=str(prof), limit=60,
                        scheduler=cluster.scheduler_address, progress=lambda i, n: seen.append((i, n)))
    assert [r.setting for r in runs] == [r.setting for r in serial]  # grid order, whatever finished first
    assert _figures(runs) == _figures(serial)
    assert seen == [(i, 6) for i in range(1, 7)]


def test_the_command_line_on_a_dask_cluster(capsys):
    pytest.importorskip("dask.distributed", reason="dask is the optional extra slotlab[dask] (make install adds it)")
    from dask.distributed import LocalCluster

    from slotlab.cli import cmd_whatif

    argv = [str(DATA), "--vary", "--cache-ram 0,1024", "--limit", "20", "--profile", "llama-3.1-8b", "-np", "2",
            "--json"]
    assert cmd_whatif([*argv, "--jobs", "1"]) == 0
    want = json.loads(capsys.readouterr().out)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        assert cmd_whatif([*argv, "--scheduler", cluster.scheduler_address]) == 0
    got = json.loads(capsys.readouterr().out)
    for d in (*want["runs"], *got["runs"]):
        d.pop("wall_seconds")
    assert got == want and want["best"]


def test_scheduler_without_dask_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "dask.distributed", None)  # import fails as if not installed
    with pytest.raises(ConfigError, match=r"--scheduler tcp://127\.0\.0\.1:8786: dask\.distributed is not installed "
                                          r"\(pip install 'slotlab\[dask\]'"):
        run_grid(DATA, [], VARIES, speed=SPEED, profile="llama-3.1-8b", limit=5, scheduler="tcp://127.0.0.1:8786")
    from slotlab.cli import main

    assert main(["whatif", str(DATA), "--vary", "-np 1,2", "--limit", "5", "--scheduler", "tcp://127.0.0.1:8786"]) == 1
