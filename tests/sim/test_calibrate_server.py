"""`slotlab calibrate --url`: the speed model of a real llama-server (the pin, on the default model), from
its own timings, and what `slotlab simulate --speed` then does with it. Needs the built server
(`make llama-server`); without it the test is skipped, as the recorders are."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.build_llama_server import server_binary
from slotlab.llama.model import default_model_path
from slotlab.sim.speed import SpeedModel

pytestmark = pytest.mark.skipif(server_binary() is None, reason="llama-server is not built (make llama-server)")


@pytest.fixture(scope="module")
def server():
    from tests.golden.llama_server import LlamaServer

    with LlamaServer(default_model_path(), ["-np", "1", "-c", "4096"]) as srv:
        yield srv


def test_calibrate_a_real_server_and_simulate_with_it(server, tmp_path):
    out, meas = tmp_path / "speed.json", tmp_path / "meas.json"
    r = subprocess.run([sys.executable, "-m", "slotlab.cli", "calibrate", "--url", server.url, "--repeats", "1",
                        "-o", str(out), "--measurements", str(meas)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    speed = SpeedModel.from_json(out.read_text())
    assert speed.t_token > 0 and speed.t_fixed >= 0 and "calibrated from its timings" in speed.source
    assert "b11312" in speed.source or "11312" in speed.source  # the server's build, from /props
    # the fitted line predicts the server's own long prompt within 25 % (one noisy machine)
    n, seconds = json.loads(meas.read_text())["prompts"][-1]
    assert n == 2048 and abs(speed.decode_time(n) - seconds) <= 0.25 * seconds
    assert "prompt of  2048 tokens" in r.stdout and "speed model: llama-server at" in r.stdout
    sim = subprocess.run([sys.executable, "-m", "slotlab.cli", "simulate", "tests/sim/data/mooncake_conversation_first500.jsonl",
                          "--limit", "20", "--speed", str(out), "--json"], capture_output=True, text=True, timeout=600)
    assert sim.returncode == 0, sim.stderr
    assert "calibrated from its timings" in json.loads(sim.stdout)["totals"]["speed"]


def test_calibrate_names_a_server_it_cannot_reach():
    r = subprocess.run([sys.executable, "-m", "slotlab.cli", "calibrate", "--url", "http://127.0.0.1:9"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "cannot reach the server" in r.stderr and "Traceback" not in r.stderr
