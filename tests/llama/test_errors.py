"""Bad input gives a slotlab error that names the problem, never a crash or a ctypes traceback."""

import struct
from pathlib import Path

import pytest

from slotlab.errors import ConfigError, ModelError
from slotlab.llama import Context, Model


def test_missing_model_file(tmp_path):
    with pytest.raises(ModelError, match="model file not found: .*nope.gguf"):
        Model(tmp_path / "nope.gguf")


def test_text_file_renamed_gguf(tmp_path):
    p = tmp_path / "notes.gguf"
    p.write_text("these are my notes, not a model\n")
    with pytest.raises(ModelError, match=r"notes.gguf is not a GGUF model file \(it starts with b'thes'"):
        Model(p)


def test_empty_file(tmp_path):
    p = tmp_path / "empty.gguf"
    p.write_bytes(b"")
    with pytest.raises(ModelError, match="empty file"):
        Model(p)


def _gguf_with_arch(arch: str) -> bytes:
    def s(x: str) -> bytes:
        b = x.encode()
        return struct.pack("<Q", len(b)) + b

    return b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + s("general.architecture") + struct.pack("<I", 8) + s(arch)


def test_unsupported_architecture(tmp_path):
    p = tmp_path / "future.gguf"
    p.write_bytes(_gguf_with_arch("transformer-9000"))
    with pytest.raises(ModelError, match="unsupported model architecture 'transformer-9000'"):
        Model(p)


def test_truncated_header(tmp_path):
    p = tmp_path / "cut.gguf"
    p.write_bytes(_gguf_with_arch("gemma3")[:30])
    with pytest.raises(ModelError, match="truncated GGUF header"):
        Model(p)


def test_gpu_layers_without_gpu_build(model):
    from slotlab.llama import supports_gpu_offload

    if supports_gpu_offload():
        pytest.skip("this build has GPU offload")
    with pytest.raises(ModelError, match="no GPU backend"):
        Model(model.path, n_gpu_layers=-1)


@pytest.mark.parametrize("n_parallel", [0, -3, 257])
def test_bad_n_parallel(model, n_parallel):
    with pytest.raises(ConfigError, match="n_parallel"):
        Context(model, n_ctx=1024, n_parallel=n_parallel)


def test_n_ctx_beyond_training_context_is_a_warning():
    """As llama-server: -c beyond the model's training context is no error. llama.cpp logs "possible
    training context overflow" and the server runs with each slot capped at n_ctx_train (SC:1213,
    SC:4007-4016). On the tiny test model (n_ctx_train 256) this costs nothing."""
    from slotlab.llama import _lib

    m = Model(Path(__file__).parents[1] / "models" / "qwen35-tiny.gguf")
    try:
        c = Context(m, n_ctx=1024, n_parallel=1)
        assert (c.n_ctx_seq, c.n_ctx_slot(), m.n_ctx_train) == (1024, 256, 256)
        assert any("possible training context overflow" in line for line in _lib.recent_errors())
        c.close()
        c = Context(m, n_ctx=1024, n_parallel=2, kv_unified=False)  # 512 per sequence, still capped
        assert (c.n_ctx_seq, c.n_ctx_slot()) == (512, 256)
        c.close()
    finally:
        m.close()


def test_flags_errors_name_the_flag():
    from slotlab.engine.params import ServerParams

    for args, flag in [(["-np", "0"], "-np/--parallel"), (["--cache-ram", "-5"], "--cache-ram"),
                       (["-sps", "1.5"], "--slot-prompt-similarity"), (["-cms", "-1"], "--checkpoint-min-step"),
                       (["-c", "lots"], "-c"), (["--no-such-flag"], "--no-such-flag"), (["-c"], "-c needs a value")]:
        with pytest.raises(ConfigError, match=flag):
            ServerParams.from_args(args)


def test_seq_ops_reject_bad_sequence_ids(model):
    ctx = Context(model, n_ctx=512, n_parallel=2)
    with pytest.raises(ValueError, match="sequence id 2 outside 0..1"):
        ctx.seq_pos_max(2)
    with pytest.raises(ValueError):
        ctx.state_seq_size(-1)
