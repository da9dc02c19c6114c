"""`slotlab whatif TRACE --proposals`: llama-server as built, each proposal, and the ideal caches on one trace.

The question after "which flag" is "which change to llama-server": this runs the trace once under the
build's own rules (the flags given), once per modelled proposal (slotlab.proposals: its flags added,
everything else the build's), and reads the ideal prefix caches of the same memory from the first run
(slotlab.ideal: LRU, Belady-optimal, infinite; only for traces with block ids). Every row is counted
over the same requests and prompt tokens as `slotlab simulate`'s totals, so the rows compare directly:
tokens reused, tokens prefilled, the prefill time that saves at the speed model's rate, the RAM the
cache held. A proposal's row says whether a patched llama-server's goldens back it (`verified`).

The runs go through `slotlab.sim.whatif.run_settings`: local processes or a Dask cluster, as the rest of
whatif."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from slotlab.proposals import PROPOSALS

__all__ = ["PricedRow", "settings", "price", "rows_of", "table_lines", "as_json"]

AS_BUILT = "llama-server as built"
IDEALS = (("lru", "ideal LRU"), ("optimal", "ideal optimal"), ("infinite", "infinite cache"))


@dataclass
class PricedRow:
    name: str
    kind: str  # "server" (as built), "proposal", "ideal"
    origin: str
    reused: int
    prefilled: int
    prompt_tokens: int
    verified: bool | None = None  # proposals only
    peak_cache_bytes: int | None = None  # the RAM cache's peak (ideal rows: their budget)
    prefill_seconds_saved: float = 0.0  # against the server as built, at the speed model's prefill rate
    ttft_p50: float | None = None
    n_errors: int = 0
    error: str | None = None
    args: tuple = ()
    note: str = ""

    @property
    def reuse(self) -> float:
        return self.reused / self.prompt_tokens if self.prompt_tokens else 0.0


def settings(base: list[str]) -> list[tuple[dict, list[str]]]:
    """The runs: the flags as given, then each modelled proposal's flags added to them."""
    out = [({"proposal": AS_BUILT}, list(base))]
    for p in PROPOSALS.values():
        if p.modelled:
            out.append(({"proposal": p.name}, [*base, *p.args]))
    return out


def rows_of(runs, speed) -> list[PricedRow]:
    """The table's rows from `run_settings`' runs (the first: as built, with the bounds)."""
    base = runs[0]
    if base.error:
        raise RuntimeError(f"the trace did not run under the flags given: {base.error}")
    per_token = speed.ubatch_time(speed.n_ubatch) / speed.n_ubatch  # seconds a prompt token costs in a long prefill

    def saved(prefilled: int) -> float:
        return (base.tokens_prefilled - prefilled) * per_token

    rows = [PricedRow(AS_BUILT, "server", "the build's own rules", base.tokens_reused, base.tokens_prefilled,
                      base.prompt_tokens, peak_cache_bytes=base.peak_cache_bytes, ttft_p50=base.ttft_p50,
                      n_errors=base.n_errors, args=tuple(base.flags))]
    for r in runs[1:]:
        p = PROPOSALS[r.setting["proposal"]]
        if r.error:
            rows.append(PricedRow(p.name, "proposal", p.origin, 0, 0, base.prompt_tokens, verified=p.verified,
                                  error=r.error, args=p.args))
            continue
        same = r.prompt_tokens == base.prompt_tokens
        notes = [] if same else ["other requests failed: its totals count other requests"]
        secs = saved(r.tokens_prefilled)
        read = r.extra.get("disk_read_bytes", 0)
        if read:  # the disk tier's reads cost time the prefill saved must pay for
            from slotlab.engine.params import ServerParams
            bw = ServerParams.from_args(list(r.flags)).cache_disk_bandwidth
            secs -= read / (bw * 1e6)
            notes.append(f"{read / 2**30:.1f} GiB read from disk at {bw} MB/s, counted")
        rows.append(PricedRow(p.name, "proposal", p.origin, r.tokens_reused, r.tokens_prefilled, r.prompt_tokens,
                              verified=p.verified, peak_cache_bytes=r.peak_cache_bytes,
                              prefill_seconds_saved=secs, ttft_p50=r.ttft_p50,
                              n_errors=r.n_errors, args=p.args, note="; ".join(notes)))
    b = base.extra.get("bounds")
    if b:
        gib = b.get("budget_gib")  # None: no byte limit (--cache-ram -1), the ideal caches are infinite too
        for key, name in IDEALS:
            reused = int(b[key])
            sized = key != "infinite" and gib is not None
            rows.append(PricedRow(name, "ideal", "slotlab.ideal (kvcache-simulator's rules)", reused,
                                  base.prompt_tokens - reused, base.prompt_tokens,
                                  peak_cache_bytes=int(gib * 2**30) if sized else None,
                                  prefill_seconds_saved=saved(base.prompt_tokens - reused),
                                  note=f"{b['block_tokens']}-token blocks" + (
                                      f", {gib:.2f} GiB" if sized else ", no memory limit" if key != "infinite"
                                      else "")))
    return rows


def price(trace: str, base: list[str], *, speed, profile: str | None = None, limit: int | None = None,
          time_scale: float = 1.0, jobs: int | None = None, progress=None, scheduler=None) -> list[PricedRow]:
    """Run the trace as built and under each proposal; the priced rows (as built, proposals, ideals)."""
    from slotlab.sim.whatif import run_settings

    runs = run_settings(trace, settings(base), speed=speed, profile=profile, limit=limit, time_scale=time_scale,
                        jobs=jobs, progress=progress, scheduler=scheduler, bounds_first=True)
    return rows_of(runs, speed)


def table_lines(rows: list[PricedRow]) -> list[str]:
    w = max(len(r.name) for r in rows)
    head = f"{'':<{w}} {'reused':>13} {'prefilled':>11} {'prefill saved':>13} {'RAM':>9}  status"
    out = [head, "-" * len(head)]
    for r in rows:
        if r.error:
            out.append(f"{r.name:<{w}} failed: {r.error}")
            continue
        status = {True: "verified", False: "unverified", None: ""}[r.verified] if r.kind == "proposal" else (
            "(the flags given)" if r.kind == "server" else "ideal: no llama-server rule")
        if r.kind == "proposal":
            status += f" · {r.origin}"
        ram = "-" if r.peak_cache_bytes is None else f"{r.peak_cache_bytes / 2**30:.2f} GiB"
        out.append(f"{r.name:<{w}} {r.reused:>8,} {100 * r.reuse:>4.1f}% {r.prefilled:>11,} "
                   f"{r.prefill_seconds_saved:>12,.1f}s {ram:>9}  {status}" + (f" ({r.note})" if r.note else ""))
    if not any(r.kind == "ideal" for r in rows):
        out.append("ideal caches: this trace has no block ids (Mooncake hash_ids), so no ideal bound is computed")
    props = [r for r in rows if r.kind == "proposal" and not r.error]
    best = max(props, key=lambda r: (r.prefill_seconds_saved, r.reused), default=None)
    built = rows[0]
    # a change smaller than 0.1 % of what the server prefills is noise for a decision, not a best change
    if best is not None and best.prefill_seconds_saved > 0 and built.prefilled - best.prefilled >= built.prefilled / 1000:
        out.append(f"best change to llama-server here: {best.name} ({best.origin}, "
                   f"{'verified' if best.verified else 'unverified'}): {best.reused - built.reused:,} tokens more "
                   f"reused, {best.prefill_seconds_saved:,.1f} s of prefill saved")
    elif best is not None:
        more = [r.name for r in props if r.reused > built.reused]
        out.append("no proposal saves 0.1 % of the prefill of llama-server as built on this traffic" + (
            f" ({', '.join(more)} reuse more tokens: too few, or at a cost that outweighs them)" if more else ""))
    return out


def as_json(rows: list[PricedRow]) -> dict:
    """`whatif --proposals --json`: the server as built, `proposals` (name, origin, reused, prefilled,
    verified, ...), and the ideal rows."""
    def one(r: PricedRow) -> dict:
        d = asdict(r)
        d["args"] = list(r.args)
        return d
    return {"as_built": one(rows[0]),
            "proposals": [one(r) for r in rows if r.kind == "proposal"],
            "ideal": [one(r) for r in rows if r.kind == "ideal"]}
