"""The panel's static picture (slotlab.panel.static) draws the live panel's figure: the same arrays
(slotlab.panel.figure) for the same engine state, on the real model in step mode; the PNG is
deterministic and small."""

import re

import pytest

from slotlab.engine.scheduler import Engine
from slotlab.figures import png
from slotlab.panel import Panel, PanelState
from slotlab.panel.figure import COLORS, PROV_LABELS, figure_data, legend_entries
from slotlab.panel.state import PROVENANCE
from slotlab.panel.static import panel_figure, panel_image, panel_png, panel_state

P = ("You are a helpful geography tutor. Answer in two sentences. "
     "Question: which rivers flow through Vienna, Budapest and Belgrade?")


@pytest.fixture(scope="module")
def run(model):
    e = Engine("-np 2 -c 2048", model=model)
    p = Panel(e)
    for q in (P, P + " Also, where does the Danube end?"):
        t = e.submit(q, n_predict=8)
        while e.step():
            p.refresh()
        p.refresh()
        assert t.done
    yield e, p
    p.close()
    e.close()


def _trace(tr, *names):
    return tuple(list(getattr(tr, n) or ()) for n in names)


def test_the_static_data_are_the_live_traces(run):
    e, p = run
    d = panel_figure(e).slotlab_data
    assert d == figure_data(p.state) == figure_data(PanelState.from_bus(e.events))
    assert list(p.fig.layout.xaxis.range) == d.x_range
    for j, kind in enumerate(PROVENANCE):
        b = d.prov[kind]
        assert p.fig.data[j].name == PROV_LABELS[kind] and p.fig.data[j].showlegend == bool(b.x)
        assert _trace(p.fig.data[j], "x", "y", "base", "hovertext") == (b.x, b.y, b.base, b.hovertext)
    k = len(PROVENANCE)
    assert _trace(p.fig.data[k], "x", "y", "hovertext") == (d.divergence.x, d.divergence.y, d.divergence.hovertext)
    assert _trace(p.fig.data[k + 1], "x", "y", "base") == (d.window.x, d.window.y, d.window.base)
    c = d.checkpoints
    assert _trace(p.fig.data[k + 2], "x", "y", "base", "hovertext") == (c.x, c.y, c.base, c.hovertext)
    assert _trace(p.fig.data[k + 3], "x", "y") == (d.n_past.x, d.n_past.y)
    m = d.checkpoint_events
    tr = p.fig.data[k + 4]
    assert _trace(tr, "x", "y", "hovertext") == (m.x, m.y, m.hovertext)
    assert (list(tr.marker.symbol), list(tr.marker.color)) == (m.symbol, m.color)
    tr = p.fig.data[k + 5]
    assert _trace(tr, "x", "y", "hovertext") == (d.evictions.x, d.evictions.y, d.evictions.hovertext)
    assert list(tr.marker.color or ()) == d.evictions.color
    # the scenario drew something in each part: spans, a divergence, checkpoints, the window, n_past, marks
    assert d.prov["prefill"].x and d.prov["generated"].x and d.divergence.x
    assert c.x and d.window.x and d.n_past.x and "created" in str(m.hovertext)


def test_the_picture_draws_those_arrays(run):
    e, p = run
    fig = panel_figure(p)
    d = fig.slotlab_data
    ax1, ax2, ax3, axt = fig.axes
    pos = {s: j for j, s in enumerate(d.slots)}
    for ax in (ax1, ax2):
        assert [t.get_text() for t in ax.get_yticklabels()] == d.slots == ["slot 0", "slot 1"]
        assert list(ax.get_xlim()) == d.x_range
    drawn = {c.get_label(): [(r.get_x(), r.get_width(), round(r.get_y() + r.get_height() / 2, 9)) for r in c.patches]
             for c in ax1.containers}
    for kind in PROVENANCE:
        b = d.prov[kind]
        assert drawn.get(kind, []) == [(a, w, pos[y]) for a, w, y in zip(b.base, b.x, b.y)]
        if b.x:
            assert ax1.containers[[c.get_label() for c in ax1.containers].index(kind)].patches[0].get_facecolor() \
                == pytest.approx(tuple(int(COLORS[kind][i:i + 2], 16) / 255 for i in (1, 3, 5)) + (1.0,))
    drawn = {c.get_label(): [(r.get_x(), r.get_width(), round(r.get_y() + r.get_height() / 2, 9)) for r in c.patches]
             for c in ax2.containers}
    assert drawn["checkpoint"] == [(a, w, pos[y]) for a, w, y in zip(d.checkpoints.base, d.checkpoints.x, d.checkpoints.y)]
    assert drawn["SWA window"] == [(a, w, pos[y]) for a, w, y in zip(d.window.base, d.window.x, d.window.y)]
    text = axt.texts[0].get_text()
    for x in e.cache.entries:  # the RAM-cache strip: every entry, in FIFO order
        assert f"#{x.id} {x.n_tokens()} tok" in text
    assert [int(i) for i in re.findall(r"#(\d+) \d+ tok", text)] == [x.id for x in e.cache.entries]
    assert f"{e.cache.n_tokens()} / " in text


def test_png_is_deterministic_small_and_the_same_from_any_source(run):
    e, p = run
    a = panel_png(e)
    assert a[:8] == b"\x89PNG\r\n\x1a\n" and len(a) < png.MAX_BYTES
    assert panel_png(e) == a == panel_png(e.events) == panel_png(p) == panel_png(PanelState.from_bus(e.events))
    img = panel_image(e)
    assert img.data == a and img.format == "png"
    assert panel_state(p) is p.state
    with pytest.raises(TypeError):
        panel_state(object())


def test_the_legend_names_only_what_is_drawn_once_each(run):
    e, p = run
    fig = panel_figure(e)
    d = fig.slotlab_data
    one, two = legend_entries(d)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    entries = [lab for lab in labels if lab.strip() and not lab.startswith("plot ")]
    assert entries == [lab for _, lab in one + two] and len(set(entries)) == len(entries)
    assert [k for k, _ in one] == [k for k in PROVENANCE if d.prov[k].x] + (["divergence"] if d.divergence.x else [])
    assert not d.prov["file"].x and PROV_LABELS["file"] not in labels   # no slot file in this run: no entry
    assert "checkpoint created" in entries and "checkpoint [pos_min, pos_max]" in entries


def test_evictions_are_drawn_per_request(model):
    """Plot 3's x axis is each eviction's time (not an internal event number): on a unified pool the
    idle-slot loop clears the previous request's slot when the next one launches."""
    e = Engine("-np 2 -kvu -c 2048", model=model)
    try:
        for q in (P, "Translate to German: the weather is lovely today.", P + " And the Sava?"):
            t = e.submit(q, n_predict=4)
            e.run_until(lambda: t.done)
        st = PanelState.from_bus(e.events)
        d = figure_data(st)
        evicted = [(round(ev.t, 3), ev.payload.reason) for ev in e.events.log if ev.kind == "cache_evict" or
                   ev.kind == "slot_clear" and ev.payload.reason in ("idle_clear", "purge") and ev.payload.n_tokens > 0]
        assert evicted and sorted(zip(d.evictions.x, d.evictions.y)) == sorted(set(evicted))   # at each one's time
        assert sum(d.evictions.symbol) == len(evicted) and "idle_clear" in d.evictions.y
        ax3 = panel_figure(st).axes[2]
        assert ax3.get_xlabel() == "seconds since the server started"
    finally:
        e.close()
