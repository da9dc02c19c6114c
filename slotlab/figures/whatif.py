"""Sizing the cache: `slotlab whatif`'s results as static pictures.

Why: a what-if grid is a table of settings x outcomes (reuse, prefill, RAM, time to first token), and a
reader compares rows by eye far faster on bars than on digits: which setting comes close to the
infinite-cache bound, which one stays within the RAM budget, which one is fastest. The plotly figure
(`whatif --html`) needs JavaScript; these show wherever the notebook or the PNG is opened.

All three take slotlab's own results, never numbers typed in:
* `overview(runs, pick=, budget_mib=)`: one row per setting (`WhatIfRun`, or the dicts `whatif --json`
  prints), four panels: prompt tokens reused against the infinite-cache bound, tokens prefilled, peak
  RAM cache against the budget, TTFT p50 / p99; the best setting under the budget in red (the data of
  `whatif.write_html`).
* `sweep(series, flag, metric=)`: reuse (or TTFT) against the values of one varied flag, one line per
  series of runs, with reference runs and the bound as horizontal lines.
* `cache_over_time(timelines)`: the bytes the RAM cache held against simulated time (`whatif.
  cache_timeline`), its `--cache-ram` limit, and each eviction marked by its reason.
* `fleet_sweep(runs, ttft_target=, pick=)`: a grid over fleets (`--vary "--fleet 1,2,4" --vary "--router
  ..."`): prompt tokens reused and TTFT p99 against the number of servers, one line per router; the
  target as a horizontal line and the smallest fleet meeting it (`whatif.smallest_fleet`) circled.
  `write_png` draws it when --fleet is varied."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from slotlab.figures import png

__all__ = ["overview", "sweep", "cache_over_time", "fleet_sweep", "labels_of", "write_html", "write_png"]

GIB = 2**30
BLUE, RED, GREY = "#1f77b4", "#d62728", "#7f7f7f"
#: an eviction's reason -> (colour, what it means)
REASONS = {
    "make_room": ("#d62728", "make_room: oldest entry dropped for a new one"),
    "loaded": ("#2ca02c", "loaded: restored into a slot (a hit)"),
    "token_limit": ("#ff7f0e", "token_limit: over -c tokens"),
    "byte_limit": ("#9467bd", "byte_limit"),
    "obsolete_prefix": ("#8c564b", "obsolete_prefix: a prefix of the new entry"),
    "shrink": ("#e377c2", "shrink"),
    "cleared": ("#7f7f7f", "cleared"),
}


def _runs(runs) -> list:
    """WhatIfRun objects, from WhatIfRun or the dicts of `whatif --json` ({"runs": [...]} or a list)."""
    from slotlab.sim.whatif import WhatIfRun

    if isinstance(runs, dict):
        runs = runs["runs"]
    names = {f.name for f in fields(WhatIfRun)}
    return [r if isinstance(r, WhatIfRun) else WhatIfRun(**{k: v for k, v in r.items() if k in names}) for r in runs]


def _same(a, b) -> bool:
    return a is b or (b is not None and a.flags == b.flags)


def _value(run, flag: str) -> str:
    """The value `flag` has in the run's llama-server flags (the varied setting, else the base's)."""
    if flag in run.setting:
        return str(run.setting[flag])
    i = len(run.flags) - 1 - run.flags[::-1].index(flag)
    return str(run.flags[i + 1])


def _groups(flags: list) -> list[str]:
    """`["-c", "8192", "-kvu", "--cache-ram", "-1"]` -> `["-c 8192", "-kvu", "--cache-ram -1"]`."""
    out: list[str] = []
    for f in map(str, flags):
        if out and not (f.startswith("-") and not f.lstrip("-").replace(".", "", 1).isdigit()):
            out[-1] += " " + f
        else:
            out.append(f)
    return out


def labels_of(runs) -> list[str]:
    """Each run's flags less those every run shares: `run.label` for one grid, and what tells the
    settings apart when runs of several grids are drawn together."""
    runs = _runs(runs)
    groups = [_groups(r.flags) for r in runs]
    common = set.intersection(*map(set, groups)) if groups else set()
    return [" ".join(g for g in gs if g not in common) or r.label or "(base)" for r, gs in zip(runs, groups)]


def _bound_pct(runs) -> float | None:
    r = next((r for r in runs if r.bound_tokens and r.prompt_tokens), None)
    return None if r is None else 100 * r.bound_tokens / r.prompt_tokens


def overview(runs, *, pick=None, budget_mib: float | None = None, title: str | None = None, labels=None):
    """Every setting of a what-if grid on one row; `pick` (from `whatif.best`) drawn in red; `labels`
    replace the settings' own (`run.label`) on the rows."""
    runs = _runs(runs)
    pick = _runs([pick])[0] if isinstance(pick, dict) else pick
    labels = list(labels) if labels is not None else labels_of(runs)
    n = len(runs)
    fig, axes = png.new(11.0, 0.8 + 0.3 * n, ncols=4, sharey=True, gridspec_kw={"wspace": 0.08})
    y = list(range(n))
    ok = [r.error is None for r in runs]
    col = [RED if _same(r, pick) else BLUE for r in runs]
    hatch = ["//" if r.n_errors else "" for r in runs]

    def bars(ax, vals, **kw):
        for i in y:
            if ok[i]:
                ax.barh(i, vals[i], color=col[i], hatch=hatch[i], edgecolor="white" if not hatch[i] else "black",
                        linewidth=0.0 if not hatch[i] else 0.3, height=0.7, **kw)

    ax = axes[0]
    bars(ax, [100 * r.reuse for r in runs])
    bound = _bound_pct(runs)
    for i, r in enumerate(runs):
        if ok[i] and r.of_bound is not None:
            ax.text(100 * r.reuse, i, f" {100 * r.of_bound:.0f} %", va="center", fontsize=7, color=GREY)
    if bound is not None:
        ax.axvline(bound, color=GREY, ls="--", lw=1)
        ax.text(bound, 1.01, f"infinite-cache bound {bound:.1f} %", ha="right", va="bottom", fontsize=7, color=GREY,
                transform=ax.get_xaxis_transform())
        ax.set_xlim(0, bound * 1.08)
    ax.set_xlabel("prompt tokens reused (% of prompt;\ngrey: % of the bound)")

    ax = axes[1]
    bars(ax, [r.tokens_prefilled / 1e6 for r in runs])
    ax.set_xlabel("tokens prefilled (millions)")
    lo = min((r.tokens_prefilled for r, k in zip(runs, ok) if k), default=0) / 1e6
    hi = max((r.tokens_prefilled for r, k in zip(runs, ok) if k), default=1) / 1e6
    ax.set_xlim(max(0.0, lo - 0.15 * (hi - lo + 1e-9) - 0.05 * hi), hi * 1.02)  # the differences, not the bulk

    ax = axes[2]
    bars(ax, [r.peak_cache_bytes / GIB for r in runs])
    if budget_mib is not None:
        ax.axvline(budget_mib / 1024, color=RED, ls=":", lw=1.2)
        ax.text(budget_mib / 1024, 1.01, f"budget {budget_mib / 1024:g} GiB", ha="center", va="bottom", fontsize=7,
                color=RED, transform=ax.get_xaxis_transform())
    ax.set_xlabel("peak RAM cache (GiB)")

    ax = axes[3]
    bars(ax, [r.ttft_p50 for r in runs])
    for i, r in enumerate(runs):
        if ok[i]:
            ax.plot(r.ttft_p99, i, "D", color="black", ms=3.5)
            if r.n_errors:
                ax.text(r.ttft_p99, i, f"  {r.n_errors} errors", va="center", fontsize=7, color=RED)
        else:
            ax.text(0.02, i, "failed: " + str(r.error)[:40], va="center", fontsize=7, color=RED,
                    transform=ax.get_yaxis_transform())
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (s, log): p50 bar, p99 \u25c6")

    axes[0].set_yticks(y, labels, fontsize=8)
    for t, r in zip(axes[0].get_yticklabels(), runs):
        if _same(r, pick):
            t.set_color(RED)
            t.set_fontweight("bold")
    axes[0].invert_yaxis()
    for ax in axes:
        ax.grid(axis="x", alpha=0.3)
        ax.tick_params(axis="y", length=0)
    head = title or "slotlab whatif"
    if pick is not None:
        within = f" within {budget_mib / 1024:g} GiB of RAM cache" if budget_mib is not None else ""
        head += f"\nred: the best setting{within} (lowest TTFT p50 by default); hatched: requests failed"
    h = 0.8 + 0.3 * n  # inches: the title sits just above the panels' top (0.88 of the figure) and their notes
    fig.suptitle(head, fontsize=10, x=0.02, ha="left", va="bottom", y=fig.subplotpars.top + 0.22 / h)
    return fig


def sweep(series: dict, flag: str, *, metric: str = "reuse", refs: dict | None = None, title: str | None = None,
          xlabel=None):
    """`metric` against the values of `flag`: one line per entry of `series` (name -> runs in x order);
    `refs` (name -> run) are horizontal lines. metric "reuse": prompt tokens reused, % of the prompt,
    with the infinite-cache bound; "ttft": TTFT p50 (line) and p99 (diamonds), log scale, failed
    requests noted."""
    series = {k: _runs(v) for k, v in series.items()}
    refs = {k: _runs([v])[0] for k, v in (refs or {}).items()}
    fig, ax = png.new(7.0, 3.2)
    xs = []
    for runs in series.values():
        for r in runs:
            v = _value(r, flag)
            if v not in xs:
                xs.append(v)
    pos = {v: i for i, v in enumerate(xs)}
    colors = [BLUE, "#ff7f0e", "#2ca02c", "#9467bd"]
    every = [r for runs in series.values() for r in runs] + list(refs.values())
    for k, (name, runs) in enumerate(series.items()):
        c = colors[k % len(colors)]
        x = [pos[_value(r, flag)] for r in runs]
        if metric == "reuse":
            yv = [100 * r.reuse for r in runs]
            ax.plot(x, yv, "o-", color=c, label=name)
            for xi, yi in zip(x, yv):  # the first series' values below its line, the others' above
                ax.annotate(f"{yi:.2f}", (xi, yi), textcoords="offset points", xytext=(0, -11 if k == 0 else 5),
                            ha="center", fontsize=7, color=c)
        elif metric == "ttft":
            ax.plot(x, [r.ttft_p50 for r in runs], "o-", color=c, label=f"{name}: TTFT p50")
            ax.plot(x, [r.ttft_p99 for r in runs], "D", color=c, ms=4, mfc="none", label=f"{name}: TTFT p99")
            for xi, r in zip(x, runs):
                ax.annotate(f"{r.ttft_p50:.1f} s", (xi, r.ttft_p50), textcoords="offset points", xytext=(6, -3),
                            fontsize=7, color=c)
                if r.n_errors:
                    ax.annotate(f"{r.n_errors} of {r.n_requests} requests failed", (xi, r.ttft_p99),
                                textcoords="offset points", xytext=(0, 8), ha="center", fontsize=7, color=RED)
        else:
            raise ValueError(f"metric {metric!r}: reuse or ttft")
    styles = [":", "-.", (0, (1, 3))]
    for k, (name, r) in enumerate(refs.items()):
        v = 100 * r.reuse if metric == "reuse" else r.ttft_p50
        ax.axhline(v, color="black", ls=styles[k % len(styles)], lw=1, label=f"{name}: {v:.2f}"
                   + (" %" if metric == "reuse" else " s"))
    if metric == "reuse":
        bound = _bound_pct(every)
        if bound is not None:
            ax.axhline(bound, color=GREY, ls="--", lw=1, label=f"infinite-cache bound: {bound:.1f} %")
            ax.set_ylim(0, bound * 1.1)
        ax.set_ylabel("prompt tokens reused (%)")
    else:
        ax.set_yscale("log")
        ax.set_ylabel("time to first token (s, log)")
    ax.set_xticks(range(len(xs)), [_tick(flag, v) for v in xs])
    ax.set_xlabel(xlabel or flag)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    if title:
        ax.set_title(title, loc="left")
    return fig


def _tick(flag: str, v: str) -> str:
    """`--cache-ram 131072` -> `131072\\n128 GiB`."""
    if flag in ("--cache-ram", "-cram"):
        try:
            mib = int(v)
        except ValueError:
            return v
        return f"{v}\n{mib / 1024:g} GiB" if mib > 0 else f"{v}\n" + ("off" if mib == 0 else "no byte limit")
    return v


def cache_over_time(timelines, *, title: str | None = None):
    """One panel per `whatif.CacheTimeline`, sharing the simulated-time axis: the GiB the RAM cache
    held (after each save and eviction), its `--cache-ram` limit, and under the curve one tick per
    eviction, coloured by its reason (`loaded` = the entry went back into a slot: a hit)."""
    tls = list(timelines)
    fig, axes = png.new(9.0, 0.5 + 1.9 * len(tls), nrows=len(tls), sharex=True, squeeze=False,
                        gridspec_kw={"hspace": 0.45})
    axes = axes[:, 0]
    reasons_seen = []
    for ax, tl in zip(axes, tls):
        t = [0.0] + list(tl.t)
        h = [0.0] + [b / GIB for b in tl.held]
        ax.step(t, h, where="post", color=BLUE, lw=1)
        ax.fill_between(t, h, step="post", color=BLUE, alpha=0.15)
        if tl.limit_bytes:
            ax.axhline(tl.limit_bytes / GIB, color=GREY, ls="--", lw=1)
            ax.text(0, tl.limit_bytes / GIB, f" limit {tl.limit_bytes / GIB:g} GiB", va="bottom", fontsize=7,
                    color=GREY)
        ymax = max(tl.peak / GIB, (tl.limit_bytes or 0) / GIB, 1e-9) * 1.25
        # each eviction as a tick in a band below zero, one band per reason
        by = {}
        for e in tl.evictions:
            by.setdefault(e[1], []).append(e[0])
        band = 0.08 * ymax
        for k, (reason, ts) in enumerate(sorted(by.items())):
            c = REASONS.get(reason, (GREY, reason))[0]
            yk = -band * (k + 0.6)
            ax.plot(ts, [yk] * len(ts), "|", color=c, ms=6, mew=0.8)
            ax.text(1.005, yk, f"{reason} \u00d7 {len(ts)}", transform=ax.get_yaxis_transform(), va="center",
                    fontsize=7, color=c)
            if reason not in reasons_seen:
                reasons_seen.append(reason)
        ax.set_ylim(-band * (len(by) + 0.3), ymax)
        ax.set_ylabel("GiB held")
        r = tl.totals
        pct = 100 * r["tokens_reused"] / r["prompt_tokens"] if r.get("prompt_tokens") else 0.0
        ax.set_title(f"{tl.label}: {len(tl.saves)} saves, {tl.evicted()} evictions, peak "
                     f"{tl.peak / GIB:.1f} GiB, reused {pct:.2f} %", loc="left", fontsize=9)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("simulated time (s)")
    axes[-1].set_xlim(0, max([tl.t[-1] for tl in tls if tl.t] + [1.0]))
    notes = "; ".join(REASONS.get(k, (GREY, k))[1] for k in reasons_seen)
    fig.suptitle((title + "\n" if title else "") + "evictions below each curve, by reason (" + notes + ")",
                 fontsize=9, x=0.02, ha="left")
    return fig


# ---------------------------------------------------------------------------------------------- files

def write_html(runs: list, path, *, pick=None, budget_mib: float | None = None, title: str = "slotlab whatif") -> None:
    """A plotly figure: per setting, reuse vs the bound, tokens prefilled, peak RAM cache, TTFT p50 / p99."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    ok = [r for r in runs if r.error is None]
    labels = [r.label for r in ok]
    colors = ["#d62728" if pick is not None and r is pick else "#1f77b4" for r in ok]
    fig = make_subplots(rows=2, cols=2, subplot_titles=("prompt tokens reused (% of prompt; line: infinite cache)",
                                                        "tokens prefilled", "peak RAM cache (MiB)",
                                                        "TTFT (s): p50 bars, p99 markers"))
    fig.add_trace(go.Bar(x=labels, y=[100 * r.reuse for r in ok], marker_color=colors, name="reused %"), 1, 1)
    if ok and ok[0].bound_tokens:
        bound = 100 * ok[0].bound_tokens / ok[0].prompt_tokens
        fig.add_trace(go.Scatter(x=labels, y=[bound] * len(ok), mode="lines", name="infinite-cache bound",
                                 line=dict(dash="dash", color="gray")), 1, 1)
    fig.add_trace(go.Bar(x=labels, y=[r.tokens_prefilled for r in ok], marker_color=colors, name="prefilled"), 1, 2)
    fig.add_trace(go.Bar(x=labels, y=[r.peak_cache_bytes / 2**20 for r in ok], marker_color=colors, name="peak RAM"),
                  2, 1)
    if budget_mib is not None:
        fig.add_trace(go.Scatter(x=labels, y=[budget_mib] * len(ok), mode="lines", name="budget",
                                 line=dict(dash="dot", color="red")), 2, 1)
    fig.add_trace(go.Bar(x=labels, y=[r.ttft_p50 for r in ok], marker_color=colors, name="TTFT p50"), 2, 2)
    fig.add_trace(go.Scatter(x=labels, y=[r.ttft_p99 for r in ok], mode="markers", name="TTFT p99",
                             marker=dict(symbol="diamond", color="black")), 2, 2)
    sub = f"best within {budget_mib:g} MiB: {pick.label}" if pick is not None and budget_mib is not None else (
        f"best: {pick.label}" if pick is not None else "")
    fig.update_layout(title=f"{title}<br><sup>{sub}</sup>", showlegend=True, height=800)
    fig.write_html(str(path), include_plotlyjs="cdn")


def _fleet_of(run) -> tuple[int, str] | None:
    f = run.extra.get("fleet") if isinstance(run.extra, dict) else None
    return None if f is None else (int(f["servers"]), str(f["router"]))


def is_fleet_sweep(runs) -> bool:
    """True where the runs are fleets of more than one size (`--vary "--fleet ..."`)."""
    sizes = {f[0] for f in map(_fleet_of, _runs(runs)) if f is not None}
    return len(sizes) > 1


def fleet_sweep(runs, *, ttft_target: float | None = None, pick=None, title: str | None = None):
    """Two panels against the number of servers N (the runs of `--vary "--fleet ..."`, with or without
    `--vary "--router ..."`): prompt tokens reused (% of the prompt) and TTFT p99 (log scale), one line
    per router. `ttft_target` (seconds): a horizontal line on the TTFT panel; `pick` (`whatif.
    smallest_fleet`) circled on both. Failed runs are left out."""
    runs = [r for r in _runs(runs) if r.error is None and _fleet_of(r) is not None]
    routers: dict[str, list] = {}
    for r in runs:
        routers.setdefault(_fleet_of(r)[1], []).append(r)
    sizes = sorted({_fleet_of(r)[0] for r in runs})
    fig, (a1, a2) = png.new(9.0, 3.2, ncols=2)
    colors = [BLUE, "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b"]
    for k, (name, rs) in enumerate(routers.items()):
        rs = sorted(rs, key=lambda r: _fleet_of(r)[0])
        c = colors[k % len(colors)]
        x = [_fleet_of(r)[0] for r in rs]
        a1.plot(x, [100 * r.reuse for r in rs], "o-", color=c, label=name)
        a2.plot(x, [r.ttft_p99 for r in rs], "o-", color=c, label=name)
    failed = sorted({r.n_errors for r in runs})
    if failed and failed[-1]:  # refused requests have no TTFT: said once, not at every point
        a2.set_title(f"{failed[0]}{'' if len(failed) == 1 else f'-{failed[-1]}'} of {runs[0].n_requests} "
                     "requests failed in each run", fontsize=8, color=RED, loc="right")
    bound = _bound_pct(runs)
    if bound is not None:
        a1.axhline(bound, color=GREY, ls="--", lw=1, label=f"one infinite cache: {bound:.1f} %")
    if ttft_target is not None:
        a2.axhline(ttft_target, color=RED, ls=":", lw=1, label=f"target {ttft_target:g} s")
    if pick is not None and _fleet_of(pick) is not None:
        n = _fleet_of(pick)[0]
        a1.plot([n], [100 * pick.reuse], "o", ms=11, mfc="none", mec=RED, mew=1.5)
        a2.plot([n], [pick.ttft_p99], "o", ms=11, mfc="none", mec=RED, mew=1.5,
                label=f"smallest meeting it: {n} x {_fleet_of(pick)[1]}")
    for ax in (a1, a2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.minorticks_off()
        ax.set_xlabel("servers (--fleet)")
        ax.grid(alpha=0.3)
    a1.set_ylabel("prompt tokens reused (%)")
    a1.set_ylim(0, max([bound or 0] + [100 * r.reuse for r in runs] + [1]) * 1.1)
    a2.set_yscale("log")
    from matplotlib.ticker import FuncFormatter

    a2.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # 30, not 3 x 10^1
    lo, hi = a2.get_ylim()
    if hi / max(lo, 1e-12) <= 30:  # within a decade or so the minor ticks carry the labels; beyond, clutter
        a2.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    else:
        from matplotlib.ticker import NullFormatter

        a2.yaxis.set_minor_formatter(NullFormatter())
    a2.set_ylabel("TTFT p99 (s, log)")
    a1.legend(fontsize=7, frameon=False)
    a2.legend(fontsize=7, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10, x=0.02, ha="left")
    fig.tight_layout()
    return fig


def write_png(runs: list, path, *, pick=None, budget_mib: float | None = None, title: str = "slotlab whatif",
              ttft_target: float | None = None, fleet_pick=None) -> None:
    """The grid as a static PNG: `fleet_sweep` where --fleet is varied (`fleet_pick`: the smallest fleet
    meeting `ttft_target`), else `overview` (the data `write_html` shows)."""
    if is_fleet_sweep(runs):
        fig = fleet_sweep(runs, ttft_target=ttft_target, pick=fleet_pick, title=title)
    else:
        fig = overview(runs, pick=pick, budget_mib=budget_mib, title=title)
    Path(path).write_bytes(png.to_png(fig))
