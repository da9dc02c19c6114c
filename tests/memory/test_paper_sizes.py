"""The paper memory against the real context of the default model (Gemma 3 270M, SWA 512).

The same Memory calls go to a `LlamaMemory` over real contexts and to a `PaperMemory` built from the
GGUF header; after every call the two must agree on the byte: state sizes (full and PARTIAL_ONLY,
target and draft), pos_min / pos_max of every sequence, decode return codes, restore results.

Real decoding costs ~10 ms a token on two shared cores, so long sequences are "planted": the paper
memory writes a state in llama.cpp's byte format (K/V data zero) and both memories restore it — the
real context through `llama_state_seq_set_data_ext`, which places the cells with its own find_slot.
Then a few real decodes run on top (window-cache wrap-around, purges, full pools). One test decodes
a long prompt for real, so the natural layout is covered too.

SLOTLAB_PAPER_EXAMPLES=N raises the number of generated programs (default 8);
SLOTLAB_PAPER_RANDOM=1 draws new ones each run (default: derandomized, reproducible)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from slotlab.llama import Context
from slotlab.memory.base import Batch
from slotlab.memory.llama_memory import LlamaMemory
from slotlab.memory.paper import PaperBlob, PaperMemory
from slotlab.memory.paper.format import read_kv_part
from slotlab.memory.profile import ModelProfile

N_EXAMPLES = int(os.environ.get("SLOTLAB_PAPER_EXAMPLES", "8"))
RANDOM = os.environ.get("SLOTLAB_PAPER_RANDOM", "") not in ("", "0")


@pytest.fixture(scope="module")
def profile(model) -> ModelProfile:
    return ModelProfile.from_gguf(model.path)


@pytest.fixture(scope="module", autouse=True)
def _close_contexts():
    yield
    while Pair._ctxs:
        for c in Pair._ctxs.popitem()[1]:
            c.close()


class Pair:
    """A real memory and a paper memory of one configuration, driven together."""

    _ctxs: dict = {}

    def __init__(self, model, profile, cfg: dict):
        self.cfg = cfg
        types = dict(type_k=cfg.get("ctk", "f16"), type_v=cfg.get("ctv", "f16"), flash_attn=cfg.get("fa", "auto"))
        kw = dict(n_ctx=cfg["n_ctx"], n_parallel=cfg["np"], kv_unified=cfg["kvu"], swa_full=cfg["swa_full"],
                  n_batch=cfg["n_batch"], n_ubatch=cfg["n_ubatch"], **types)
        key = (str(model.path),) + tuple(sorted(kw.items()))
        if key not in Pair._ctxs:  # contexts are reused across examples (cleared: the same as fresh)
            while len(Pair._ctxs) >= 3:  # a few configurations at a time: each holds its KV buffers
                for c in Pair._ctxs.pop(next(iter(Pair._ctxs))):
                    c.close()
            Pair._ctxs[key] = (Context(model, **kw), Context(model, **kw, probe_seq_rm=False))
        ctx, dctx = Pair._ctxs[key]
        ctx.clear()
        dctx.clear()
        n_ctx_slot = ctx.n_ctx_slot()
        self.real = LlamaMemory(model, ctx, n_ctx_slot=n_ctx_slot, dmodel=model if cfg["draft"] else None,
                                dctx=dctx if cfg["draft"] else None)
        self.paper = PaperMemory(profile, n_ctx=cfg["n_ctx"], n_slots=cfg["np"], kv_unified=cfg["kvu"],
                                 swa_full=cfg["swa_full"], n_batch=cfg["n_batch"], n_ubatch=cfg["n_ubatch"],
                                 draft=profile if cfg["draft"] else None, **types)
        self.profile = profile
        self.rng = np.random.default_rng(1)
        self.log: list = []
        r, p = self.real.info, self.paper.info
        assert (r.n_ctx, r.n_ctx_slot, r.n_batch, r.n_ubatch, r.n_swa, r.can_shift, r.seq_rm_type) == \
               (p.n_ctx, p.n_ctx_slot, p.n_batch, p.n_ubatch, p.n_swa, p.can_shift, p.seq_rm_type), (r, p)
        assert (ctx.n_ctx_seq, ctx.n_batch) == (self.paper.n_ctx_seq, self.paper.n_batch)

    @property
    def n_seq(self) -> int:
        return self.cfg["np"]

    def check(self, what: str) -> None:
        self.log.append(what)
        drafts = (False, True) if self.cfg["draft"] else (False,)
        for s in range(self.n_seq):
            got = (self.paper.pos_min(s), self.paper.pos_max(s))
            want = (self.real.pos_min(s), self.real.pos_max(s))
            assert got == want, f"seq {s} pos after {self.log}: paper {got} real {want}"
            for d in drafts:
                for partial in (False, True):
                    got = self.paper.state_size(s, draft=d, partial=partial)
                    want = self.real.state_size(s, draft=d, partial=partial)
                    assert got == want, (f"seq {s} size(draft={d}, partial={partial}) after {self.log}: "
                                         f"paper {got} real {want}")

    # -- operations ----------------------------------------------------------------------------------------

    def next_pos(self, s: int) -> int:
        return self.real.pos_max(s) + 1

    def decode(self, jobs: list[tuple[int, int]]) -> None:
        """One server-style batch: each (seq, n) continues its sequence; decoded in n_batch chunks."""
        jobs = [(s, n) for s, n in jobs if s < self.n_seq]
        if not jobs:
            return
        b = Batch(sum(n for _, n in jobs))
        for s, n in jobs:
            hi = max(11, min(5000, self.profile.n_vocab - 1))  # token ids of the model's vocabulary
            b.add_seq(self.rng.integers(10, hi, n, dtype=np.int32), self.next_pos(s), s, logits_last=True)
        nb = self.paper.info.n_batch
        for off in range(0, b.n_tokens, nb):
            n = min(nb, b.n_tokens - off)
            r_real, r_paper = self.real.decode(b, off, n), self.paper.decode(b, off, n)
            assert r_paper == r_real, f"decode rc after {self.log} {jobs} at {off}: paper {r_paper} real {r_real}"
            if r_real != 0:
                self.check(f"decode{jobs}@{off}=rc{r_real}")
                return
            if self.cfg["draft"]:
                d_real, d_paper = self.real.decode_draft(b, off, n), self.paper.decode_draft(b, off, n)
                assert d_paper == d_real, f"draft decode rc after {self.log}: paper {d_paper} real {d_real}"
            self.check(f"decode{jobs}@{off}")

    def plant(self, s: int, n: int, partial: bool = False) -> None:
        """Restore a state of positions 0..n-1 into seq s (both memories, from the same bytes)."""
        if s >= self.n_seq:
            return
        c = self.cfg
        scratch = PaperMemory(self.profile, n_ctx=c["n_ctx"], n_slots=c["np"], kv_unified=c["kvu"],
                              swa_full=c["swa_full"], n_batch=c["n_batch"], n_ubatch=c["n_ubatch"])
        b = Batch(scratch.n_batch)
        p = 0
        while p < n:
            k = min(scratch.n_batch, n - p)
            b.clear()
            b.add_seq(np.full(k, 7, dtype=np.int32), p, s)
            if scratch.decode(b, 0, k) != 0:
                return  # does not fit this context at all
            p += k
        blob = scratch.state_bytes(s, partial=partial)
        assert len(blob) == scratch.state_size(s, partial=partial)
        r_real = self.real.state_set(blob, s, partial=partial)
        r_paper = self.paper.state_set(blob, s, partial=partial)
        assert r_paper == r_real, f"plant({s}, {n}, {partial}) after {self.log}: paper {r_paper} real {r_real}"
        if c["draft"]:
            d_real = self.real.state_set(blob, s, draft=True, partial=partial)
            d_paper = self.paper.state_set(blob, s, draft=True, partial=partial)
            assert d_paper == d_real
        self.check(f"plant({s},{n},{partial})={r_real > 0}")

    def rm(self, s: int, frac: float) -> None:
        if s >= self.n_seq:
            return
        p0 = int(frac * (self.real.pos_max(s) + 1))
        assert self.real.seq_rm(s, p0, -1) == self.paper.seq_rm(s, p0, -1)
        self.check(f"rm({s},{p0})")

    def shift(self, s: int, fa: float, fb: float) -> None:
        """The --cache-reuse move: drop [a, b), shift [b, end) back by b - a (only where can_shift)."""
        if s >= self.n_seq or not self.paper.info.can_shift:
            return
        n = self.real.pos_max(s) + 1
        a, b = sorted((int(fa * n), int(fb * n)))
        for m in (self.real, self.paper):
            assert m.seq_rm(s, a, b)
            m.seq_add(s, b, -1, a - b)
        self.check(f"shift({s},{a},{b})")

    def copy(self, src: int, dst: int, partial: bool) -> None:
        """A state round trip src -> dst, as the RAM cache (full) and checkpoints (partial) do."""
        if src >= self.n_seq or dst >= self.n_seq:
            return
        blob_r = self.real.state_get(src, partial=partial).copy()
        blob_p = self.paper.state_get(src, partial=partial).copy()
        assert isinstance(blob_p, PaperBlob) and len(blob_p) == len(blob_r) and blob_p.nbytes == len(blob_r)
        r_real = self.real.state_set(blob_r, dst, partial=partial)
        r_paper = self.paper.state_set(blob_p, dst, partial=partial)
        assert r_paper == r_real, f"copy({src}->{dst}, {partial}) after {self.log}: paper {r_paper} real {r_real}"
        self.check(f"copy({src},{dst},{partial})")

    def draft(self, s: int, n_max: int) -> None:
        if not self.cfg["draft"] or s >= self.n_seq or self.real.pos_max(s) < 0:
            return
        pos = self.next_pos(s)
        out_r = self.real.draft(s, 42, pos, n_max)
        out_p = self.paper.draft(s, 42, pos, n_max)
        assert len(out_p) == len(out_r)
        self.check(f"draft({s},{n_max})")

    def run(self, ops) -> None:
        self.check("start")
        for op, *args in ops:
            getattr(self, op)(*args)


# ---------------------------------------------------------------------------- generated programs

CONFIGS = [dict(np=np_, kvu=kvu, swa_full=sf, draft=d) for np_ in (1, 2) for kvu in (False, True)
           for sf in (False, True) for d in (False, True) if not (np_ == 1 and kvu)]


@st.composite
def programs(draw):
    cfg = dict(draw(st.sampled_from(CONFIGS)))
    cfg["n_ctx"] = draw(st.sampled_from([1024, 2048, 4096]))
    cfg["n_batch"] = draw(st.sampled_from([64, 256, 512]))
    cfg["n_ubatch"] = draw(st.sampled_from([32, 128, 512]))
    seq = st.integers(0, cfg["np"] - 1)
    budget = 140 if cfg["draft"] else 240  # real tokens decoded per program (~10 ms each)
    ops = []
    for _ in range(draw(st.integers(2, 6))):
        kind = draw(st.sampled_from(["plant", "plant", "decode", "decode", "decode", "rm", "copy", "draft", "shift"]))
        if kind == "plant":
            ops.append(("plant", draw(seq), draw(st.integers(1, 3000)), draw(st.booleans())))
        elif kind == "decode":
            jobs = [(s, draw(st.integers(1, 100))) for s in sorted(set(draw(st.lists(seq, min_size=1, max_size=2))))]
            n = sum(k for _, k in jobs)
            if n > budget:
                continue
            budget -= n
            ops.append(("decode", jobs))
        elif kind == "rm":
            ops.append(("rm", draw(seq), draw(st.floats(0, 1))))
        elif kind == "copy":
            ops.append(("copy", draw(seq), draw(seq), draw(st.booleans())))
        elif kind == "shift":
            ops.append(("shift", draw(seq), draw(st.floats(0, 1)), draw(st.floats(0, 1))))
        else:
            ops.append(("draft", draw(seq), draw(st.integers(1, 4))))
    return cfg, ops


def _cfg(np_, kvu, swa_full, draft, n_ctx, n_batch, n_ubatch):
    return dict(np=np_, kvu=kvu, swa_full=swa_full, draft=draft, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch)


@settings(max_examples=N_EXAMPLES, deadline=None, database=None, derandomize=not RANDOM,
          suppress_health_check=list(HealthCheck))
@given(prog=programs())
# the window cache (1024 cells here) wraps and reuses masked cells; pos_min rises by purges
@example(prog=(_cfg(1, False, False, False, 4096, 512, 512),
               [("plant", 0, 2000, False), ("decode", [(0, 90)]), ("decode", [(0, 30)]), ("rm", 0, 0.9),
                ("decode", [(0, 20)])]))
# one unified pool: the second sequence runs out of cells ("failed to find free space": rc 1)
@example(prog=(_cfg(2, True, False, False, 1024, 256, 128),
               [("plant", 0, 900, False), ("decode", [(1, 40)]), ("decode", [(0, 10), (1, 80)])]))
# --swa-full, unified: a sequence's new cells overwrite another's masked cells (its pos_min rises)
@example(prog=(_cfg(2, True, True, False, 2048, 512, 512),
               [("plant", 1, 1200, False), ("rm", 1, 0.5), ("plant", 0, 1400, False), ("decode", [(0, 40)]),
                ("copy", 1, 0, True)]))
# a draft context mirrors everything; drafting moves its window cache
@example(prog=(_cfg(2, False, False, True, 4096, 256, 128),
               [("plant", 1, 1500, False), ("decode", [(0, 30), (1, 20)]), ("draft", 1, 4), ("copy", 1, 0, True),
                ("decode", [(0, 8)])]))
# cache reuse: a context no larger than the window cache can shift (can_shift without --swa-full)
@example(prog=(_cfg(1, False, False, False, 1024, 256, 128),
               [("plant", 0, 900, False), ("shift", 0, 0.2, 0.5), ("decode", [(0, 40)]), ("decode", [(0, 30)])]))
def test_paper_matches_real_context(model, profile, prog):
    cfg, ops = prog
    Pair(model, profile, cfg).run(ops)


def test_long_prompt_decoded_for_real(model, profile):
    """No planting: a 790-token prompt in n_batch chunks wraps the 768-cell window cache naturally."""
    pair = Pair(model, profile, _cfg(1, False, False, False, 2048, 400, 32))
    pair.run([("decode", [(0, 789)]), ("decode", [(0, 1)])])
    assert pair.real.pos_min(0) > 0  # the window cache did wrap


@pytest.mark.parametrize("ctk,ctv,fa", [("q8_0", "q8_0", "auto"), ("q4_0", "f16", "off"), ("bf16", "q5_1", "on")])
def test_kv_cache_types_set_the_sizes(model, profile, ctk, ctv, fa):
    """-ctk / -ctv / -fa change every state's bytes (and so what --cache-ram holds): the paper memory
    computes them as the real context reports them, and the server's flags reach both."""
    cfg = {**_cfg(2, False, True, False, 2048, 256, 256), "ctk": ctk, "ctv": ctv, "fa": fa}
    pair = Pair(model, profile, cfg)
    pair.decode([(0, 40), (1, 7)])
    pair.check(f"-ctk {ctk} -ctv {ctv} -fa {fa}")
    f16 = Pair(model, profile, _cfg(2, False, True, False, 2048, 256, 256))
    f16.decode([(0, 40)])
    assert pair.paper.state_size(0) < f16.paper.state_size(0) or ctk == "bf16"
    from slotlab.engine.params import ServerParams
    p = ServerParams.from_args(["-np", "2", "-c", "2048", "-ctk", ctk, "-ctv", ctv, "-fa", fa])
    assert (p.cache_type_k, p.cache_type_v, p.flash_attn, p.notes) == (ctk, ctv, fa, ())
    assert PaperMemory.from_params(p).tgt.caches[0].spec == pair.paper.tgt.caches[0].spec


# ---------------------------------------------------------------------------- byte format and files

def test_state_bytes_have_the_real_layout(model, profile):
    """Parsed with the paper memory's reader, a real blob has the paper's headers, cell counts and
    positions; the paper's bytes restore into the real context (and the real's into the paper)."""
    pair = Pair(model, profile, _cfg(2, False, False, False, 2048, 256, 256))
    pair.decode([(0, 40), (1, 7)])
    for partial in (False, True):
        real = pair.real.state_get(0, partial=partial).copy()
        mine = pair.paper.state_bytes(0, partial=partial)
        assert len(real) == len(mine)
        off_r = off_m = 8
        assert bytes(real[:8]) == bytes(mine[:8])  # io magic + seq id
        for i in pair.paper.tgt.parts(partial):
            spec = pair.paper.tgt.caches[i].spec
            off_r2, cells_r = read_kv_part(real, off_r, spec)
            off_m2, cells_m = read_kv_part(mine, off_m, spec)
            assert (off_r2 - off_r, [(s, p.tolist()) for s, p, _ in cells_r]) == \
                   (off_m2 - off_m, [(s, p.tolist()) for s, p, _ in cells_m])
            off_r, off_m = off_r2, off_m2
        assert off_r == off_m == len(real)
        # real bytes into the paper memory, paper bytes into the real context
        assert pair.paper.state_set(real, 1, partial=partial) == len(real)
        assert pair.real.state_set(mine, 1, partial=partial) == len(mine)
        pair.check(f"cross-restore partial={partial}")


def test_slot_file_sizes_match(model, profile, tmp_path):
    pair = Pair(model, profile, _cfg(1, False, False, False, 2048, 512, 512))
    pair.plant(0, 700)
    pair.decode([(0, 5)])
    toks = np.arange(705, dtype=np.int32)
    n_real = pair.real.save_file(tmp_path / "real.bin", 0, toks)
    n_paper = pair.paper.save_file(tmp_path / "paper.bin", 0, toks)
    assert n_paper == n_real == (tmp_path / "real.bin").stat().st_size == (tmp_path / "paper.bin").stat().st_size
    # each memory reads the other's file
    r1 = pair.real.load_file(tmp_path / "paper.bin", 0)
    r2 = pair.paper.load_file(tmp_path / "real.bin", 0)
    assert r1[0] == r2[0] == n_real and r1[1].tolist() == r2[1].tolist() == toks.tolist()
    pair.check("load_file")
    assert pair.paper.load_file(tmp_path / "missing.bin", 0)[0] == 0


# ---------------------------------------------------------------------------- the profile

def test_profile_from_gguf_is_what_the_model_reports(model, profile):
    assert (profile.n_layer, profile.n_swa, profile.n_ctx_train, profile.n_vocab) == \
           (model.n_layer, model.n_swa, model.n_ctx_train, model.n_vocab)
    assert profile.architecture == model.architecture == "gemma3" and profile.notes == ()
    assert ModelProfile.from_json(profile.to_json()) == profile
