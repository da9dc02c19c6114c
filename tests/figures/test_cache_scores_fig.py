"""slotlab.figures.cache_scores and .cache_fifo: the pictures draw PromptCache's own results (scores,
entries, events), no model needed, and render as small deterministic PNGs."""

from __future__ import annotations

import numpy as np

from slotlab.engine.event_types import CACHE_LOAD_SCORES
from slotlab.engine.prompt_cache import PromptCache
from slotlab.figures import cache_fifo, cache_scores, png

PER_TOKEN = 16 * 1024


def toks(*r):
    return np.concatenate([np.arange(a, b, dtype=np.int32) for a, b in r])


def entry(lcp, n, tail):
    return toks((0, lcp), (tail, tail + n - lcp))


FIFO = [entry(60, 300, 10_000), entry(30, 40, 20_000), entry(50, 200, 30_000), entry(70, 80, 40_000),
        entry(90, 150, 50_000)]


def scan(order, on_event=None):
    c = PromptCache(0, 4096)
    for t in order:
        c.alloc(t, [], PER_TOKEN * len(t))
    c.on_event = on_event
    return c.load(np.empty(0, np.int32), toks((0, 100)))


def test_scan_order_changes_the_winner_and_both_panels_render():
    fwd, rev = scan(FIFO), scan(FIFO[::-1])
    assert [s.below_floor for s in fwd.scores] == [True, False, False, False, False]
    assert fwd.entry.n_tokens() == 80 and rev.entry.n_tokens() == 150
    fig = cache_scores.figure(fwd, rev, titles=["oldest first", "newest first"])
    assert len(fig.axes) == 2
    data = png.to_png(fig)
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) < png.MAX_BYTES
    assert data == png.to_png(cache_scores.figure(fwd, rev, titles=["oldest first", "newest first"]))


def test_the_event_an_engine_records_gives_the_same_scores():
    seen = []
    res = scan(FIFO, on_event=lambda kind, **f: seen.append((kind, f)))
    data = [f for k, f in seen if k == CACHE_LOAD_SCORES][0]["result"]
    assert cache_scores.load_result(data) is data  # a LoadResult passes through
    # the event bus stores plain fields: rebuild them as the engine's events carry them
    ev = {"lcp_base": res.lcp_base, "f_keep_base": float(res.f_keep_base), "f_sim_base": float(res.f_sim_base),
          "scores": [{"entry_id": s.entry.id, "n_tokens": s.n_tokens, "lcp": s.lcp, "f_keep": float(s.f_keep),
                      "f_sim": float(s.f_sim), "below_floor": s.below_floor, "improved": s.improved,
                      "winner": s.winner} for s in res.scores]}
    back = cache_scores.load_result(ev)
    assert [(s.f_keep, s.f_sim, s.winner) for s in back.scores] == [(s.f_keep, s.f_sim, s.winner) for s in res.scores]
    assert back.scores[3].f_keep.dtype == np.float32 and (back.f_keep_best, back.f_sim_best) == (res.f_keep_best,
                                                                                              res.f_sim_best)
    assert len(png.to_png(cache_scores.figure(back))) < png.MAX_BYTES


def test_fifo_recorder_sees_each_rule():
    cache = PromptCache(4 * 1024 * 1024, 4096)
    rec = cache_fifo.Recorder(cache)
    save = lambda t: cache.alloc(t, [], PER_TOKEN * len(t))  # noqa: E731
    a = save(toks((0, 100))); rec.snap("a")
    save(toks((0, 50))); rec.snap("b")
    save(toks((500, 800))); rec.snap("c")
    d = save(toks((0, 160))); rec.snap("d")
    e = save(toks((900, 980))); rec.snap("e")
    f = save(toks((2000, 2100))); rec.snap("f")
    names = {x.id: n for n, x in zip("adef", (a, d, e, f))}
    name = lambda i: names[i]  # noqa: E731
    said = [cache_fifo.outcome(s, name) for s in rec.steps]
    assert said[1] == "not cached: a prefix of a"
    assert said[2] == "not cached: 4.69 MiB > the 4.00 MiB limit"
    assert said[3] == "a removed: a prefix of the new prompt; d appended"
    assert said[5] == "d evicted (oldest) to make room; f appended"
    assert [[x[1] for x in s.entries] for s in rec.steps] == [[100], [100], [100], [160], [160, 80], [80, 100]]
    assert len(png.to_png(cache_fifo.figure(rec.steps, names=names))) < png.MAX_BYTES
