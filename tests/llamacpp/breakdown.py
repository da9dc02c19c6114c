"""Group slotlab's failures of llama.cpp's server tests by what went wrong, for whoever fixes them.

    python -m tests.llamacpp.run_server_tests --server slotlab --only-real-passed --out /tmp/s.json
    python -m tests.llamacpp.breakdown /tmp/s.json [--md FILE]

Only tests that passed on the real llama-server count (the others say nothing about slotlab). A test
excused in not_modelled.toml is listed apart with its reason. The group key is the server's own error
line when it died (e.g. a refused flag), else the first line of the assertion, with numbers and ports
blanked so that one cause is one group."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

from tests.llamacpp import run_server_tests as runner


def cause(o: dict) -> str:
    said = o.get("server_said") or ""
    msg = o.get("message") or ""
    if "Server process died" in msg and said:
        key = "server did not start: " + said
    else:
        key = msg or o["outcome"]
    key = re.sub(r"\b\d+(\.\d+)?\b", "N", key)
    return key[:200]


def breakdown(slotlab: dict[str, dict]) -> str:
    real = json.loads(runner.REAL_OUTCOMES.read_text())["outcomes"]
    excused = runner.not_modelled()
    passed_real = sorted(n for n, o in real.items() if o["outcome"] == "passed")
    required = [n for n in passed_real if not runner.is_excused(n, excused)]
    ran = [n for n in passed_real if n in slotlab]
    ok = [n for n in required if slotlab.get(n, {}).get("outcome") == "passed"]
    groups: dict[str, list[str]] = defaultdict(list)
    for n in required:
        o = slotlab.get(n)
        if o is None:
            continue
        if o["outcome"] != "passed":
            groups[cause(o)].append(n)
    excused_rows = [(n, runner.is_excused(n, excused), slotlab.get(n, {}).get("outcome", "not run"))
                    for n in passed_real if runner.is_excused(n, excused)]
    out = [f"# slotlab serve vs llama.cpp's server tests",
           "",
           f"- real llama-server passes {len(passed_real)} tests; {len(excused_rows)} are excused "
           f"(not_modelled.toml); {len(required)} are required",
           f"- this run: {len(ran)} of the real server's passes ran on slotlab; "
           f"{len(ok)} of {len(required)} required pass",
           ""]
    out.append("## Required tests failing on slotlab, by cause")
    for key, ids in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        out.append(f"\n### {len(ids)} x `{key}`")
        out += [f"- {n}" for n in ids]
    out.append("\n## Excused (not modelled) tests")
    out += [f"- {n} ({outcome} on slotlab): {reason}" for n, reason, outcome in excused_rows]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("outcomes", type=Path, help="a run's JSON (run_server_tests --out)")
    ap.add_argument("--md", type=Path)
    a = ap.parse_args(argv)
    doc = json.loads(a.outcomes.read_text())
    text = breakdown(doc.get("outcomes", doc))
    if a.md:
        a.md.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
