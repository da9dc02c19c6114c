"""`slotlab report FLEET.json`: a fleet run (what `slotlab simulate --fleet N --json` printed), server by
server: what each received and why (the router's reasons, counted), what it reused, how its RAM cache
fared (peak bytes, evictions by reason), its queue and TTFT; and `--png` the lanes of
`slotlab.figures.fleet`.

Why from the JSON and not by running again: the fleet's run is the record (the same way a session log
is for an agent's report); reading it back costs nothing and shows exactly what was simulated, with the
flags, profile speed and router it ran under. Every figure is the JSON's own."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

from slotlab.errors import TraceError

__all__ = ["is_fleet_json", "load_fleet", "lines"]


def is_fleet_json(path) -> bool:
    p = Path(path)
    if p.suffix.lower() != ".json" or not p.is_file():
        return False
    try:
        with open(p, encoding="utf-8") as f:
            head = f.read(4096)
    except OSError:
        return False
    return '"fleet"' in head and head.lstrip().startswith("{")


def load_fleet(path) -> dict:
    try:
        d = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise TraceError(f"cannot read the fleet run {path}: {e}") from None
    missing = [k for k in ("fleet", "servers", "routing", "results", "totals") if k not in d]
    if missing:
        raise TraceError(f"{path}: not a fleet run (missing {', '.join(missing)}; write one with "
                         "`slotlab simulate TRACE --fleet N --router R --json > run.json`)")
    return d


def _reason(why: str) -> str:
    """A router's reason without its numbers: 'session: blocks [0, 1] hashes to server 2' -> 'session: blocks
    [..] hashes to server N'; counted per server."""
    return re.sub(r"\d+", "N", re.sub(r"\[[^\]]*\]", "[..]", why))


def lines(d: dict) -> list[str]:
    f, t = d["fleet"], d["totals"]
    pct = lambda a, b: f"{100 * a / b:.1f} %" if b else "-"  # noqa: E731
    out = [f"fleet       {f['servers']} servers behind the {f['router']} router ({' '.join(d.get('flags') or [])})",
           f"            the router sees {f['router_sees']}",
           f"            {f['how']}",
           f"total       {t['n_requests']} requests, {pct(t['tokens_reused'], t['prompt_tokens'])} of "
           f"{t['prompt_tokens']:,} prompt tokens reused, TTFT p50 {t['ttft_p50']:.2f} s, p99 {t['ttft_p99']:.2f} s"]
    if t.get("speed"):
        out.append(f"speed       {t['speed']}")
    res = {r["i"]: r for r in d["results"]}
    for s in d["servers"]:
        st = s["totals"]
        mine = [r for r in d["routing"] if r["server"] == s["server"]]
        ev = st.get("evictions") or {}
        out += ["", f"server {s['server']}    {st['n_requests']} requests ({st.get('n_errors', 0)} refused), "
                f"{pct(st['tokens_reused'], st['prompt_tokens'])} of {st['prompt_tokens']:,} prompt tokens reused",
                f"  cache     peak {st.get('peak_cache_bytes', 0) / 2**20:,.1f} MiB; evictions: "
                + (", ".join(f"{k} {v}" for k, v in sorted(ev.items())) or "none"),
                f"  latency   queue wait p99 {st['queue_wait_p99']:.2f} s, TTFT p50 {st['ttft_p50']:.2f} s, "
                f"p99 {st['ttft_p99']:.2f} s"]
        why = Counter(_reason(r["why"]) for r in mine)
        out.append("  routed    " + "; ".join(f"{n} x {w}" for w, n in why.most_common(4))
                   + (f"; {len(why) - 4} more reasons" if len(why) > 4 else ""))
        cold = sum(1 for r in mine if (res.get(r["i"], {}).get("cache_n") or 0) == 0
                   and res.get(r["i"], {}).get("status") == 200)
        out.append(f"  cold      {cold} of its requests reused nothing")
    w = None
    if d.get("capacity"):
        from slotlab.fleet.capacity import warning

        w = warning(d["capacity"], f["servers"])
    if w:
        out += ["", w]
    return out
