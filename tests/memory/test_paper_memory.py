"""The paper memory without a real context: profiles from GGUF headers of any size, the engine
running multi-turn conversations on paper, blobs that occupy no memory. No model is loaded here."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from slotlab.engine.params import ServerParams
from slotlab.engine.scheduler import Engine
from slotlab.errors import ConfigError, ModelError, ShiftNotSupported
from slotlab.memory import check_memory
from slotlab.memory.base import Batch
from slotlab.memory.paper import PaperAllocator, PaperBlob, PaperMemory, PaperVocab, paper_allocate, paper_sizes
from slotlab.memory.profile import GGUFError, ModelProfile, ProfileError, read_gguf_kv


ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gemma() -> ModelProfile:
    return ModelProfile.default()


# ---------------------------------------------------------------------------- a GGUF header, no weights

def _gguf(path, kv: dict, n_tensors: int = 723) -> None:
    """A GGUF file with metadata only (the tensor section is never read)."""

    def s(x: str) -> bytes:
        b = x.encode()
        return struct.pack("<Q", len(b)) + b

    out = [b"GGUF", struct.pack("<IQQ", 3, n_tensors, len(kv))]
    for k, v in kv.items():
        out.append(s(k))
        if isinstance(v, str):
            out.append(struct.pack("<I", 8) + s(v))
        elif isinstance(v, bool):
            out.append(struct.pack("<I?", 7, v))
        elif isinstance(v, int):
            out.append(struct.pack("<II", 4, v))
        elif isinstance(v, float):
            out.append(struct.pack("<If", 6, v))
        elif isinstance(v, list) and v and isinstance(v[0], str):
            out.append(struct.pack("<IIQ", 9, 8, len(v)) + b"".join(s(x) for x in v))
        elif isinstance(v, list):
            out.append(struct.pack("<IIQ", 9, 5, len(v)) + struct.pack(f"<{len(v)}i", *v))
    path.write_bytes(b"".join(out) + b"\0" * 64)


def _llama70b(path) -> None:
    _gguf(path, {"general.architecture": "llama", "general.name": "Llama 3.3 70B", "llama.block_count": 80,
                 "llama.context_length": 131072, "llama.embedding_length": 8192, "llama.attention.head_count": 64,
                 "llama.attention.head_count_kv": 8, "llama.rope.freq_base": 500000.0,
                 "tokenizer.ggml.tokens": [f"t{i}" for i in range(128256)]})


def test_profile_of_a_70b_header(tmp_path):
    _llama70b(tmp_path / "llama70b.gguf")
    p = ModelProfile.from_gguf(tmp_path / "llama70b.gguf")
    assert (p.architecture, p.n_layer, p.n_ctx_train, p.n_vocab, p.n_swa, p.is_swa_model) == \
           ("llama", 80, 131072, 128256, 0, False)
    assert p.n_embd_head_k == p.n_embd_head_v == 128 and set(p.n_head_kv) == {8} and p.notes == ()
    assert p.bytes_per_token() == 80 * 2 * 8 * 128 * 2  # 320 KiB per token in f16
    mem = PaperMemory(p, n_ctx=32768, n_slots=4)
    assert mem.info.can_shift and mem.info.n_swa == 0 and not mem.info.needs_checkpoints
    sizes = paper_sizes(p, 100_000, n_ctx=131072)
    per_cell = 12 + p.bytes_per_token()
    assert sizes["state"] == 8 + 4 + 4 + 100_000 * per_cell + 8 + 80 * 24
    assert sizes["partial"] == sizes["state"]  # a plain KV cache ignores PARTIAL_ONLY
    assert ModelProfile.from_json(p.to_json()) == p


def test_swa_patterns_and_unknown_keys(tmp_path):
    base = {"block_count": 12, "context_length": 8192, "embedding_length": 1024, "attention.head_count": 8,
            "attention.head_count_kv": 4}
    _gguf(tmp_path / "g2.gguf", {"general.architecture": "gemma2", **{f"gemma2.{k}": v for k, v in base.items()}})
    g2 = ModelProfile.from_gguf(tmp_path / "g2.gguf")
    assert g2.n_swa == 4096 and g2.swa_layers == (True, False) * 6  # gemma2: the default window, 1 of 2
    _gguf(tmp_path / "oss.gguf", {"general.architecture": "gpt-oss", "gpt-oss.attention.sliding_window": 128,
                                  "gpt-oss.attention.sliding_window_pattern": [1, 0] * 6,
                                  **{f"gpt-oss.{k}": v for k, v in base.items()}})
    oss = ModelProfile.from_gguf(tmp_path / "oss.gguf")
    assert oss.n_swa == 128 and oss.swa_layers == (True, False) * 6
    _gguf(tmp_path / "x.gguf", {"general.architecture": "mystery", "mystery.attention.sliding_window": 256,
                                **{f"mystery.{k}": v for k, v in base.items()}})
    x = ModelProfile.from_gguf(tmp_path / "x.gguf")
    assert not x.is_swa_model and x.notes  # said, not guessed silently
    (tmp_path / "bad.gguf").write_bytes(b"NOPE" + b"\0" * 40)
    with pytest.raises(GGUFError, match="not a GGUF"):
        read_gguf_kv(tmp_path / "bad.gguf")


def test_a_memory_slotlab_cannot_size_names_the_architecture_and_what_it_lacks(tmp_path):
    """A recurrent GGUF without its state's hyperparameters, and an architecture whose state slotlab
    does not model: the profile is read (nothing else breaks: `notes` says it), the paper memory
    refuses it with a sentence naming the architecture and the hyperparameter."""
    base = {"block_count": 12, "context_length": 8192, "embedding_length": 1024, "attention.head_count": 8,
            "attention.head_count_kv": 4}
    _gguf(tmp_path / "m.gguf", {"general.architecture": "mamba", **{f"mamba.{k}": v for k, v in base.items()},
                                "mamba.ssm.inner_size": 2048, "mamba.ssm.state_size": 16})
    m = ModelProfile.from_gguf(tmp_path / "m.gguf")
    assert m.memory == "recurrent" and "mamba.ssm.conv_kernel" in m.unsized and m.unsized in m.notes
    with pytest.raises(ModelError, match=r"mamba: slotlab cannot size the recurrent state: the GGUF lacks "
                                         r"mamba\.ssm\.conv_kernel$"):
        PaperMemory(m)
    _gguf(tmp_path / "k.gguf", {"general.architecture": "kimi-linear",
                                **{f"kimi-linear.{k}": v for k, v in base.items()}})
    k = ModelProfile.from_gguf(tmp_path / "k.gguf")
    assert k.memory == "hybrid"
    with pytest.raises(ModelError, match=r"kimi-linear: slotlab cannot size this hybrid memory: it does not model "
                                         r"kimi-linear's kda\.head_dim"):
        PaperMemory(k)
    # the same GGUF with the state's keys: sized (mamba: no group count, as llama.cpp's mamba reads none)
    _gguf(tmp_path / "m2.gguf", {"general.architecture": "mamba", **{f"mamba.{k}": v for k, v in base.items()},
                                 "mamba.ssm.conv_kernel": 4, "mamba.ssm.inner_size": 2048, "mamba.ssm.state_size": 16,
                                 "mamba.ssm.group_count": 8})
    m2 = ModelProfile.from_gguf(tmp_path / "m2.gguf")
    assert (m2.n_embd_r(), m2.n_embd_s(), m2.ssm_n_group) == (3 * 2048, 16 * 2048, 0)
    assert PaperMemory(m2, n_ctx=1024).info.seq_rm_type == "FULL"


@pytest.mark.parametrize("drop", ["n_vocab", "n_head_kv", "architecture"])
def test_a_malformed_profile_names_the_missing_field(tmp_path, drop):
    d = ModelProfile.from_json(ROOT / "slotlab/sim/profiles/llama-3.1-8b.json").to_dict()
    del d[drop]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ProfileError, match=rf"{path}: model profile: missing field\(s\) {drop} "):
        ModelProfile.from_json(path)
    h = ModelProfile.from_json(ROOT / "slotlab/sim/profiles/qwen3.5-27b.json").to_dict()
    del h["ssm_d_state"], h["ssm_d_inner"], h["ssm_d_conv"]
    with pytest.raises(ProfileError, match="a hybrid profile needs its state sizes: ssm_d_conv, ssm_d_inner"):
        ModelProfile.from_json(h)
    h = ModelProfile.from_json(ROOT / "slotlab/sim/profiles/qwen3.5-27b.json").to_dict()
    del h["layer_memory"]
    with pytest.raises(ProfileError, match="a hybrid profile needs layer_memory"):
        ModelProfile.from_json(h)
    with pytest.raises(ProfileError, match="not JSON"):
        ModelProfile.from_json("{nope")



def test_json_profile_for_a_model_the_user_does_not_have(gemma, caplog):
    p = ModelProfile.from_json({"architecture": "gemma3", "n_layer": 62, "n_ctx_train": 131072, "n_vocab": 262208,
                                "n_head_kv": 16, "n_embd_head_k": 128, "n_embd_head_v": 128, "n_swa": 1024,
                                "swa_type": "standard", "swa_layers": "SSSSSF" * 10 + "SS"})
    mem = PaperMemory(p, n_ctx=65536, n_slots=2)
    assert mem.info.n_swa == 1024 and not mem.info.can_shift and mem.info.needs_checkpoints
    with pytest.raises(ValueError, match="unknown model profile field"):
        ModelProfile.from_json({"architecture": "x", "bogus": 1})
    # beyond the training context: llama.cpp warns and runs, each slot capped at n_ctx_train
    with caplog.at_level("WARNING", logger="slotlab.memory"):
        big = PaperMemory(gemma, n_ctx=65536, n_slots=1)
    assert "possible training context overflow" in caplog.text
    assert big.info.n_ctx_slot == gemma.n_ctx_train


# ---------------------------------------------------------------------------- memory behaviour

def test_blobs_are_virtual_and_round_trip(gemma):
    mem = PaperMemory(gemma, n_ctx=32768, n_slots=2, kv_unified=True)
    check_memory(mem)
    b = Batch(2048)
    for p0 in range(0, 18_000, 2048):
        b.clear()
        b.add_seq(np.arange(p0, p0 + 2048, dtype=np.int32) % 1000 + 10, p0, 0)
        assert mem.decode(b, 0, 2048) == 0
    size = mem.state_size(0)
    assert size > 60 * 2**20  # ~64 MiB of state ...
    blob = mem.state_get(0)
    assert isinstance(blob, PaperBlob) and len(blob) == blob.nbytes == size
    assert blob.copy().payload is blob.payload  # ... that costs nothing to hold or copy
    assert mem.state_set(blob, 1) == 0 and mem.pos_max(1) == -1  # 2 x 18432 cells > the 32768-cell pool
    mem.seq_rm(0, 8000, -1)
    blob = mem.state_get(0)
    size = len(blob)
    assert mem.state_set(blob, 1) == size and mem.state_size(1) == size
    assert (mem.pos_min(1), mem.pos_max(1)) == (mem.pos_min(0), mem.pos_max(0))
    ck = mem.state_get(0, partial=True)
    raw = bytes(ck)  # materialized: llama.cpp's byte format, restorable like the blob itself
    assert len(raw) == len(ck) and mem.state_set(raw, 1, partial=True) == len(ck)
    assert mem.state_set(ck, 1) == 0  # a checkpoint blob is not a full state
    assert mem.state_set(ck, 1, partial=True) == len(ck)
    assert mem.state_set(paper_allocate(size), 1) == 0  # an unfilled buffer: wrong magic
    with pytest.raises(ShiftNotSupported):
        mem.seq_add(0, 0, 10, -5)


def test_sampler_and_vocab(gemma):
    mem = PaperMemory(gemma, n_ctx=4096, n_slots=1)
    v = mem.vocab
    assert isinstance(v, PaperVocab) and v.n_vocab == gemma.n_vocab
    b = Batch(8)
    b.add_seq(np.array([5, 6, 7], dtype=np.int32), 0, 0, logits_last=True)
    assert mem.decode(b, 0, 3) == 0
    smp = mem.sampler(temperature=0.0, seed=1, ignore_eos=False)
    t = smp.sample(2)
    assert v.gen_lo <= t < v.eog and not v.is_eog(t) and t == smp.sample(2)
    with pytest.raises(ValueError, match="no logits"):
        smp.sample(0)
    with pytest.raises(NotImplementedError, match="tokenizer"):
        v.tokenize("hello")


def test_a_request_with_sampling_runs_on_paper(gemma):
    """Issue 21 item 6: the paper memories take `sampling` / `prompt` as LlamaMemory.sampler does (and
    ignore them), so a request that sets the server's sampling fields is served, on PaperMemory and on
    the simulator's SimMemory alike, with the same placeholders as without."""
    from slotlab.sampling import SamplingParams
    from slotlab.sim.paper_replay import paper_engine

    outs = []
    for sampling in (None, SamplingParams(seed=1)):
        for make in (lambda p: Engine(p, memory=PaperMemory.from_params(p, profile=gemma), allocate=paper_allocate),
                     lambda p: paper_engine(p, profile=gemma)[0]):  # paper_engine gives (engine, allocator)
            eng = make(ServerParams.from_args(["-np", "1", "-c", "1024"]))
            try:
                t = eng.submit(list(range(10, 40)), n_predict=4, sampling=sampling)
                eng.run_until(lambda: t.done)
                assert t.result is not None and t.error is None
                outs.append(list(t.result["tokens"]))
            finally:
                eng.close()
    assert all(o == outs[0] for o in outs) and len(outs[0]) == 4


def test_allocator_budget():
    alloc = PaperAllocator(limit_bytes=1000)
    a = alloc(600)
    with pytest.raises(MemoryError):
        alloc(600)
    del a
    assert alloc.live_bytes == 0 and alloc.peak_bytes == 600
    assert len(alloc(900)) == 900


# ---------------------------------------------------------------------------- the engine on paper

def _conversations(eng: Engine, n_turns: int, n_convs: int, sys_len: int = 1200, n_predict: int = 16):
    rng = np.random.default_rng(0)
    gen_lo = eng.memory.vocab.gen_lo if hasattr(eng.memory.vocab, "gen_lo") else 200_000
    prompts = [[2] + rng.integers(10, gen_lo, sys_len).tolist() for _ in range(n_convs)]
    results = []
    for turn in range(n_turns):
        for c in range(n_convs):
            prompts[c] += rng.integers(10, gen_lo, 300 + 50 * c).tolist()
            t = eng.submit(np.array(prompts[c], dtype=np.int32), n_predict=n_predict)
            eng.run_until(lambda: t.done)
            assert t.error is None, t.error
            prompts[c] += t.result["tokens"]
            results.append((turn, c, t.result))
    return results


@pytest.mark.parametrize("flags", [
    "-np 2 -c 16384 --cache-ram 512 --ctx-checkpoints 4",
    "-np 2 -c 16384 -kvu --cache-ram 512 --swa-full",
    "-np 1 -c 8192 --cache-ram 1024 -md DEFAULT --spec-type draft-simple --spec-draft-n-max 4",
])
def test_engine_multi_turn_on_paper(gemma, flags):
    from slotlab.memory.profile import default_model_gguf

    flags = flags.replace("DEFAULT", str(default_model_gguf()))
    params = ServerParams.from_args(flags)
    mem = PaperMemory.from_params(params, profile=gemma)
    alloc = PaperAllocator()
    eng = Engine(params, memory=mem, allocate=alloc)
    results = _conversations(eng, n_turns=3, n_convs=3)
    later = [r for turn, _, r in results if turn > 0]
    assert all(r["timings"]["cache_n"] > 1000 for r in later)  # every follow-up reused its conversation
    kinds = {ev.kind for ev in eng.events.log}
    assert "cache_loaded" in kinds  # three conversations on fewer slots: the RAM cache carried them
    for e in eng.cache.entries:
        assert isinstance(e.main, PaperBlob) and e.main.payload is not None
        assert len(e.drft) == (len(e.main) if params.speculative else 0)
    assert alloc.peak_bytes > 20 * 2**20  # tens of MiB of "state" in the cache, none of it allocated
    if not params.swa_full:
        assert "checkpoint_created" in kinds and mem.info.needs_checkpoints
    if params.speculative:
        assert eng.metrics.spec_draft_tokens_total > 0
        assert 0 < eng.metrics.spec_accepted_tokens_total < eng.metrics.spec_draft_tokens_total
        for s in eng.slots:
            assert mem.dft.pos_max(s.id) == mem.pos_max(s.id) == len(s.tokens) - 1
    eng.close()


def test_slot_save_and_restore_on_paper(gemma, tmp_path):
    params = ServerParams.from_args(f"-np 1 -c 4096 --slot-save-path {tmp_path} --no-slot-appendices")
    eng = Engine(params, memory=PaperMemory.from_params(params, profile=gemma), allocate=paper_allocate)
    t = eng.submit(np.arange(10, 1510, dtype=np.int32), n_predict=4)
    eng.run_until(lambda: t.done)
    s = eng.slot_action("save", 0, "a.bin")
    eng.run_until(lambda: s.done)
    assert s.error is None and s.result["n_written"] == (tmp_path / "a.bin").stat().st_size
    n_state = eng.memory.state_size(0)
    e = eng.slot_action("erase", 0)
    eng.run_until(lambda: e.done)
    r = eng.slot_action("restore", 0, "a.bin")
    eng.run_until(lambda: r.done)
    assert r.error is None and r.result["n_restored"] == 1503 and eng.memory.state_size(0) == n_state


@pytest.mark.parametrize("n_vocab,n_generated", [(128256, 4096), (262144, 4096), (1000, 250), (64, 16), (4, 1)])
def test_paper_vocab_chain_is_generated_step_by_step(n_vocab, n_generated):
    """chain() (a hot loop, with a faster path for a power-of-two number of placeholders) returns
    what generated() gives step by step, appended to `out`."""
    v = PaperVocab(n_vocab, n_generated)
    for tok, pos, seed in [(0, 0, 0), (5, 1000, 77), (n_vocab - 1, 123456, (1 << 64) - 1), (v.gen_lo, 7, 3)]:
        want, t = [], tok
        for j in range(300):
            t = v.generated(t, pos + j, seed)
            want.append(t)
        assert v.chain(tok, pos, seed, 300) == want
        assert v.chain(tok, pos, seed, 0) == []
        assert v.chain(tok, pos, seed, 5, [1, 2]) == [1, 2] + want[:5]


@pytest.mark.parametrize("sequential", [True, False])
def test_split_equal_on_one_run_per_sequence_is_the_general_split(sequential):
    """`split_equal`'s shortcut for batches where every sequence has one run of rows (what the server
    builds) gives the ubatches of the general loop over each sequence's rows, on random batches: any
    number of sequences in any order (sequential mode then skips the non-consecutive ones), runs of
    1 to 3,000 rows, ubatches of 1 to 512 (fewer rows than sequences included)."""
    from slotlab.memory.paper.context import PaperContext, _split_equal_rows, split_equal
    rng = np.random.default_rng(11 if sequential else 12)
    for _ in range(400):
        qs = rng.permutation(8)[:int(rng.integers(1, 9))].tolist()
        if rng.random() < 0.5:
            qs = sorted(qs)
        seq = np.concatenate([np.full(int(rng.choice([1, 1, 2, 7, 513, 3000])), q, dtype=np.int32) for q in qs])
        runs = PaperContext._runs(seq)
        n_ubatch = int(rng.choice([1, 2, 3, 64, 512]))
        got = split_equal(runs, seq, n_ubatch, sequential)
        want = _split_equal_rows(runs, seq, n_ubatch, sequential)
        assert [[(q, r.tolist()) for q, r in ub] for ub in got] == [[(q, r.tolist()) for q, r in ub] for ub in want]


@pytest.mark.parametrize("n_vocab, n_generated", [(262144, 4096), (128256, 4096), (1000, 250), (50, 12)])
def test_chains_are_chain_for_each(n_vocab, n_generated):
    """`PaperVocab.chains` (numpy, many chains at once: what the simulator's fast-forward computes a
    trace's placeholders with) gives each chain exactly as `chain` steps it token by token, for a
    power-of-two placeholder range (the mask path) and others (the modulo path), any seed, lengths 0+."""
    v = PaperVocab(n_vocab, n_generated)
    rng = np.random.default_rng(n_vocab)
    toks = rng.integers(0, n_vocab, 200).tolist()
    poss = rng.integers(0, 300_000, 200).tolist()
    ks = rng.integers(0, 60, 200).tolist()
    for seed in (0, 1, 0xFFFFFFFF, 0x5EED ^ 0xDEADBEEF):
        out, starts = v.chains(toks, poss, seed, ks)
        assert out.dtype == np.int32 and len(out) == sum(ks)
        for t, p, k, s in zip(toks, poss, ks, starts):
            assert out[s:s + k].tolist() == v.chain(t, p, seed, k)
    out, starts = v.chains([], [], 0, [])
    assert len(out) == 0 and len(starts) == 0


def test_outside_is_the_vocabulary_check_on_every_dtype_and_edge():
    """`outside` (one unsigned maximum on int32 ids) says what `t.min() < 0 or t.max() >= n` says:
    the edges of the vocabulary, the most negative id, strided views, other dtypes."""
    from slotlab.memory.paper.vocab import outside

    rng = np.random.default_rng(5)
    cases = [np.array([v], dtype=np.int32) for v in (-2**31, -1, 0, 9, 10, 2**31 - 1)]
    cases += [rng.integers(-3, 13, int(rng.integers(1, 50))).astype(dt) for dt in (np.int32, np.int64) for _ in range(50)]
    cases += [np.arange(40, dtype=np.int32)[::7], np.arange(-5, 40, dtype=np.int32)[5::3]]
    for t in cases:
        for n in (1, 10, 11, 2**31 - 1):
            assert outside(t, n) == bool(t.min() < 0 or t.max() >= n), (t, n)


@pytest.mark.parametrize("swa_type", ["standard", "chunked", "symmetric", "none"])
def test_window_cells_written_counted_from_the_dense_record(swa_type):
    """`CellCache.n_written` counts a dense stream's unmasked cells from its record (positions lo..hi,
    each once) without a look at the cells: the same count as the mask over the cells, on layouts
    prompts and generation leave (ubatches and single tokens, head resets, purges, seq_rm of a
    prefix or a suffix), for every window type."""
    from slotlab.memory.paper.format import CacheSpec
    from slotlab.memory.paper.window import CellCache

    rng = np.random.default_rng({"standard": 1, "chunked": 2, "symmetric": 3, "none": 4}[swa_type])
    for n_swa, size in ((16, 40), (64, 96), (7, 23)):
        c = CellCache(CacheSpec("w", size, 2, 2, n_swa, swa_type, (), False, False))
        mask_count = lambda q: int(c._written_mask(q)[1].sum())
        nxt, checked = [0, 0], 0
        for _ in range(400):
            q = int(rng.integers(0, 2))
            r = rng.random()
            if r < 0.1 and nxt[q] > 4:  # a suffix or a prefix removed
                cut = int(rng.integers(1, nxt[q]))
                if rng.random() < 0.5:
                    c.seq_rm(q, cut, 2**31 - 1)
                    nxt[q] = c.pos_max(q) + 1 if c.pos_max(q) >= 0 else 0
                else:
                    c.seq_rm(q, 0, cut)
                continue
            if r < 0.12:
                c.seq_rm(q, 0, 2**31 - 1)
                nxt[q] = 0
                continue
            k = 1 if r < 0.6 else int(rng.integers(2, min(size, n_swa + 8)))
            pos = np.arange(nxt[q], nxt[q] + k, dtype=np.int32)
            c._begin()
            if c._place_one(c.stream_of(q), q, pos, pos + 5, run=True):
                c._end()
                nxt[q] += k
            else:
                c._rollback()
            d = c.dense[c.stream_of(q)]
            if d and d[0] == q:
                checked += 1
            assert c.n_written(q) == mask_count(q), (q, d)
        assert checked > 100  # the record held on most steps (the counted path ran)



def test_a_blob_is_written_once_so_checkpoint_copies_share_it(gemma):
    """A `PaperBlob` gets its state once (made with it, or filled by `state_get(out=)` as a buffer
    just allocated); filling one that holds a state is refused, so a checkpoint copied into a RAM-cache
    entry shares its blob (no copy per checkpoint per save), while a numpy buffer is still copied."""
    from slotlab.engine.prompt_cache import Checkpoint
    mem = PaperMemory(gemma, n_ctx=4096, n_slots=1)
    b = Batch(512)
    b.add_seq(np.arange(512, dtype=np.int32) + 10, 0, 0)
    assert mem.decode(b, 0, 512) == 0
    out = paper_allocate(mem.state_size(0))
    filled = mem.state_get(0, out=out)
    assert filled is out and out.payload is not None
    with pytest.raises(ValueError, match="holds a state already"):
        mem.state_get(0, out=out)
    ck = Checkpoint(512, 0, 511, data_tgt=mem.state_get(0, partial=True), data_dft=np.ones(3, np.uint8))
    c = ck.copy()
    assert c.data_tgt is ck.data_tgt and c.size() == ck.size()  # shared: never written again
    assert c.data_dft is not ck.data_dft and c.data_dft.tolist() == [1, 1, 1]  # a numpy buffer: copied


def test_prompt_chunks_are_checked_against_the_vocabulary_once_a_prompt(gemma):
    """`advance_steps` checks a chunk's ids as a decode would; a chunk that is a view of a read-only
    prompt (a task's tokens) is checked through its whole prompt once. A prompt with a bad id
    anywhere is not taken as known: its chunks are checked one by one (a good one passes, the bad one
    is refused), and a writable array is never remembered."""
    mem = PaperMemory(gemma, n_ctx=4096, n_slots=1)
    nv = mem.n_vocab
    good = np.arange(100, 164, dtype=np.int32)
    good.flags.writeable = False
    bad = good.copy()
    bad[-1] = nv  # one id outside the vocabulary, at the end
    bad.flags.writeable = False
    assert mem._known_in_vocab(good[:8], nv) and mem._known_in_vocab(good[8:], nv)
    assert id(good) in mem._in_vocab
    assert not mem._known_in_vocab(bad[:8], nv) and id(bad) not in mem._in_vocab
    assert not mem._known_in_vocab(np.arange(8, dtype=np.int32)[2:], nv)  # writable base: not remembered
    assert mem.advance_steps([[(0, bad[:32], 0)]], [[31]]) == 1  # the good chunk of the bad prompt
    assert mem.advance_steps([[(0, bad[32:], 32)]], [[31]]) == 0  # its bad chunk: the decode refuses it
    assert mem.pos_max(0) == 31
