"""A panel opened late on a long run (after the event bus trimmed its log) shows the right slots and RAM
cache; errors in event subscribers and in panel updates show in the status line and the log."""

import asyncio
import collections
import dataclasses
import logging
import pytest

from slotlab.engine import event_types as T
from slotlab.engine.events import EventBus
from slotlab.engine.scheduler import Engine
from slotlab.panel import Panel
from slotlab.panel.state import PROVENANCE, PanelState

N_EVENTS = 300_000


def _summary(st: PanelState) -> dict:
    return {"shape": (st.n_slots, st.n_ctx_slot, st.n_swa, st.cache_ram, list(st.flags)),
            "slots": {i: dataclasses.asdict(s) for i, s in st.slots.items()}, "entries": dict(st.entries),
            "gauge": dict(st.gauge), "scores": dict(st.scores), "why": list(st.why), "evictions": list(st.evictions),
            "ckpt_marks": list(st.ckpt_marks), "history": {i: list(h) for i, h in st.history.items()},
            "n_requests": st.n_requests, "last_seq": st.last_seq}


# ------------------------------------------------------------------------------------------- a synthetic long run

class Run:
    """A 2-slot server with a RAM cache, as the engine reports it: each request saves the slot's previous
    prompt to the cache (FIFO, at most 3 entries), sometimes restores an entry, prefills, checkpoints,
    decodes and releases. `model` holds what the panel must show."""

    def __init__(self, bus: EventBus):
        self.bus = bus
        self.entries: collections.OrderedDict = collections.OrderedDict()  # id -> n_tokens
        self.slots = {0: 0, 1: 0}  # slot -> n_tokens
        self.next_id = 0
        self.n_done = 0
        e = bus.emit
        e(T.CacheInit(limit_size=64 << 20, limit_tokens=4096), "prompt cache is enabled, size limit: 64 MiB")
        e(T.Init(n_slots=2, n_ctx_slot=2048, kv_unified=True, n_swa=512, cache_ram=64,
                 flags=["-np", "2", "-kvu", "--cache-ram", "64"], draft=False, sps=0.1),
          "initializing, n_slots = 2, n_ctx_slot = 2048, kv_unified = 'true'", level="INF")

    def _state(self):
        n = sum(self.entries.values())
        self.bus.emit(T.CacheState(func="update", n_entries=len(self.entries), size=n * 1000, n_tokens=n,
                                   limit_size=64 << 20, limit_tokens=4096, limit_tokens_cur=4096))

    def _evict(self, eid, reason, slot=-1):
        n = self.entries.pop(eid)
        self.bus.emit(T.CacheEvict(func="alloc", entry_id=eid, reason=reason, n_tokens=n, size=n * 1000), slot=slot)

    def request(self, task: int, slot: int, n_prompt: int, n_gen: int = 3, load: bool = False) -> None:
        e, bus = self.bus.emit, self.bus
        e(T.TaskQueued(n_tokens=n_prompt, id_slot=-1), task=task)
        e(T.SlotSelectedByLru(t_last=1), "selected slot by LRU, t_last = 1", level="INF", slot=slot, task=task)
        if self.slots[slot]:
            n = self.slots[slot]
            e(T.CacheSave(func="prompt_save", n_tokens=n, size_tgt=n * 1000, size_dft=0, id_slot=slot,
                          id_task=task - 2), " - saving prompt", slot=slot, task=task)
            while len(self.entries) >= 3:
                self._evict(next(iter(self.entries)), "make_room", slot)
            eid, self.next_id = self.next_id, self.next_id + 1
            self.entries[eid] = n
            e(T.CacheAlloc(func="alloc", entry_id=eid, n_tokens=n, size=n * 1000, id_slot=slot, id_task=task - 2,
                           size_main=n * 1000, size_dft=0, size_ckpt=0, n_checkpoints=0, head=f"prompt of {task - 2}",
                           checkpoints=[]), slot=slot, task=task)
        winner = None
        if load and len(self.entries) > 1:
            winner = next(iter(self.entries))
            e(T.CacheLoadFound(func="load", entry_id=winner, f_keep=0.9, f_sim=0.8), " - found better prompt",
              slot=slot, task=task)
        scores = [{"entry_id": i, "n_tokens": n, "lcp": 10, "f_keep": 0.5, "f_sim": 0.4, "below_floor": False,
                   "improved": i == winner, "winner": i == winner} for i, n in self.entries.items()]
        e(T.CacheLoadScores(func="load", preview=False, lcp_base=0, f_keep_base=-1.0, f_sim_base=0.0, winner_id=winner,
                            scores=scores), slot=slot, task=task)
        n_past = 0
        if winner is not None:
            n_past = self.entries[winner] // 2
            self._evict(winner, "loaded", slot)
            e(T.CacheLoaded(entry_id=winner, n_tokens=n_past * 2, f_keep=0.9, f_sim=0.8), slot=slot, task=task)
        self._state()
        loaded = {"f_keep_best": 0.9, "f_sim_best": 0.8, "f_keep_base": -1.0} if winner is not None else {}
        e(T.SlotDecision(how="lru", f_sim=0.0, f_keep=None, update_cache=True,
                         load=True if winner is not None else None, id_requested=-1, **loaded), slot=slot, task=task)
        e(T.TaskLaunched(n_tokens=n_prompt), "processing task, is_child = 0", level="INF", slot=slot, task=task)
        e(T.PromptStart(), "new prompt", slot=slot, task=task)
        origin = f"cache #{winner}" if winner is not None else "slot"
        e(T.PromptPlan(n_past=n_past, n_prompt=n_prompt, lcp=n_past, ckpt=None, origin=origin, shifts=[],
                       divergence=n_past, div_text=" x"), slot=slot, task=task)
        e(T.PromptBatch(n_added=n_prompt - n_past, n_tokens=n_prompt, n_prompt=n_prompt), slot=slot, task=task)
        e(T.CheckpointCreated(n_tokens=n_prompt - 4, pos_min=0, pos_max=n_prompt - 5, size=4096),
          "created context checkpoint 1 of 8", slot=slot, task=task)
        ck = [(0, n_prompt - 5, n_prompt - 4, 4096, task)]

        def snap(state, n_tokens, n_gen):
            e(T.SlotSnapshot(state=state, n_tokens=n_tokens, n_prompt=n_prompt, n_past=n_past,
                             prompt_n=n_prompt - n_past, n_gen=n_gen, origin=origin, shifts=[], checkpoints=ck),
              slot=slot, task=task)

        snap("processing_prompt", n_prompt, 0)
        for g in range(n_gen):
            e(T.Decode(off=0, n_tokens=1, n_prompt=0, ms=0.2))
            snap("generating", n_prompt + g, g + 1)
        n_tok = n_prompt + n_gen - 1
        e(T.TaskDone(cache_n=n_past, prompt_n=n_prompt - n_past, predicted_n=n_gen, tokens_cached=n_tok), slot=slot,
          task=task)
        e(T.SlotRelease(n_tokens=n_tok), "stop processing", level="INF", slot=slot, task=task)
        snap("idle", n_tok, n_gen)
        self.slots[slot] = n_tok
        self.n_done += 1

    def pad(self, n: int) -> None:
        """`n` decode events (a long stretch of generation nobody needs to redraw)."""
        emit = self.bus.emit
        for i in range(n):
            emit(T.Decode(off=0, n_tokens=2, n_prompt=0, ms=0.1))


def test_a_state_rebuilt_after_300k_events_equals_the_live_one():
    bus = EventBus()  # the default bound: 200,000 events in the log
    live = PanelState()
    bus.subscribe(live.apply)
    seen = {}
    bus.subscribe(lambda ev: seen.__setitem__(ev.seq, _summary(live)) if ev.kind == T.TASK_DONE else None)
    run = Run(bus)
    for task in range(400):  # both slots, cache entries come and go
        run.request(task, task % 2, 40 + task % 30, load=task % 7 == 3)
    run.pad(N_EVENTS - bus.n_events)
    for task in range(400, 420):  # after the trim point: slot 0 only; slot 1's picture is from before it
        run.request(task, 0, 60 + task % 5, load=task % 5 == 0)
    assert bus.n_events > N_EVENTS and bus.n_trimmed > N_EVENTS - bus.max_log
    assert bus.log[0].seq > 50_000 and all(e.kind == T.DECODE for e in bus.log[:1000])

    # the log alone no longer knows the server's shape (what PanelState.rebuild(bus.log) used to show)
    assert PanelState.rebuild(bus.log).n_slots == 0

    late = PanelState.from_bus(bus)
    assert _summary(late) == _summary(live)
    assert late.n_slots == 2 and late.n_ctx_slot == 2048 and set(late.slots) == {0, 1}
    for s, n in run.slots.items():
        assert (late.slots[s].n_tokens, late.slots[s].state) == (n, "idle")
    assert late.slots[1].task == 399 and late.slots[0].task == 419
    assert late.slots[1].prov[-1] == (40 + 399 % 30, run.slots[1], "generated") and "chosen by LRU" in late.slots[1].why
    assert late.why[-1][0] == 419 and late.history[1][-1][3] in (("prefill",), ("cache", "prefill"))
    assert list(late.entries) == list(run.entries) and len(late.entries) >= 2
    assert {i: x["n_tokens"] for i, x in late.entries.items()} == dict(run.entries)
    assert late.gauge["n_entries"] == len(run.entries)
    assert late.n_requests == run.n_done == 420
    assert len(late.evictions) > 100 and len(late.why) == T.WHY_KEEP and len(late.ckpt_marks) == T.CHECKPOINT_MARKS_KEEP

    # scrubbing: exact at every point the log still holds
    checked = 0
    for seq, summary in seen.items():
        if seq >= bus.first_seq:
            assert _summary(PanelState.from_bus(bus, upto=seq)) == summary
            checked += 1
    assert checked == 20


# ------------------------------------------------------------------------------------------- the real engine

def test_panel_attached_after_300k_events_shows_the_engines_slots_and_cache(model):
    e = Engine(["-np", "2", "-kvu", "-c", "4096", "--swa-full", "-sps", "0", "--cache-ram", "64", "--no-cache-idle-slots"],
               model=model)
    early = Panel(e)
    for q in ("Tell me about the rivers of Europe, their sources and their deltas",
              "A completely unrelated question about the anatomy of house cats",
              "Tell me about the rivers of Europe, their sources and their deltas and in Asia?"):
        e.submit(q, n_predict=4)
        e.run_until_idle()
    # a long run: generation nobody redraws, until the bus has trimmed init and the requests above
    for _ in range(N_EVENTS - e.events.n_events):
        e.events.emit(T.Decode(off=0, n_tokens=2, n_prompt=0, ms=0.1))
    t = e.submit("One more question, about the tides of the North Sea", n_predict=3)
    e.run_until_idle()
    assert t.done and e.events.n_events > N_EVENTS
    assert e.events.first_seq > 100_000 and not e.events.filter([T.INIT])

    late = Panel(e)
    st = late.state
    assert st.n_slots == 2 and set(st.slots) == {0, 1}
    for s in e.slots:
        sv = st.slots[s.id]
        assert (sv.n_tokens, sv.state) == (len(s.tokens), s.state.value)
        assert sv.task == (s.task or s.task_prev).id
    assert list(st.entries) == [x.id for x in e.cache.entries] and st.entries
    for x in e.cache.entries:
        assert st.entries[x.id]["n_tokens"] == x.n_tokens() and f"#{x.id}" in late.cache_box.value
    assert st.gauge["size"] == e.cache.size() and st.gauge["n_tokens"] == e.cache.n_tokens()
    assert st.n_requests == 4
    assert "<td>slot 1</td>" in late.slot_table.value
    # one slot's picture and a cache entry come from before the trim point
    assert {ev.slot for ev in e.events.retained if ev.kind == T.SLOT_SNAPSHOT} == {0, 1}
    assert len({ev.slot for ev in e.events.log if ev.kind == T.SLOT_SNAPSHOT}) == 1
    assert {ev.payload.entry_id for ev in e.events.retained if ev.kind == T.CACHE_ALLOC} & set(st.entries)
    # the figure has a timeline for every slot that holds tokens
    ys = {y for tr in late.fig.data[:len(PROVENANCE)] for y in tr.y}
    assert ys == {f"slot {s.id}" for s in e.slots if len(s.tokens)} and ys
    # the late panel and the one that watched everything agree
    early.refresh()
    assert _summary(late.state) == _summary(early.state)
    # the slider starts at the oldest event the log holds, and says why
    assert late.slider.min == e.events.first_seq and late.slider.max == e.events.log[-1].seq
    assert "were trimmed" in late.trim_note.value
    assert late.show_at(0).last_seq == e.events.first_seq  # clamped to what the log holds
    assert _summary(late.show_at(e.events.log[-1].seq)) == _summary(early.state)
    early.close()
    late.close()
    e.close()


# ------------------------------------------------------------------------------------------- errors are shown

def test_a_raising_subscriber_shows_in_the_status_line_and_the_engine_goes_on(model, caplog):
    e = Engine(["-np", "1", "-c", "1024", "--swa-full"], model=model)
    p = Panel(e)

    def notebook_hook(ev):
        if ev.kind == T.TASK_DONE:
            raise KeyError("cache_n_typo")

    e.events.subscribe(notebook_hook)
    with caplog.at_level(logging.ERROR, logger="slotlab.events"):
        t = e.submit("Tell me about rivers", n_predict=3)
        e.run_until_idle()
    assert t.done and t.error is None and t.result["tokens_predicted"] == 3
    p.refresh()
    assert p.state.n_requests == 1  # the panel got the event the hook failed on
    assert "1 event subscriber error(s)" in p.status.value and "notebook_hook" in p.status.value
    assert "KeyError" in p.status.value and "cache_n_typo" in p.status.value
    rec = [r for r in caplog.records if r.name == "slotlab.events"]
    assert len(rec) == 1 and rec[0].exc_info[0] is KeyError
    # a control's outcome and the error share the status line
    p.b_save.click()
    assert "does not support slots action" in p.status.value and "subscriber error" in p.status.value
    p.close()
    e.close()


def test_a_panel_update_that_raises_is_shown_logged_and_skipped(model, caplog):
    e = Engine(["-np", "1", "-c", "1024", "--swa-full"], model=model)
    with pytest.raises(TypeError, match="missing .*keyword-only argument"):  # the schema: checked at construction
        T.SlotSnapshot(state="idle")
    p = Panel(e)
    with caplog.at_level(logging.ERROR, logger="slotlab.panel"):
        # a payload of the right shape with a value a view cannot use, as an out-of-date producer might send
        e.events.emit(T.PromptPlan(n_past=0, n_prompt=None, lcp=0, ckpt=None, origin="slot", shifts=[], divergence=-1,
                                   div_text=""), slot=0, task=99)
        t = e.submit("Tell me about rivers", n_predict=3)
        e.run_until_idle()
        p.refresh()
    assert t.done and p.state.n_requests == 1
    assert p.state.slots[0].n_tokens == len(e.slots[0].tokens) > 0  # the events after the bad one were applied
    assert "1 panel update error(s)" in p.status.value and "prompt_plan" in p.status.value
    assert p.n_errors == 1 and "TypeError" in p.last_error
    rec = [r for r in caplog.records if r.name == "slotlab.panel"]
    assert len(rec) == 1 and rec[0].exc_info is not None
    p.close()
    e.close()


def test_the_pump_survives_a_failing_update(model, caplog):
    e = Engine(["-np", "1", "-c", "1024", "--swa-full"], model=model)

    async def main():
        p = Panel(e, fps=200)  # the pump starts on the running loop
        calls = []
        real = p.refresh

        def flaky():
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("redraw exploded")
            return real()

        p.refresh = flaky
        e.submit("Tell me about rivers", n_predict=2)
        e.run_until_idle()
        for _ in range(200):
            await asyncio.sleep(0.01)
            if len(calls) >= 2 and not p.pending:
                break
        p.close()
        return p, calls

    with caplog.at_level(logging.ERROR, logger="slotlab.panel"):
        p, calls = asyncio.run(main())
    assert len(calls) >= 2 and p.state.n_requests == 1
    assert "redraw exploded" in p.status.value or "redraw exploded" in p.last_error
    assert any("redraw exploded" in r.getMessage() for r in caplog.records if r.name == "slotlab.panel")
    e.close()
