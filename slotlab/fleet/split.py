"""A server's part of the trace, and its results in the trace's numbering.

Why: each server is an unchanged simulation of its own trace, so a part is a `SimTrace` of the
requests routed there (the same request objects, in trace order, with their arrivals: the server
sees them when the router sent them; a router adds no delay here). Its results are numbered within
the part; `to_global` renumbers them as the whole trace's (`i`), so a fleet of one gives exactly
`slotlab simulate`'s rows."""

from __future__ import annotations

from slotlab.sim.traces import SimTrace


def parts_of(choices: list[int], n: int) -> list[list[int]]:
    """Per server, the trace indices routed there, in trace order."""
    out: list[list[int]] = [[] for _ in range(n)]
    for i, s in enumerate(choices):
        out[s].append(i)
    return out


def subtrace(trace: SimTrace, idx: list[int]) -> SimTrace:
    """The trace of one server: the requests `idx`, everything else of `trace` as it is."""
    return SimTrace(list(trace.flags), [trace.requests[i] for i in idx], trace.path, notes=[], block=trace.block,
                    files=trace.files, vocab=trace.vocab, header=trace.header)


def to_global(results: list[dict], idx: list[int]) -> list[dict]:
    """A part's result rows with `i` the trace's index (copies: a cached run's rows stay as they were)."""
    return [{**r, "i": idx[r["i"]]} for r in results]
