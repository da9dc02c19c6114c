"""The generation fast-forward's memory step (`PaperMemory.advance_generation` over
`PaperContext.advance_tokens`) leaves a paper memory exactly as the same one-token-per-sequence
batches decoded one `decode` at a time, on every memory kind: a sliding-window (iSWA) memory whose
window cache wraps, reuses masked cells and purges (Gemma 3's header, gpt-oss' 128-token window),
hybrid memories (Qwen3.5's M-RoPE attention part, Granite 4.0-H's Mamba-2 layers) and a plain KV
cache, each with a stream per sequence and unified, and where the pool fills up (it stops where
decode refuses). Compared: every cache's cells as the memory holds them (a window cache's cell
array, head and used count; a count cache's cells per sequence; the recurrent positions), pos_min /
pos_max, state sizes, stats and the rows a sampler reads. No model is loaded."""

from pathlib import Path

import numpy as np
import pytest

from slotlab.memory.base import Batch
from slotlab.memory.paper import PaperMemory
from slotlab.memory.paper.cells import CountCache
from slotlab.memory.paper.window import CellCache
from slotlab.memory.profile import ModelProfile

ROOT = Path(__file__).resolve().parents[2]


def _profile(name):
    return ModelProfile.default() if name == "default" else ModelProfile.from_json(ROOT / f"slotlab/sim/profiles/{name}.json")


def _full_state(mem: PaperMemory, n_seq: int):
    out = []
    for c in mem.tgt.caches:
        if isinstance(c, CellCache):
            out.append(("cells", c.pos.tolist(), c.seq.tolist(), c.tok.tolist(), list(c.head), list(c.used),
                        [(c.pos_min(q), c.pos_max(q), c.n_written(q)) for q in range(n_seq)]))
        elif isinstance(c, CountCache):
            out.append(("count", list(c.used), [(c.pos_min(q), c.pos_max(q)) + tuple(a.tolist() for a in c.written(q))
                                                for q in range(n_seq)]))
        else:
            out.append(("recurrent", list(c.pos)))
    per_seq = [(mem.pos_min(q), mem.pos_max(q), mem.state_size(q), mem.state_size(q, partial=True))
               for q in range(n_seq)]
    last = None if mem._last is None else [a.tolist() for a in mem._last]
    return out, per_seq, last, mem.stats["decode"], mem.stats["decode_tokens"]


def _decode(mem, runs, logits_all=True):
    bt = Batch(mem.n_batch + 8)
    for q, t, p0 in runs:
        bt.add_seq(np.asarray(t, dtype=np.int32), p0, q)
    bt.logits[:bt.n_tokens] = 1 if logits_all else 0
    return mem.decode(bt, 0, bt.n_tokens)


CASES = [  # (profile, memory, generating sequences, whether the pool fills up)
    ("default", dict(n_ctx=16384, n_slots=4), [0, 1, 3], False),  # Gemma 3 270M: a 1024-cell window cache a stream
    ("default", dict(n_ctx=16384, n_slots=2, kv_unified=True), [1], False),  # one stream, one sequence generating
    ("gpt-oss-20b", dict(n_ctx=12288, n_slots=3), [0, 2], False),  # a 128-token window: wraps often
    ("gemma-3-27b", dict(n_ctx=8192, n_slots=2, swa_full=True), [0, 1], False),  # the window cache: the whole context
    ("qwen3.5-27b", dict(n_ctx=16384, n_slots=4), [0, 2, 3], False),  # hybrid, M-RoPE attention
    ("qwen3.5-27b", dict(n_ctx=16384, n_slots=2, kv_unified=True), [0, 1], False),
    ("granite-4.0-h-small", dict(n_ctx=8192, n_slots=2), [1], False),  # hybrid, Mamba-2
    ("llama-3.1-8b", dict(n_ctx=8192, n_slots=2), [0, 1], False),
    ("default", dict(n_ctx=2048, n_slots=1), [0], True),  # the context fills: stops where decode refuses
    ("default", dict(n_ctx=8192, n_slots=4), [0, 2], True),
    ("qwen3.5-27b", dict(n_ctx=3072, n_slots=2, kv_unified=True), [0, 1], True),  # a shared pool fills
]


@pytest.mark.parametrize("name, kw, gen, fills", CASES)
def test_advance_generation_is_decode_after_decode(name, kw, gen, fills):
    prof = _profile(name)
    rng = np.random.default_rng(11)
    n_seq = kw["n_slots"]
    a, b = PaperMemory(prof, **kw), PaperMemory(prof, **kw)
    have = [0] * n_seq
    # prompts first (the real decode on both: chunks of n_batch split into ubatches, window purges)
    for q in range(n_seq):
        n = int(rng.integers(300, 1500)) if q in gen else int(rng.integers(1, 700))
        toks = rng.integers(10, 1000, n).astype(np.int32)
        for o in range(0, n, a.n_batch):
            chunk = toks[o:o + a.n_batch]
            for m in (a, b):
                assert _decode(m, [(q, chunk, have[q])], logits_all=False) == 0
            have[q] += len(chunk)
    assert _full_state(a, n_seq) == _full_state(b, n_seq)
    calls = []  # what the window cache's bulk step answered (-1: the per-step decode ran instead)
    if a.tgt.iswa:
        win = a.tgt.attn[1]
        bulk = win.advance_tokens
        win.advance_tokens = lambda *x: calls.append(bulk(*x)) or calls[-1]
    n_steps = 0
    for k in (1, 7, 1500, 900):  # several calls, long enough for the window caches to wrap
        feed = rng.integers(10, 1000, (k, len(gen))).astype(np.int32)
        m = a.advance_generation(gen, [have[q] for q in gen], feed)
        n_ok = 0
        for j in range(k):
            if _decode(b, [(q, [int(feed[j, c])], have[q] + j) for c, q in enumerate(gen)]) != 0:
                b.stats["decode"] -= 1  # the refused decode (the caller's plain step makes it)
                break
            n_ok += 1
        assert m == n_ok, f"{name}: applied {m} steps, decode took {n_ok}"
        assert _full_state(a, n_seq) == _full_state(b, n_seq)
        for q in gen:
            have[q] += m
        n_steps += m
        if m < k:
            break
    assert n_steps > 0
    assert (n_steps < 1 + 7 + 1500 + 900) == fills
    if a.tgt.iswa:  # a stream per sequence: in bulk; one stream holding another sequence: step by step
        assert calls and all(c >= 0 for c in calls) == (not kw.get("kv_unified", False))


def _window(size, n_stream, n_swa, swa_type):
    from slotlab.memory.paper.format import CacheSpec
    return CellCache(CacheSpec("swa", size, n_stream, n_stream, n_swa, swa_type, (), False, False))


def _cells(c: CellCache, n_seq: int):
    return (c.pos.tolist(), c.seq.tolist(), c.tok.tolist(), list(c.head), list(c.used),
            [(c.pos_min(q), c.pos_max(q), c.n_written(q)) for q in range(n_seq)])


@pytest.mark.parametrize("swa_type", ["standard", "chunked", "symmetric"])
@pytest.mark.parametrize("seed", range(6))
def test_window_bulk_is_step_after_step_from_any_layout(swa_type, seed):
    """`CellCache.advance_tokens` (runs of cells decided on numpy slices) against `prepare` + `commit`
    one token at a time, from layouts the simulator reaches and worse: ubatches of every size, partial
    `seq_rm` (holes, a head moved back, so head resets, wraps and purges of cells far from the head),
    small caches and windows, streams that fail (a window as large as the cache). A third cache `c`
    is driven as `b` but always through the general `_find` / `_apply` (a phantom sequence in every
    stream's set turns off the one-sequence-stream path of `prepare`), so that path is checked too."""
    rng = np.random.default_rng(1000 * seed + len(swa_type))
    for trial in range(12):
        size = int(rng.choice([16, 40, 64, 256]))
        n_stream = int(rng.integers(1, 4))
        n_swa = int(rng.integers(2, size + 8))
        a, b, c3 = (_window(size, n_stream, n_swa, swa_type) for _ in range(3))
        for st in c3.seqs:
            st.add(250)  # no cells: `prepare` takes the general path in every stream
        have = [0] * n_stream
        for _ in range(int(rng.integers(0, 8))):  # a history: prompt ubatches and partial removals
            q = int(rng.integers(0, n_stream))
            if rng.random() < 0.3 and have[q]:
                p1 = int(rng.integers(1, have[q] + 1))
                p0 = int(rng.integers(0, p1))
                if rng.random() < 0.5:
                    p1 = have[q]  # a cut-back (the server's seq_rm [n_past, end)): the sequence continues there
                for c in (a, b, c3):
                    c.seq_rm(q, p0, p1)
                if p1 == have[q]:
                    have[q] = max(p0, a.pos_max(q) + 1)
                continue
            n = int(rng.integers(1, size + 1))
            pos = np.arange(have[q], have[q] + n, dtype=np.int32)
            tok = rng.integers(0, 99, n).astype(np.int32)
            ub = [[(q, np.arange(n))]]
            ok = [c.prepare(ub, pos, tok) for c in (a, b, c3)]
            assert ok[0] == ok[1] == ok[2]
            if ok[0]:
                a.commit(), b.commit(), c3.commit()
                have[q] += n
        assert _cells(a, n_stream) == _cells(b, n_stream) == _cells(c3, n_stream)
        gen = sorted(rng.choice(n_stream, int(rng.integers(1, n_stream + 1)), replace=False).tolist())
        if n_stream == 1:
            gen = [0]
        p0s = [max(have[q], a.pos_max(q) + 1) for q in gen]
        k = int(rng.integers(1, 3 * size))
        feed = rng.integers(0, 99, (k, len(gen))).astype(np.int32)
        m = a.advance_tokens(gen, p0s, feed, k)
        assert m >= 0
        n_ok = 0
        for j in range(k):
            ub = [[(q, np.array([c]))] for c, q in enumerate(gen)] if n_stream > 1 else [[(gen[0], np.array([0]))]]
            pos = np.array([p + j for p in p0s], dtype=np.int32)
            tok = feed[j].astype(np.int32)
            if n_stream > 1:  # one ubatch: a row per generating sequence, each in its stream
                ub = [[(q, np.array([c])) for c, q in enumerate(gen)]]
            ok = b.prepare(ub, pos, tok)
            assert ok == c3.prepare(ub, pos, tok)
            if not ok:
                break
            b.commit(), c3.commit()
            n_ok += 1
        assert m == n_ok, (size, n_stream, n_swa, swa_type, trial)
        assert _cells(a, n_stream) == _cells(b, n_stream) == _cells(c3, n_stream), (size, n_stream, n_swa, swa_type, trial)


def _dense_truth(c: CellCache, s: int):
    """What the dense record of stream s must say, from the cells themselves."""
    m = c.seq[s] >= 0
    if not m.any():
        return None
    qs = set(c.seq[s][m].tolist())
    if len(qs) > 1:
        return False
    p = c.pos[s][m]
    lo, hi = int(p.min()), int(p.max())
    return (qs.pop(), lo, hi) if hi - lo + 1 == len(p) == len(set(p.tolist())) else False


@pytest.mark.parametrize("swa_type", ["standard", "chunked", "symmetric"])
@pytest.mark.parametrize("seed", range(5))
def test_dense_stream_path_is_the_general_find_and_apply(swa_type, seed):
    """`CellCache._place_dense` (slices, and a record of the positions a one-sequence stream holds)
    against the one-sequence path without it (`_find_one` / `_apply_one`) and the general `_find` /
    `_apply`, after every operation of a random history: prompt ubatches of any size (wrapping the
    ring, failing for lack of usable cells), ubatches over two streams whose second group fails
    after the first was placed (the rollback must restore the record), cut-backs, prefix and middle
    `seq_rm`, `seq_add`, bulk generation. The record itself is checked against the cells after every
    step: a stale one would let the dense path purge or place wrongly."""
    rng = np.random.default_rng(7000 + 10 * seed + len(swa_type))
    for trial in range(10):
        size = int(rng.choice([16, 40, 64, 256]))
        n_stream = int(rng.integers(1, 4))
        n_swa = int(rng.integers(2, size + 8))
        fast, plain, gen = (_window(size, n_stream, n_swa, swa_type) for _ in range(3))
        plain._place_dense = lambda *a: None  # the one-sequence path without the record
        for st in gen.seqs:
            st.add(250)  # the general path in every stream
        caches = (fast, plain, gen)
        have = [0] * n_stream
        for step in range(40):
            r = rng.random()
            q = int(rng.integers(0, n_stream))
            if r < 0.25 and have[q]:
                p1 = int(rng.integers(1, have[q] + 1))
                p0 = int(rng.integers(0, p1))
                kind = rng.integers(0, 3)
                if kind == 0:
                    p1 = have[q]  # a cut-back
                elif kind == 1:
                    p0 = 0  # a prefix
                for c in caches:
                    c.seq_rm(q, p0, p1)
                if p1 == have[q]:
                    have[q] = max(p0, fast.pos_max(q) + 1)
            elif r < 0.3 and have[q] > 4:
                for c in caches:
                    c.seq_add(q, 2, have[q], -2)  # holes at 0..1 after a shift: not dense any more
                have[q] = max(0, fast.pos_max(q) + 1)
            elif r < 0.45:
                p0s = [max(have[x], fast.pos_max(x) + 1) for x in [q]]
                k = int(rng.integers(1, size))
                feed = rng.integers(0, 99, (k, 1)).astype(np.int32)
                outs = [c.advance_tokens([q], p0s, feed, k) for c in (fast, plain)]
                assert outs[0] == outs[1]
                m = outs[0]
                for j in range(max(m, 0)):
                    pos = np.array([p0s[0] + j], dtype=np.int32)
                    assert gen.prepare([[(q, np.array([0]))]], pos, feed[j])
                    gen.commit()
                if m < 0:  # refused (another sequence's cells in the stream): all three token by token
                    for j in range(k):
                        pos = np.array([p0s[0] + j], dtype=np.int32)
                        ok = [c.prepare([[(q, np.array([0]))]], pos, feed[j]) for c in caches]
                        assert ok[0] == ok[1] == ok[2]
                        if not ok[0]:
                            break
                        for c in caches:
                            c.commit()
                        m = j + 1
                have[q] = max(have[q], p0s[0] + max(m, 0))
            else:
                qs = [q] if n_stream == 1 or rng.random() < 0.6 else sorted({q, int(rng.integers(0, n_stream))})
                n = int(rng.integers(1, size + 1))
                rows, pos, off = [], [], 0
                for x in qs:
                    p0 = max(have[x], fast.pos_max(x) + 1)
                    pos.append(np.arange(p0, p0 + n, dtype=np.int32))
                    rows.append((x, np.arange(off, off + n)))
                    off += n
                pos = np.concatenate(pos)
                tok = rng.integers(0, 99, len(pos)).astype(np.int32)
                ok = [c.prepare([rows], pos, tok) for c in caches]
                assert ok[0] == ok[1] == ok[2], (trial, step)
                if ok[0]:
                    for c in caches:
                        c.commit()
                    for x in qs:
                        have[x] = fast.pos_max(x) + 1
            assert _cells(fast, n_stream) == _cells(plain, n_stream) == _cells(gen, n_stream), (trial, step)
            for s in range(n_stream):
                d = fast.dense[s]
                if d is not None:  # (None: not known, recomputed when asked)
                    assert d == _dense_truth(fast, s), (trial, step, s)


@pytest.mark.parametrize("swa_type", ["standard", "chunked", "symmetric"])
@pytest.mark.parametrize("seed", range(4))
def test_place_alone_without_a_journal_only_where_nothing_can_fail(swa_type, seed):
    """`place_alone` skips its journal where `_cannot_fail` says no group can fail (each stream holds
    only its sequence, each position once, groups at most size - n_swa + 1 cells, position after
    position). Against `prepare` + `commit` of the same ubatches (always journaled, the general
    path): every decode `_cannot_fail` passes is one `prepare` takes, the cells agree after each, and
    where `_cannot_fail` declines the journaled path still decides as `prepare` (failures included),
    from layouts a prompt, a generation, cut-backs and shifts leave."""
    rng = np.random.default_rng(9100 + 10 * seed + len(swa_type))
    n_checked = n_free = 0
    for trial in range(12):
        size = int(rng.choice([16, 40, 64, 256]))
        n_stream = int(rng.integers(2, 4))  # a stream per sequence (place_alone's case)
        n_swa = int(rng.integers(2, size + 8))
        fast, plain = _window(size, n_stream, n_swa, swa_type), _window(size, n_stream, n_swa, swa_type)
        have = [0] * n_stream
        for step in range(30):
            r = rng.random()
            q = int(rng.integers(0, n_stream))
            if r < 0.15 and have[q]:
                p0 = int(rng.integers(0, have[q]))
                for c in (fast, plain):
                    c.seq_rm(q, p0, have[q])  # a cut-back
                have[q] = max(p0, fast.pos_max(q) + 1)
                continue
            if r < 0.2 and have[q] > 4:
                for c in (fast, plain):
                    c.seq_add(q, 2, have[q], -2)
                have[q] = max(0, fast.pos_max(q) + 1)
                continue
            # one decode: ubatches of groups over one or two streams, position after position
            qs = sorted({q, int(rng.integers(0, n_stream))})
            ubs, rows = [], []
            p = {x: max(have[x], fast.pos_max(x) + 1) for x in qs}
            if rng.random() < 0.2:  # positions the stream holds already (not after its last cell)
                p = {x: max(0, v - int(rng.integers(1, n_swa + 2))) for x, v in p.items()}
            for _ in range(int(rng.integers(1, 4))):
                ub = []
                for x in qs:
                    k = int(rng.integers(1, max(2, size // 2)))
                    pos = np.arange(p[x], p[x] + k, dtype=np.int32)
                    ub.append((x, pos, rng.integers(0, 99, k).astype(np.int32)))
                    p[x] += k
                ubs.append(ub)
            safe = fast._cannot_fail(ubs)
            # the same decode as `prepare` reads it: rows of one batch, ubatch by ubatch
            pos_all = np.concatenate([g[1] for ub in ubs for g in ub])
            tok_all = np.concatenate([g[2] for ub in ubs for g in ub])
            plain_ubs, a = [], 0
            for ub in ubs:
                groups = []
                for x, pos, _ in ub:
                    groups.append((x, np.arange(a, a + len(pos))))
                    a += len(pos)
                plain_ubs.append(groups)
            ok_plain = plain.prepare(plain_ubs, pos_all, tok_all)
            if ok_plain:
                plain.commit()
            ok_fast = fast.place_alone([[(x, pos, tok) for x, pos, tok in ub] for ub in ubs])
            assert ok_fast == ok_plain, (size, n_swa, swa_type, trial, step)
            if safe:
                assert ok_plain  # what _cannot_fail promised
                n_free += 1
            n_checked += 1
            assert _cells(fast, n_stream) == _cells(plain, n_stream), (size, n_swa, swa_type, trial, step)
            if ok_plain:
                for x in qs:
                    have[x] = max(have[x], p[x])
    assert n_free > 0 and n_checked > n_free  # both paths were taken


@pytest.mark.parametrize("swa_type", ["standard", "chunked", "symmetric"])
@pytest.mark.parametrize("size,n_swa", [(24, 16), (17, 16), (64, 8)])
def test_full_ring_generation_is_step_after_step(swa_type, size, n_swa):
    """`_advance_ring`, the generation fast path of a full ring in position order (what a long prompt
    leaves), is taken there and leaves the cells as one-token `prepare` + `commit` steps do, for runs
    shorter than the ring, as long as it, and several times around it (heads at every offset)."""
    rng = np.random.default_rng(size * 100 + n_swa + len(swa_type))
    for m in (1, 5, size - 1, size, size + 1, 3 * size + 2):
        for lead in (0, 3, size - 2):  # the prompt's length decides where the head stands
            fast, plain = _window(size, 2, n_swa, swa_type), _window(size, 2, n_swa, swa_type)
            n_prompt = 2 * size + lead
            p = 0
            while p < n_prompt:  # the prompt in groups of at most size - n_swa + 1 cells
                k = min(n_prompt - p, max(1, size - n_swa + 1), 7)
                g = [[(1, np.arange(p, p + k, dtype=np.int32), rng.integers(0, 99, k).astype(np.int32))]]
                assert fast.place_alone(g) and plain.place_alone(g)
                p += k
            used = []
            ring = fast._advance_ring
            fast._advance_ring = lambda *a: used.append(ring(*a)) or used[-1]
            feed = rng.integers(0, 99, (m, 1)).astype(np.int32)
            assert fast.advance_tokens([1], [p], feed, m) == m
            assert used and used[0] is not None, "the full-ring path was not taken"
            for j in range(m):
                assert plain.prepare([[(1, np.array([0]))]], np.array([p + j], dtype=np.int32), feed[j])
                plain.commit()
            assert _cells(fast, 2) == _cells(plain, 2), (m, lead)
