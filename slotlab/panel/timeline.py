"""The panel's conversations tab: the conversation timeline (slotlab.timeline) as a plotly view.

Per conversation, each chat call is a horizontal bar: its `cache_n` reused, then its `prompt_n` by
cause — the client's change (hatched, its kind's colour), the server mechanism that lost a prefix it
held (the miss colour), new tokens — and a ▼ where the client's change made the prompt diverge. The
arrays come from `timeline_data` (pure, from the `Timeline` fold the panel's state keeps: the same fold
`slotlab report --png` draws), so what the panel shows is what the static picture shows. A call is
drawn once it is done; calls reach the panel as `client_call` events (a replayed session log, or
`slotlab.timeline.Conversations` sending chat calls to the panel's engine)."""

from __future__ import annotations

from dataclasses import dataclass, field

from slotlab.conversation import KINDS as CLIENT_KINDS
from slotlab.explain import CAUSES
from slotlab.palette import CLIENT_COLORS, MISS_COLORS, NEW, REUSED
from slotlab.timeline import NEW as NEW_CAUSE

#: every part a bar can have, in drawing (and legend) order: one plotly trace each
PARTS = ("reused", *(f"server:{c}" for c in CAUSES), *(f"client:{k}" for k in CLIENT_KINDS), NEW_CAUSE)


def part_color(part: str) -> str:
    side, _, kind = part.partition(":")
    if side == "client":
        return CLIENT_COLORS.get(kind, CLIENT_COLORS["other"])
    if side == "server":
        return MISS_COLORS.get(kind, MISS_COLORS["other"])
    return REUSED if part == "reused" else NEW


def part_label(part: str) -> str:
    side, _, kind = part.partition(":")
    return {"client": f"client: {kind}", "server": f"server: {kind}"}.get(
        side, "reused (cache_n)" if part == "reused" else "new tokens (nothing held them)")


@dataclass
class TimelineData:
    """The arrays of the view: per part, bars (x = tokens, base = where they start, y = the call's row);
    `rows` the rows top to bottom; `marks` the divergences of client changes."""

    parts: dict = field(default_factory=dict)  # part -> {"x", "y", "base", "hovertext"}
    rows: list = field(default_factory=list)
    marks: dict = field(default_factory=lambda: {"x": [], "y": [], "color": [], "hovertext": []})
    stable: dict = field(default_factory=lambda: {"x": [], "y": [], "hovertext": []})  # ◆ a stable client's reuse
    n_other: int = 0


def row_name(b) -> str:
    return f"{b.session} · #{b.request}"


def timeline_data(tl, stable=None) -> TimelineData:
    """The arrays for `tl` (a slotlab.timeline.Timeline); `stable` (slotlab.why.stable.Pricing, its
    calls numbered as the timeline's requests) adds a ◆ per call where a stable client's reuse ends."""
    d = TimelineData(parts={p: {"x": [], "y": [], "base": [], "hovertext": []} for p in PARTS}, n_other=tl.n_other)
    cost = {c.request: c for c in stable.calls} if stable is not None else {}
    for s, bars in tl.conversations().items():
        for b in bars:
            y = row_name(b)
            d.rows.append(y)
            cc = cost.get(b.request)
            if cc is not None:
                d.stable["x"].append(cc.stable_reused)
                d.stable["y"].append(y)
                d.stable["hovertext"].append(
                    f"#{b.request}: a stable client would have reused {cc.stable_reused} and processed "
                    f"{cc.stable_processed} (as sent: {cc.reused} / {cc.processed})"
                    + (f"; the {cc.change} cost {cc.client}" if cc.change and not cc.why else "")
                    + (f"; {cc.server} still lost to the server ({cc.server_cause})" if cc.server else ""))
            segs = [("reused", b.cache_n)] + list(b.parts)
            left = 0
            for part, n in segs:
                if n <= 0:
                    continue
                t = d.parts.setdefault(part, {"x": [], "y": [], "base": [], "hovertext": []})
                t["x"].append(n)
                t["y"].append(y)
                t["base"].append(left)
                t["hovertext"].append(f"{s} #{b.request}: {part_label(part)}, {n} tokens [{left}, {left + n})"
                                      + (f" — {b.label()}" if b.label() else ""))
                left += n
            c = b.call
            if c is not None and c.change:
                d.marks["x"].append(min(c.position if c.position >= 0 else b.cache_n, b.cache_n + b.prompt_n))
                d.marks["y"].append(y)
                d.marks["color"].append(part_color(f"client:{c.change}"))
                d.marks["hovertext"].append(f"#{b.request} {c.change} at message {c.message_index} ({c.role}): "
                                            f"{c.before!r} -> {c.after!r}; {c.tokens_lost} tokens processed again")
    return d


class TimelineView:
    """The conversations tab: a plotly FigureWidget (one bar trace per part) and a note line."""

    def __init__(self):
        import ipywidgets as w
        import plotly.graph_objects as go

        self.fig = go.FigureWidget()
        for p in PARTS:
            pattern = (dict(shape="/", fillmode="overlay", fgcolor="white", solidity=0.3) if p.startswith("client:")
                       else None)
            self.fig.add_bar(name=part_label(p), orientation="h", x=[], y=[], base=[], hovertext=[], hoverinfo="text",
                             marker=dict(color=part_color(p), pattern=pattern,
                                         line=dict(width=0.6 if p.startswith("server:") else 0, color="#333")),
                             showlegend=False)
        self.fig.add_scatter(name="▼ the client's change: where the prompt diverged", mode="markers", x=[], y=[],
                             hovertext=[], hoverinfo="text", marker=dict(symbol="triangle-down", size=10, color=[],
                                                                         line=dict(width=0.5, color="black")),
                             showlegend=False)
        self.fig.add_scatter(name="◆ a stable client's reuse (Panel.show_stable)", mode="markers", x=[], y=[],
                             hovertext=[], hoverinfo="text", marker=dict(symbol="diamond", size=9, color="white",
                                                                         line=dict(width=1.2, color="black")),
                             showlegend=False)
        self.fig.update_layout(barmode="overlay", height=200, width=1000, bargap=0.3,
                               margin=dict(l=150, r=40, t=30, b=40), legend=dict(orientation="v", x=1.02, y=1.0),
                               title=dict(text="conversations: each call's reused and processed tokens, by cause",
                                          font=dict(size=13)),
                               xaxis=dict(title=dict(text="prompt tokens: reused (cache_n), then processed "
                                                          "(prompt_n) by cause", font=dict(size=11))))
        self.note = w.HTML()
        self.advice = w.HTML()
        self.stable = None  # slotlab.why.session.SessionWhy, once show_stable drew one
        self.box = w.VBox([self.fig, self.note, self.advice])

    def show_stable(self, sw, tl) -> None:
        """Draw `sw` (Conversations.analysis): a ◆ per call, and the session's price and the advice
        that worked below the picture."""
        import html

        self.stable = sw
        lines = (sw.pricing.lines() if sw.pricing is not None else []) + sw.advice.lines()
        self.advice.value = "<pre style='font-size:11px'>" + html.escape("\n".join(lines)) + "</pre>"
        self.render(tl)

    def render(self, tl) -> TimelineData:
        d = timeline_data(tl, self.stable.pricing if self.stable is not None else None)
        with self.fig.batch_update():
            for j, p in enumerate(PARTS):
                t, tr = d.parts[p], self.fig.data[j]
                tr.x, tr.y, tr.base, tr.hovertext = t["x"], t["y"], t["base"], t["hovertext"]
                tr.showlegend = bool(t["x"])
            m = self.fig.data[len(PARTS)]
            m.x, m.y, m.hovertext = d.marks["x"], d.marks["y"], d.marks["hovertext"]
            m.marker.color = d.marks["color"]
            m.showlegend = bool(d.marks["x"])
            st = self.fig.data[len(PARTS) + 1]
            st.x, st.y, st.hovertext = d.stable["x"], d.stable["y"], d.stable["hovertext"]
            st.showlegend = bool(d.stable["x"])
            self.fig.layout.yaxis.categoryorder = "array"
            self.fig.layout.yaxis.categoryarray = d.rows[::-1]
            self.fig.layout.height = 160 + 22 * max(1, len(d.rows))
        note = ("" if d.rows else "<i>no chat call yet: calls reach this tab as <code>client_call</code> events "
                "(<code>slotlab.timeline.Conversations(engine).chat(messages)</code>, or a replayed session log)</i>")
        if d.n_other:
            note += f" <small>{d.n_other} request(s) without chat messages are not drawn.</small>"
        if self.note.value != note:
            self.note.value = note
        return d
