"""The shipped model profiles (slotlab/sim/profiles/) and `slotlab profiles`.

Each profile holds a model's published hyperparameters and cites, field by field, where each value
comes from (`sources`: the model's config.json / model card, or llama.cpp's source for what the GGUF
converter derives). The sizes `slotlab profiles` lists are computed by the paper memory, whose
formulas the byte-exact tests prove against the real context on a model of the same architecture:
test_paper_sizes.py (gemma3, the default model: the iSWA pair and, with --swa-full, a plain KV cache)
and test_paper_recurrent.py (the hybrid and recurrent architectures)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from slotlab.memory.profile import ModelProfile
from slotlab.sim.cli import PROFILES, profile_rows
from tests.memory.test_paper_recurrent import ARCHS as TINY_ARCHS

ROOT = Path(__file__).resolve().parents[2]

# issue 22 item 4: the names, exactly
NAMES = ["llama-3.1-8b", "llama-3.3-70b", "gemma-3-4b", "gemma-3-12b", "gemma-3-27b", "gpt-oss-20b", "gpt-oss-120b",
         "qwen3-30b-a3b", "qwen3.5-27b", "qwen3.5-35b-a3b", "qwen3-next-80b-a3b", "mistral-small-3.2-24b",
         "granite-4.0-h-small"]
# which byte-exact test proves the formulas of each architecture's memory
PROVEN_BY = {"llama": "plain KV cache (test_paper_sizes: the default model with --swa-full, the base cache)",
             "qwen3moe": "plain KV cache (as llama)", "gemma3": "test_paper_sizes (the default model, Gemma 3)",
             "gpt-oss": "the iSWA pair of test_paper_sizes (another layer pattern)"}
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ModelProfile) if f.default is not dataclasses.MISSING}


def test_the_issue_s_profiles_are_shipped():
    assert set(NAMES) <= {p.stem for p in PROFILES.glob("*.json")}


@pytest.mark.parametrize("name", NAMES)
def test_every_value_cites_its_source(name):
    d = json.loads((PROFILES / f"{name}.json").read_text())
    p = ModelProfile.from_json(PROFILES / f"{name}.json")
    cited = dict(p.sources)
    for field, value in d.items():
        if field in ("name", "notes", "sources") or _DEFAULTS.get(field, object()) == value:
            continue
        assert field in cited and cited[field].strip(), f"{name}: {field} = {value!r} has no source"
    proof = PROVEN_BY.get(p.architecture) or (p.architecture in TINY_ARCHS and "test_paper_recurrent")
    assert proof, f"{name}: no byte-exact test covers {p.architecture}"


def test_profile_rows_are_the_paper_memory_s_sizes():
    rows = {r["profile"]: r for r in profile_rows(NAMES)}
    for name in NAMES:
        p = ModelProfile.from_json(PROFILES / f"{name}.json")
        r = rows[name]
        assert (r["memory"], r["kv_bytes_per_token"], r["recurrent_bytes_per_seq"]) == \
               (p.memory, p.bytes_per_token(), p.rs_bytes_per_seq())
        c8, c32 = r["checkpoint_bytes"][8192], r["checkpoint_bytes"][32768]
        if p.memory == "hybrid":  # the recurrent part only: a state of one cell, whatever the length
            n_rs = len(p.rs_layers())
            assert c8 == c32 == 8 + 4 + 8 + 8 + n_rs * 24 + p.rs_bytes_per_seq()
        elif p.is_swa_model:  # the window cache: the cells the window does not mask
            assert c8 == c32 and c8 > p.n_swa * (p.bytes_per_token() * len(p.layers(True)) // len(p.layers()))
        else:  # a plain KV cache writes everything: one cell a token
            cell = 12 + p.bytes_per_token()
            assert c32 - c8 == (32768 - 8192) * cell
    # figures worth knowing, checked: Qwen3-Next's 75.4 MiB of recurrent state a sequence, Llama 3.1 8B's
    # 128 KiB a token
    assert rows["qwen3-next-80b-a3b"]["recurrent_bytes_per_seq"] == 36 * 4 * (3 * (4096 + 2 * 16 * 128) + 128 * 4096)
    assert rows["llama-3.1-8b"]["kv_bytes_per_token"] == 32 * 2 * 8 * 128 * 2


def test_slotlab_profiles_lists_them():
    out = subprocess.run([sys.executable, "-m", "slotlab.cli", "profiles"], capture_output=True, text=True, cwd=ROOT,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:3] == ["profile", "memory", "KV"]
    for name in NAMES:
        row = next(l for l in lines if l.startswith(name + " "))
        assert ("hybrid" in row) == name.startswith(("qwen3.5", "qwen3-next", "granite"))
    js = subprocess.run([sys.executable, "-m", "slotlab.cli", "profiles", "--json", "gemma-3-27b"], capture_output=True,
                        text=True, cwd=ROOT, timeout=300)
    assert json.loads(js.stdout)[0]["n_swa"] == 1024
