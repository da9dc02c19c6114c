"""Which of a golden trace's answers (NAME.llama-server.json, what the real server answered over HTTP)
a server log can show, and how a row read from a log is compared with the server's answer.

The server logs a completion, an erase (`clearing prompt with N tokens`) and a failed restore (the
library's error, the clear, `send_error`). It logs nothing for a successful save or restore: a save
changes nothing the log could show later; a restore shows by what follows it, when the slot then
holds other tokens than before and the slot is used (a completion in it, an erase, a failed restore)
before another restore overwrites it. An action the HTTP layer refused (a bad file name) never
reached the server loop: no line either."""

from __future__ import annotations


def strip(r: dict) -> dict:
    """A result without what a log never has nor a test compares (`content`, the reply's `timings`)."""
    r = {k: v for k, v in r.items() if k != "content"}
    if isinstance(r.get("reply"), dict):
        r["reply"] = {k: v for k, v in r["reply"].items() if k != "timings"}
    return r


def _n_slots(flags: list[str]) -> int:
    for i, f in enumerate(flags[:-1]):
        if f in ("-np", "--parallel"):
            return int(flags[i + 1])
    return 4  # the server's default


def log_can_show(trace: dict, results: list[dict]) -> list[bool]:
    """Per row of `results` (the server's answers to `trace["requests"]`): can the server's log show it?"""
    n_slots = _n_slots(trace.get("flags", []))
    held: dict[int, object] = {}  # slot -> what it holds (an opaque label), as far as the answers say
    files: dict[str, object] = {}
    out: list[bool] = []
    pending: dict[int, int] = {}  # slot -> index of a restore that nothing has shown yet
    for i, (q, r) in enumerate(zip(trace["requests"], results)):
        if "action" not in r:
            if r.get("id_slot") is not None:
                pending.pop(r["id_slot"], None)
                held[r["id_slot"]] = ("completion", i)
            out.append(True)
            continue
        s = q["id_slot"] % n_slots
        if r["status"] != 200:
            msg = r["reply"]["error"]["message"]
            out.append(msg.startswith(("Unable to restore slot", "Unable to save slot")))
            if msg.startswith("Unable to restore slot"):  # the slot was cleared
                pending.pop(s, None)
                held[s] = "empty"
            continue
        if r["action"] == "save":
            files[q["filename"]] = held.get(s, "empty")
            out.append(False)
        elif r["action"] == "erase":
            pending.pop(s, None)
            held[s] = "empty"
            out.append(True)
        else:  # restore
            new = files.get(q["filename"], ("file", q["filename"]))
            if s in pending:  # the earlier restore was overwritten before anything showed it
                out[pending.pop(s)] = False
            changed = new != held.get(s, "empty")
            held[s] = new
            out.append(changed)
            if changed:
                pending[s] = i
    for s, i in pending.items():  # never used afterwards: nothing showed it
        out[i] = False
    return out


def shown(trace: dict, results: list[dict]) -> list[dict]:
    """The rows of `results` a log can show, stripped."""
    return [strip(r) for r, ok in zip(results, log_can_show(trace, results)) if ok]


def agrees(got: dict, want: dict) -> bool:
    """`got` (read from a log) is `want` (the server's answer), except reply fields that are None and
    named in `got["lacks"]` (what the log does not give)."""
    lacks = got.get("lacks", [])
    if {k: v for k, v in got.items() if k not in ("reply", "lacks")} != {k: v for k, v in want.items() if k != "reply"}:
        return False
    if "reply" not in want:
        return "reply" not in got
    g, w = got.get("reply") or {}, want["reply"]
    return set(g) == set(w) and all(g[k] == w[k] or (g[k] is None and k in lacks) for k in w)


def known(rows: list[dict]) -> list[dict]:
    """The rows but the unlogged actions (bare `all slots are idle` lines: checked by `unlogged_fit`)."""
    return [r for r in rows if r.get("action") != "unlogged"]


def _segment_of(rows: list[dict]) -> list[int]:
    """Per row: how many completions come before it (actions between two completions share a segment)."""
    out, k = [], 0
    for r in rows:
        out.append(k)
        if "action" not in r:
            k += 1
    return out


def unlogged_fit(trace: dict, results: list[dict], got: list[dict]) -> str | None:
    """None if every unlogged row read from a log (a loop iteration that printed only `all slots are
    idle`) can be a task the server answered without a line: per stretch between two completions, no
    more unlogged rows and inferred restores together than the successful saves and restores the server
    answered there, unless the recorder read `/slots` there (it does before a request it does not wait
    for: tests/golden/record_traces.py), which makes such lines too. Else what does not fit."""
    seg_got = _segment_of(got)
    seg_res = _segment_of(results)
    n = max([*seg_got, *seg_res, 0]) + 1
    allowed = [0] * n
    reads = [False] * n
    for q, r, k in zip(trace["requests"], results, seg_res):
        if "action" in r and r["status"] == 200 and r["action"] in ("save", "restore"):
            allowed[k] += 1
        if "action" not in q and not q.get("wait", True):
            reads[k] = True
    used = [0] * n
    for r, k in zip(got, seg_got):
        if r.get("action") == "unlogged" or (r.get("action") == "restore" and r["status"] == 200):
            used[k] += 1
    bad = [k for k in range(n) if used[k] > allowed[k] and not reads[k]]
    return None if not bad else f"stretches {bad}: {[(used[k], allowed[k]) for k in bad]} (rows, answered actions)"
