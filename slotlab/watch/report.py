"""`slotlab watch --log FILE`: read a finished llama-server log and report each request the way
`slotlab replay` does (`--json`: the golden-trace schema, plus `build`: the llama.cpp build the log names
and what its log cannot give; `--events F`: every event as JSON lines)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from slotlab.engine import event_types as T
from slotlab.errors import SlotlabError
from slotlab.explain import Explainer
from slotlab.watch.divergence import Divergence, read_divergences, short
from slotlab.watch.log_reader import LogReader, flags_of, requests_json


def read(path: str | Path) -> tuple[LogReader, list]:
    """The reader after the whole file, and its events; a SlotlabError when the file cannot be read."""
    rd = LogReader()
    try:
        events = rd.read_file(path)
    except OSError as e:
        raise SlotlabError(f"cannot read log {path}: {e.strerror or e}") from None
    return rd, events


def read_log_divergences(path: str | Path) -> dict:
    """The LLAMA_SERVER_SLOTS_DEBUG blocks of a log file, by task (slotlab.watch.divergence)."""
    try:
        with open(path, "rb") as f:
            return read_divergences(f)
    except OSError as e:
        raise SlotlabError(f"cannot read log {path}: {e.strerror or e}") from None


def write_events(events: list, path: str | Path) -> int:
    """Every event as one JSON object per line (the format `slotlab replay --events` writes)."""
    with open(path, "w") as f:
        for e in events:
            f.write(json.dumps(e.to_json(), allow_nan=True) + "\n")
    return len(events)


def _order(events: list) -> dict[int, int]:
    """task id -> request index (0-based, in the order the prompts started)."""
    return {t: i for i, t in enumerate(e.task for e in events if e.kind == T.PROMPT_PLAN)}


def misses(events: list, divergences: dict | None = None) -> tuple[list, dict]:
    """The misses a log shows, as (request index, Miss), and tokens lost by cause: slotlab.explain's fold
    over the reader's events. A log names no tokens, so what it can explain is what its numbers say:
    the lcp of each idle slot (-lv 4 similarity lines) and of each RAM entry a load listed, and the
    checkpoint lines (forced re-processing, a checkpoint restored short of the divergence). With
    `divergences` (slotlab.watch.divergence: the LLAMA_SERVER_SLOTS_DEBUG lines), a miss in the slot
    the task ran in gets the text on both sides of the divergence."""
    x = Explainer().fold(events)
    order = _order(events)
    for m in x.misses:
        d = (divergences or {}).get(m.task)
        if d is not None and d.diverged and m.where == f"slot {d.slot}" and not (m.prompt_text or m.held_text):
            m.prompt_text, m.held_text = d.prompt, d.held
    return [(order.get(m.task, -1), m) for m in x.misses], dict(x.lost_by_cause)


#: why a server's log alone shows no client changes
NO_MESSAGES = ("a server log carries no chat messages: to see what the client changed between calls and have "
               "advice tested on the whole session, record the traffic (slotlab proxy --record session.jsonl "
               "--flags \"...\") and run slotlab simulate session.jsonl --why")


#: why a log shows no text around the divergences
NO_DIFF = ("the log shows no text around the divergences: start llama-server with LLAMA_SERVER_SLOTS_DEBUG=1 "
           "(and LLAMA_SERVER_SLOTS_N_DIFF=N for N tokens before each; it shows N + 2 after)")


def diverged(events: list, divergences: dict | None) -> list[tuple[int, Divergence]]:
    """(request index, Divergence) of every task whose prompt left what its slot held, in request order."""
    order = _order(events)
    return sorted(((order.get(t, -1), d) for t, d in (divergences or {}).items() if d.diverged),
                  key=lambda x: x[0])


def why_lines(events: list, divergences: dict | None = None) -> list[str]:
    """The misses a log shows with their causes. No trace can be replayed from a log, so no flag change
    is offered (each line says how to test them: explain.NOT_TESTED). Where the log
    has the text around a prompt's divergence, each request that left what its slot held shows it (the
    change itself may be the client's: the server's flags cannot undo that)."""
    found, lost = misses(events, divergences)
    rows = [(i, f"#{i} {m.line()}") for i, m in found]
    with_miss = {m.task for _, m in found if m.prompt_text or m.held_text}
    for i, d in diverged(events, divergences):
        if d.task not in with_miss:
            rows.append((i, f"#{i} task {d.task}: the prompt left what slot {d.slot} held at ' | ': "
                            f"held '{short(d.held)}' / prompt '{short(d.prompt)}'"))
    out = [r for _, r in sorted(rows, key=lambda x: x[0])]
    tot = ", ".join(f"{c} {n}" for c, n in sorted(lost.items(), key=lambda kv: -kv[1]))
    out.append(f"tokens lost by cause: {tot or 'none'}")
    return out


#: what the report says of a task the log shows only as a bare `all slots are idle` line
UNLOGGED = ("a task the server logs only as `all slots are idle`: a save, a restore nothing later reveals, or a "
            "/slots or /metrics read (the kind, slot, file and sizes are not in the log; a recording proxy has them)")


def run(log: str, *, as_json: bool = False, events_path: str | None = None, out=None, why: bool = False) -> int:
    out = out or sys.stdout
    rd, events = read(log)
    if events_path:
        write_events(events, events_path)
    results = requests_json(events)
    if as_json:
        doc = {"flags": flags_of(events), "results": results, "build": rd.build.summary()}
        if why:
            divs = read_log_divergences(log)
            found, lost = misses(events, divs)
            doc["misses"] = [{"request": i, **m.as_dict()} for i, m in found]
            doc["lost_by_cause"] = lost
            doc["divergences"] = [{"request": i, **d.as_dict()} for i, d in diverged(events, divs)]
            doc["client_changes"] = []  # a log has no messages (NO_MESSAGES)
            doc["notes"] = [NO_MESSAGES, *([NO_DIFF] if not divs and results else [])]
        print(json.dumps(doc, indent=1, ensure_ascii=False), file=out)
        return 0
    head = f"{'#':>3} {'kind':<8} {'slot':>4} {'status':>6} {'cached':>7} {'prefill':>7} {'tokens':>7}  detail"
    print(head, file=out)
    for i, r in enumerate(results):
        if "action" in r:
            rep = r["reply"]
            det = (rep["error"]["message"] if "error" in rep else
                   UNLOGGED if r["action"] == "unlogged" else json.dumps(rep))
            slot = rep.get("id_slot", "-")
            print(f"{i:>3} {r['action']:<8} {slot:>4} {r['status']:>6} {'':>7} {'':>7} {'':>7}  {det}", file=out)
        elif r["status"] is None:
            print(f"{i:>3} {'request':<8} {r['id_slot']:>4} {'-':>6} {'':>7} {'':>7} {'':>7}  not finished in this log",
                  file=out)
        elif r["status"] != 200:
            print(f"{i:>3} {'request':<8} {'-':>4} {r['status']:>6} {'':>7} {'':>7} {'':>7}  {r['error']['message']}",
                  file=out)
        else:
            print(f"{i:>3} {'request':<8} {r['id_slot']:>4} {r['status']:>6} {r['cache_n']:>7} {r['prompt_n']:>7} "
                  f"{r['tokens_evaluated']:>7}", file=out)
    n_trc = sum(1 for e in events if e.level == "TRC" and e.message)
    typed = sum(1 for e in events if e.kind in T.REGISTRY)
    print(f"{rd.n_lines} lines read ({rd.n_plain} kept as plain log lines), {typed} typed events", file=out)
    print(rd.build.line(), file=out)
    for e in events:  # the one warning when the log is from another build than slotlab models
        if e.kind == T.LOG and e.message.startswith("slotlab watch: this log is from"):
            print(e.message, file=out)
    if n_trc == 0 and rd.n_lines:
        print("no TRC lines in this log (llama-server below -lv 4): slot choice scores, RAM-cache saves and loads, "
              "checkpoints and erases are not shown; cache_n and tokens_evaluated are derived from the timings",
              file=out)
    for p in rd.problems[:5]:
        print(f"reader problem: {p}", file=out)
    if why:
        divs = read_log_divergences(log)
        print("\n".join(why_lines(events, divs)), file=out)
        if not divs and results:
            print(f"note: {NO_DIFF}", file=out)
        print(f"note: {NO_MESSAGES}", file=out)
    return 0
