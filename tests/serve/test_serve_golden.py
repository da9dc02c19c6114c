"""The golden-trace recorder pointed at `slotlab serve` instead of llama-server yields the same JSON
(except `content` and timings) for every golden trace: HTTP in front of the same engine decisions."""

import tempfile
from pathlib import Path

import pytest

from slotlab.engine.replay import install_files, load_trace, resolve_flags
from slotlab.llama.model import default_model_path
from tests.golden.llama_server import LlamaServer, slotlab_serve_command
from tests.golden.record_traces import send_trace
from tests.golden.test_golden import DIR, TRACES, _strip

import json


@pytest.mark.parametrize("name", TRACES)
def test_recorder_against_slotlab_serve(name):
    trace = load_trace(DIR / f"{name}.json")
    want = json.loads((DIR / f"{name}.llama-server.json").read_text())
    slots_dir = tempfile.mkdtemp(prefix="serve-slots-")
    install_files(trace, slots_dir)
    flags = resolve_flags(trace.flags, type("M", (), {"path": default_model_path()}))
    with LlamaServer(default_model_path(), [*flags, "--slot-save-path", slots_dir, "--no-slot-appendices"],
                     command=slotlab_serve_command()) as srv:
        got, _ = send_trace(srv, trace)
    for i, (g, w) in enumerate(zip(got, want["results"])):
        assert _strip(g) == _strip(w), f"{name}: request {i} differs"
