"""The tiny hybrid and recurrent test models (tests/models/, see make_tiny_models.py) and the parity
points found while recording their golden traces (issue 14)."""

import json
from pathlib import Path

import pytest

from slotlab.engine.replay import load_trace, replay
from tests.golden.trace_models import split_model
from tests.models.make_tiny_models import DIR as MODELS_DIR
from tests.models.make_tiny_models import MODELS, sha256

TINY = Path(__file__).with_name("traces_tiny")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_file_is_the_generated_one(name):
    """The committed file is what `make tiny-models` writes (llama.cpp's model saver, fixed seed)."""
    assert sha256(MODELS_DIR / name) == MODELS[name][2]


def _replay(name: str, *flags: str) -> tuple[list, list]:
    trace = load_trace(TINY / f"{name}.json")
    path, rest = split_model(trace.flags)
    trace.flags = ["-m", str(path), *rest, *flags]  # the model wherever pytest runs from
    out = replay(trace)
    out["engine"].close()
    want = json.loads((TINY / f"{name}.llama-server.json").read_text())["results"]
    return out["results"], want


@pytest.mark.parametrize("kind", ["hybrid", "recurrent"])
def test_slot_files_by_default_as_the_server_and_appendices_opt_in(kind):
    """llama-server's slot file holds no checkpoints, and a hybrid / recurrent memory cannot be rolled
    back, so continuing a restored conversation re-processes it (cache_n 0; llama.cpp #26676). slotlab
    does the same by default; its checkpoint appendix (--slot-appendices, an extension) keeps them."""
    name = f"{kind}_slot_files"
    got, want = _replay(name)
    cut = lambda rs: [{k: v for k, v in r.items() if k not in ("content", "reply")} for r in rs]  # noqa: E731
    assert cut(got) == cut(want)
    continued = [i for i, r in enumerate(want) if "action" not in r][1:]  # the requests after a restore
    assert all(want[i]["cache_n"] == 0 for i in continued)
    ext, _ = _replay(name, "--slot-appendices")
    assert all(ext[i]["cache_n"] > 0 for i in continued)


@pytest.mark.parametrize("arch,log", [("qwen35", "hybrid_agent_loop"), ("mamba2", "recurrent_agent_loop")])
def test_info_reports_the_memory_as_the_servers_log_does(arch, log):
    """`slotlab info`: seq_rm FULL, checkpoints needed, and one checkpoint of the recurrent state as
    large as the RS buffer the server's log reports for one sequence."""
    import re

    from slotlab.engine.backend import load
    from slotlab.engine.params import ServerParams

    text = (Path(__file__).with_name("traces_tiny") / f"{log}.llama-server.log").read_text()
    rs_mib = float(re.search(r"llama_memory_recurrent:\s+CPU RS buffer size =\s+([\d.]+) MiB", text).group(1))
    b = load(ServerParams.from_args(["-m", str(MODELS_DIR / f"{arch}-tiny.gguf"), "-np", "1", "-c", "256"]))
    try:
        mem = b.describe()["memory"]
    finally:
        b.close()
    assert mem["seq_rm_type"] == "FULL" and mem["needs_checkpoints"]
    assert round(mem["checkpoint_bytes_1"] / 2**20, 2) == rs_mib
