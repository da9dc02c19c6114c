"""Bad input at the command line (issue 22, "Done when"): a malformed profile given to `--profile` (JSON
or TOML) names the file and the missing field; a GGUF header of an architecture slotlab cannot size
names the architecture and the hyperparameter it lacks — and nothing else breaks: the header still
reads, `slotlab profiles` lists the other profiles beside it, a grid fails once with the sentence (not
each run). The library's own checks are tests/memory/test_paper_memory.py's; these are what a user
running `slotlab simulate / whatif / profiles` sees (exit status 1, one `slotlab: error:` line)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slotlab.cli import main
from slotlab.memory.profile import ModelProfile, ProfileError
from tests.memory.test_paper_memory import _gguf

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data" / "mooncake_conversation_first500.jsonl"
LLAMA = ROOT / "slotlab" / "sim" / "profiles" / "llama-3.1-8b.json"
BASE = {"block_count": 12, "context_length": 8192, "embedding_length": 1024, "attention.head_count": 8,
        "attention.head_count_kv": 4}


def _toml(d: dict) -> str:
    """A profile dict as TOML: top-level keys (None left out: TOML has no null), then each table
    (`sources`). JSON's ints, floats, strings, true / false and arrays are TOML values as written."""
    out = [f"{k} = {json.dumps(v)}" for k, v in d.items() if v is not None and not isinstance(v, dict)]
    for k, v in d.items():
        if isinstance(v, dict):
            out += [f"[{k}]", *(f"{json.dumps(a)} = {json.dumps(b)}" for a, b in v.items())]
    return "\n".join(out) + "\n"


def _run(capsys, *argv) -> tuple[int, str, str]:
    rc = main(list(argv))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_a_toml_profile_reads_as_its_json_twin(tmp_path, capsys):
    d = ModelProfile.from_json(LLAMA).to_dict()
    (tmp_path / "llama.toml").write_text(_toml(d))
    assert ModelProfile.from_file(tmp_path / "llama.toml") == ModelProfile.from_json(LLAMA)
    args = ["simulate", str(DATA), "--limit", "20", "--prefill-tps", "8000", "--gen-tps", "60", "-np", "2", "--json"]
    rc, out_toml, _ = _run(capsys, *args, "--profile", str(tmp_path / "llama.toml"))
    rc2, out_json, _ = _run(capsys, *args, "--profile", str(LLAMA))
    a, b = json.loads(out_toml)["totals"], json.loads(out_json)["totals"]
    a.pop("wall_seconds"), b.pop("wall_seconds")
    assert rc == rc2 == 0 and a == b and a["n_requests"] == 20


@pytest.mark.parametrize("kind", ["json", "toml"])
@pytest.mark.parametrize("drop", ["n_vocab", "n_head_kv"])
def test_a_malformed_profile_file_names_the_missing_field(tmp_path, capsys, kind, drop):
    d = ModelProfile.from_json(LLAMA).to_dict()
    del d[drop]
    path = tmp_path / f"bad.{kind}"
    path.write_text(json.dumps(d) if kind == "json" else _toml(d))
    want = f"slotlab: error: {path}: model profile: missing field(s) {drop} (required: architecture,"
    for cmd in (["simulate", str(DATA), "--limit", "5", "--prefill-tps", "8000", "--gen-tps", "60"],
                ["whatif", str(DATA), "--limit", "5", "--vary", "-np 1,2", "--jobs", "1"], ["profiles"]):
        rc, out, err = _run(capsys, *cmd, *(["--profile"] if cmd[0] != "profiles" else []), str(path))
        assert rc == 1 and err.count(want) == 1 and "Traceback" not in err, (cmd[0], err)
        assert "-np 1" not in out  # the grid did not start: one error, not one a run
    path.write_text("n_layer = [" if kind == "toml" else "{nope")
    with pytest.raises(ProfileError, match=rf"{path}: not {kind.upper()}"):
        ModelProfile.from_file(path)


@pytest.mark.parametrize("arch,extra,says", [
    ("mamba", {"ssm.inner_size": 2048, "ssm.state_size": 16},
     "mamba: slotlab cannot size the recurrent state: the GGUF lacks mamba.ssm.conv_kernel"),
    ("granitehybrid", {"ssm.conv_kernel": 4, "ssm.inner_size": 2048, "ssm.state_size": 16},
     "granitehybrid: slotlab cannot size the recurrent state: the GGUF lacks granitehybrid.ssm.group_count"),
    ("kimi-linear", {}, "kimi-linear: slotlab cannot size this hybrid memory: it does not model kimi-linear's "
                        "kda.head_dim (a KDA state)"),
])
def test_a_gguf_slotlab_cannot_size_names_the_architecture_and_hyperparameter(tmp_path, capsys, arch, extra, says):
    path = tmp_path / f"{arch}.gguf"
    _gguf(path, {"general.architecture": arch, **{f"{arch}.{k}": v for k, v in {**BASE, **extra}.items()}})
    prof = ModelProfile.from_gguf(path)  # the header reads: only the state's size is unknown
    assert prof.architecture == arch and prof.unsized.startswith(says) and prof.unsized in prof.notes
    rc, _, err = _run(capsys, "simulate", str(DATA), "--limit", "5", "--prefill-tps", "8000", "--gen-tps", "60",
                      "--profile", str(path))
    assert rc == 1 and err.count(f"slotlab: error: {says}") == 1 and "Traceback" not in err, err
    rc, out, err = _run(capsys, "whatif", str(DATA), "--limit", "5", "--vary", "-np 1,2", "--jobs", "1",
                        "--profile", str(path))
    assert rc == 1 and err.count(says) == 1 and "-np 1" not in out, err
    # nothing else breaks: the other profiles list beside it, its row says why it has no figures
    rc, out, err = _run(capsys, "profiles", "llama-3.1-8b", str(path))
    assert rc == 0 and not err
    lines = out.splitlines()
    assert lines[1].split()[:3] == ["llama-3.1-8b", "kv", "131,072"]
    assert lines[2].split()[2:] == ["?", "-", "?", "?", "?"] and f"{path}: ? = not sized: {says}" in out
    rc, out, _ = _run(capsys, "profiles", "--json", str(path))
    row = json.loads(out)[0]
    assert rc == 0 and row["unsized"].startswith(says) and row["checkpoint_bytes"] == {"8192": None, "32768": None}


def test_a_gguf_without_a_required_hyperparameter_names_it(tmp_path, capsys):
    path = tmp_path / "llama.gguf"
    _gguf(path, {"general.architecture": "llama", **{f"llama.{k}": v for k, v in BASE.items() if k != "block_count"}})
    rc, _, err = _run(capsys, "simulate", str(DATA), "--limit", "5", "--prefill-tps", "8000", "--gen-tps", "60",
                      "--profile", str(path))
    assert rc == 1 and f"slotlab: error: {path}: required key llama.block_count is missing" in err, err
