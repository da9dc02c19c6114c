"""The paper memory against the real context on tiny random-weight hybrid and recurrent models.

Every architecture whose memory is recurrent or hybrid and that llama.cpp's `test-llama-archs` can
write (tests/models/make_tiny_models.py) is driven through the same calls on a real context
(`LlamaMemory`) and on a `PaperMemory` built from the GGUF header; after every call the two must agree
on the byte: the state sizes for every flag combination the server uses (full and PARTIAL_ONLY, the
target and the draft context), pos_min / pos_max of every sequence, decode return codes, the result
of `seq_rm` (a recurrent state refuses a partial cut) and of every restore. The r / s rows of the
recurrent state are sized from the header's ssm / conv / group (or short-convolution) hyperparameters
as llama-memory-recurrent allocates them (`ModelProfile.n_embd_r` / `n_embd_s`), so a passing
architecture proves those formulas for it.

Left out, and why, in LEFT_OUT; `test_every_hybrid_and_recurrent_arch_is_covered` keeps the two lists
complete against slotlab's table of recurrent / hybrid architectures."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slotlab.errors import ModelError
from slotlab.llama import Model
from slotlab.memory.paper import PaperMemory
from slotlab.memory.paper.format import read_kv_part, read_rs_part
from slotlab.memory.profile import HYBRID_ARCHS, RECURRENT_ARCHS, ModelProfile
from tests.memory.test_paper_sizes import Pair, _cfg
from tests.models.make_tiny_models import EXTRA, MODELS, generated

N_EXAMPLES = int(os.environ.get("SLOTLAB_PAPER_EXAMPLES", "4"))
RANDOM = os.environ.get("SLOTLAB_PAPER_RANDOM", "") not in ("", "0")

# architecture -> its tiny model's file name: committed (MODELS) or generated when test-llama-archs is built
# (EXTRA; those tests skip, saying so, without the tool)
ARCHS = {arch: name for name, (arch, _, _) in {**MODELS, **EXTRA}.items() if arch != "kimi-linear"}
COMMITTED = {arch for arch, _, _ in MODELS.values()}

LEFT_OUT = {
    # test-llama-archs at the pin writes no model of these (-a rwkv6 / rwkv7 / arwkv7 save nothing,
    # rwkv6qwen2 is "unsupported"): their state formula (token_shift_count x n_embd, n_embd x wkv.head_size)
    # is implemented after llama-hparams.cpp but unproven
    "rwkv6": "test-llama-archs writes no rwkv6 model", "rwkv7": "test-llama-archs writes no rwkv7 model",
    "arwkv7": "test-llama-archs writes no arwkv7 model", "rwkv6qwen2": "test-llama-archs: unsupported",
    # the tiny model aborts inside llama.cpp (GGML_ASSERT in ggml_view_1d from build_plamo2_mamba_layer, a
    # batch of 3 sequences): the real context cannot be driven; its state is mamba2's formula (group 0)
    "plamo2": "llama.cpp aborts in build_plamo2_mamba_layer on the tiny model (3 sequences in a batch)",
    # not sizable by slotlab (ModelProfile.unsized names why; test_kimi_linear_is_refused_by_name)
    "kimi-linear": "a KDA state (kimi-linear.kda.head_dim) and an MLA cache: slotlab does not size KDA states",
    "kimi-k3": "a KDA state: slotlab does not size KDA states",
    "glm5-next": "a KDA state and an indexer cache (llama_memory_hybrid_idx): not modelled",
    "qwen4exp": "an indexer cache (llama_memory_hybrid_idx): not modelled",
    "deepseek4": "compressed and indexer caches (llama_kv_cache_dsv4): not modelled",
    "bailingmoe3": "a linear-attention state with an MLA cache: not modelled",
    "minimax-01": "a lightning-attention state (n_embd_head_la): not modelled",
}


def _arch_params():
    return [pytest.param(a, id=a) for a in sorted(ARCHS)]


@pytest.fixture(scope="module", autouse=True)
def _close_contexts():
    yield
    while Pair._ctxs:
        for c in Pair._ctxs.popitem()[1]:
            c.close()


_MODELS: dict[str, tuple[Model, ModelProfile]] = {}


def _model(arch: str) -> tuple[Model, ModelProfile]:
    if arch not in _MODELS:
        path = generated(ARCHS[arch])
        if path is None:
            pytest.skip(f"{ARCHS[arch]}: not committed, and llama.cpp's test-llama-archs is not built to write it "
                        "(python -m tests.models.make_tiny_models --extra)")
        _MODELS[arch] = (Model(path), ModelProfile.from_gguf(path))
    return _MODELS[arch]


class RPair(Pair):
    """`Pair` with the cuts a recurrent memory answers differently: any [p0, p1) range."""

    def cut(self, s: int, fa: float, fb: float) -> None:
        if s >= self.n_seq:
            return
        n = self.real.pos_max(s) + 1
        a, b = sorted((int(fa * (n + 1)), int(fb * (n + 1))))
        b = -1 if fb >= 1 else b
        got, want = self.paper.seq_rm(s, a, b), self.real.seq_rm(s, a, b)
        assert got == want, f"seq_rm({s}, {a}, {b}) after {self.log}: paper {got} real {want}"
        self.check(f"cut({s},{a},{b})={want}")


def test_every_hybrid_and_recurrent_arch_is_covered():
    """Each recurrent / hybrid architecture slotlab knows is tested here or left out with a reason; the
    eight the issue names have a model, the committed ones a file."""
    assert set(ARCHS) & set(LEFT_OUT) == set()
    assert (RECURRENT_ARCHS | HYBRID_ARCHS) - set(ARCHS) == set(LEFT_OUT)
    for arch in ("qwen35", "qwen3next", "mamba2", "granitehybrid", "nemotron_h", "lfm2", "falcon-h1", "jamba"):
        assert arch in ARCHS
    assert COMMITTED == {"qwen35", "mamba2", "granitehybrid", "nemotron_h", "lfm2", "jamba"}


def test_kimi_linear_is_refused_by_name():
    """A real GGUF of an architecture slotlab cannot size: the profile reads, the paper memory names
    the architecture and the hyperparameter it does not model."""
    path = generated("kimi-linear-tiny.gguf")
    if path is None:
        pytest.skip("kimi-linear-tiny.gguf needs llama.cpp's test-llama-archs (python -m tests.models.make_tiny_models "
                    "--extra)")
    prof = ModelProfile.from_gguf(path)
    assert prof.memory == "hybrid" and prof.unsized in prof.notes
    with pytest.raises(ModelError, match=r"^kimi-linear: slotlab cannot size this hybrid memory: it does not model "
                                         r"kimi-linear's kda\.head_dim"):
        PaperMemory(prof, n_ctx=256)


@pytest.mark.parametrize("arch", _arch_params())
def test_profile_reads_the_recurrent_state(arch):
    """The header gives layers and state widths; the RS buffer llama.cpp allocates for one sequence
    is the r and s rows of every recurrent layer (f32), which is the state's tensor part."""
    model, profile = _model(arch)
    assert profile.memory in ("recurrent", "hybrid") and not profile.unsized and profile.notes == ()
    assert profile.rs_layers() and profile.n_embd_r() + profile.n_embd_s() > 0
    mem = PaperMemory(profile, n_ctx=256, n_slots=1)
    assert mem.info.seq_rm_type == "FULL" and mem.info.needs_checkpoints
    window = 4 + 4 if profile.is_swa_model else 0  # lfm2: an iSWA attention part writes its (empty) window cache
    assert mem.state_size(0, partial=True) == 8 + window + 4 + 8 + len(profile.rs_layers()) * 24  # no cell yet


CONFIGS = [
    # (np, kvu, draft, n_ctx, n_batch, n_ubatch)
    (1, False, False, 256, 256, 256),
    (2, False, True, 512, 64, 32),
    (2, True, False, 256, 128, 16),
    (3, False, False, 768, 256, 64),
]

PROGRAM = [
    ("decode", [(0, 20), (1, 7)]),
    ("cut", 0, 0.5, 1.0),  # a partial cut of the end: refused by the recurrent part
    ("cut", 0, 0.2, 0.4),  # a range before the end: nothing happens (true)
    ("copy", 0, 1, False), ("copy", 0, 2, True),
    ("plant", 1, 150, False), ("plant", 0, 90, True),
    ("decode", [(0, 5), (1, 30), (2, 9)]),
    ("draft", 0, 3),
    ("cut", 1, 0.0, 1.0),  # the whole sequence
    ("decode", [(1, 40)]),
    ("decode", [(0, 120), (2, 60)]),  # past the attention cells of a small context: rc 1 where the real one fails
    ("copy", 2, 0, True), ("copy", 1, 2, False),
    ("decode", [(2, 3)]),
]


@pytest.mark.parametrize("arch", _arch_params())
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "np{}-kvu{:d}-draft{:d}-c{}-b{}-ub{}".format(*c))
def test_paper_matches_real_context(arch, cfg):
    model, profile = _model(arch)
    np_, kvu, draft, n_ctx, n_batch, n_ubatch = cfg
    RPair(model, profile, _cfg(np_, kvu, False, draft, n_ctx, n_batch, n_ubatch)).run(PROGRAM)


@pytest.mark.parametrize("arch", _arch_params())
def test_cache_types_and_v_trans(arch):
    """-ctk / -ctv and -fa off change the attention part's bytes; the recurrent rows stay f32."""
    model, profile = _model(arch)
    for ctk, ctv, fa in (("q8_0", "q8_0", "auto"), ("f16", "f16", "off")):
        cfg = {**_cfg(2, False, False, False, 512, 128, 128), "ctk": ctk, "ctv": ctv, "fa": fa}
        RPair(model, profile, cfg).run([("decode", [(0, 33), (1, 5)]), ("copy", 0, 1, False), ("copy", 1, 0, True)])


@st.composite
def programs(draw, n_seq: int):
    seq = st.integers(0, n_seq - 1)
    ops = []
    for _ in range(draw(st.integers(3, 8))):
        kind = draw(st.sampled_from(["plant", "decode", "decode", "cut", "copy", "draft"]))
        if kind == "plant":
            ops.append(("plant", draw(seq), draw(st.integers(1, 250)), draw(st.booleans())))
        elif kind == "decode":
            ops.append(("decode", [(s, draw(st.integers(1, 60))) for s in sorted(set(draw(st.lists(seq, min_size=1,
                                                                                                  max_size=3))))]))
        elif kind == "cut":
            ops.append(("cut", draw(seq), draw(st.floats(0, 1)), draw(st.floats(0, 1))))
        elif kind == "copy":
            ops.append(("copy", draw(seq), draw(seq), draw(st.booleans())))
        else:
            ops.append(("draft", draw(seq), draw(st.integers(1, 4))))
    return ops


@pytest.mark.parametrize("arch", _arch_params())
@settings(max_examples=N_EXAMPLES, deadline=None, database=None, derandomize=not RANDOM,
          suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_generated_programs(arch, data):
    model, profile = _model(arch)
    np_, kvu, draft, n_ctx, n_batch, n_ubatch = data.draw(st.sampled_from(CONFIGS))
    ops = data.draw(programs(np_))
    RPair(model, profile, _cfg(np_, kvu, False, draft, n_ctx, n_batch, n_ubatch)).run(ops)


@pytest.mark.parametrize("arch", _arch_params())
def test_state_bytes_have_the_real_layout(arch):
    """A real blob parsed with the paper's readers has the paper's headers, cell counts and positions,
    and each side restores the other's bytes."""
    model, profile = _model(arch)
    pair = RPair(model, profile, _cfg(2, False, False, False, 512, 128, 128))
    pair.decode([(0, 40), (1, 7)])
    for partial in (False, True):
        real = pair.real.state_get(0, partial=partial).copy()
        mine = pair.paper.state_bytes(0, partial=partial)
        assert len(real) == len(mine)
        assert bytes(real[:8]) == bytes(mine[:8])
        off_r = off_m = 8
        for i in pair.paper.tgt.parts(partial):
            spec = pair.paper.tgt.caches[i].spec
            read = read_rs_part if spec.name == "rs" else read_kv_part
            off_r2, cells_r = read(real, off_r, spec)
            off_m2, cells_m = read(mine, off_m, spec)
            if spec.name == "rs":
                assert (off_r2 - off_r, cells_r.tolist()) == (off_m2 - off_m, cells_m.tolist())
            else:
                assert (off_r2 - off_r, [(s, p.tolist()) for s, p, _ in cells_r]) == \
                       (off_m2 - off_m, [(s, p.tolist()) for s, p, _ in cells_m])
            off_r, off_m = off_r2, off_m2
        assert off_r == off_m == len(real)
        assert pair.paper.state_set(real, 1, partial=partial) == len(real)
        assert pair.real.state_set(mine, 1, partial=partial) == len(mine)
        pair.check(f"cross-restore partial={partial}")


@pytest.mark.parametrize("arch", _arch_params())
def test_slot_file_sizes_match(arch, tmp_path):
    model, profile = _model(arch)
    pair = RPair(model, profile, _cfg(1, False, False, False, 256, 256, 256))
    pair.decode([(0, 70)])
    toks = np.arange(70, dtype=np.int32) % 100
    n_real = pair.real.save_file(tmp_path / "real.bin", 0, toks)
    n_paper = pair.paper.save_file(tmp_path / "paper.bin", 0, toks)
    assert n_paper == n_real == (tmp_path / "real.bin").stat().st_size == (tmp_path / "paper.bin").stat().st_size
    r1 = pair.real.load_file(tmp_path / "paper.bin", 0)
    r2 = pair.paper.load_file(tmp_path / "real.bin", 0)
    assert r1[0] == r2[0] == n_real
    pair.check("load_file")


def size_table() -> list[tuple[str, int, int, int, int]]:
    """(arch, full state paper, real, PARTIAL_ONLY paper, real) of one sequence of 100 tokens (np 1, c 256)."""
    rows = []
    for arch in sorted(ARCHS):
        model, profile = _model(arch)
        pair = RPair(model, profile, _cfg(1, False, False, False, 256, 256, 256))
        pair.decode([(0, 100)])
        rows.append((arch, pair.paper.state_size(0), pair.real.state_size(0),
                     pair.paper.state_size(0, partial=True), pair.real.state_size(0, partial=True)))
    return rows


def test_size_table():
    """The figures the docs quote (python -m pytest -s prints them)."""
    rows = size_table()
    for arch, fp, fr, pp, pr in rows:
        print(f"{arch:14s} full {fp:>9d} paper {fr:>9d} real   partial {pp:>9d} paper {pr:>9d} real")
        assert (fp, pp) == (fr, pr)
