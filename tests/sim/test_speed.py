"""The speed model and its calibration through slotlab's engine (slotlab.sim.speed, `slotlab calibrate`)."""

import json

import numpy as np
import pytest

from slotlab.sim import speed as sp
from slotlab.sim.speed import SpeedModel, context_positions, fit

TRUTH = SpeedModel(0.0, 0.0, 512, "truth", table=((1, 0.020), (4, 0.022), (32, 0.040), (128, 0.110), (512, 0.400)),
                   outputs=((2, 0.009), (3, 0.016), (4, 0.022)), t_decode=0.003, t_first_output=0.008,
                   t_ctx=4e-7, t_kv=1.2e-6, t_byte=6e-10)
A, B = 0.002, 0.001  # the step around llama_decode: a + b per output row (TRUTH: t_decode = a + b)


def _steps(truth: SpeedModel, rng, outliers: int = 0) -> list:
    """Steps like `measure` records, timed by `truth`: prompts at 0 and their 4-token tails, a generation
    step after each, deep turns, batched generation; some with state copies."""
    plan = []
    for _ in range(4):
        for n in (1, 4, 32, 128, 512):
            plan += [(n, 0, 0, 0, 1, 0), (4, 1, 4 * n, n, 1, 8_000_000), (1, 1, n + 4, n + 4, 1, 0)]
        for p in (1024, 2048):
            plan += [(32, 0, 32 * p, p, 1, 7_000_000), (4, 1, 4 * (p + 32), p + 32, 1, 7_000_000),
                     (1, 1, p + 36, p + 36, 1, 0)]
        for b in (2, 3, 4):
            plan += [(b, b, b * 40, b * 40, b, 0)] * 3
    plan += [(700, 0, 0, 0, 1, 0)] * 3  # one decode past n_ubatch: two micro-batches
    steps = []
    for n, k, c, v, q, nb in plan:
        t = truth.decode_time(n, k, c, v) - truth.t_decode
        if k == 0:  # the step around it skips the row's sampling (b); llama_decode skips the rest of t_first_output
            t += B
        elif k > 1:
            t -= B * (k - 1)
        over = A + B * k
        steps.append([t + over + nb * truth.t_byte, nb, nb * truth.t_byte, [[n, k, c, v, t, q]]])
    for i in rng.choice(len(steps), outliers, replace=False):  # a busy machine: a few steps 5-20x slower
        f = rng.uniform(5, 20)
        s = steps[i]
        steps[i] = [s[0] * f, s[1], s[2], [[*s[3][0][:4], s[3][0][4] * f, s[3][0][5]]]]
    return steps


@pytest.mark.parametrize("outliers", [0, 8])
def test_fit_recovers_the_speed_model(outliers):
    got = fit({"steps": _steps(TRUTH, np.random.default_rng(1), outliers)})
    for n, k, c, v in [(1, 1, 0, 0), (1, 1, 800, 800), (4, 1, 3000, 750), (13, 1, 13 * 761, 761), (32, 0, 0, 0),
                       (100, 0, 0, 0), (512, 0, 0, 0), (747, 0, 0, 0), (2, 2, 200, 200), (4, 4, 400, 400),
                       (3, 3, 0, 0)]:
        want = TRUTH.decode_time(n, k, c, v)
        assert got.decode_time(n, k, c, v) == pytest.approx(want, rel=0.01), (n, k, c, v)
    assert got.t_decode == pytest.approx(TRUTH.t_decode, rel=1e-6)
    assert got.t_first_output == pytest.approx(TRUTH.t_first_output, rel=0.01)
    assert got.copy_time(7_900_000) == pytest.approx(TRUTH.copy_time(7_900_000), rel=1e-6)
    assert got.t_ctx == pytest.approx(TRUTH.t_ctx, rel=0.02) and got.t_kv == pytest.approx(TRUTH.t_kv, rel=0.02)


def test_pool_joins_the_steps():
    a, b = {"steps": [[1.0, 0, 0.0, [[1, 1, 0, 0, 0.5, 1]]]], "table": [[1, 0.5]]}, {"steps": [[2.0, 0, 0.0, []]]}
    assert sp.pool([a, b])["steps"] == a["steps"] + b["steps"]


def test_context_positions_as_the_paper_memory_counts(monkeypatch):
    """(n_ctx, n_kv) of a decode, as the calibration records it and the simulator charges it."""
    from slotlab.batch import Batch
    from slotlab.memory.paper import PaperMemory
    from slotlab.sim.memory import SimMemory

    b = Batch(64)
    b.add(7, 40, 1, logits=True)  # a generating row at 40 in sequence 1
    b.add_seq(np.arange(10, 22, dtype=np.int32), 100, 0, logits_last=True)  # a 12-token chunk after 100
    got = context_positions(b.seq[:b.n_tokens], b.pos[:b.n_tokens])
    assert got == (40 + 12 * 100, 40 + 100)
    mem = SimMemory.__new__(SimMemory)  # only its decode accounting: the paper decode is stubbed
    mem.decoded, mem.decoded_out, mem.decoded_ctx, mem.decoded_kv, mem.count_ctx = [], [], [], [], True
    monkeypatch.setattr(PaperMemory, "decode", lambda self, batch, off, n: 0)
    assert SimMemory.decode(mem, b, 0, b.n_tokens) == 0
    assert (mem.decoded_ctx[0], mem.decoded_kv[0]) == got and mem.decoded_out == [2]


def test_a_decode_without_outputs_saves_the_first_row():
    s = SpeedModel(0.01, 0.001, table=((1, 0.02), (64, 0.08)), t_decode=0.003, t_first_output=0.005)
    assert s.decode_time(64, 0) == pytest.approx(s.decode_time(64, 1) - 0.005)
    old = json.loads(s.to_json())
    del old["t_first_output"]  # a speed model written before the field: no saving
    s0 = SpeedModel.from_json(json.dumps(old))
    assert s0.decode_time(64, 0) == s0.decode_time(64, 1)
    assert SpeedModel.from_json(s.to_json()) == s


def test_calibrate_cli(monkeypatch, tmp_path, capsys):
    """`slotlab calibrate -o`: the speed model JSON `simulate --speed` reads; llama-server flags go to the engine."""
    from slotlab.sim import cli

    seen = {}

    def fake(model, *, repeats, n_threads, flags, n_gpu_layers=0):
        seen.update(model=model, repeats=repeats, n_threads=n_threads, flags=flags)
        return TRUTH, {"steps": [], "table": [[1, 0.02], [512, 0.4]], "seqs": [[2, 0.03]], "step": [20, 0.025],
                       "copy": [8_000_000, 0.005]}

    monkeypatch.setattr(sp, "calibrate", fake)
    out = tmp_path / "speed.json"
    assert cli.calibrate_main(["-t", "2", "-o", str(out), "--repeats", "3", "--swa-full"]) == 0
    assert seen == {"model": None, "repeats": 3, "n_threads": 2, "flags": ["--swa-full"]}
    assert SpeedModel.from_json(out.read_text()) == TRUTH
    text = capsys.readouterr().out
    assert "decode of  512 tokens" in text and "engine generation step" in text and "2 sequences generating" in text


@pytest.mark.slow
def test_measure_through_the_engine():
    """The embedded model through slotlab's engine: every kind of step is recorded and the fit is sane."""
    meas = sp.measure(sizes=(1, 8), seqs=(2,), depths=(64,), repeats=1, n_threads=2)
    decs = [d for s in meas["steps"] for d in s[3]]
    assert {(d[0], d[1]) for d in decs if d[2] == 0 and d[5] == 1} >= {(1, 0), (8, 0)}  # the SWA cut: no output
    assert any(d[0] == 2 and d[1] == 2 for d in decs)  # two sequences generating
    assert any(d[2] >= 64 * d[0] for d in decs)  # deep in the conversation
    assert [n for n, _ in meas["table"]][:2] == [1, 8] and meas["step"][0] > 3 and meas["copy"][0] > 0
    s = fit(meas)  # a handful of steps (and the machine may be busy): only that it fits
    assert all(t >= 0 for _, t in s.table) and s.decode_time(1, 1, 70, 70) > 0 and s.t_byte > 0


@pytest.mark.parametrize("profile", ["llama-3.1-8b", "gemma-3-27b", "qwen3.5-27b"])
def test_step_clocks_are_the_steps_added_one_by_one(profile):
    """`step_clocks` (a generation fast-forward's clock in one numpy pass) is bit for bit the clock of
    adding `decode_time` step by step, as plain stepping does: a fast-forward compares those clocks
    with arrivals, so one rounding apart would move an arrival to another step."""
    from pathlib import Path

    from slotlab.memory.profile import ModelProfile
    from slotlab.sim import gpus

    prof = ModelProfile.from_json(Path(sp.__file__).parent / "profiles" / f"{profile}.json")
    rng = np.random.default_rng(7)
    odd = SpeedModel(0.013, 3.1e-5, 512, t_decode=0.0017, t_ctx=float(rng.uniform(1e-9, 1e-6)),
                     t_kv=float(rng.uniform(1e-9, 1e-5)))  # terms of any magnitude: every rounding shows
    for model in (gpus.speed_for(prof, gpus.default_gpu(prof).name), TRUTH, SpeedModel.from_rates(8000, 60), odd):
        for _ in range(40):
            b, x0, n = int(rng.integers(1, 9)), int(rng.integers(0, 200_000)), int(rng.integers(1, 600))
            now = float(rng.choice([0.0, rng.uniform(0, 1e5)]))  # (at 0 the first clock is a step's time itself)
            for ctx in (True, False):
                c, want = now, []
                for j in range(n):
                    x = x0 + j * b
                    c += model.decode_time(b, b, x, x) if ctx else model.decode_time(b, b)
                    want.append(c)
                got = model.step_clocks(now, b, x0, n, ctx)
                assert got.tolist() == want
