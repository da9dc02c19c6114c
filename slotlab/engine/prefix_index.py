"""The RAM cache's entries in lexicographic order, so that one prompt's lcp with every entry costs a
binary search instead of a scan.

`PromptCache.load` needs `lcp(entry, prompt)` for every entry (f_keep / f_sim), ~150 entries of ~10k
tokens on a small SWA model with `--cache-ram 8192`, and most of them share a long system prompt with
the prompt, so each is a full comparison. For token sequences in lexicographic order (a prefix before
its extensions) the lcp of two sequences is the minimum of the neighbour lcps between them:
lcp(a, c) = min(lcp(a, b), lcp(b, c)) for a <= b <= c. So with the neighbour lcps kept as entries come
and go, a prompt placed between sorted[j - 1] and sorted[j] by a binary search (log2(n) comparisons)
has lcp min(lcp(prompt, sorted[j - 1]), neighbour lcps from i + 1 to j - 1) with sorted[i] left of it,
and the mirror image to the right: two running minimums over an array. Exact, no hashing."""

from __future__ import annotations

from typing import Any

import numpy as np

from slotlab.engine.tokens import common_prefix

__all__ = ["PrefixIndex"]


def _after(d: int, a: np.ndarray, b: np.ndarray) -> bool:
    """Whether `a` sorts after `b`, given d = lcp(a, b): a prefix sorts before its extensions."""
    if d == a.shape[0]:
        return False  # a is a prefix of b (or equal): not after
    if d == b.shape[0]:
        return True
    return bool(a[d] > b[d])


class PrefixIndex:
    """Entries (anything with a `tokens` int32 array that never changes) sorted by their tokens, with
    `nb[i] = lcp(sorted[i - 1], sorted[i])`. Entries compare by identity.

    Each entry is added with an integer `key` (the RAM cache gives its entry id, which grows in the
    order entries are appended): `in_key_order` hands a scan's lcps, and the entries' lengths, in that
    order as arrays, so the cache scores its FIFO list without a dictionary lookup per entry (with
    ~150 entries and two scans a request, those lookups were the scoring's cost)."""

    def __init__(self):
        self.sorted: list[Any] = []
        self.nb: list[int] = []  # nb[0] is unused (0)
        self.keys: list[int] = []  # the entries' keys, in sorted order
        self.ns: list[int] = []  # the entries' token counts, in sorted order
        # the last `scan`: (its lcps in sorted order, as a list), kept in step with removals, so that
        # `add(known=True)` places an entry whose tokens it scanned without comparing anything
        self._last: list[int] | None = None

    def __len__(self) -> int:
        return len(self.sorted)

    def _place(self, toks: np.ndarray) -> tuple[int, dict[int, int]]:
        """The insertion point j (after every entry that sorts before or equal to `toks`) and the lcps
        the binary search computed, by sorted index.

        Each comparison starts past min(L, R), the lcps of `toks` with the search's two boundaries
        (sorted[lo - 1] and sorted[hi]; 0 until both exist): every entry between them shares that
        prefix with `toks` (the lcp of sorted sequences is the minimum over the neighbours between
        them), so the long system prompt most entries share with a prompt is read once, not once a
        probe."""
        lo, hi = 0, len(self.sorted)
        seen: dict[int, int] = {}
        left = right = 0
        while lo < hi:
            mid = (lo + hi) // 2
            t = self.sorted[mid].tokens
            k = min(left, right)
            d = seen[mid] = k + common_prefix(t[k:], toks[k:]) if k else common_prefix(t, toks)
            if _after(d, t, toks):
                hi, right = mid, d
            else:
                lo, left = mid + 1, d
        return lo, seen

    def _place_known(self, toks: np.ndarray, known: list[int]) -> int:
        """`_place`'s insertion point when every entry's lcp with `toks` is known (`known`, in sorted
        order): the same binary search, each comparison one token read past the lcp."""
        lo, hi = 0, len(self.sorted)
        srt = self.sorted
        while lo < hi:
            mid = (lo + hi) // 2
            if _after(known[mid], srt[mid].tokens, toks):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def add(self, entry, key: int = 0, known: bool = False) -> None:
        """Insert `entry` under `key`. `known`: the last `scan` was of tokens equal to `entry.tokens`
        (the RAM cache's `alloc` scored the prompt before making room; the removals since are
        followed), so the place and the neighbour lcps cost no comparison."""
        toks = entry.tokens
        last = self._last
        self._last = None
        if known:
            if last is None or len(last) != len(self.sorted):
                raise AssertionError("PrefixIndex.add(known=True) without a scan of the entries held")
            j = self._place_known(toks, last)
            left = last[j - 1] if j else 0
            right = last[j] if j < len(self.sorted) else None
        else:
            j, seen = self._place(toks)
            left = seen[j - 1] if j - 1 in seen else (common_prefix(self.sorted[j - 1].tokens, toks) if j else 0)
            right = None
            if j < len(self.sorted):
                right = seen[j] if j in seen else common_prefix(self.sorted[j].tokens, toks)
        self.sorted.insert(j, entry)
        self.keys.insert(j, int(key))
        self.ns.insert(j, int(toks.shape[0]))
        self.nb.insert(j, left if j else 0)
        if right is not None:
            self.nb[j + 1] = right

    def remove(self, entry) -> None:
        i = next(k for k, e in enumerate(self.sorted) if e is entry)
        del self.sorted[i]
        del self.keys[i]
        del self.ns[i]
        if self._last is not None:
            del self._last[i]
        if i < len(self.sorted):  # the new neighbours' lcp: the smaller of the two around the gap
            self.nb[i + 1] = 0 if i == 0 else min(self.nb[i], self.nb[i + 1])
        del self.nb[i]
        if self.nb:
            self.nb[0] = 0

    def scan(self, toks: np.ndarray) -> np.ndarray:
        """lcp(entry.tokens, toks) for every entry, in sorted order (int64); remembered for
        `add(known=True)`."""
        n = len(self.sorted)
        if n == 0:
            self._last = []
            return np.empty(0, dtype=np.int64)
        j, seen = self._place(toks)
        out = np.empty(n, dtype=np.int64)
        nb = np.asarray(self.nb, dtype=np.int64)
        if j > 0:
            left = seen[j - 1] if j - 1 in seen else common_prefix(self.sorted[j - 1].tokens, toks)
            out[j - 1] = left
            if j > 1:  # i < j - 1: min(left, nb[i + 1 .. j - 1])
                out[:j - 1] = np.minimum(left, np.minimum.accumulate(nb[1:j][::-1])[::-1])
        if j < n:
            right = seen[j] if j in seen else common_prefix(self.sorted[j].tokens, toks)
            out[j] = right
            if j + 1 < n:  # i > j: min(right, nb[j + 1 .. i])
                out[j + 1:] = np.minimum(right, np.minimum.accumulate(nb[j + 1:]))
        self._last = out.tolist()
        return out

    def in_key_order(self, out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A scan's lcps and the entries' token counts, both ordered by key (int64 arrays)."""
        order = np.argsort(np.array(self.keys, dtype=np.int64), kind="stable")
        return out[order], np.array(self.ns, dtype=np.int64)[order]
