"""The live panel: one ipywidgets box over a `PanelState` fed by the engine's events.

The engine never touches a widget: its events land in a deque (any thread), and a pump on the
kernel's asyncio loop drains it at most 10 times a second, folds the events into the state and
applies one batched update (`fig.batch_update()` + `hold_sync()`), replacing whole trace arrays.
One FigureWidget holds the token timelines, the checkpoint chain and the eviction plot, whose arrays
come from `slotlab.panel.figure.figure_data` (pure; `static.panel_figure` draws the same arrays as a
picture for committed notebooks); tables,
gauges and the event log are HTML. The time slider rebuilds the state from the event bus
(`PanelState.from_bus`): a panel opened late on a long run, after the bus trimmed its log, still
shows every slot and cache entry, but the slider only reaches the events the log still holds.

Errors are shown, never swallowed: an event subscriber that raised (counted by the bus) and a panel
update that raised (logged to `slotlab.panel` with its traceback; the panel goes on with the next
event) both appear in the status line next to the controls."""

from __future__ import annotations

import asyncio
import collections
import functools
import html
import logging
import threading

import ipywidgets as w
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from slotlab import explain
from slotlab.llama.build import LLAMA_CPP_BUILD
from slotlab.panel import figure
from slotlab.panel.figure import CHECKPOINT_COLOR, COLORS, DIVERGENCE_COLOR, N_PAST_COLOR, TITLES
from slotlab.panel.state import EVICTION_REASONS, PROVENANCE, PanelState
from slotlab.panel.timeline import TimelineView
from slotlab.units import MIB

log = logging.getLogger("slotlab.panel")


def _esc(x) -> str:
    return html.escape(str(x))


class Panel(w.VBox):
    """`Panel(engine)`: display it in a cell. `refresh()` applies pending events now (tests, step mode)."""

    def __init__(self, engine, *, max_rows: int = 200, fps: float = 10.0):
        self.engine = engine
        self.max_rows = max_rows
        self.period = 1.0 / fps
        self.pending: collections.deque = collections.deque()
        self.live = True
        self.n_errors = 0  # panel updates that raised (see `last_error` and the status line)
        self.last_error: str | None = None
        self._control_msg = ""
        self._lock = threading.Lock()
        # subscribe first, then rebuild: an event emitted in between is in both and applied once (by seq)
        self._unsubscribe = engine.events.subscribe(self.pending.append)
        # the event log shows each miss's cause as a request_miss event: the explainer is a view the
        # engine does not attach itself (attach is idempotent: one per bus)
        explain.attach(engine.events)
        self.state = PanelState.from_bus(engine.events)
        self._build()
        self._task = None
        self._render_safely()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not None:
            self._task = loop.create_task(self._pump())

    # ------------------------------------------------------------------ layout

    def _build(self) -> None:
        n = max(self.state.n_slots, 1)
        fig = make_subplots(rows=3, cols=1, vertical_spacing=0.09, row_heights=[0.45, 0.35, 0.2],
                            subplot_titles=TITLES)
        self.fig = go.FigureWidget(fig)
        for kind in PROVENANCE:  # legends name only what is drawn (`showlegend` follows the data in render)
            self.fig.add_bar(name=figure.PROV_LABELS[kind], orientation="h", marker_color=COLORS[kind], x=[], y=[],
                             base=[], hovertext=[], hoverinfo="text", row=1, col=1, legendgroup="prov",
                             showlegend=False)
        self.fig.add_scatter(name=figure.CHAIN_LABELS["divergence"], mode="markers", marker_symbol="line-ns-open",
                             marker_size=22, showlegend=False,
                             marker_color=DIVERGENCE_COLOR, x=[], y=[], hovertext=[], hoverinfo="text", row=1, col=1)
        self.fig.add_bar(name=figure.CHAIN_LABELS["window"], orientation="h", marker_color=figure.window_rgba_css(),
                         x=[], y=[], base=[], hoverinfo="skip", row=2, col=1, showlegend=False)
        self.fig.add_bar(name=figure.CHAIN_LABELS["checkpoint"], orientation="h", marker_color=CHECKPOINT_COLOR, x=[],
                         y=[], base=[], hovertext=[], hoverinfo="text", row=2, col=1, width=0.35, showlegend=False)
        self.fig.add_scatter(name=figure.CHAIN_LABELS["n_past"], mode="markers", marker_symbol="line-ns-open",
                             marker_size=18, marker_color=N_PAST_COLOR, x=[], y=[], row=2, col=1, showlegend=False)
        self.fig.add_scatter(name="checkpoint events (hover: which)", mode="markers", x=[], y=[], hovertext=[],
                             hoverinfo="text", marker=dict(size=11, symbol=[], color=[]), row=2, col=1,
                             showlegend=False)
        self.fig.add_scatter(name="eviction", mode="markers", x=[], y=[], hovertext=[], hoverinfo="text",
                             marker_color=[], row=3, col=1, showlegend=False)
        # the legend sits right of the plots, in the margin: 270 px hold its longest label ("loaded from a
        # RAM-cache entry", "SWA window (last n_swa positions)") at plotly's 12 px font, where 150 cut them
        self.fig.update_layout(barmode="overlay", height=300 + 80 * n, width=1120, margin=dict(l=70, r=270, t=40, b=30),
                               legend=dict(orientation="v", x=1.02, y=1.0), bargap=0.3)
        self.fig.update_xaxes(matches="x", row=2, col=1)
        for row in (1, 2):
            self.fig.update_yaxes(categoryorder="array", categoryarray=[f"slot {i}" for i in range(n)][::-1], row=row, col=1)
        self.fig.update_yaxes(categoryorder="array", categoryarray=list(EVICTION_REASONS), row=3, col=1)
        self.fig.update_xaxes(title_text=figure.EVICTION_XLABEL, title_font_size=11, row=3, col=1)

        self.header = w.HTML()
        self.slot_table = w.HTML()
        self.why_box = w.HTML()
        self.cache_box = w.HTML()
        self.gauges = w.HTML()
        self.events_box = w.HTML()
        self.f_kind = w.Dropdown(description="kind", options=["(all)"], value="(all)", layout=w.Layout(width="260px"))
        self.f_slot = w.Dropdown(description="slot", options=["(all)"] + [str(i) for i in range(n)], value="(all)",
                                 layout=w.Layout(width="160px"))
        self.f_reason = w.Dropdown(description="reason", options=["(all)"] + list(EVICTION_REASONS), value="(all)",
                                   layout=w.Layout(width="220px"))
        self.f_text = w.Checkbox(description="with log text only", value=True)
        for c in (self.f_kind, self.f_slot, self.f_reason, self.f_text):
            c.observe(lambda _: self._render_events(), "value")
        # controls
        self.b_run = w.Button(description="run (live)", icon="play")
        self.b_pause = w.Button(description="pause", icon="pause")
        self.b_step = w.Button(description="step", icon="step-forward")
        self.b_idle = w.Button(description="run until idle", icon="fast-forward")
        self.prompt = w.Textarea(placeholder="prompt text", layout=w.Layout(width="420px", height="60px"))
        self.n_predict = w.BoundedIntText(value=16, min=-1, max=100000, description="n_predict", layout=w.Layout(width="170px"))
        self.id_slot = w.IntText(value=-1, description="id_slot", layout=w.Layout(width="150px"))
        self.b_send = w.Button(description="send", icon="paper-plane", button_style="primary")
        self.a_slot = w.IntText(value=0, description="slot", layout=w.Layout(width="130px"))
        self.a_file = w.Text(value="slot.bin", description="file", layout=w.Layout(width="220px"))
        self.b_save, self.b_restore, self.b_erase = (w.Button(description=x) for x in ("save", "restore", "erase"))
        self.b_clear = w.Button(description="clear RAM cache", icon="trash")
        self.status = w.HTML()
        last = max(self.state.last_seq, 0)
        self.slider = w.IntSlider(description="event #", min=min(self._slider_min(), last), max=last, value=last,
                                  continuous_update=False, layout=w.Layout(width="70%"))
        self.trim_note = w.HTML()
        self.follow = w.Checkbox(description="follow live", value=True)
        self.b_run.on_click(lambda _: self._do(self.engine.start) or self._do(self.engine.resume))
        self.b_pause.on_click(lambda _: self._do(self.engine.pause))
        self.b_step.on_click(lambda _: self._do(self.engine.step))
        self.b_idle.on_click(lambda _: self._do(self.engine.run_until_idle))
        self.b_send.on_click(lambda _: self._do(lambda: self.engine.submit(self.prompt.value, n_predict=self.n_predict.value,
                                                                            id_slot=self.id_slot.value)))
        self.b_save.on_click(lambda _: self._do(lambda: self.engine.slot_action("save", self.a_slot.value, self.a_file.value)))
        self.b_restore.on_click(lambda _: self._do(lambda: self.engine.slot_action("restore", self.a_slot.value, self.a_file.value)))
        self.b_erase.on_click(lambda _: self._do(lambda: self.engine.slot_action("erase", self.a_slot.value)))
        self.b_clear.on_click(lambda _: self._do(self.engine.clear_cache))
        self.slider.observe(self._on_scrub, "value")
        self.follow.observe(self._on_follow, "value")
        controls = w.VBox([
            w.HBox([self.b_run, self.b_pause, self.b_step, self.b_idle, self.status]),
            w.HBox([self.prompt, w.VBox([self.n_predict, self.id_slot, self.b_send])]),
            w.HBox([self.a_slot, self.a_file, self.b_save, self.b_restore, self.b_erase, self.b_clear]),
            w.HBox([self.slider, self.follow]),
            self.trim_note,
        ])
        self.timeline = TimelineView()  # the conversations tab (slotlab.panel.timeline)
        tabs = w.Tab(children=[
            w.VBox([self.gauges, self.cache_box]),
            w.VBox([w.HBox([self.f_kind, self.f_slot, self.f_reason, self.f_text]), self.events_box]),
            self.why_box,
            self.slot_table,
            self.timeline.box,
        ])
        for i, t in enumerate(("RAM prompt cache", "events", "why", "slots", "conversations")):
            tabs.set_title(i, t)
        self.tabs = tabs
        super().__init__([self.header, controls, self.fig, tabs])
        self.add_class("slotlab-panel")

    def _do(self, fn) -> None:
        try:
            r = fn()
            err = getattr(r, "error", None)
            self._control_msg = _esc(err.message) if err else ""
        except Exception as e:  # a control must never raise into the kernel's widget handler
            self._control_msg = f"{_esc(type(e).__name__)}: {_esc(e)}"
        self._render_status()
        self.refresh()

    # ------------------------------------------------------------------ errors and the status line

    def _note_error(self, where: str, exc: BaseException) -> None:
        """A panel update raised: log it with its traceback, count it, show it; the panel goes on."""
        self.n_errors += 1
        self.last_error = f"{where}: {type(exc).__name__}: {exc}"
        if self.n_errors <= 20 or self.n_errors % 1000 == 0:
            log.error("panel update failed (%d so far), the panel goes on: %s", self.n_errors, self.last_error,
                      exc_info=exc)
        self._render_status()

    def _render_status(self) -> None:
        """The status line: the last control's outcome, then any subscriber / panel / schema errors."""
        bus = self.engine.events
        parts = []
        if self._control_msg:
            parts.append(f"<span style='color:#b00'>{self._control_msg}</span>")
        if bus.n_errors:
            parts.append(f"<span class='slotlab-error' style='color:#b00'>⚠ {bus.n_errors} event subscriber error(s); "
                         f"last: {_esc(bus.last_error)} (traceback: logger slotlab.events)</span>")
        if self.n_errors:
            parts.append(f"<span class='slotlab-error' style='color:#b00'>⚠ {self.n_errors} panel update error(s); "
                         f"last: {_esc(self.last_error)} (traceback: logger slotlab.panel)</span>")
        value = " · ".join(parts)
        if self.status.value != value:
            self.status.value = value

    def _render_safely(self) -> None:
        try:
            self.render()
        except Exception as exc:  # a drawing bug must not freeze the panel: shown, and the next update retries
            self._note_error("redrawing", exc)

    # ------------------------------------------------------------------ event pump

    async def _pump(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            if self.pending:
                try:
                    self.refresh()
                except Exception as exc:  # the pump must outlive any error (else the panel freezes silently)
                    self._note_error("panel update", exc)
            elif hasattr(self.engine, "panel_note"):  # a live source (slotlab.watch.Watch): its status changes too
                try:
                    self._render_header(self.state)
                except Exception as exc:
                    self._note_error("panel header", exc)

    def _slider_min(self) -> int:
        """The first event the slider can show: 0, or the oldest event the bus's log still holds."""
        bus = self.engine.events
        return bus.first_seq if bus.n_trimmed else 0

    def refresh(self) -> int:
        """Fold pending events into the state and redraw once; returns how many were taken. An event
        that fails to apply is reported (status line, logger `slotlab.panel`) and skipped."""
        with self._lock:
            n = 0
            while self.pending:
                ev = self.pending.popleft()
                n += 1
                if self.live and ev.seq > self.state.last_seq:
                    try:
                        self.state.apply(ev)
                    except Exception as exc:
                        self._note_error(f"applying event #{ev.seq} ({ev.kind})", exc)
            if n:
                bus = self.engine.events
                last = bus.log[-1].seq if bus.log else max(self.state.last_seq, 0)
                with self.slider.hold_trait_notifications():
                    self.slider.max = last
                    self.slider.min = min(self._slider_min(), last)
                    if self.live:
                        self.slider.value = last
                if self.live:
                    self._render_safely()
                else:
                    self._render_status()
                    self._render_trim_note()
            return n

    def _on_scrub(self, change) -> None:
        if self.live and change["new"] == self.slider.max:
            return
        self.show_at(change["new"])

    def _on_follow(self, change) -> None:
        if change["new"]:
            self.live = True
            self.state = PanelState.from_bus(self.engine.events)
            self.slider.value = self.slider.max
            self._render_safely()

    def show_at(self, seq: int) -> PanelState:
        """The panel as it was right after event `seq` (rebuilt from the event bus); stops following.
        Once the bus has trimmed its log, `seq` is raised to the oldest event it still holds."""
        self.live = False
        self.follow.value = False
        self.state = PanelState.from_bus(self.engine.events, upto=max(seq, self._slider_min()))
        self._render_safely()
        return self.state

    def show_stable(self, conversations, progress=None):
        """Price the chat calls `conversations` (slotlab.timeline.Conversations) sent to this panel's
        engine against a stable client and test every flag change and client fix over them, on paper
        (`Conversations.analysis`); the conversations tab draws a ◆ per call where a stable client's
        reuse ends and lists the price and the advice that worked. Returns the SessionWhy."""
        sw = conversations.analysis(progress=progress)
        self.timeline.show_stable(sw, self.state.timeline)
        return sw

    def close(self) -> None:
        self._unsubscribe()
        if self._task is not None:
            self._task.cancel()
        super().close()

    # ------------------------------------------------------------------ rendering

    def render(self) -> None:
        st = self.state
        d = figure.figure_data(st)
        with self.hold_sync(), self.fig.batch_update():
            self._render_timelines(st, d)
            self._render_checkpoints(st, d)
            self._render_evictions(st, d)
        self._render_header(st)
        self._render_cache(st)
        self._render_events()
        self._render_why(st)
        self._render_slots(st)
        self.timeline.render(st.timeline)
        self._render_status()
        self._render_trim_note()

    def _render_trim_note(self) -> None:
        bus = self.engine.events
        if not bus.n_trimmed:
            value = ""
        else:
            value = (f"<small>The event log keeps the last {len(bus.log):,} events: the slider reaches "
                     f"#{bus.first_seq:,} to #{self.slider.max:,}; the {bus.n_trimmed:,} earlier events were trimmed "
                     "(the slots, RAM-cache entries, gauges and recent history they defined are kept, so the state "
                     "shown is complete; only their own rows are gone from the event list).</small>")
        if self.trim_note.value != value:
            self.trim_note.value = value

    def _render_header(self, st: PanelState) -> None:
        flags = " ".join(st.flags) or "(server defaults)"
        value = (f"<b>slotlab</b> (models llama.cpp b{LLAMA_CPP_BUILD}) · {st.n_slots} slots · n_ctx_slot {st.n_ctx_slot} · n_swa {st.n_swa} · "
                 f"<code>{_esc(flags)}</code>{_proposals_note(tuple(st.flags))} · event #{st.last_seq} · "
                 f"{st.n_requests} requests done"
                 + ("" if self.live else " · <b style='color:#b00'>scrubbing (not live)</b>"))
        note = getattr(self.engine, "panel_note", None)  # a source that is not an Engine (slotlab.watch) says what it is
        if note is not None:
            value += f"<div class='slotlab-source'>{note()}</div>"
        if self.header.value != value:
            self.header.value = value

    def _x_range(self, st: PanelState) -> list:
        return figure.x_range(st)

    # the three plots: the arrays come from `figure` (the static picture, `static.panel_figure`, draws the same)

    def _render_timelines(self, st: PanelState, d: figure.FigureData | None = None) -> None:
        d = d or figure.figure_data(st)
        self.fig.layout.xaxis.range = d.x_range
        for j, kind in enumerate(PROVENANCE):
            b = d.prov[kind]
            tr = self.fig.data[j]
            tr.x, tr.y, tr.base, tr.hovertext = b.x, b.y, b.base, b.hovertext
            tr.showlegend = bool(b.x)
        tr = self.fig.data[len(PROVENANCE)]
        tr.x, tr.y, tr.hovertext = d.divergence.x, d.divergence.y, d.divergence.hovertext
        tr.showlegend = bool(d.divergence.x)

    def _render_checkpoints(self, st: PanelState, d: figure.FigureData | None = None) -> None:
        d = d or figure.figure_data(st)
        k0 = len(PROVENANCE) + 1
        t = self.fig.data[k0]
        t.x, t.y, t.base = d.window.x, d.window.y, d.window.base
        t.showlegend = bool(d.window.x)
        t = self.fig.data[k0 + 1]
        t.x, t.y, t.base, t.hovertext = d.checkpoints.x, d.checkpoints.y, d.checkpoints.base, d.checkpoints.hovertext
        t.showlegend = bool(d.checkpoints.x)
        self.fig.data[k0 + 2].x, self.fig.data[k0 + 2].y = d.n_past.x, d.n_past.y
        self.fig.data[k0 + 2].showlegend = bool(d.n_past.x)
        # the last checkpoint events, at the n_tokens they concern: created / restored / evict / none
        m = d.checkpoint_events
        t = self.fig.data[k0 + 3]
        t.x, t.y, t.hovertext = m.x, m.y, m.hovertext
        t.marker.symbol, t.marker.color = m.symbol, m.color

    def _render_evictions(self, st: PanelState, d: figure.FigureData | None = None) -> None:
        d = d or figure.figure_data(st)
        m = d.evictions
        t = self.fig.data[-1]
        t.x, t.y, t.hovertext = m.x, m.y, m.hovertext
        t.marker.color = m.color

    def _render_cache(self, st: PanelState) -> None:
        g = st.gauge
        if not g:
            self.gauges.value = "<i>RAM prompt cache: no state yet</i>" if st.cache_ram else "<i>RAM prompt cache disabled (--cache-ram 0)</i>"
        else:
            lim = g["limit_size"]
            pb = f"{100 * g['size'] / lim:.1f}" if lim else "0"
            pt = 100 * g["n_tokens"] / max(1, g["limit_tokens_cur"])
            self.gauges.value = (
                f"<div>bytes: {g['size'] / MIB:.2f} / {'no limit' if not lim else f'{lim / MIB:.0f} MiB'} "
                f"<progress value='{pb}' max='100'></progress></div>"
                f"<div>tokens: {g['n_tokens']} / {g['limit_tokens_cur']} "
                f"<progress value='{pt:.1f}' max='100'></progress> "
                f"<small>(limit = max(n_ctx {g['limit_tokens']}, limit_size / bytes-per-token), re-estimated at every update)</small></div>")
        sc = st.scores or {}
        by_id = {s["entry_id"]: s for s in sc.get("scores", [])}
        rows = []
        ids = list(st.entries)
        for pos, eid in enumerate(ids):
            e = st.entries[eid]
            s = by_id.get(eid)
            style = ""
            if s and s.get("winner"):
                style = " style='background:#d8f0d8;font-weight:bold'"
            elif s and s.get("below_floor"):
                style = " style='color:#999'"
            score = (f"{s['f_keep']:.3f}" + (" <small>(&lt; 0.25 floor)</small>" if s["below_floor"] else "")
                     + f"</td><td>{s['f_sim']:.3f}") if s else "</td><td>"
            ck = ", ".join(str(c[2]) for c in e.get("checkpoints", [])) or "-"
            rows.append(f"<tr{style}><td>#{eid}{' ⟵ next evicted' if pos == 0 else ''}</td><td>{e['n_tokens']}</td>"
                        f"<td>{e['size_main'] / MIB:.2f} / {e['size_dft'] / MIB:.2f} / {e['size_ckpt'] / MIB:.2f}</td>"
                        f"<td>{ck}</td>"
                        f"<td>{_esc(e['head'][:48])}</td><td>slot {e['id_slot']} · task {e['id_task']}</td><td>{score}</td></tr>")
        base = ""
        if sc:
            kind = "preview (no load needed)" if sc.get("preview") else "load"
            # an empty slot has no baseline: the server scores it f_keep -1 so that any entry at the floor wins
            held = ("baseline: the slot is empty (any entry at or above the 0.25 floor wins)" if sc["f_keep_base"] < 0
                    else f"baseline f_keep {sc['f_keep_base']:.3f}, f_sim {sc['f_sim_base']:.3f}")
            base = (f"<div>scores against task {sc.get('task')} in slot {sc.get('slot')} ({kind}): {held}; winner "
                    f"{'#' + str(sc['winner_id']) if sc.get('winner_id') is not None else 'none'}</div>")
        self.cache_box.value = (base + "<table class='slotlab-cache'><tr><th>entry (FIFO, oldest first)</th><th>tokens</th>"
                                "<th>MiB main / draft / ckpt</th><th>checkpoints at n_tokens</th><th>prompt</th><th>from</th><th>f_keep</th><th>f_sim</th></tr>"
                                + "".join(rows) + "</table>")

    def _render_events(self) -> None:
        evs = list(self.engine.events.log)
        if not self.live:
            evs = [e for e in evs if e.seq <= self.state.last_seq]
        kinds = sorted({e.kind for e in evs[-5000:]})
        if list(self.f_kind.options)[1:] != kinds:
            cur = self.f_kind.value
            self.f_kind.options = ["(all)"] + kinds
            self.f_kind.value = cur if cur in self.f_kind.options else "(all)"
        k, s, r = self.f_kind.value, self.f_slot.value, self.f_reason.value
        out = []
        for e in reversed(evs):
            if self.f_text.value and not e.message:
                continue
            if k != "(all)" and e.kind != k:
                continue
            if s != "(all)" and e.slot != int(s):
                continue
            if r != "(all)" and getattr(e.payload, "reason", None) != r:
                continue
            out.append(f"<tr><td>{e.seq}</td><td>{e.level}</td><td>{_esc(e.kind)}</td><td>{e.slot if e.slot >= 0 else ''}"
                       f"</td><td>{e.task if e.task >= 0 else ''}</td><td><code>{_esc(e.message)}</code></td></tr>")
            if len(out) >= self.max_rows:
                break
        self.events_box.value = ("<table class='slotlab-events'><tr><th>#</th><th>lvl</th><th>kind</th><th>slot</th>"
                                 "<th>task</th><th>server log text</th></tr>" + "".join(out) + "</table>")

    def _render_why(self, st: PanelState) -> None:
        items = "".join(f"<li>task {t} (slot {s}): {_esc(m)}</li>" for t, s, m in reversed(st.why))
        self.why_box.value = f"<ul class='slotlab-why'>{items}</ul>"

    def _render_slots(self, st: PanelState) -> None:
        rows = []
        for i in range(st.n_slots):
            sv = st.slot(i)
            hist = " ".join(f"[t{t}: {c}+{p} {'/'.join(k)}]" for t, c, p, k in st.history.get(i, ()))
            rows.append(f"<tr><td>slot {i}</td><td>{sv.state}</td><td>{sv.task}</td><td>{sv.n_tokens}</td><td>{sv.n_past}</td>"
                        f"<td>{sv.prompt_n}</td><td>{sv.n_gen}</td><td>{len(sv.checkpoints)}</td><td><small>{_esc(hist)}</small></td></tr>")
        self.slot_table.value = ("<table class='slotlab-slots'><tr><th>slot</th><th>state</th><th>task</th><th>n_tokens</th>"
                                 "<th>cache_n</th><th>prompt_n</th><th>n_gen</th><th>ckpts</th><th>history (cached+prefilled)</th></tr>"
                                 + "".join(rows) + "</table>")


@functools.lru_cache(maxsize=8)
def _proposals_note(flags: tuple) -> str:
    """The changes to the build's rules the flags turn on (slotlab/proposals), for the header: a
    proposal is a visible choice wherever the server's decisions are shown."""
    from slotlab.engine.params import ServerParams
    from slotlab.proposals import active

    try:
        ps = active(ServerParams.from_args(list(flags)))
    except Exception:  # noqa: BLE001 - flags a source reports that slotlab does not parse: nothing to add
        return ""
    if not ps:
        return ""
    return " · <b style='color:#b35900'>rules changed by " + _esc(", ".join(p.label() for p in ps)) + "</b>"
