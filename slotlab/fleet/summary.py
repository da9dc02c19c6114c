"""The fleet's totals: the same fields as one server's (`SimResult.totals`), over all its servers.

Why its own module: a fleet's figures are not a mean of the servers' (percentiles are taken over
every request, the peak cache is the sum of N machines' RAM), so they are computed again from the
merged rows the way `simulate` computes one server's. Counters (tokens, evictions, clears, disk
reads, engine steps) are sums; `sim_seconds` is the last server's clock; `infinite_cache_tokens` is
the bound of ONE infinite cache over the whole trace (what no router can beat), where each server's
own totals give the bound of its part. `bounds` (ideal caches of one server's memory) is kept for a
fleet of one only: each server's summary has its own. A field added to `simulate`'s totals later is
carried by `_carry` (agreed value, sum, or per-server list) rather than dropped."""

from __future__ import annotations

from collections import Counter

import numpy as np


def _pct(xs, q) -> float:
    return float(np.percentile(xs, q)) if len(xs) else 0.0


def _sum_dicts(ds) -> dict:
    c: Counter = Counter()
    for d in ds:
        c.update(d)
    return dict(c)


def _carry(vals: list):
    """A totals field the fleet does not compute itself, over the servers: one value where they all
    agree (a setting: the proposals run, the speed model), a sum of numbers or of counters (dicts of
    numbers), else the list of the servers' values. A fleet of one keeps its server's value."""
    if all(v == vals[0] for v in vals):
        return vals[0]
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
        return sum(vals)
    if all(isinstance(v, dict) and all(isinstance(x, (int, float)) for x in v.values()) for v in vals):
        return _sum_dicts(vals)
    return vals


def merge_totals(trace, results: list[dict], server_totals: list[dict], wall_s: float) -> dict:
    """The fleet's totals over its merged `results` (trace order) and its servers' totals."""
    acts = [d for d in results if "action" in d]
    ok = [d for d in results if d["status"] == 200 and "action" not in d]
    waits = [d["queue_wait"] for d in ok if d["queue_wait"] is not None]
    ttfts = [d["ttft"] for d in ok if d["ttft"] is not None]
    reused = sum(d["cache_n"] for d in ok)
    prefilled = sum(d["prompt_n"] for d in ok)
    st = server_totals
    n = len(results)
    if len(st) == 1:
        bound = st[0]["infinite_cache_tokens"]
    elif trace.block:
        from slotlab.ideal import infinite_hit_tokens

        mask = [d["status"] == 200 and "action" not in d for d in results]
        bound = infinite_hit_tokens(trace.requests, trace.block, mask)[0]
    else:
        bound = None
    t = {
        "n_requests": n - len(acts), "n_ok": len(ok), "n_errors": n - len(acts) - len(ok),
        "sim_seconds": max((x["sim_seconds"] for x in st), default=0.0), "wall_seconds": round(wall_s, 3),
        "prompt_tokens": reused + prefilled, "tokens_reused": reused, "tokens_prefilled": prefilled,
        "tokens_generated": sum(d["predicted_n"] for d in ok),
        "infinite_cache_tokens": bound,
        "evictions": _sum_dicts(x["evictions"] for x in st), "slot_clears": _sum_dicts(x["slot_clears"] for x in st),
        "peak_cache_bytes": sum(x["peak_cache_bytes"] for x in st),
        "disk_reads": sum(x["disk_reads"] for x in st), "disk_read_bytes": sum(x["disk_read_bytes"] for x in st),
        "queue_wait_p50": _pct(waits, 50), "queue_wait_p99": _pct(waits, 99),
        "ttft_p50": _pct(ttfts, 50), "ttft_p99": _pct(ttfts, 99),
        "speed": st[0]["speed"] if st else "",
        "n_steps": sum(x["n_steps"] for x in st),
        "fast_forward_steps": sum(x["fast_forward_steps"] for x in st),
        "fast_forwards": sum(x["fast_forwards"] for x in st),
    }
    if len(st) == 1 and st[0].get("bounds") is not None:
        t["bounds"] = st[0]["bounds"]
    for k in dict.fromkeys(k for x in st for k in x):  # fields this module does not know (yet)
        if k not in t and k != "bounds":
            t[k] = _carry([x.get(k) for x in st])
    if acts:
        t["n_actions"] = len(acts)
        t["action_errors"] = sum(1 for d in acts if d["status"] != 200)
    return t
