"""`PrefixIndex` (the RAM cache's entries in lexicographic order) gives every entry's lcp with a
prompt exactly as one `common_prefix` per entry does, as entries come and go (added with the lcps
known or not): sequences sharing prefixes of every length, prefixes of each other, equal ones, empty
ones."""

from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from slotlab.engine.prefix_index import PrefixIndex
from slotlab.engine.tokens import common_prefix

_seq = st.lists(st.integers(0, 3), min_size=0, max_size=12)  # a small alphabet: long shared prefixes
_ops = st.lists(st.tuples(st.sampled_from(["add", "add", "rm", "q"]), _seq, st.integers(0, 50)), max_size=40)


@settings(max_examples=400, deadline=None)
@given(ops=_ops)
def test_lcps_equal_one_comparison_per_entry(ops):
    idx, live, key = PrefixIndex(), [], iter(range(10**6))
    for op, toks, k in ops:
        t = np.array(toks, dtype=np.int32)
        if op == "add":
            e = SimpleNamespace(tokens=t, key=next(key))
            # half the adds as the RAM cache's alloc makes them: placed by the scan it scored the prompt
            # by, with entries removed between the scan and the add (its obsolete prefixes, make-room)
            if k % 2:
                idx.scan(t)
                for _ in range(k % 3):
                    if live:
                        idx.remove(live.pop((k * 7) % len(live)))
            idx.add(e, e.key, known=bool(k % 2))
            live.append(e)
        elif op == "rm" and live:
            idx.remove(live.pop(k % len(live)))
        got = dict(zip(map(id, idx.sorted), idx.scan(t).tolist()))
        assert got == {id(e): common_prefix(e.tokens, t) for e in live}
        lc, ns = idx.in_key_order(idx.scan(t))  # in the order entries were added (the cache's FIFO list)
        assert lc.tolist() == [common_prefix(e.tokens, t) for e in live]
        assert ns.tolist() == [len(e.tokens) for e in live]
        assert len(idx) == len(live)
        s = idx.sorted  # the order and the neighbour lcps the queries rely on
        assert all(tuple(a.tokens) <= tuple(b.tokens) for a, b in zip(s, s[1:]))
        assert idx.nb[1:] == [common_prefix(a.tokens, b.tokens) for a, b in zip(s, s[1:])]


def test_common_prefix_is_the_first_mismatch_at_every_length():
    """`common_prefix` compares the leading 256 tokens first, then up to 2048, and the rest only when
    they agree: the first mismatch at every place (inside each stage, at its edges, in the rest,
    none), against the definition, on prompts short and long."""
    rng = np.random.default_rng(3)

    def first_mismatch(a, b):
        n = min(len(a), len(b))
        return next((i for i in range(n) if a[i] != b[i]), n)

    for n in (0, 1, 255, 256, 257, 1024, 1025, 4096, 4097, 5000):
        a = rng.integers(0, 5, n).astype(np.int32)
        for k in sorted({0, 1, 255, 256, 257, 2047, 2048, 2049, n // 2, max(0, n - 1), n}):
            if k > n:
                continue
            tail = rng.integers(0, 5, int(rng.integers(0, 2000))).astype(np.int32)
            if k < n and len(tail):
                tail[0] = (a[k] + 1) % 5  # mismatch exactly at k
            b = np.concatenate([a[:k], tail])
            assert common_prefix(a, b) == first_mismatch(a, b) == common_prefix(b, a)
