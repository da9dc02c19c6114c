"""A fleet on one picture: a lane per server (a row per slot), each request a bar on the simulated clock.

Why: a fleet's totals say how much was reused and how long the queue grew; they do not say where. The
lanes do: under round-robin a conversation's turns hop between servers and land on cold slots (pale
bars), under session affinity they stay (dark bars), and a server the router overloads shows its queue
as grey whiskers in front of its bars. Beside the lanes, each server's requests, reuse and TTFT p99:
the balance the router struck.

`lane_data(res)` is the one computation; `lanes_png` (matplotlib, for notebooks and `simulate --fleet
--png`) and `lanes_plotly` (the live panel, `slotlab.panel.fleet`, and `--html`, with the router's
reason for every request on hover) both draw its arrays. `res` is a `FleetResult` or the dict `slotlab
simulate --fleet N --json` prints."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Lanes", "as_doc", "lane_data", "lanes_png", "lanes_plotly", "write_png", "write_html"]


@dataclass
class Lanes:
    """Per request (trace order): its lane (row index), start of its queue wait (arrival), start of its
    prefill (arrival + queue wait), end, the share of its prompt reused, label for hover; per lane its
    (server, slot); per server its summary. Failed requests (no slot) are left out and counted."""

    row: list
    arrival: list
    start: list
    end: list
    reused: list
    hover: list
    lanes: list  # [(server, slot)]
    servers: list  # [{"server", "n_requests", "reused", "ttft_p99"}]
    router: str
    n_failed: int


def as_doc(res) -> dict:
    """A `FleetResult` as the dict `simulate --fleet --json` prints (a dict is returned as it is)."""
    return res if isinstance(res, dict) else res.as_json()


def lane_data(res) -> Lanes:
    d = as_doc(res)
    route = {r["i"]: r for r in d["routing"]}
    lanes = sorted({(route[r["i"]]["server"], r["id_slot"]) for r in d["results"]
                    if r.get("id_slot") is not None and r.get("id_slot", -1) >= 0})
    ix = {k: j for j, k in enumerate(lanes)}
    out = Lanes([], [], [], [], [], [], lanes, [], d["fleet"]["router"], 0)
    for r in d["results"]:
        s = route[r["i"]]["server"]
        if r.get("id_slot") is None or r["id_slot"] < 0 or r.get("end") is None:
            out.n_failed += 1
            continue
        n = (r.get("cache_n") or 0) + (r.get("prompt_n") or 0)
        share = (r.get("cache_n") or 0) / n if n else 0.0
        out.row.append(ix[(s, r["id_slot"])])
        out.arrival.append(r["arrival"])
        out.start.append(r["arrival"] + (r.get("queue_wait") or 0.0))
        out.end.append(r["end"])
        out.reused.append(share)
        out.hover.append(f"#{r['i']} → server {s}, slot {r['id_slot']}: {route[r['i']]['why']}<br>"
                         f"reused {r.get('cache_n') or 0:,} of {n:,} tokens ({100 * share:.0f} %), "
                         f"queue {r.get('queue_wait') or 0:.2f} s, TTFT {r.get('ttft') or 0:.2f} s")
    for s in d["servers"]:
        t = s["totals"]
        out.servers.append({"server": s["server"], "n_requests": t["n_requests"],
                            "reused": t["tokens_reused"] / t["prompt_tokens"] if t["prompt_tokens"] else 0.0,
                            "ttft_p99": t["ttft_p99"]})
    return out


def lanes_png(res, *, title: str | None = None, width: float = 10.0) -> bytes:
    """The lanes and the per-server summary as a PNG (slotlab.figures.png: deterministic bytes)."""
    import matplotlib as mpl

    from slotlab.figures import png

    L = lane_data(res)
    h = max(2.2, 0.32 * len(L.lanes) + 1.2)
    fig, (ax, bx) = png.new(width, h, ncols=2, gridspec_kw={"width_ratios": [4, 1.3], "wspace": 0.35})
    cmap = mpl.colormaps["Blues"]
    for r, a, s, e, f in zip(L.row, L.arrival, L.start, L.end, L.reused):
        if s > a:  # the queue wait: a whisker under the lane's bars (other requests of the slot run then)
            ax.plot([a, s], [r + 0.42, r + 0.42], color="#888", lw=0.7, solid_capstyle="butt")
        ax.barh(r, max(e - s, 1e-9), left=s, height=0.7, color=cmap(0.2 + 0.8 * f), edgecolor="none")
    ax.set_yticks(range(len(L.lanes)), [f"server {s} · slot {j}" for s, j in L.lanes])
    ax.invert_yaxis()
    ax.set_xlabel("simulated time (s)")
    for k in range(1, len(L.lanes)):
        if L.lanes[k][0] != L.lanes[k - 1][0]:
            ax.axhline(k - 0.5, color="#444", lw=0.8)
    sm = mpl.cm.ScalarMappable(cmap=mpl.colors.ListedColormap(cmap([0.2 + 0.8 * i / 255 for i in range(256)])),
                               norm=mpl.colors.Normalize(0, 100))
    cb = fig.colorbar(sm, ax=ax, pad=0.01, fraction=0.03)
    cb.set_label("prompt reused (%)")
    ax.set_title(title or f"{len(L.servers)} servers behind the {L.router} router: a bar per request "
                          "(grey underline: its queue wait)", loc="left")
    ys = range(len(L.servers))
    bx.barh(ys, [100 * s["reused"] for s in L.servers], color="#1f77b4", height=0.6)
    for y, s in zip(ys, L.servers):
        inside = s["reused"] > 0.55
        bx.text(100 * s["reused"] + (-2 if inside else 2), y + 0.42,
                f"{100 * s['reused']:.1f} % of {s['n_requests']} · TTFT p99 {s['ttft_p99']:,.1f} s",
                va="bottom", ha="right" if inside else "left", fontsize=7)
    bx.set_yticks(list(ys), [f"server {s['server']}" for s in L.servers])
    bx.set_ylim(len(L.servers) - 0.3, -0.7)
    bx.set_xlim(0, 100)
    bx.set_xlabel("prompt reused (%)")
    bx.set_title("per server", loc="left")
    return png.to_png(fig)


def lanes_plotly(res, *, title: str | None = None):
    """The lanes as a plotly figure (hover: the router's reason, reuse, queue and TTFT of each request)."""
    import plotly.graph_objects as go

    L = lane_data(res)
    fig = go.Figure()
    fig.add_trace(go.Bar(y=L.row, x=[e - s for s, e in zip(L.start, L.end)], base=L.start, orientation="h",
                         marker={"color": [100 * f for f in L.reused], "colorscale": "Blues", "cmin": -25, "cmax": 100,
                                 "colorbar": {"title": "reused %"}},
                         hovertext=L.hover, hoverinfo="text", name="requests", width=0.7))
    qx, qy = [], []
    for r, a, s in zip(L.row, L.arrival, L.start):
        if s > a:
            qx += [a, s, None]
            qy += [r, r, None]
    if qx:
        fig.add_trace(go.Scatter(x=qx, y=qy, mode="lines", line={"color": "#999", "width": 1}, name="queue wait",
                                 hoverinfo="skip"))
    fig.update_yaxes(tickvals=list(range(len(L.lanes))), ticktext=[f"server {s} · slot {j}" for s, j in L.lanes],
                     autorange="reversed")
    fig.update_layout(title=title or f"{len(L.servers)} servers behind the {L.router} router", barmode="overlay",
                      xaxis_title="simulated time (s)", height=max(260, 28 * len(L.lanes) + 140),
                      margin={"l": 130, "r": 20, "t": 50, "b": 40}, showlegend=False)
    return fig


def write_png(res, path, **kw) -> None:
    from pathlib import Path

    Path(path).write_bytes(lanes_png(res, **kw))


def write_html(res, path, **kw) -> None:
    lanes_plotly(res, **kw).write_html(str(path), include_plotlyjs="cdn")
