"""The shipped speed estimates per profile and GPU class (slotlab.sim.gpus): they reproduce the llama.cpp
measurements they rest on, order models and GPUs as those do, and the command lines say what they use."""

import json
import statistics
from pathlib import Path

import pytest

from slotlab.cli import main
from slotlab.memory.profile import ModelProfile
from slotlab.sim import gpus
from slotlab.sim.cli import PROFILES, resolve_profile

DATA = Path(__file__).resolve().parent / "data" / "mooncake_conversation_trace.jsonl"
SHIPPED = sorted(p.stem for p in PROFILES.glob("*.json"))


def test_generation_fit_reproduces_the_measured_table():
    rep = gpus.fit_report()
    assert len(rep) == sum(len(v.split()) - v.split().count("x") for _, _, v in gpus.GEN_MEASURED.values())
    for moe in (False, True):
        err = [r["predicted"] / r["measured"] - 1 for r in rep if r["moe"] == moe]
        # a line per GPU (dense) and one factor for every MoE: each row within 40 %, the typical within 15 %
        assert max(abs(e) for e in err) < 0.40, (moe, err)
        assert statistics.median(abs(e) for e in err) < 0.15, (moe, err)
    # the measured 27B row on the 4090 (47 tok/s), against the qwen3.5-27b profile's estimate
    sp = gpus.speed_for(resolve_profile("qwen3.5-27b"), "rtx-4090")
    assert sp.gen_rate(1) == pytest.approx(47, rel=0.15)


def test_prefill_reproduces_the_anchor_curve():
    """Llama 3.1 8B on the RTX 4090 is (nearly) the anchor itself: its micro-batch rates are the measured ones
    (within 6 %: the profile's Q4_K_M weights are 5 % more bytes to read than the anchor's Q4_K_S)."""
    sp = gpus.speed_for(resolve_profile("llama-3.1-8b"), "rtx-4090")
    for m, tps in gpus.PREFILL_ANCHOR["tps"]:
        assert m / sp.ubatch_time(m) == pytest.approx(tps, rel=0.06), m
    assert sp.source.startswith("Llama 3.1 8B Q4_K_M") and "RTX 4090" in sp.source and "PR #7860" in sp.source


@pytest.mark.parametrize("g", list(gpus.GPUS))
def test_orders_models_and_depth_as_physics_does(g):
    sp = {n: gpus.speed_for(resolve_profile(n), g) for n in ("llama-3.1-8b", "gemma-3-27b", "llama-3.3-70b",
                                                             "qwen3-30b-a3b")}
    pre = {n: s.prefill_rate(2048) for n, s in sp.items()}
    gen = {n: s.gen_rate(1) for n, s in sp.items()}
    assert pre["llama-3.1-8b"] > pre["gemma-3-27b"] > pre["llama-3.3-70b"]
    assert gen["llama-3.1-8b"] > gen["gemma-3-27b"] > gen["llama-3.3-70b"]
    assert gen["qwen3-30b-a3b"] > gen["gemma-3-27b"]  # 3.3 B active of 30.5 B
    for s in sp.values():  # deeper in a context: slower prefill and generation; batching pays
        assert s.decode_time(512, 1, 512 * 32768, 32768) > s.decode_time(512) > 0
        assert s.decode_time(1, 1, 32768, 32768) > s.decode_time(1, 1)
        assert s.gen_rate(4) * 4 > 2 * s.gen_rate(1)


def test_faster_class_is_faster_on_every_profile():
    for n in SHIPPED:
        p = resolve_profile(n)
        a, b = gpus.speed_for(p, "rtx-4090"), gpus.speed_for(p, "h100-sxm")
        assert b.prefill_rate(2048) > a.prefill_rate(2048) and b.gen_rate(1) > a.gen_rate(1), n
        assert gpus.speed_for(p, "h200-sxm").gen_rate(1) > b.gen_rate(1), n  # 4.8 against 3.35 TB/s


def test_default_gpu_is_the_smallest_that_holds_the_weights():
    for n in SHIPPED:
        p = resolve_profile(n)
        total, _ = gpus.weights_bytes(p)
        g = gpus.default_gpu(p)
        assert total * 1.1 <= g.memory_gib * 2**30, n
        assert not gpus.fit_note(p, g)
        assert all(total * 1.1 > h.memory_gib * 2**30 for h in gpus.GPUS.values() if h.memory_gib < g.memory_gib), n
    assert gpus.default_gpu(resolve_profile("llama-3.1-8b")).name == "rtx-4080"
    assert gpus.default_gpu(resolve_profile("gpt-oss-120b")).memory_gib == 80
    note = gpus.fit_note(resolve_profile("gpt-oss-120b"), gpus.GPUS["rtx-4090"])
    assert "do not fit one RTX 4090" in note and "--gpu h100-sxm" in note


def test_every_shipped_profile_has_cited_sizes():
    for n in SHIPPED:
        d = json.loads((PROFILES / f"{n}.json").read_text())
        assert d["n_params"] > 1e9 and d["n_head"] > 0, n
        for k in ("n_params", "n_head"):
            assert d["sources"][k].startswith("https://huggingface.co/"), (n, k)
        if "n_params_active" in d:
            assert d["n_params_active"] < d["n_params"] and "n_params_active" in d["sources"], n


def test_a_gguf_profile_sizes_itself_from_the_file():
    p = ModelProfile.default()  # Gemma 3 270M Q4_K_M
    assert p.n_head > 0
    total, active = gpus.weights_bytes(p)
    assert 0.2e9 < total < 0.4e9 and active == total  # dense, about the file


def test_a_profile_without_sizes_says_what_to_give():
    p = ModelProfile.from_json(json.dumps({k: v for k, v in json.loads((PROFILES / "llama-3.1-8b.json").read_text())
                                           .items() if k not in ("n_params", "n_params_active", "sources")}))
    with pytest.raises(ValueError, match="no n_params: give --speed"):
        gpus.speed_for(p)


@pytest.mark.skipif(not DATA.exists(), reason="the whole Mooncake trace (tests/sim/data) is missing")
def test_simulate_says_which_speed_it_uses(capsys):
    args = ["simulate", str(DATA), "--limit", "20", "-np", "2", "--profile", "gemma-3-27b", "--json"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert "speed: Gemma 3 27B Q4_K_M" in err and "RTX 4090" in err
    doc = json.loads(out)
    t27 = doc["totals"]["ttft_p50"]
    assert main(args + ["--gpu", "h100-sxm"]) == 0
    out, err = capsys.readouterr()
    assert "H100 SXM" in err
    assert json.loads(out)["totals"]["ttft_p50"] < t27  # the faster GPU answers sooner
    assert main(["simulate", str(DATA), "--limit", "3", "--profile", "gpt-oss-120b", "--gpu", "rtx-4090"]) == 0
    assert "warning: the weights" in capsys.readouterr().err


@pytest.mark.skipif(not DATA.exists(), reason="the whole Mooncake trace (tests/sim/data) is missing")
@pytest.mark.parametrize("bad, says", [(["--gpu", "tpu-v9"], "unknown GPU class 'tpu-v9' (one of: rtx-4080"),
                                       (["--gpu", "h100-sxm", "--prefill-tps", "1", "--gen-tps", "1"], "give one"),
                                       (["--prefill-tps", "100"], "go together")])
def test_bad_speed_options_are_one_line_errors(capsys, bad, says):
    assert main(["simulate", str(DATA), "--limit", "3", *bad]) != 0
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_profiles_speed_table(capsys):
    assert main(["profiles", "--speed", "--json", "llama-3.1-8b", "llama-3.3-70b"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["default_gpu"] for r in rows] == ["rtx-4080", "h100-sxm"]
    assert not rows[1]["gpus"]["rtx-4090"]["fits"] and rows[1]["gpus"]["h100-sxm"]["fits"]
    assert main(["profiles", "--speed"]) == 0
    out = capsys.readouterr().out
    assert "pavlokhmel.com" in out and "pull/7860" in out and len(out.splitlines()) >= len(SHIPPED) + 2
