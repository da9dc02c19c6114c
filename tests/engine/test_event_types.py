"""The event schema (slotlab.engine.event_types) and the EventBus around it: payloads checked at
construction, their JSON, subscriber errors reported (not swallowed), and retention of what a trimmed
log defined."""

import ast
import dataclasses
import inspect
import json
import logging

import numpy as np
import pytest

from slotlab.engine import event_types as T
from slotlab.engine.events import Event, EventBus
from slotlab.engine.scheduler import Engine

INIT = dict(n_slots=2, n_ctx_slot=1024, kv_unified=True, n_swa=0, cache_ram=64, flags=["-np", "2"], draft=False, sps=0.1)


def _alloc(i, n=100):
    return dict(func="alloc", entry_id=i, n_tokens=n, size=n * 1000, id_slot=i % 2, id_task=i, size_main=n * 1000,
                size_dft=0, size_ckpt=0, n_checkpoints=0, head=f"prompt {i}", checkpoints=[])


# ------------------------------------------------------------------------------------------- the schema itself

def test_every_kind_constant_has_one_class_and_every_class_its_family():
    consts = {v for k, v in vars(T).items() if k.isupper() and isinstance(v, str)}
    assert consts == set(T.REGISTRY) == set(T.KINDS)
    assert len(consts) >= 60
    for kind, cls in T.REGISTRY.items():
        assert cls.FAMILY and kind in T.FAMILIES[cls.FAMILY]
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
        assert cls.__doc__ and cls.__doc__.strip()


def test_every_field_is_documented():
    """Each field of each payload class is followed by its docstring in the source."""
    tree = ast.parse(inspect.getsource(T))
    undocumented = []
    for node in tree.body:
        if not isinstance(node, ast.ClassDef) or node.name not in ({c.__name__ for c in T.REGISTRY.values()}
                                                                   | {"Payload", "Held", "Lost"}):
            continue
        body = node.body
        for i, st in enumerate(body):
            if not isinstance(st, ast.AnnAssign) or "ClassVar" in ast.unparse(st.annotation):
                continue
            nxt = body[i + 1] if i + 1 < len(body) else None
            if not (isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
                undocumented.append(f"{node.name}.{ast.unparse(st.target)}")
    assert undocumented == []


def test_the_constructor_is_the_schema_check():
    """A missing or unknown field fails where the payload is built, naming it; optional fields may be
    left out; the class gives the event's kind."""
    assert T.Init(**INIT).KIND == T.INIT and T.CacheEvict.KIND == T.CACHE_EVICT
    with pytest.raises(TypeError, match="n_tokens"):
        T.CacheEvict(entry_id=1, reason="make_room", size=3)
    with pytest.raises(TypeError, match="bogus"):
        T.CacheEvict(entry_id=1, reason="make_room", size=3, n_tokens=4, bogus=1)
    with pytest.raises(TypeError):  # keyword-only: no positional payloads whose order could drift
        T.SlotSim(3, 0.5)
    assert T.CacheInit() == T.CacheInit(limit_size=T.UNSET, limit_tokens=T.UNSET)
    bus = EventBus()
    with pytest.raises(TypeError, match="ms"):
        bus.emit(T.Decode(off=0, n_tokens=1, n_prompt=0))
    assert bus.log == [] and bus.n_events == 0  # nothing half-made reaches the log
    ev = bus.emit(T.Decode(off=0, n_tokens=1, n_prompt=0, ms=0.5), slot=1)
    assert (ev.seq, ev.kind, ev.slot, ev.payload.ms) == (0, T.DECODE, 1, 0.5)


def test_payload_is_typed_and_frozen():
    ev = Event(7, 0.1, T.CACHE_ALLOC, "TRC", "", -1, 3, T.CacheAlloc(**_alloc(5)))
    p = ev.payload
    assert isinstance(p, T.CacheAlloc) and isinstance(p, T.RamCacheEvent) and p.FAMILY == "ram_cache"
    assert (p.entry_id, p.n_tokens, p.func, p.head) == (5, 100, "alloc", "prompt 5")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.n_tokens = 1
    assert ev.log_line() == "srv         alloc: "
    assert Event(0, 0, T.SLOT_SKIP, "TRC", "x", 0, 1, T.SlotSkip()).log_line() == "slot    slot_skip: id  0 | task 1 | x"


def test_json_is_the_fields_in_order_without_unset_or_private_ones():
    """UNSET (a source that did not report the field) is left out, None is written as null, private
    `_` fields never leave the process, nested parts (`Held`, `Lost`) are dicts in field order."""
    d = T.Decode(off=2, n_tokens=8, n_prompt=3, ms=np.float64(0.25), _steps=4)
    assert json.dumps(d.to_json()) == '{"off": 2, "n_tokens": 8, "n_prompt": 3, "ms": 0.25}'
    assert d.as_dict() == {"off": 2, "n_tokens": 8, "n_prompt": 3, "ms": 0.25} and d._steps == 4
    assert T.CacheInit().to_json() == {} and not T.UNSET and repr(T.UNSET) == "UNSET"
    held = T.Held(where="slot", id=1, lcp=5, n_held=9, prompt_text="a", held_text="b")
    dec = T.SlotDecision(how="lru", f_sim=0.0, f_keep=None, update_cache=True, load=None, id_requested=-1, held=held,
                         lost=None, checks=[(0, "empty", 0, np.float32(0.5))])
    assert json.dumps(dec.to_json()) == (
        '{"how": "lru", "f_sim": 0.0, "f_keep": null, "update_cache": true, "load": null, "id_requested": -1, '
        '"held": {"where": "slot", "id": 1, "lcp": 5, "n_held": 9, "prompt_text": "a", "held_text": "b"}, '
        '"lost": null, "checks": [[0, "empty", 0, 0.5]]}')
    lost = T.Lost(where="entry", id=3, reason="make_room", seq=40, lcp=5, n_held=9, prompt_text="", held_text="")
    assert list(lost.to_json()) == ["where", "id", "reason", "seq", "lcp", "n_held", "prompt_text", "held_text"]
    ev = EventBus().emit(T.CacheEvict(func="alloc", reason="make_room", entry_id=3, n_tokens=9, size=90), "x", slot=0)
    assert ev.to_json()["data"] == {"func": "alloc", "reason": "make_room", "entry_id": 3, "n_tokens": 9, "size": 90}


def test_every_event_of_a_real_engine_matches_the_schema(model, tmp_path):
    """Scenarios that reach most emit sites: RAM cache (save, load, evictions, clear), idle-slot saving,
    checkpoints (SWA), cache reuse, slot files, deferral, speculative decoding. Each event's payload is
    its kind's class (every emit site built one) and its JSON is plain."""
    doc = " ".join(f"Line {i} of the harbour log." for i in range(120))
    seen: set[str] = set()
    engines = []

    def run(flags, fn):
        e = Engine(flags, model=model)
        engines.append(e)
        fn(e)
        e.run_until_idle()
        for ev in e.events.log:
            assert type(ev.payload) is T.REGISTRY[ev.kind] and ev.payload.KIND == ev.kind
            json.dumps(ev.to_json())
        seen.update(ev.kind for ev in e.events.log)
        e.close()

    def ram(e):
        for q in ("Tell me about rivers", "A question about cats and dogs", "Tell me about rivers and deltas",
                  "Completely different: the moon", "A question about cats"):
            e.submit(q, n_predict=3)
            e.run_until_idle()
        e.submit("queued while busy", n_predict=2, id_slot=0)
        e.submit("also slot zero", n_predict=2, id_slot=0)  # deferred until slot 0 is free
        e.run_until_idle()
        for args in (("save", 0, "a.bin"), ("restore", 1, "a.bin"), ("erase", 1)):
            t = e.slot_action(*args)
            e.run_until_idle()
            assert t.done and t.error is None, (args, t.error)
        e.clear_cache()

    run(["-np", "2", "-kvu", "-c", "2048", "--cache-ram", "64", "-sps", "0", "--swa-full",
         "--slot-save-path", str(tmp_path)], ram)

    def ckpt(e):
        e.submit(doc, n_predict=2)
        e.run_until_idle()
        e.submit(doc.replace("Line 100", "Row 100"), n_predict=2)

    run(["-np", "1", "-c", "2048", "--cache-ram", "0"], ckpt)

    def reuse(e):
        a = " ".join(f"Fact {i}: the tide rises." for i in range(12))
        b = " ".join(f"Fact {i}: the wind blows." for i in range(12))
        e.submit(a + " " + b, n_predict=2)
        e.run_until_idle()
        e.submit(b, n_predict=2, n_cache_reuse=4)

    run(["-np", "1", "-c", "2048", "--swa-full", "--cache-reuse", "4", "--cache-ram", "0"], reuse)

    def spec(e):
        e.submit("The history of the lighthouse begins with fires on hilltops.", n_predict=8)

    run(["-np", "1", "-c", "2048", "-md", str(model.path), "--spec-draft-n-max", "4", "--spec-type", "draft-simple",
         "--swa-full"], spec)

    must = {T.INIT, T.CACHE_INIT, T.TASK_QUEUED, T.TASK_LAUNCHED, T.TASK_DONE, T.SLOT_RELEASE, T.SLOT_SNAPSHOT,
            T.SLOT_DECISION, T.SLOT_SELECTED_BY_LRU, T.CACHE_SAVE, T.CACHE_ALLOC, T.CACHE_EVICT, T.CACHE_STATE,
            T.CACHE_STATE_ENTRY, T.CACHE_LOAD_BASE, T.CACHE_LOAD_SCORES, T.PROMPT_BATCH, T.PROMPT_PLAN, T.DECODE,
            T.CHECKPOINT_CREATED, T.SLOT_SAVED, T.SLOT_RESTORED, T.SLOT_CLEAR, T.SPEC_DRAFT,
            T.SPEC_VERIFY, T.TASK_DEFERRED, T.TASK_UNDEFERRED, T.SLOT_SELECTED_BY_ID}
    assert must <= seen, sorted(must - seen)


# ------------------------------------------------------------------------------------------- subscriber errors

def test_a_raising_subscriber_is_logged_counted_and_the_others_still_get_events(caplog):
    bus = EventBus()
    got = []

    def broken(ev):
        raise RuntimeError(f"view bug on {ev.kind}")

    bus.subscribe(broken)
    bus.subscribe(got.append)
    with caplog.at_level(logging.ERROR, logger="slotlab.events"):
        ev = bus.emit(T.TaskQueued(n_tokens=5, id_slot=-1), task=0)
        bus.emit(T.TaskQueued(n_tokens=5, id_slot=-1), task=1)
    assert got == bus.log and ev.seq == 0
    assert bus.n_errors == 2 and len(bus.errors) == 2
    err = bus.errors[0]
    assert (err.seq, err.kind, err.error) == (0, "task_queued", "RuntimeError: view bug on task_queued")
    assert "broken" in err.subscriber and "raise RuntimeError" in err.traceback
    assert bus.last_error == "event subscriber " + err.subscriber + " raised on event #1 (task_queued): RuntimeError: view bug on task_queued"
    recs = [r for r in caplog.records if r.name == "slotlab.events"]
    assert len(recs) == 2 and recs[0].exc_info and "the engine goes on" in recs[0].getMessage()


def test_subscriber_errors_are_throttled_in_the_log_but_all_counted(caplog):
    bus = EventBus()
    bus.subscribe(lambda ev: 1 / 0)
    with caplog.at_level(logging.ERROR, logger="slotlab.events"):
        for _ in range(1000):
            bus.emit(T.Params(), "x")
    assert bus.n_errors == 1000 and len(bus.errors) == 50
    assert len([r for r in caplog.records if r.name == "slotlab.events"]) == 21  # 20 first + the 1000th


# ------------------------------------------------------------------------------------------- retention

def test_trimming_is_chunked_and_the_log_stays_contiguous():
    bus = EventBus(max_log=1000)
    assert bus.trim_chunk == 20
    for i in range(5000):
        bus.emit(T.Decode(off=i, n_tokens=1, n_prompt=0, ms=0.1))
    assert 980 <= len(bus.log) <= 1000
    assert [e.seq for e in bus.log] == list(range(bus.first_seq, 5000))
    assert bus.n_trimmed == bus.first_seq == 5000 - len(bus.log)
    assert bus.dropped == {"decode": bus.n_trimmed} and bus.retained == []


def test_trimmed_state_defining_events_are_retained():
    bus = EventBus(max_log=10, trim_chunk=1)
    bus.emit(T.CacheInit(limit_size=1 << 26, limit_tokens=4096))
    init = bus.emit(T.Init(**INIT), level="INF")
    snaps = {}
    for i in range(3):
        bus.emit(T.CacheAlloc(**_alloc(i)))
    bus.emit(T.CacheEvict(func="alloc", entry_id=0, reason="make_room", n_tokens=100, size=100_000))
    for s in (0, 1, 0):
        snaps[s] = bus.emit(T.SlotSnapshot(state="idle", n_tokens=s + 10, n_prompt=0, n_past=0, prompt_n=0, n_gen=0,
                                           origin="slot", shifts=[], checkpoints=[]), slot=s, task=s)
    for i in range(40):
        bus.emit(T.Decode(off=i, n_tokens=1, n_prompt=0, ms=0.1))
    r = bus.replay()
    kinds = [e.kind for e in r.events[: len(r.events) - len(bus.log)]]
    assert kinds == ["cache_init", "init", "cache_alloc", "cache_alloc", "cache_evict", "slot_snapshot", "slot_snapshot"]
    assert r.events[1] is init and snaps[0] in r.events and snaps[1] in r.events
    assert [e.payload.entry_id for e in r.events if e.kind == "cache_alloc"] == [1, 2]  # entry 0 was evicted
    # the first snapshot of slot 0 is superseded, entry 0's alloc ended by its evict, 30 decodes trimmed
    assert r.dropped == {"slot_snapshot": 1, "cache_alloc": 1, "decode": 30}
    assert r.first_seq == bus.first_seq == bus.log[0].seq and r.n_trimmed == bus.n_trimmed
    assert [e.seq for e in r.events] == sorted({e.seq for e in r.events})
    # replay up to an event: the retained part and the log prefix
    upto = bus.log[3].seq
    assert bus.replayable(upto)[-1].seq == upto and len(bus.replayable(upto)) == 7 + 4


def test_retention_is_bounded():
    bus = EventBus(max_log=100)
    for i in range(20_000):
        bus.emit(T.SlotDecision(how="lru", f_sim=0.0, f_keep=None, update_cache=False, load=None, id_requested=-1),
                 slot=i % 4, task=i)
        bus.emit(T.PromptPlan(n_past=0, n_prompt=5, lcp=0, ckpt=None, origin="slot", shifts=[], divergence=0,
                              div_text="x"), slot=i % 4, task=i)
        bus.emit(T.TaskDone(cache_n=0, prompt_n=5, predicted_n=1, tokens_cached=6), slot=i % 4, task=i)
    held = bus.retained
    assert sum(e.kind == "prompt_plan" for e in held) == T.WHY_KEEP  # the per-slot rings are within the last 200
    # the conversation timeline's last TIMELINE_KEEP answers hold each slot's last HISTORY_PER_SLOT too
    assert sum(e.kind == "task_done" for e in held) == max(T.TIMELINE_KEEP, 4 * T.HISTORY_PER_SLOT)
    assert sum(e.kind == "slot_decision" for e in held) == T.DECISIONS_KEEP
    assert sum(bus.dropped.values()) + len(held) + len(bus.log) == bus.n_events


def test_fast_payload_constructors_make_the_dataclass_instances():
    """event_types replaces the frozen dataclasses' __init__ (speed): the instances must be the same,
    field by field and in __dict__ order, and a missing or unknown field must still fail."""
    import dataclasses

    assert T.DATACLASS_INIT  # the payload classes got one
    for cls, orig in T.DATACLASS_INIT.items():
        kw = {f.name: ("v", i) for i, f in enumerate(dataclasses.fields(cls))}
        ref = object.__new__(cls)
        orig(ref, **kw)
        got = cls(**kw)
        assert list(vars(got).items()) == list(vars(ref).items()) and got == ref, cls
        required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]
        if required:  # defaults as the dataclass has them
            only = {k: kw[k] for k in required}
            ref = object.__new__(cls)
            orig(ref, **only)
            assert list(vars(cls(**only)).items()) == list(vars(ref).items()), cls
            with pytest.raises(TypeError):
                cls(**{k: kw[k] for k in required[1:]})
        with pytest.raises(TypeError):
            cls(**kw, no_such_field=1)
        with pytest.raises(dataclasses.FrozenInstanceError):
            got.func = 1


def test_fast_event_constructor_makes_the_dataclass_instance():
    from slotlab.engine.events import Event, _new_event

    p = T.PromptSeqRm()
    a, b = _new_event(3, 0.5, "k", "INF", "m", 1, 2, p), Event(3, 0.5, "k", "INF", "m", 1, 2, p)
    assert a == b and list(vars(a).items()) == list(vars(b).items()) and type(a) is Event


def test_derived_events_are_delivered_in_seq_order_to_every_subscriber():
    """An event emitted by a subscriber (a derived one) is logged at once but delivered after the
    current event has reached every subscriber; a subscriber added or removed during a delivery
    takes effect from the next event; a raising one does not stop the others."""
    bus = EventBus(max_log=None)
    seen: dict[str, list] = {"a": [], "b": [], "late": []}

    def a(ev):
        seen["a"].append(ev.seq)
        if ev.seq == 0:  # two derived events, one of which derives another
            bus.emit(T.PromptSeqRm(), "d1")
            bus.emit(T.PromptSeqRm(), "d2")
            bus.subscribe(lambda e: seen["late"].append(e.seq))
        if ev.message == "d1":
            bus.emit(T.PromptSeqRm(), "d3")

    def b(ev):
        seen["b"].append(ev.seq)
        if ev.seq == 1:
            raise ValueError("b is broken")

    bus.subscribe(a)
    unsub = bus.subscribe(b)
    first = bus.emit(T.PromptSeqRm(), "root")
    assert first.seq == 0 and [e.message for e in bus.log] == ["root", "d1", "d2", "d3"]
    assert seen["a"] == seen["b"] == [0, 1, 2, 3] and seen["late"] == [1, 2, 3]
    assert bus.n_errors == 1 and bus.errors[-1].seq == 1
    unsub()
    unsub()  # a second call does nothing
    bus.emit(T.PromptSeqRm(), "after")
    assert seen["b"] == [0, 1, 2, 3] and seen["a"][-1] == 4 and seen["late"][-1] == 4
