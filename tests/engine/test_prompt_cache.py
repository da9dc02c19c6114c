"""Pure-policy tests of the RAM prompt cache (spec section 2) and the server_tokens helpers.

No model is loaded: sizes are small byte counts, tokens are small int arrays. Float32 cases use
numbers found by search so that float64 arithmetic would decide the other way."""

from __future__ import annotations

import warnings
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from slotlab.engine.prompt_cache import (
    CacheEntry,
    Checkpoint,
    PromptCache,
    f32,
    f32_ratio,
)
from slotlab.engine.tokens import as_tokens, common_prefix, is_prefix


# -- helpers ---------------------------------------------------------------------------------------


class Recorder:
    def __init__(self):
        self.events: list[tuple[str, dict]] = []

    def __call__(self, kind, **fields):
        self.events.append((kind, fields))

    def kinds(self):
        return [k for k, _ in self.events]

    def of(self, kind, **match):
        return [f for k, f in self.events if k == kind and all(f.get(a) == b for a, b in match.items())]

    def messages(self):
        return [f["message"] for _, f in self.events]


def seq(*parts):
    """Concatenate ranges/lists into one int32 token array."""
    out = []
    for p in parts:
        out.extend(p)
    return np.array(out, dtype=np.int32)


def cache(limit_size=0, limit_tokens=0, **kw):
    rec = Recorder()
    c = PromptCache(limit_size, limit_tokens, on_event=rec, clock=lambda: 0.0, **kw)
    return c, rec


def toks(entries):
    return [e.tokens.tolist() for e in entries]


def naive_lcp(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# -- tokens ----------------------------------------------------------------------------------------


def test_common_prefix_basics():
    assert common_prefix([], []) == 0
    assert common_prefix([1, 2], []) == 0
    assert common_prefix([1, 2, 3], [1, 2, 3]) == 3
    assert common_prefix([1, 2, 3], [1, 2]) == 2
    assert common_prefix([1, 2, 3], [1, 9, 3]) == 1
    assert common_prefix([7], [8]) == 0
    assert is_prefix([1, 2], [1, 2, 3]) and is_prefix([], [5]) and is_prefix([4], [4])
    assert not is_prefix([1, 2, 3], [1, 2])


def test_as_tokens_is_int32_1d():
    assert as_tokens([1, 2]).dtype == np.int32
    with pytest.raises(ValueError):
        as_tokens([[1, 2]])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 2), max_size=40), st.lists(st.integers(0, 2), max_size=40))
def test_common_prefix_equals_naive_loop(a, b):
    expected = naive_lcp(a, b)
    assert common_prefix(np.array(a, np.int32), np.array(b, np.int32)) == expected
    assert common_prefix(a, b) == expected


def test_f32_single_rounding_for_huge_ints():
    # via float64 this would round twice: 2**54 + 2**30 + 1 -> 2**54 + 2**30 (tie) -> 2**54
    n = 2**54 + 2**30 + 1
    assert int(f32(n)) == 2**54 + 2**31
    assert int(f32(2**24 + 1)) == 2**24  # tie to even
    assert int(f32(2**24 + 3)) == 2**24 + 4
    assert f32(12345) == np.float32(12345)


def test_f32_ratio_floor_rounds_up_to_quarter():
    # k/(4k+1) is below 0.25 exactly but rounds to 0.25f: the server keeps such an entry
    k = 2**23
    assert Fraction(k, 4 * k + 1) < Fraction(1, 4)
    assert f32_ratio(k, 4 * k + 1) == np.float32(0.25)
    assert not (f32_ratio(k, 4 * k + 1) < np.float32(0.25))


def test_f32_ratio_is_the_float32_division():
    """The fast path (one rounding of the float64 quotient) against float32 / float32, on random and
    edge counts up to and past 2**24."""
    rng = np.random.default_rng(5)
    nums = list(rng.integers(0, 1 << 25, 20000)) + [0, 1, 3, (1 << 24) - 1, 1 << 24, (1 << 24) + 1]
    dens = list(rng.integers(1, 1 << 25, 20000)) + [1, 3, 7, (1 << 24) - 1, 1 << 24, (1 << 24) + 1]
    small = rng.integers(0, 5000, (20000, 2))
    for a, b in list(zip(nums, dens)) + [(int(x), int(y) + 1) for x, y in small]:
        want = np.float32(f32(int(a))) / np.float32(f32(int(b)))
        got = f32_ratio(int(a), int(b))
        assert type(got) is np.float32 and got == want, (a, b)


def test_f32_ratio_zero_division_is_silent_nan():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = f32_ratio(0, 0)
    assert np.isnan(r) and r.dtype == np.float32


# -- construction ----------------------------------------------------------------------------------


def test_from_cache_ram():
    assert PromptCache.from_cache_ram(8192, 4096).limit_size == 8192 * 1024 * 1024
    c = PromptCache.from_cache_ram(-1, 4096)
    assert c.limit_size == 0 and c.limit_tokens == 4096
    with pytest.raises(ValueError):
        PromptCache.from_cache_ram(0, 4096)


def test_entry_size_counts_buffers_and_checkpoints_but_n_tokens_does_not():
    c, _ = cache()
    ck = Checkpoint(n_tokens=2, pos_min=0, pos_max=1, data_tgt=b"x" * 7, data_dft=np.zeros(3, np.uint8))
    e = c.alloc(seq(range(5)), [ck], 10, 4)
    assert e.size() == 10 + 4 + 10 and c.size() == 24
    assert c.n_tokens() == 5


def test_checkpoint_summary_follows_every_field_and_buffer_assignment():
    """`Checkpoint.summary()` / `size()` are remembered: any assignment must forget them, a resizable
    buffer must never be remembered, and a copy must carry only what holds for it."""
    from slotlab.memory.paper.blob import PaperBlob

    ck = Checkpoint(4, 1, 3, id_task=5, data_tgt=b"x" * 7, data_dft=np.zeros(3, np.uint8))
    assert ck.summary() == (1, 3, 4, 10, 5) and ck.size() == 10
    ck.data_tgt = PaperBlob(100)  # what CacheEntry-style buffer replacement and slot files do
    assert ck.summary() == (1, 3, 4, 103, 5) and ck.size() == 103
    ck.data_dft = b""  # slot_actions drops draft data this way
    ck.data_spec = b"s" * 2
    assert ck.size() == 102
    ck.pos_min, ck.pos_max, ck.n_tokens, ck.id_task = 2, 9, 10, 6
    assert ck.summary() == (2, 9, 10, 102, 6)
    ba = bytearray(b"abc")  # resizable in place: measured on every call
    ck.data_tgt = ba
    assert ck.size() == 5
    ba.extend(b"defg")
    assert ck.size() == 9 and ck.summary() == (2, 9, 10, 9, 6)
    ck.data_tgt = np.ones(4, np.uint8)
    cp = ck.copy()
    assert cp.summary() == ck.summary() == (2, 9, 10, 6, 6)
    assert cp is not ck and cp.data_tgt is not ck.data_tgt and (cp.data_tgt == 1).all()
    cp.data_tgt = b""  # the copy's own assignment forgets only its own summary
    assert cp.size() == 2 and ck.size() == 6
    ba2 = bytearray(b"12")
    ck.data_spec = ba2
    cp2 = ck.copy()  # a resizable buffer is copied as bytes: the copy may remember
    ba2.extend(b"345")
    assert ck.size() == 4 + 5 and cp2.size() == 4 + 2


# -- alloc -----------------------------------------------------------------------------------------


def test_alloc_appends_deep_copies():
    c, rec = cache()
    t = seq(range(4))
    buf = np.ones(5, np.uint8)
    ck = Checkpoint(3, 0, 2, id_task=7, data_tgt=buf)
    e = c.alloc(t, [ck], 8, 0, id_slot=2, id_task=11, created_at=1.5)
    t[0] = 99
    buf[0] = 0
    assert e.tokens.tolist() == [0, 1, 2, 3] and not e.tokens.flags.writeable
    assert e.checkpoints[0] is not ck and e.checkpoints[0].data_tgt[0] == 1
    assert e.checkpoints[0].id_task == 7
    assert (e.id_slot, e.id_task, e.created_at) == (2, 11, 1.5)
    assert len(e.main) == 8 and len(e.drft) == 0 and not e.main.any()
    assert c.entries == [e]
    assert rec.kinds() == ["cache_save", "cache_alloc"]
    assert rec.events[0][1]["message"] == (
        " - saving prompt with length 4, total state size = 0.000 MiB (draft: 0.000 MiB)")
    e2 = c.alloc(seq([5]), [], 1)
    assert e2.id > e.id


def test_alloc_skips_prompt_already_contained():
    c, rec = cache()
    e = c.alloc(seq(range(10)), [], 100)
    assert c.alloc(seq(range(6)), [], 1) is None  # a prefix of an entry
    assert c.alloc(seq(range(10)), [], 1) is None  # equal
    assert c.entries == [e]
    dup = rec.of("cache_skip_duplicate")
    assert len(dup) == 2 and dup[0]["message"] == " - prompt is already in the cache, skipping"


def test_alloc_over_limit_skip_happens_before_prefix_removal():
    c, rec = cache(limit_size=100)
    e = c.alloc(seq([1, 2]), [], 10)
    assert c.alloc(seq([1, 2, 3]), [], 101) is None
    assert c.entries == [e]  # the contained prefix was NOT removed
    assert not rec.of("cache_evict")
    (skip,) = rec.of("cache_skip_over_limit")
    assert skip["level"] == "WRN" and skip["message"] == (
        " - prompt state size 0.000 MiB exceeds cache size limit 0.000 MiB, skipping")
    # checkpoints count towards the new entry's size: 50 + 20 + 31 > 100
    ck = Checkpoint(1, 0, 0, data_tgt=b"a" * 31)
    assert c.alloc(seq([1, 2, 3]), [ck], 50, 20) is None
    # exactly at the limit is fine (strict >), and then the prefix goes
    assert c.alloc(seq([1, 2, 3]), [], 100) is not None
    assert toks(c.entries) == [[1, 2, 3]]


def test_alloc_over_limit_message_in_mib():
    c, rec = cache(limit_size=3 * 1024 * 1024)
    c.alloc(seq([1]), [], 4 * 1024 * 1024 + 512 * 1024)
    assert rec.of("cache_skip_over_limit")[0]["message"] == (
        " - prompt state size 4.500 MiB exceeds cache size limit 3.000 MiB, skipping")


def test_alloc_removes_obsolete_prefixes_only():
    c, rec = cache()
    c.alloc(seq([1, 2]), [], 1)
    c.alloc(seq([1, 2, 9]), [], 1)
    c.alloc(seq([5]), [], 1)
    e = c.alloc(seq([1, 2, 3, 4]), [], 1)
    assert e is not None
    assert toks(c.entries) == [[1, 2, 9], [5], [1, 2, 3, 4]]
    (ev,) = rec.of("cache_evict")
    assert ev["reason"] == "obsolete_prefix" and ev["level"] == "TRC"
    assert ev["message"] == " - removing obsolete cached prompt with length 2"


def test_alloc_make_room_is_fifo():
    c, rec = cache(limit_size=100)
    for i in range(3):
        c.alloc(seq([10 + i]), [], 30)
    c.alloc(seq([20]), [], 50)  # 90 + 50 > 100 -> pop (60+50 > 100) -> pop (30+50 <= 100)
    assert toks(c.entries) == [[12], [20]]
    ev = rec.of("cache_evict", reason="make_room")
    assert [e["entry"].tokens.tolist() for e in ev] == [[10], [11]]
    assert ev[0]["level"] == "WRN" and ev[0]["message"] == (
        " - making room for prompt cache entry, removing oldest entry (size = 0.000 MiB)")
    assert c.size() <= c.limit_size


def test_alloc_make_room_counts_checkpoints():
    c, _ = cache(limit_size=100)
    c.alloc(seq([1]), [Checkpoint(1, 0, 0, data_tgt=b"z" * 40)], 10)  # entry size 50
    c.alloc(seq([2]), [], 50)  # 50 + 50 <= 100: no eviction
    assert len(c) == 2
    c.alloc(seq([3]), [], 1)  # 100 + 1 > 100: the oldest goes
    assert toks(c.entries) == [[2], [3]]


def test_alloc_does_not_enforce_token_limit_update_does():
    c, rec = cache(limit_size=0, limit_tokens=5)
    e = c.alloc(seq(range(10)), [], 4)
    assert c.entries == [e]
    assert c.update() == 5
    assert c.entries == []
    (ev,) = rec.of("cache_evict", reason="token_limit")
    assert ev["message"] == (
        " - cache token limit (5, est: 5) reached, removing oldest entry (size = 0.000 MiB)")


def test_alloc_allocates_target_then_draft():
    calls = []

    def allocate(n):
        calls.append(n)
        return bytearray(n)

    c, _ = cache(allocate=allocate)
    e = c.alloc(seq([1, 2]), [], 7, 3)
    assert calls == [7, 3] and e.size() == 10


# -- bad_alloc -------------------------------------------------------------------------------------


class FailingAllocator:
    def __init__(self):
        self.fail_on = None  # fail when the call count reaches this value
        self.calls = 0

    def __call__(self, n):
        self.calls += 1
        if self.fail_on is not None and self.calls >= self.fail_on:
            raise MemoryError()
        return np.zeros(n, np.uint8)


def test_bad_alloc_shrinks_to_40_percent_and_keeps_removals():
    alloc = FailingAllocator()
    c, rec = cache(limit_size=1000, limit_tokens=10**6, allocate=alloc)
    c.alloc(seq([1, 2]), [], 100)  # A: will be removed as obsolete prefix
    c.alloc(seq([3]), [], 100)  # B
    c.alloc(seq([4]), [], 50)  # C
    rec.events.clear()
    alloc.fail_on = alloc.calls + 1
    assert c.alloc(seq([1, 2, 3]), [], 10) is None
    # A removed before the failed allocation stays removed; limit = int(0.4 * 150) = 60;
    # update() evicts B (150 > 60), C remains (50 <= 60)
    assert c.limit_size == 60
    assert toks(c.entries) == [[4]]
    assert rec.kinds() == ["cache_save", "cache_evict", "cache_alloc_failed", "cache_limit_reduced",
                           "cache_evict", "cache_state", "cache_state_entry"]
    assert rec.events[1][1]["reason"] == "obsolete_prefix"
    failed = rec.of("cache_alloc_failed")[0]
    assert failed["level"] == "ERR"
    assert failed["message"] == "failed to allocate memory for prompt cache state: std::bad_alloc"
    red = rec.of("cache_limit_reduced")[0]
    assert red["message"] == " - cache size limit reduced to 0.000 MiB" and red["limit_size_old"] == 1000
    shrink = rec.of("cache_evict", reason="shrink")
    assert len(shrink) == 1 and shrink[0]["message"].startswith(" - cache size limit reached")


def test_bad_alloc_on_draft_buffer_too():
    alloc = FailingAllocator()
    c, _ = cache(limit_size=1000, allocate=alloc)
    c.alloc(seq([9]), [], 300)
    alloc.fail_on = alloc.calls + 2  # target buffer succeeds, draft buffer fails
    assert c.alloc(seq([1]), [], 10, 10) is None
    assert c.limit_size == 120 and toks(c.entries) == []


def test_bad_alloc_on_empty_cache_sets_limit_one_byte():
    alloc = FailingAllocator()
    alloc.fail_on = 1
    c, rec = cache(limit_size=0, limit_tokens=100, allocate=alloc)
    assert c.alloc(seq([1, 2]), [], 10) is None
    assert c.limit_size == 1
    alloc.fail_on = None
    assert c.alloc(seq([1, 2]), [], 2) is None  # every later save is over the limit
    assert rec.of("cache_skip_over_limit")
    assert c.alloc(seq([3]), [], 1) is not None  # a 1-byte state still fits


def test_bad_alloc_error_text_from_exception():
    def allocate(n):
        raise MemoryError("out of RAM")

    c, rec = cache(allocate=allocate)
    c.alloc(seq([1]), [], 1)
    assert rec.of("cache_alloc_failed")[0]["message"].endswith(": out of RAM")


# -- load ------------------------------------------------------------------------------------------


def test_load_empty_slot_baseline_is_minus_one():
    c, rec = cache()
    e = c.alloc(seq([1], [50, 51, 52]), [], 1)  # lcp 1 of 4 -> f_keep exactly 0.25
    r = c.load(seq(), seq([1], range(100, 200)))
    assert r.f_keep_base == np.float32(-1.0) and r.f_sim_base == 0
    assert r.entry is e
    assert r.scores[0].f_keep == np.float32(0.25) and r.scores[0].winner
    assert rec.messages()[-4:-1] == [
        " - looking for better prompt, base f_keep = -1.000, f_sim = 0.000",
        "   - prompt with length       4, lcp =       1, f_keep = 0.250, f_sim = 0.010",
        " - found better prompt with f_keep = 0.250, f_sim = 0.010",
    ]
    assert rec.kinds()[-1] == "cache_load_scores"
    assert c.entries == [e]  # load itself removes nothing


def test_load_floor_skips_below_quarter_even_for_empty_slot():
    c, _ = cache()
    c.alloc(seq([1], [50, 51, 52, 53]), [], 1)  # lcp 1 of 5 -> 0.2
    r = c.load(seq(), seq([1], range(100, 110)))
    assert r.entry is None
    assert r.scores[0].below_floor and not r.scores[0].improved
    assert r.f_keep_best == np.float32(-1.0)


def test_load_nothing_better_than_slot():
    c, _ = cache()
    slot = seq(range(100))
    new = seq(range(100), range(500, 520))
    c.alloc(slot, [], 1)  # the entry just saved equals the baseline: never strictly better
    c.alloc(seq(range(80), [7] * 10), [], 1)  # worse on both axes
    c.alloc(seq(range(100), range(900, 1000)), [], 1)  # better f_sim? no: same lcp, lower f_keep
    r = c.load(slot, new)
    assert r.entry is None
    assert r.f_keep_base == np.float32(1.0)


def test_load_requires_both_axes_strictly():
    c, _ = cache()
    new = seq(range(1000))
    slot = seq(range(500))  # f_keep 1.0, f_sim 0.5
    c.alloc(seq(range(900), [-1] * 900), [], 1)  # f_sim 0.9 but f_keep 0.5 -> rejected
    r = c.load(slot, new)
    assert r.entry is None and not r.scores[0].below_floor
    slot2 = seq(range(500), [-5] * 500)  # f_keep 0.5, f_sim 0.5
    r2 = c.load(slot2, new)
    assert r2.entry is None  # f_sim 0.9 > 0.5 but f_keep 0.5 ties the slot's 0.5
    slot3 = seq(range(500), [-5] * 600)  # f_keep 0.4545, f_sim 0.5: now the entry beats both
    assert c.load(slot3, new).entry is c.entries[0]


def _appendix_b_entries():
    new = seq(range(1000))
    a = seq(range(600), [-1] * 200)  # 800 tokens, lcp 600: f_keep 0.75, f_sim 0.60
    b = seq(range(900), [-2] * 2100)  # 3000 tokens, lcp 900: f_keep 0.30, f_sim 0.90
    return new, a, b


def test_appendix_b_order_a_then_b():
    new, a, b = _appendix_b_entries()
    c, _ = cache()
    ea = c.alloc(a, [], 1)
    c.alloc(b, [], 1)
    r = c.load(seq(), new)
    assert r.entry is ea
    assert [s.improved for s in r.scores] == [True, False]
    assert (r.f_keep_best, r.f_sim_best) == (np.float32(0.75), np.float32(0.6))


def test_appendix_b_order_b_then_a():
    new, a, b = _appendix_b_entries()
    c, _ = cache()
    eb = c.alloc(b, [], 1)
    c.alloc(a, [], 1)
    r = c.load(seq(), new)
    assert r.entry is eb
    assert [s.improved for s in r.scores] == [True, False]


def test_load_later_entry_dominating_replaces_earlier():
    c, _ = cache()
    new = seq(range(100))
    c.alloc(seq(range(40), [-1] * 60), [], 1)  # 0.4 / 0.4
    e2 = c.alloc(seq(range(60), [-2] * 20), [], 1)  # 0.75 / 0.6
    r = c.load(seq(), new)
    assert r.entry is e2 and [s.improved for s in r.scores] == [True, True]
    assert [s.winner for s in r.scores] == [False, True]


def test_load_float32_tie_rejects_what_float64_would_take():
    # slot: 4280 tokens sharing 2189 with the request; entry: 4411 tokens sharing 2256.
    # Exactly 2189/4280 < 2256/4411, but both round to the same float32 -> not strictly better.
    a, b, c_, d = 2189, 4280, 2256, 4411
    assert Fraction(a, b) < Fraction(c_, d) and a / b < c_ / d
    new = seq(range(3000))
    slot = seq(range(a), [-1] * (b - a))
    entry = seq(range(c_), [-2] * (d - c_))
    c, _ = cache()
    c.alloc(entry, [], 1)
    r = c.load(slot, new)
    assert r.scores[0].f_keep == r.f_keep_base
    assert r.scores[0].f_sim > r.f_sim_base
    assert r.entry is None


def test_load_empty_request_is_nan_and_silent():
    c, _ = cache()
    c.alloc(seq([1, 2]), [], 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = c.load(seq([1]), seq())
    assert np.isnan(r.f_sim_base) and r.entry is None


_prefixes = st.lists(st.integers(0, 60), min_size=0, max_size=12)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entries=_prefixes, tails=_prefixes, n_slot=st.integers(0, 60), slot_tail=st.integers(0, 20),
       n_new=st.integers(0, 60), new_tail=st.integers(0, 20))
@example(entries=[1], tails=[3], n_slot=0, slot_tail=0, n_new=10, new_tail=0)  # f_keep exactly 0.25 wins
@example(entries=[5], tails=[0], n_slot=0, slot_tail=0, n_new=0, new_tail=0)  # an empty prompt: NaN
def test_load_without_the_per_entry_table_makes_the_same_choice(entries, tails, n_slot, slot_tail, n_new, new_tail):
    """`per_entry` off (`slotlab simulate`) scores on arrays (`_best_entry`): the same winner and best
    ratios as the listed scan, on entries sharing any prefix with the prompt, an empty slot or
    prompt (NaN), floors and float32 ties; the score table is left empty, and silent loads (a
    preview, emit=False) still list it."""
    new = seq(range(n_new), [-3] * new_tail)
    slot = seq(range(n_slot), [-4] * slot_tail)
    made = []
    for c_ in (cache()[0], cache()[0]):
        for k, (n, t) in enumerate(zip(entries, tails + [0] * len(entries))):
            c_.alloc(seq(range(n), [-10 - k] * t), [], 1)
        made.append(c_)
    listed, fast = made
    fast.per_entry = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a, b = listed.load(slot, new), fast.load(slot, new)
    ia = None if a.entry is None else listed.entries.index(a.entry)
    ib = None if b.entry is None else fast.entries.index(b.entry)
    assert ia == ib
    same = lambda x, y: (np.isnan(x) and np.isnan(y)) or x == y  # noqa: E731
    assert same(a.f_keep_best, b.f_keep_best) and same(a.f_sim_best, b.f_sim_best)
    assert type(b.f_keep_best) is np.float32 and type(b.f_sim_best) is np.float32
    assert len(a.scores) == len(listed.entries) and b.scores == ()
    assert len(fast.load(slot, new, emit=False).scores) == len(fast.entries)


# -- restore / take --------------------------------------------------------------------------------


def _one_entry(size_tgt=8, size_dft=0):
    c, rec = cache()
    e = c.alloc(seq([1, 2, 3]), [Checkpoint(2, 0, 1, data_tgt=b"c" * 5)], size_tgt, size_dft)
    e.main[:] = 7
    return c, rec, e


def test_restore_success_removes_entry():
    c, rec, e = _one_entry(8, 4)
    got = []
    assert c.restore(e, lambda buf: got.append(bytes(buf)) or len(buf),
                     lambda buf: got.append(bytes(buf)) or len(buf))
    assert got == [b"\x07" * 8, b"\x00" * 4]
    assert c.entries == [] and len(e.main) == 0 and len(e.drft) == 0
    assert e.tokens.tolist() == [1, 2, 3] and len(e.checkpoints) == 1
    (ev,) = rec.of("cache_evict", reason="loaded")
    assert ev["entry"] is e


def test_restore_target_failure_leaves_entry_intact():
    c, rec, e = _one_entry(8)
    assert not c.restore(e, lambda buf: 0)
    assert c.entries == [e] and len(e.main) == 8
    (ev,) = rec.of("cache_restore_failed")
    assert ev["level"] == "ERR" and ev["message"] == "failed to restore state with size 8"


def test_restore_draft_failure_leaves_corrupted_entry_cached():
    c, rec, e = _one_entry(8, 4)
    assert not c.restore(e, lambda buf: len(buf), lambda buf: 1)
    assert c.entries == [e]
    assert len(e.main) == 0 and e.size() == 4 + 5  # drft + checkpoint still counted
    assert c.n_tokens() == 3
    (ev,) = rec.of("cache_restore_failed")
    assert ev["level"] == "WRN" and ev["message"] == "failed to restore state with size 4"


def test_restore_draft_without_draft_context_asserts():
    c, _, e = _one_entry(8, 4)
    with pytest.raises(AssertionError):
        c.restore(e, lambda buf: len(buf))


def test_take_removes_by_identity():
    c, _ = cache()
    e1 = c.alloc(seq([1]), [], 1)
    e2 = c.alloc(seq([2]), [], 1)
    assert c.take(e2) is e2 and c.entries == [e1]
    with pytest.raises(KeyError):
        c.take(e2)


# -- update ----------------------------------------------------------------------------------------


def test_update_byte_limit_fifo():
    c, rec = cache(limit_size=1000, limit_tokens=10**6)
    for i in range(4):
        c.alloc(seq([i]), [], 300)  # make-room keeps it at 900
    assert toks(c.entries) == [[1], [2], [3]]
    c.limit_size = 500
    c.update()
    assert toks(c.entries) == [[3]]
    ev = rec.of("cache_evict", reason="byte_limit")
    assert len(ev) == 2 and ev[0]["message"] == (
        " - cache size limit reached, removing oldest entry (size = 0.000 MiB)")
    st_ = rec.of("cache_state")[-1]
    assert st_["message"] == " - cache state: 1 prompts, 0.000 MiB (limits: 0.000 MiB, 1000000 tokens, 1000000 est)"
    (line,) = rec.of("cache_state_entry")[-1:]
    assert line["message"].endswith(":       1 tokens, checkpoints:  0,     0.000 MiB")


def test_update_without_byte_limit_hard_caps_tokens():
    c, _ = cache(limit_size=0, limit_tokens=10)
    c.alloc(seq(range(0, 4)), [], 10**6)
    c.alloc(seq(range(10, 14)), [], 10**6)
    c.alloc(seq(range(20, 24)), [], 10**6)
    assert c.update() == 10
    assert toks(c.entries) == [list(range(10, 14)), list(range(20, 24))]


def test_update_byte_budget_raises_token_cap():
    c, _ = cache(limit_size=10_000, limit_tokens=10)
    for i in range(5):
        c.alloc(seq(range(100 * i, 100 * i + 100)), [], 200)  # 2 bytes per token
    # est = 10000 / 2 = 5000 tokens >= 500 cached, far above n_ctx = 10
    assert c.update() == 5000 and len(c) == 5
    assert c.limit_tokens_cur == 5000


def test_update_size_per_token_floor_is_one():
    c, _ = cache(limit_size=50, limit_tokens=1)
    c.alloc(seq(range(40)), [], 4)  # 0.1 bytes per token -> floored to 1
    assert c.size_per_token() == np.float32(1.0)
    assert c.update() == 50 and len(c) == 1


def test_update_float32_evicts_where_float64_would_not():
    # 7 tokens in 8 bytes under an 8-byte limit: exactly 7 tokens fit, but in float32
    # 8 / (8/7) = 6.9999995 -> 6, so the oldest entry goes.
    c, rec = cache(limit_size=8, limit_tokens=1)
    c.alloc(seq([1, 2, 3]), [], 4)
    c.alloc(seq([4, 5, 6, 7]), [], 4)
    assert int(8 / (8 / 7)) == 7  # the float64 answer
    assert c.update() == 6
    assert toks(c.entries) == [[4, 5, 6, 7]]
    (ev,) = rec.of("cache_evict", reason="token_limit")
    assert ev["message"] == (
        " - cache token limit (1, est: 6) reached, removing oldest entry (size = 0.000 MiB)")


def test_update_float32_keeps_where_float64_would_evict():
    # 11 tokens in 25 bytes under a 25-byte limit: float64 gives 10.999999999999998 -> 10 (evict),
    # float32 gives exactly 11 -> keep.
    c, _ = cache(limit_size=25, limit_tokens=1)
    c.alloc(seq(range(5)), [], 12)
    c.alloc(seq(range(10, 16)), [], 13)
    assert int(25 / (25 / 11)) == 10
    assert c.update() == 11
    assert len(c) == 2


# -- properties (spec Appendix C) ------------------------------------------------------------------

token_lists = st.lists(st.integers(0, 2), max_size=10)

op = st.one_of(
    st.tuples(st.just("alloc"), token_lists, st.integers(0, 60), st.integers(0, 10),
              st.lists(st.integers(0, 20), max_size=2), st.booleans()),
    st.tuples(st.just("update")),
    st.tuples(st.just("load"), token_lists, token_lists),
    st.tuples(st.just("restore"), st.integers(0, 9), st.sampled_from(["ok", "tgt_fails", "dft_fails"])),
)


def _sizes_from_buffers(c):
    """The cache's totals recomputed from every entry's buffers as they are now (what the server's
    size() sums), against which its running totals are checked."""
    return (sum(len(e.main) + len(e.drft) + sum(len(k.data_tgt) for k in e.checkpoints) for e in c.entries),
            sum(len(e.tokens) for e in c.entries))


def _no_prefix_pairs(entries):
    for i, x in enumerate(entries):
        for j, y in enumerate(entries):
            if i != j and is_prefix(x.tokens, y.tokens):
                return False
    return True


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(limit_size=st.sampled_from([0, 1, 40, 100, 250]), limit_tokens=st.integers(1, 12),
       ops=st.lists(op, max_size=30))
def test_invariants_hold_after_any_sequence(limit_size, limit_tokens, ops):
    fail = {"now": False}

    def allocate(n):
        if fail["now"]:
            raise MemoryError()
        return np.zeros(n, np.uint8)

    c = PromptCache(limit_size, limit_tokens, allocate=allocate)
    for o in ops:
        if o[0] == "alloc":
            _, t, s_tgt, s_dft, ck_sizes, fails = o
            fail["now"] = fails and s_tgt % 3 == 0
            limit_before = c.limit_size
            cks = [Checkpoint(0, 0, 0, data_tgt=b"k" * n) for n in ck_sizes]
            e = c.alloc(np.array(t, np.int32), cks, s_tgt, s_dft)
            if e is not None:
                assert c.entries[-1] is e and e.size() == s_tgt + s_dft + sum(ck_sizes)
                if c.limit_size > 0:
                    assert c.size() <= c.limit_size  # alloc never breaches the byte limit
            if fail["now"] and e is None and c.limit_size != limit_before:
                assert c.size() <= c.limit_size
        elif o[0] == "update":
            cur = c.update()
            if c.limit_size > 0:
                assert c.size() <= c.limit_size
            assert c.n_tokens() <= cur and cur >= c.limit_tokens
        elif o[0] == "restore":
            _, i, how = o
            if c.entries:
                e = c.entries[i % len(c.entries)]
                fails = (how == "tgt_fails" and len(e.main) > 0) or (how == "dft_fails" and len(e.drft) > 0)
                ok = c.restore(e, (lambda buf: 0) if how == "tgt_fails" else len,
                               (lambda buf: 0) if how == "dft_fails" else len)
                assert ok == (not fails)
        else:
            _, slot, new = o
            r = c.load(np.array(slot, np.int32), np.array(new, np.int32))
            if r.entry is not None:
                w = [s for s in r.scores if s.winner]
                assert len(w) == 1 and w[0].entry is r.entry and w[0].f_keep >= np.float32(0.25)
                assert r.f_keep_base < w[0].f_keep and r.f_sim_base < w[0].f_sim
                c.take(r.entry)
            imp = [s for s in r.scores if s.improved]
            for p, q in zip(imp, imp[1:]):
                assert p.f_keep < q.f_keep and p.f_sim < q.f_sim
        assert _no_prefix_pairs(c.entries)
        assert len({e.id for e in c.entries}) == len(c.entries)
        assert (c.size(), c.n_tokens()) == _sizes_from_buffers(c)  # the running totals


_scan_ops = st.lists(st.tuples(st.sampled_from(["alloc", "alloc", "load"]), st.lists(st.integers(0, 3), max_size=12),
                               st.lists(st.integers(0, 3), max_size=12)), max_size=40)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_scan_ops, limit=st.sampled_from([0, 40, 120]))
def test_scoring_on_arrays_and_on_lists_decides_alike(ops, limit):
    """`_scan` hands the entries' lcps as numpy arrays from `_ARRAYS` entries on and as lists below:
    the same saves (duplicates, obsolete prefixes, make-room evictions, in order) and the same loads
    (winner, float32 ratios) either way, and the same as the listed scan's one comparison per
    entry, on caches whose entries share prefixes of every length."""
    import slotlab.engine.prompt_cache as pcm

    caches = [PromptCache(limit, 0, record=True) for _ in range(3)]
    caches[1].per_entry = caches[2].per_entry = False
    thresholds = (pcm._ARRAYS, 0, 10**9)  # the listed reference, arrays always, lists always
    old = pcm._ARRAYS
    try:
        for kind, a, b in ops:
            outs = []
            for c, thr in zip(caches, thresholds):
                pcm._ARRAYS = thr
                if kind == "alloc":
                    e = c.alloc(np.array(a, np.int32), [], len(a) + 1)
                    recs = [(r.kind, r.fields.get("reason"), r.fields.get("entry_id")) for r in c.take_events()]
                    outs.append((e is None, recs, [e_.tokens.tolist() for e_ in c.entries]))
                else:
                    r = c.load(np.array(b, np.int32), np.array(a, np.int32))
                    c.take_events()
                    same = lambda x: "nan" if np.isnan(x) else float(x)  # noqa: E731
                    outs.append((None if r.entry is None else c.entries.index(r.entry), same(r.f_keep_best),
                                 same(r.f_sim_best)))
            assert outs[0] == outs[1] == outs[2]
    finally:
        pcm._ARRAYS = old
