"""What the HTTP side knows that a llama-server log does not: the answers of the slot actions.

The server logs nothing for a successful `POST /slots/N?action=save` or `restore`: a log reader infers
a restore from what follows it (its row says in `lacks` what it could not read: the file name, the bytes
read, sometimes the length) and cannot see a save at all. Whoever saw the HTTP traffic has the answers:
the recording proxy of `slotlab watch --twin` / `--proxy-port` (every request, in arrival order), or the
panel's own controls (`Watch.slot_action`). `fill(log_rows, http_rows)` puts the two together:

* completions come from the log (what the server decided), the fields the log lacks (`content`) from
  the matching HTTP answer: the k-th completion the HTTP side saw is the log's k-th (task ids are given
  in arrival order);
* between two completions, each action row of the log is matched, in order, to the HTTP side's next
  action of the same kind on the same slot (a failed one: the same kind and status) and replaced by the
  HTTP answer; an "unlogged" row (a bare `all slots are idle` line) to the next successful save or
  restore no later row of the log names; HTTP actions the log did not show (saves, restores nothing
  revealed) are put where the HTTP side saw them; log rows the HTTP side did not see (a client that
  bypassed the proxy, an unlogged row that was a /slots or /metrics read) stay, with their `lacks`.

An HTTP row may carry `_after`: the number of log completions launched before it (the panel's controls
know it, the proxy does not need it). Rows are the `slotlab replay --json` schema."""

from __future__ import annotations


def _is_action(r: dict) -> bool:
    return "action" in r


def _segments(rows: list[dict], after: list[int | None] | None = None) -> tuple[list[dict], list[list[dict]]]:
    """(completions, actions before each completion and after the last: len(completions) + 1 lists)."""
    comps: list[dict] = []
    segs: list[list[dict]] = [[]]
    for i, r in enumerate(rows):
        if _is_action(r):
            k = after[i] if after is not None and after[i] is not None else None
            if k is None:
                segs[-1].append(r)
            else:
                while len(segs) <= k:
                    segs.append([])
                segs[k].append(r)
        else:
            comps.append(r)
            if after is None:
                segs.append([])
    return comps, segs


def _same(log: dict, http: dict) -> bool:
    if log["action"] == "unlogged":  # a bare idle line: any save or restore that succeeded
        return http.get("action") in ("save", "restore") and http.get("status") == 200
    if log["action"] != http["action"] or log["status"] != http["status"]:
        return False
    if log["status"] != 200:
        return True
    return (log.get("reply") or {}).get("id_slot") == (http.get("reply") or {}).get("id_slot")


def _merge_actions(log: list[dict], http: list[dict]) -> list[dict]:
    out: list[dict] = []
    used = [False] * len(http)
    pos = 0  # HTTP rows before `pos` are placed
    for i, r in enumerate(log):
        j = next((j for j in range(pos, len(http)) if not used[j] and _same(r, http[j])
                  # an unlogged row takes no answer a later row of the log names exactly
                  and not (r["action"] == "unlogged" and any(x["action"] != "unlogged" and _same(x, http[j])
                                                              for x in log[i + 1:]))), None)
        if j is None:
            out.append(r)  # the HTTP side did not see it
            continue
        for k in range(pos, j):  # what the HTTP side saw before it (saves, unseen restores)
            if not used[k]:
                out.append(http[k])
                used[k] = True
        out.append(http[j])
        used[j] = True
        pos = j + 1
    out += [h for k, h in enumerate(http) if not used[k]]
    return out


def _fill_completion(log: dict, http: dict | None) -> dict:
    if http is None or _is_action(http):
        return log
    return {k: (http.get(k) if v is None and log.get("status") == http.get("status") else v) for k, v in log.items()}


def fill(log_rows: list[dict], http_rows: list[dict], after: list[int | None] | None = None) -> list[dict]:
    """The log's rows with what the HTTP side answered (see the module docstring)."""
    http_rows = [{k: v for k, v in r.items() if k != "_after"} if isinstance(r, dict) else r for r in http_rows]
    lc, ls = _segments(log_rows)
    hc, hs = _segments(http_rows, after)
    if after is not None:
        hc = []  # the panel's rows: no completions to align, positions given
    while len(hs) < len(ls):
        hs.append([])
    out: list[dict] = []
    for i in range(len(ls)):
        h = hs[i] if i < len(hs) else []
        if i == len(ls) - 1:  # after the log's last completion: every HTTP action left
            h = [r for seg in hs[i:] for r in seg]
        out += _merge_actions(ls[i], h)
        if i < len(lc):
            out.append(_fill_completion(lc[i], hc[i] if i < len(hc) else None))
    return out
