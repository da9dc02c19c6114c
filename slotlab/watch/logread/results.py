"""What each request got, folded from events (a log reader's or the engine's), in `slotlab replay
--json`'s schema: the result list `slotlab watch --log F --json` prints and the golden tests compare."""

from __future__ import annotations

from typing import Iterable

from slotlab.engine import event_types as T


def requests_json(events: Iterable) -> list[dict]:
    """What each request got, in `slotlab replay --json`'s schema, folded from events (a log reader's or
    the engine's): completions in task-id order (= arrival order) with slot, cache_n, prompt_n,
    tokens_evaluated, tokens_cached, status and error (`content` is None: the log has no text); slot
    actions where the events show them: erase (`slot_clear` reason `erase`), save / restore
    (`slot_saved` / `slot_restored`) and their errors (a `task_error` of a task that never ran in a slot).

    The server logs nothing for a successful save or restore: a log reader infers a restore from what
    follows it (`slot_restored` with filename ""), and its row holds None where the log has no value,
    with those fields named in `lacks` (`slotlab.watch.http_side.fill` takes them from the HTTP
    answers). A save, or a restore nothing reveals, shows at most as a loop iteration that printed only
    `all slots are idle` (`slot_action_unlogged`): its row has action "unlogged", status 200 (a failed
    save or restore prints its error), `may_be` (save, restore, or a /slots or /metrics read) and
    `lacks` naming everything else. An inferred restore takes the place of the last such row before
    it (the bare idle line the restore itself left); a save whose loop iteration printed nothing at all
    (it ran in the same iteration as other work) has no row."""
    comps: dict[int, dict] = {}
    rows: list[tuple[float, int, dict]] = []  # (order key, position, result)
    unlogged: list[int] = []  # indices in `rows` of unlogged actions no inferred restore claimed
    max_task = -1
    pos = 0

    def add(key: float, r: dict) -> None:
        nonlocal pos
        rows.append((key, pos, r))
        pos += 1

    for e in events:
        k, d = e.kind, e.payload
        if k == T.TASK_LAUNCHED:
            if e.task not in comps:
                c = comps[e.task] = {"status": None, "id_slot": e.slot, "cache_n": None, "prompt_n": None,
                                     "tokens_evaluated": d.n_tokens, "tokens_cached": None, "content": None,
                                     "error": None}
                add(e.task, c)
            else:
                comps[e.task]["tokens_evaluated"] = d.n_tokens
        elif k == T.TASK_DONE and e.task in comps:
            c = comps[e.task]
            n_eval = c["tokens_evaluated"]
            if n_eval is None or n_eval < 0:
                n_eval = d.tokens_cached - d.predicted_n + 1
            c.update(status=200, id_slot=e.slot, cache_n=d.cache_n, prompt_n=d.prompt_n, tokens_evaluated=n_eval,
                     tokens_cached=d.tokens_cached)
        elif k in (T.TASK_ERROR, T.TASK_CANCELLED):
            code, type_ = (d.code, d.type) if k == T.TASK_ERROR else (499, "cancelled")
            err = {"code": code, "message": e.message if k == T.TASK_ERROR else "request cancelled by the client",
                   "type": type_}
            if e.task in comps:
                comps[e.task].update(status=code, id_slot=None, cache_n=None, prompt_n=None, tokens_evaluated=None,
                                     tokens_cached=None, content=None, error=err)
            else:
                action = ("restore" if e.message.startswith("Unable to restore slot") else
                          "save" if e.message.startswith("Unable to save slot") else None)
                if action is not None:
                    add(e.task, {"action": action, "status": code, "reply": {"error": err}})
        elif k == T.SLOT_CLEAR and d.reason == "erase":
            add(max_task + 0.5, {"action": "erase", "status": 200,
                                 "reply": {"id_slot": e.slot, "n_erased": d.n_tokens}})
        elif k == T.SLOT_SAVED:
            add(e.task, {"action": "save", "status": 200, "reply": {
                "id_slot": e.slot, "filename": d.filename, "n_saved": d.n_tokens, "n_written": d.n_bytes}})
        elif k == T.SLOT_ACTION_UNLOGGED:
            unlogged.append(len(rows))
            add(max_task + 0.5, {"action": "unlogged", "status": 200, "may_be": list(d.may_be), "reply": {},
                                 "lacks": ["action", "id_slot", "filename", "n_tokens", "n_bytes"]})
        elif k == T.SLOT_RESTORED and not d.filename:  # inferred from a log: the server printed nothing
            reply = {"id_slot": e.slot, "filename": None, "n_restored": d.n_tokens if d.n_tokens >= 0 else None,
                     "n_read": None}
            row = {"action": "restore", "status": 200, "reply": reply, "lacks": [f for f, v in reply.items() if v is None]}
            # before the task it names (the one whose launch showed it), else after what was seen so far
            key = e.task - 0.5 if e.task >= 0 else max_task + 0.5
            # the bare idle line this restore left: after the last completion before it
            j = next((j for j in reversed(unlogged) if rows[j][0] <= key), None)
            if j is not None and any(rows[j][0] < t < key for t in comps):
                j = None
            if j is not None:
                unlogged.remove(j)
                rows[j] = (rows[j][0], rows[j][1], row)
            else:
                add(key, row)
        elif k == T.SLOT_RESTORED:
            add(e.task, {"action": "restore", "status": 200, "reply": {
                "id_slot": e.slot, "filename": d.filename, "n_restored": d.n_tokens, "n_read": d.n_bytes}})
        if e.task > max_task and (k in (T.TASK_LAUNCHED, T.TASK_ERROR, T.TASK_DONE, T.SLOT_SAVED)
                                  or (k == T.SLOT_RESTORED and d.filename)):
            max_task = e.task
    rows.sort(key=lambda r: (r[0], r[1]))
    return [r for _, _, r in rows]


def flags_of(events: Iterable) -> list[str]:
    """The flags the `init` event reconstructs from the log (empty when the log has no start-up)."""
    for e in events:
        if e.kind == T.INIT:
            return list(e.payload.flags)
    return []
