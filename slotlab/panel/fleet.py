"""A fleet in JupyterLab: `FleetView(res)` shows a `simulate_fleet` result (or the dict `slotlab simulate
--fleet N --json` prints): the router and what it sees, a row per server (requests, reuse, queue wait and
TTFT p99, peak RAM cache), the lanes of `slotlab.figures.fleet` (a row per server and slot, a bar per
request, the router's reason on hover), and a server picker that lists that server's requests with
the reason each was routed there.

Why a view of its own: the live `Panel` follows one engine as it runs; a fleet is N servers on paper,
finished in seconds, so it is a fold over the result, like `slotlab report`. Nothing here computes:
the rows come from the result, the lanes from `figures.fleet.lane_data`."""

from __future__ import annotations

import html

from slotlab.figures.fleet import as_doc

__all__ = ["FleetView", "server_rows"]


def server_rows(res) -> list[dict]:
    """One row per server from the result's own totals (what the table shows)."""
    out = []
    for s in as_doc(res)["servers"]:
        t = s["totals"]
        out.append({"server": s["server"], "requests": t["n_requests"],
                    "reused_pct": 100 * t["tokens_reused"] / t["prompt_tokens"] if t["prompt_tokens"] else 0.0,
                    "queue_wait_p99": t["queue_wait_p99"], "ttft_p50": t["ttft_p50"], "ttft_p99": t["ttft_p99"],
                    "peak_cache_mib": t.get("peak_cache_bytes", 0) / 2**20})
    return out


def _table(rows: list[dict]) -> str:
    head = ("server", "requests", "reused", "queue p99 (s)", "TTFT p50 (s)", "TTFT p99 (s)", "peak RAM cache")
    cells = "".join(f"<th style='padding:2px 8px'>{h}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td style='padding:2px 8px;text-align:right'>{c}</td>" for c in (
            r["server"], r["requests"], f"{r['reused_pct']:.1f} %", f"{r['queue_wait_p99']:,.2f}",
            f"{r['ttft_p50']:,.2f}", f"{r['ttft_p99']:,.2f}", f"{r['peak_cache_mib']:,.0f} MiB")) + "</tr>"
        for r in rows)
    return f"<table style='border-collapse:collapse;font-size:12px'><tr>{cells}</tr>{body}</table>"


class FleetView:
    """The widget; `display(FleetView(res))` or leave it last in a cell."""

    def __init__(self, res, *, title: str | None = None, max_rows: int = 200):
        import ipywidgets as w
        import plotly.graph_objects as go

        from slotlab.figures.fleet import lanes_plotly

        d = as_doc(res)
        self.doc = d
        f = d["fleet"]
        t = d["totals"]
        reused = 100 * t["tokens_reused"] / t["prompt_tokens"] if t.get("prompt_tokens") else 0.0
        head = (f"<b>{f['servers']} server{'s' if f['servers'] > 1 else ''} behind the {html.escape(f['router'])} "
                f"router</b> — {t['n_requests']} requests, {reused:.1f} % of prompt tokens reused, TTFT p99 "
                f"{t['ttft_p99']:,.2f} s<br><span style='color:#555'>the router sees {html.escape(f['router_sees'])}; "
                f"{html.escape(f['how'])}</span>")
        from slotlab.fleet.capacity import warning

        warn = warning(d["capacity"], f["servers"]) if d.get("capacity") else None
        self.header = w.HTML(head + (f"<br><span style='color:#b00'>{html.escape(warn)}</span>" if warn else ""))
        self.table = w.HTML(_table(server_rows(d)))
        self.fig = go.FigureWidget(lanes_plotly(d, title=title))
        self.max_rows = max_rows
        self.pick = w.Dropdown(options=[(f"server {s['server']}", s["server"]) for s in d["servers"]],
                               description="requests of", value=d["servers"][0]["server"] if d["servers"] else None)
        self.requests = w.HTML()
        self.pick.observe(lambda ch: self._show(ch["new"]), names="value")
        self._show(self.pick.value)
        self.widget = w.VBox([self.header, self.table, self.fig, self.pick, self.requests])

    def _show(self, server) -> None:
        res = {r["i"]: r for r in self.doc["results"]}
        rows = [r for r in self.doc["routing"] if r["server"] == server]
        lines = []
        for r in rows[: self.max_rows]:
            x = res.get(r["i"], {})
            n = (x.get("cache_n") or 0) + (x.get("prompt_n") or 0)
            lines.append(f"<tr><td style='padding:1px 6px;text-align:right'>#{r['i']}</td>"
                         f"<td style='padding:1px 6px;text-align:right'>{r['arrival']:,.1f} s</td>"
                         f"<td style='padding:1px 6px;text-align:right'>{x.get('cache_n') or 0:,} / {n:,}</td>"
                         f"<td style='padding:1px 6px'>{html.escape(r['why'])}</td></tr>")
        more = (f"<br>... {len(rows) - self.max_rows} more" if len(rows) > self.max_rows else "")
        self.requests.value = ("<table style='font-size:11px'><tr><th>request</th><th>arrival</th>"
                               "<th>reused / prompt</th><th>why the router sent it here</th></tr>"
                               + "".join(lines) + "</table>" + more)

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)
