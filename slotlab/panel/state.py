"""The panel's model: a fold over engine events, with no widgets and no engine access.

`PanelState.apply(event)` is the reducer; `PanelState.rebuild(events)` replays a prefix of the log,
which is what the time slider does. Everything it keeps is bounded (ring buffers), so a long run
does not grow it."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

EVICTION_REASONS = ("make_room", "byte_limit", "token_limit", "obsolete_prefix", "loaded", "shrink", "idle_clear",
                    "purge", "cleared")
PROVENANCE = ("kept", "cache", "file", "checkpoint", "shifted", "prefill", "generated")


@dataclass
class SlotView:
    id: int
    state: str = "idle"
    task: int = -1
    n_tokens: int = 0
    n_prompt: int = 0
    n_past: int = 0
    prompt_n: int = 0
    n_gen: int = 0
    prov: list = field(default_factory=list)
    divergence: int = -1
    div_text: str = ""
    origin: str = "slot"
    shifts: list = field(default_factory=list)
    checkpoints: list = field(default_factory=list)  # (pos_min, pos_max, n_tokens, size, id_task)
    why: str = ""


@dataclass
class PanelState:
    n_slots: int = 0
    n_ctx_slot: int = 0
    n_swa: int = 0
    cache_ram: int = 0
    flags: list = field(default_factory=list)
    slots: dict = field(default_factory=dict)
    history: dict = field(default_factory=dict)  # slot -> deque of (task, cache_n, prompt_n, kinds)
    entries: dict = field(default_factory=dict)  # entry id -> info, insertion order = FIFO order
    gauge: dict = field(default_factory=dict)
    scores: dict = field(default_factory=dict)  # last cache_load_scores (task, preview, baseline, per entry)
    evictions: collections.deque = field(default_factory=lambda: collections.deque(maxlen=5000))
    ckpt_marks: collections.deque = field(default_factory=lambda: collections.deque(maxlen=200))
    why: collections.deque = field(default_factory=lambda: collections.deque(maxlen=200))
    last_seq: int = -1
    n_requests: int = 0

    @classmethod
    def rebuild(cls, events) -> "PanelState":
        st = cls()
        for e in events:
            st.apply(e)
        return st

    def slot(self, i: int) -> SlotView:
        if i not in self.slots:
            self.slots[i] = SlotView(i)
            self.history[i] = collections.deque(maxlen=20)
        return self.slots[i]

    def apply(self, e) -> None:
        self.last_seq = e.seq
        d, k = e.data, e.kind
        if k == "init":
            self.n_slots, self.n_ctx_slot = d["n_slots"], d["n_ctx_slot"]
            self.n_swa, self.cache_ram, self.flags = d.get("n_swa", 0), d.get("cache_ram", 0), d.get("flags", [])
            for i in range(self.n_slots):
                self.slot(i)
        elif k == "slot_snapshot":
            sv = self.slot(e.slot)
            sv.task, sv.state = e.task, d["state"]
            for f in ("n_tokens", "n_prompt", "n_past", "prompt_n", "n_gen", "prov", "divergence", "div_text", "origin",
                      "shifts", "checkpoints", "why"):
                setattr(sv, f, d[f])
        elif k == "task_done":
            self.n_requests += 1
            self.history[e.slot].append((e.task, d["cache_n"], d["prompt_n"], tuple(dict.fromkeys(d.get("prov", [])))))
        elif k == "cache_alloc":
            self.entries[d["entry_id"]] = {"id": d["entry_id"], "n_tokens": d["n_tokens"], "size": d["size"],
                                           "size_main": d.get("size_main", 0), "size_dft": d.get("size_dft", 0),
                                           "size_ckpt": d.get("size_ckpt", 0), "head": d.get("head", ""),
                                           "id_slot": d.get("id_slot", -1), "id_task": d.get("id_task", -1),
                                           "checkpoints": d.get("checkpoints", [])}
        elif k == "cache_evict":
            self.entries.pop(d.get("entry_id"), None)
            self.evictions.append((e.seq, e.t, d.get("reason", "?"), d.get("n_tokens", 0), e.slot))
        elif k == "slot_clear" and d.get("reason") in ("idle_clear", "purge") and d.get("n_tokens", 0) > 0:
            self.evictions.append((e.seq, e.t, d["reason"], d["n_tokens"], e.slot))
        elif k == "cache_state":
            self.gauge = {x: d[x] for x in ("size", "n_tokens", "limit_size", "limit_tokens", "limit_tokens_cur",
                                            "n_entries")}
        elif k == "cache_load_scores":
            self.scores = {"task": e.task, "slot": e.slot, **d}
        elif k == "request_why":
            self.why.append((e.task, e.slot, e.message))
        elif k in ("checkpoint_created", "checkpoint_restored", "checkpoint_evict", "checkpoint_none"):
            self.ckpt_marks.append((e.seq, e.slot, k.removeprefix("checkpoint_"), d.get("reason"), d.get("n_tokens"),
                                    d.get("pos_min"), d.get("pos_max")))
