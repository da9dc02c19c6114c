"""Can the fleet keep up? A warning when arrivals exceed what it serves, with the smallest N that would.

Why: a simulation of an overloaded fleet still ends (the trace is finite), and its hit rate and
TTFTs then describe a queue that grows for as long as the trace lasts, not the routers. Two signs
are checked, over the fleet's own run:

* busy: a server's work (below) exceeds the trace's span (first to last arrival): it would still be
  busy when the last request arrives, even with no idle gap;
* queue: the p99 queue wait exceeds `WAIT_LIMIT_S` and the last tenth of the trace waits longer
  than the first tenth (the wait grows instead of staying put).

Beside the estimate, `busy_s` is what the run shows: per server, the time it had a request launched
and not answered (a server busy past the last arrival is working off a backlog).

The work of a request is what the speed model charges for what the server actually did: prefilling
its `prompt_n` tokens (`decode_time` in micro-batches) plus generating its `predicted_n` tokens as
one of `-np` sequences stepping together (a step of -np rows, shared by -np: the best case of
batching). The smallest fleet that keeps up is ceil(total work / span): at that N the servers are
fully busy, so it is a lower bound (a larger fleet splits conversations more and may reuse less,
which adds prefill work; bursts need headroom above it)."""

from __future__ import annotations

import math

import numpy as np

#: the p99 queue wait (seconds) above which a fleet whose waits grow is called overloaded
WAIT_LIMIT_S = 30.0


def request_work(r: dict, speed, n_slots: int) -> float:
    """Busy seconds a request cost its server (module docstring); 0 for a refused one."""
    if r.get("status") != 200 or r.get("prompt_n") is None:
        return 0.0
    b = max(1, n_slots)
    return speed.decode_time(r["prompt_n"], 1) + r["predicted_n"] * speed.decode_time(b, b) / b


def busy_seconds(rows: list[dict]) -> float:
    """How long a server had at least one request launched and not answered: the union of the rows'
    [arrival + queue wait, end] (observed in the run, unlike the work estimate)."""
    iv = sorted((r["arrival"] + r["queue_wait"], r["end"]) for r in rows
                if r.get("queue_wait") is not None and r.get("end") is not None)
    total, lo, hi = 0.0, None, None
    for a, b in iv:
        if hi is None or a > hi:
            if hi is not None:
                total += hi - lo
            lo, hi = a, b
        else:
            hi = max(hi, b)
    return total + (hi - lo if hi is not None else 0.0)


def check(trace, results: list[dict], choices: list[int], n: int, speed, n_slots: int) -> dict:
    """The capacity verdict of a fleet run: per-server work, the span, the signs, the smallest N."""
    arr = [q.arrival for q in trace.requests]
    span = (max(arr) - min(arr)) if arr else 0.0
    work = [0.0] * n
    for r in results:
        work[choices[r["i"]]] += request_work(r, speed, n_slots)
    total = sum(work)
    per: list[list[dict]] = [[] for _ in range(n)]
    for r in results:
        per[choices[r["i"]]].append(r)
    ok = [r for r in results if r.get("status") == 200 and r.get("queue_wait") is not None]
    waits = [r["queue_wait"] for r in ok]
    p99 = float(np.percentile(waits, 99)) if waits else 0.0  # as the totals take it
    tenth = max(1, len(ok) // 10)
    first = sorted(r["queue_wait"] for r in ok[:tenth])
    last = sorted(r["queue_wait"] for r in ok[-tenth:])
    med = lambda xs: xs[len(xs) // 2] if xs else 0.0  # noqa: E731
    growing = med(last) > med(first)
    busy = [s for s in range(n) if span > 0 and work[s] > span]
    queue = p99 > WAIT_LIMIT_S and growing
    need = math.ceil(total / span) if span > 0 else None
    return {"span_s": round(span, 3), "work_s": [round(w, 3) for w in work],
            "busy_s": [round(busy_seconds(rows), 3) for rows in per], "busy_servers": busy,
            "queue_wait_p99": round(p99, 3), "queue_wait_first_tenth_median": round(med(first), 3),
            "queue_wait_last_tenth_median": round(med(last), 3), "overloaded": bool(busy or queue),
            "min_servers": need}


def warning(c: dict, n: int) -> str | None:
    """The one-paragraph warning of an overloaded fleet (None when it keeps up)."""
    if not c["overloaded"]:
        return None
    why = []
    if c["busy_servers"]:
        w = max(c["work_s"])
        why.append(f"{len(c['busy_servers'])} of {n} servers have more work than the trace's span "
                   f"(up to {w:.0f} s of prefill + generation in {c['span_s']:.0f} s)")
    if c["queue_wait_p99"] > WAIT_LIMIT_S:
        why.append(f"p99 queue wait {c['queue_wait_p99']:.1f} s (> {WAIT_LIMIT_S:g} s), median "
                   f"{c['queue_wait_first_tenth_median']:.1f} s in the first tenth of the trace, "
                   f"{c['queue_wait_last_tenth_median']:.1f} s in the last")
    need = c["min_servers"]
    how = "total prefill + generation work of this run / the trace's span, at full batching: a lower bound"
    if need is None:
        tail = ""
    elif need > n:
        tail = f"At least {need} servers would keep up ({how})."
    else:
        tail = (f"The work fits {need} server{'s' if need > 1 else ''} on average ({how}): the waits come from "
                f"bursts; try a fleet of more than {n}.")
    return "warning: arrivals exceed what the fleet serves: " + "; ".join(why) + ". " + tail
