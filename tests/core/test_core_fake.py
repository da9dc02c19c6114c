"""The decision core on the fake memory: no model, many cases, seconds.

These pin the core's paths (slot selection, the RAM-cache glue, the prompt plan with checkpoint
restore and cache-reuse shifts, deferral, purges, slot actions, error surfacing). They are not the
fidelity proof — the golden traces on the real context are — but they run in a second and say which
rule broke."""

from __future__ import annotations

import numpy as np
import pytest

from slotlab.engine.cache_reuse import Shift, plan_cache_reuse
from slotlab.engine.scheduler import Engine
from slotlab.engine.selection import get_available_slot
from slotlab.engine.slot import Slot, SlotState
from slotlab.engine.slot_actions import check_slot_action
from slotlab.engine.task import TaskState
from slotlab.explain import Explainer
from slotlab.memory import check_memory
from slotlab.memory.fake import FakeMemory

SYS = "You are a helpful assistant that answers briefly and precisely. " * 2


def eng(flags: str, **mem) -> Engine:
    mem.setdefault("n_slots", 2)
    return Engine(flags, memory=FakeMemory(**mem))


def run(e: Engine, prompt: str, **kw) -> dict:
    t = e.submit(prompt, n_predict=kw.pop("n_predict", 4), **kw)
    e.run_until(lambda: t.done)
    assert t.error is None, t.error
    return t.result


def kinds(e: Engine, since: int = 0) -> list[str]:
    return [ev.kind for ev in e.events.log if ev.seq >= since]


def plans(e: Engine) -> list[dict]:
    return [ev.payload.as_dict() for ev in e.events.log if ev.kind == "prompt_plan"]


# ---------------------------------------------------------------- slot selection (pure)

def _slots(*contents, busy=()):
    out = []
    for i, toks in enumerate(contents):
        s = Slot(i, 4096)
        s.tokens.assign(np.array(toks, dtype=np.int32))
        s.t_last_used = 10 + i
        if i in busy:
            s.state = SlotState.GENERATING
        out.append(s)
    return out


def test_selection_lcp_picks_the_most_similar_idle_slot():
    slots = _slots([1, 2, 3, 4], [1, 2, 9, 9], [5, 6])
    sel = get_available_slot(slots, np.array([1, 2, 3, 4, 5, 6], dtype=np.int32), -1, 0.1)
    assert (sel.id_slot, sel.how) == (0, "lcp")
    assert sel.f_keep == 1.0 and not sel.update_cache  # keeps all it holds
    assert [c.lcp for c in sel.checks] == [4, 2, 0]


def test_selection_skips_busy_and_empty_then_falls_back_to_lru():
    slots = _slots([1, 2, 3], [], [7, 7], busy=(0,))
    sel = get_available_slot(slots, np.array([1, 2, 3], dtype=np.int32), -1, 0.1)
    assert [c.skipped for c in sel.checks] == ["is_processing", "empty", None]
    assert (sel.id_slot, sel.how, sel.update_cache) == (1, "lru", True)  # oldest idle: slot 1 (t_last 11 < 12)


def test_selection_low_f_keep_asks_the_ram_cache():
    slots = _slots([1, 2] + [9] * 8)
    sel = get_available_slot(slots, np.array([1, 2, 3], dtype=np.int32), -1, 0.1)
    assert sel.how == "lcp" and np.float32(sel.f_keep) == np.float32(0.2) and sel.update_cache


def test_selection_by_id_wraps_and_sps_zero_is_lru():
    slots = _slots([1], [2])
    sel = get_available_slot(slots, np.array([2], dtype=np.int32), 3, 0.1)
    assert sel.id_slot == 1 and sel.id_requested == 3
    sel = get_available_slot(slots, np.array([1], dtype=np.int32), -1, 0.0)
    assert sel.how == "lru" and sel.checks == ()


# ---------------------------------------------------------------- the RAM-cache glue

def test_conversation_moves_through_the_ram_cache_on_one_slot():
    e = eng("-np 1 -c 4096 --cache-ram 64", n_slots=1)
    a1 = run(e, SYS + "Alice: tell me about owls")
    b1 = run(e, "Totally different: Bob asks about the weather in Lisbon today")
    a2 = run(e, SYS + "Alice: tell me about owls" + " and also about hawks")
    assert a1["timings"]["cache_n"] == 0 and b1["timings"]["cache_n"] <= 1  # the shared BOS at most
    assert a2["timings"]["cache_n"] >= len(e.tokenize(SYS + "Alice: tell me about owls")) - 1
    loaded = [ev for ev in e.events.log if ev.kind == "cache_loaded"]
    assert len(loaded) == 1 and loaded[0].task == 2
    why = Explainer().fold(e.events.log).why(2)
    assert "RAM entry #0 restored" in why and f"{a2['timings']['cache_n']} tokens reused" in why


def test_cache_off_means_no_cache_events_and_no_reuse_across_conversations():
    e = eng("-np 1 -c 4096 --cache-ram 0", n_slots=1)
    run(e, SYS + "Alice: owls")
    run(e, "Bob: weather")
    a2 = run(e, SYS + "Alice: owls and hawks")
    assert a2["timings"]["cache_n"] <= 1  # the shared BOS at most
    assert not [k for k in kinds(e) if k.startswith("cache_") and k != "cache_init"]


def test_clear_cache_goes_through_the_cache():
    e = eng("-np 1 -c 4096 --cache-ram 64", n_slots=1)
    run(e, SYS + "one")
    run(e, "something else entirely")
    assert len(e.cache.entries) == 1
    assert e.clear_cache() == 1 and e.cache.entries == []
    ev = [x for x in e.events.log if x.kind == "cache_evict"][-1]
    assert ev.payload.reason == "cleared"


# ---------------------------------------------------------------- the prompt plan

def test_full_match_reprocesses_the_last_token():
    e = eng("-np 1 -c 4096 --cache-ram 0", n_slots=1)
    p = SYS + "same prompt"
    run(e, p, n_predict=1)
    r = run(e, p, n_predict=1)
    n = len(e.tokenize(p))
    assert r["timings"]["cache_n"] == n - 1 and r["timings"]["prompt_n"] == 1
    assert "prompt_full_match" in kinds(e)


@pytest.mark.parametrize("n_ckpt", [0, 8])
def test_swa_memory_needs_a_checkpoint_to_cut_back(n_ckpt):
    """With a sliding window, pos_min >= max(0, pos_next - n_swa) makes any cut-back need a
    checkpoint — even for a prompt far shorter than the window (pos_min 0 >= threshold 0): with none,
    the server forces full re-processing (spec 3.5)."""
    e = eng(f"-np 1 -c 4096 --cache-ram 0 --ctx-checkpoints {n_ckpt}", n_slots=1, n_swa=512, n_ubatch=8, n_batch=32)
    base = SYS + "user: first question about the sliding window"
    run(e, base)
    r = run(e, base + " -- and a follow-up question")  # cuts back to the end of the prompt
    plan = plans(e)[-1]
    if n_ckpt == 0:
        assert plan["ckpt"] == "forced" and r["timings"]["cache_n"] == 0
        assert "checkpoint_none" in kinds(e)
    else:
        assert plan["ckpt"] == "restored" and r["timings"]["cache_n"] > 0
        created = [x for x in e.events.log if x.kind == "checkpoint_created" and x.task == 0]
        assert created and all(c.payload.pos_max < len(e.tokenize(base)) for c in created)


def test_recurrent_memory_needs_checkpoints_too():
    e = eng("-np 1 -c 4096 --cache-ram 0", n_slots=1, recurrent=True)
    assert e.memory.info.needs_checkpoints
    run(e, SYS + "user: hello")
    r = run(e, SYS + "user: hello again, longer now")
    assert r["timings"]["cache_n"] > 0 and plans(e)[-1]["ckpt"] == "restored"


def test_cache_reuse_plan_is_the_server_chunk_loop():
    cache = np.array([1, 2, 3, 7, 7, 4, 5, 6, 9], dtype=np.int32)
    prompt = np.array([1, 2, 3, 4, 5, 6, 8], dtype=np.int32)
    assert plan_cache_reuse(cache, prompt, 3, 2) == [Shift(5, 8, 3, 6)]
    assert plan_cache_reuse(cache, prompt, 3, 4) == []  # chunk shorter than --cache-reuse


def _server_chunk_loop(cache, prompt, n_past, n_reuse):
    """SC:3218-3266 as the server writes it: every cached position tried in turn."""
    shifts, head_c, head_p = [], n_past, n_past
    while head_c < len(cache) and head_p < len(prompt):
        n_match = 0
        while (head_c + n_match < len(cache) and head_p + n_match < len(prompt)
               and cache[head_c + n_match] == prompt[head_p + n_match]):
            n_match += 1
        if n_match >= n_reuse:
            shifts.append(Shift(head_c, head_c + n_match, head_p, head_p + n_match))
            head_c += n_match
            head_p += n_match
        else:
            head_c += 1
    return shifts


@pytest.mark.parametrize("alphabet", [2, 3, 8, 1000])
def test_cache_reuse_plan_skips_to_the_candidates_as_the_server_would_walk(alphabet):
    """plan_cache_reuse jumps to the cached positions whose token is the prompt's head (the server tries
    each position in turn): the same moves as the server's loop on prompts made of small alphabets
    (many candidates, repeated runs), of moved chunks with edits, and at the ends."""
    rng = np.random.default_rng(alphabet)
    for _ in range(300):
        n = int(rng.integers(0, 80))
        cache = rng.integers(0, alphabet, n).astype(np.int32)
        if n and rng.random() < 0.7:  # the prompt: chunks of the cache, reordered and edited
            cut = sorted(rng.integers(0, n, 4).tolist())
            parts = [cache[a:b] for a, b in zip([0] + cut, cut + [n])]
            rng.shuffle(parts)
            prompt = np.concatenate(parts + [rng.integers(0, alphabet, int(rng.integers(0, 9)))]).astype(np.int32)
            prompt[rng.integers(0, len(prompt), int(rng.integers(0, 4)))] = alphabet
        else:
            prompt = rng.integers(0, alphabet, int(rng.integers(0, 80))).astype(np.int32)
        n_past = int(rng.integers(0, min(len(cache), len(prompt)) + 1))
        for n_reuse in (1, 2, 3, 5, 16):
            assert plan_cache_reuse(cache, prompt, n_past, n_reuse) == _server_chunk_loop(cache, prompt, n_past, n_reuse)


def test_cache_reuse_shifts_kv_on_a_shifting_memory():
    e = eng("-np 1 -c 4096 --cache-ram 0 --cache-reuse 4", n_slots=1)
    a, b, c = "AAAA system part. ", "BBBB an inserted chunk that goes away. ", "CCCC the long tail that comes back intact."
    run(e, a + b + c, n_predict=1)
    r = run(e, a + c, n_predict=1)
    shifts = [x for x in e.events.log if x.kind == "cache_reuse_shift"]
    assert shifts and r["timings"]["cache_n"] > len(e.tokenize(a)) + 10
    assert any(call[0] == "seq_add" for call in e.memory.calls)
    assert plans(e)[-1]["shifts"]


def test_cache_reuse_is_refused_on_a_window_memory():
    e = eng("-np 1 -c 4096 --cache-ram 0 --cache-reuse 4", n_slots=1, n_swa=16)
    assert any(x.kind == "params" and "cache_reuse is not supported" in x.message for x in e.events.log)
    run(e, "x" * 40)
    r = run(e, "y" + "x" * 40, n_cache_reuse=4)
    assert r["timings"]["cache_n"] == 0 and "cache_reuse_unsupported" in kinds(e)


# ---------------------------------------------------------------- queue, deferral, KV pressure

def test_a_request_for_a_busy_slot_is_deferred_then_runs():
    e = eng("-np 2 -c 4096 --cache-ram 0")
    t1 = e.submit("first request " * 5, n_predict=8, id_slot=0)
    e.step()
    t2 = e.submit("second request", n_predict=2, id_slot=0)
    e.step()
    assert t2.state is TaskState.DEFERRED and "task_deferred" in kinds(e)
    e.run_until_idle()
    assert t1.done and t2.done and t2.result["id_slot"] == 0
    assert kinds(e).index("task_undeferred") > kinds(e).index("task_deferred")


def test_unified_pool_pressure_purges_an_idle_slot_then_halves_the_batch():
    e = eng("-np 2 -c 256 --cache-ram 0 -kvu", n_slots=2, kv_unified=True, n_cells=120)
    run(e, "p" * 90, id_slot=0, n_predict=1)
    r = run(e, "q" * 100, id_slot=1, n_predict=1)
    ks = kinds(e)
    assert "slot_purge" in ks and "decode_retry" in ks
    assert r["timings"]["prompt_n"] == len(e.tokenize("q" * 100))
    assert len(e.slots[0].tokens) == 0  # the purged slot lost its prompt


def test_cancel_of_a_queued_task_answers_499():
    e = eng("-np 1 -c 4096", n_slots=1)
    t = e.submit("hello", n_predict=2)
    e.cancel(t)
    assert t.done and t.error.code == 499 and t.error.type == "cancelled"


# ---------------------------------------------------------------- slot actions, errors

def test_slot_actions_share_their_checks(tmp_path):
    assert check_slot_action(None, "save", "a.bin").code == 501
    assert check_slot_action(str(tmp_path), "bogus").message == "Invalid action"
    assert check_slot_action(str(tmp_path), "save", "../x").message == "Invalid filename"
    e = eng(f"-np 2 -c 4096 --cache-ram 0 --slot-save-path {tmp_path}")
    run(e, SYS + "keep me", id_slot=0)
    t = e.slot_action("save", 0, "../x")
    assert t.done and (t.error.code, t.error.message) == (400, "Invalid filename")
    for act, args in (("save", ("a.bin",)), ("erase", ()), ("restore", ("a.bin",))):
        t = e.slot_action(act, 0, *args)
        e.run_until(lambda: t.done)
        assert t.error is None, (act, t.error)
    r = run(e, SYS + "keep me, and more", id_slot=0)
    assert r["timings"]["cache_n"] > 0 and e.slots[0].origin == "slot"


def test_a_broken_token_listener_is_logged_and_the_request_finishes(caplog):
    e = eng("-np 1 -c 4096", n_slots=1)

    def boom(task, tok):
        raise RuntimeError("listener broke")

    r = run(e, "hi there", on_token=boom, n_predict=3)
    assert r["tokens_predicted"] == 3
    errs = [x for x in e.events.log if x.kind == "callback_error"]
    assert len(errs) == 3 and "listener broke" in errs[0].message
    assert "on_token callback" in caplog.text


def test_the_fake_is_a_memory_and_an_object_is_refused_by_name():
    check_memory(FakeMemory())
    with pytest.raises(TypeError, match="missing"):
        Engine("-np 1", memory=object())


# ---------------------------------------------------------------- failure semantics (server-context.cpp:2711-2886)

def _two_generating(e: Engine, n_predict: int = 12):
    a = e.submit(SYS + "first question", n_predict=n_predict)
    b = e.submit(SYS + "another one", n_predict=n_predict)
    e.run_until(lambda: all(s.stats.n_gen >= 2 for s in e.slots))
    assert {a.id_slot, b.id_slot} == {0, 1} and not (a.done or b.done)
    return a, b


def test_a_decode_that_raises_aborts_every_slot_and_the_next_request_is_served():
    """An exception out of the decode phase: `abort_all_slots("decode() failed: ...")` (server_error,
    500) for both tasks of the batch, the server's ERR line, and the loop keeps serving."""
    e = eng("-np 2 -c 4096 --cache-ram 0")
    a, b = _two_generating(e)
    real = e.memory.decode

    def broken(batch, off, n):
        raise RuntimeError("the memory broke")

    e.memory.decode = broken
    seq0 = e.events.n_events
    e.step()
    e.memory.decode = real
    for t in (a, b):
        assert t.done and t.result is None
        assert (t.error.code, t.error.type, t.error.message) == (500, "server_error", "decode() failed: the memory broke")
    fail = [x for x in e.events.log if x.seq >= seq0 and x.kind == "phase_failed"]
    assert [(x.level, x.message, x.payload.phase) for x in fail] == [("ERR", "decode() failed: the memory broke", "decode")]
    assert [x.task for x in e.events.log if x.seq >= seq0 and x.kind == "task_error"] == [s.task_prev.id for s in e.slots]  # slot order
    assert not any(s.is_processing for s in e.slots)
    r = run(e, SYS + "a third request", n_predict=5)
    assert r["tokens_predicted"] == 5 and r["stop_type"] == "limit"


def test_a_slot_that_raises_in_post_decode_is_released_and_the_other_slot_goes_on():
    """`iterate`: the exception of one slot's sampler ends that task alone ("got exception: ..."); the
    other task of the same batch finishes exactly as it does when nothing fails."""
    ref = eng("-np 2 -c 4096 --cache-ram 0")
    ra, rb = _two_generating(ref)
    ref.run_until_idle()
    e = eng("-np 2 -c 4096 --cache-ram 0")
    a, b = _two_generating(e)

    def broken(i):
        raise ValueError("no logits for this row")

    e.slots[a.id_slot].sampler.sample = broken
    e.step()
    assert a.done and a.error is not None and b.error is None and not b.done
    assert (a.error.code, a.error.message) == (500, "got exception: no logits for this row")
    exc = e.events.filter(["slot_exception"])
    assert [(x.slot, x.level, x.message) for x in exc] == [(a.id_slot, "ERR", "got exception: no logits for this row")]
    assert not e.events.filter(["phase_failed"])
    e.run_until_idle()
    assert b.result["content"] == rb.result["content"] and b.result["tokens_predicted"] == 12
    assert run(e, SYS + "first question", n_predict=3)["tokens_predicted"] == 3


def test_a_prompt_that_raises_in_pre_decode_ends_its_task_alone():
    """A slot whose KV and tokens disagree (`pos_min == -1` with n_past > 0: a GGML_ABORT in the server,
    an exception here) ends its own task in pre_decode; the slot generating beside it goes on."""
    e = eng("-np 2 -c 4096 --cache-ram 0")
    run(e, SYS + "the cached prefix", n_predict=2, id_slot=0)
    b = e.submit(SYS + "another one", n_predict=8, id_slot=1)
    e.run_until(lambda: e.slots[1].stats.n_gen >= 1)
    real = e.memory.pos_min
    e.memory.pos_min = lambda seq: -1 if seq == 0 else real(seq)
    a = e.submit(SYS + "the cached prefix, continued", n_predict=4, id_slot=0)
    e.run_until(lambda: a.done)
    e.memory.pos_min = real
    assert a.error is not None and a.error.message.startswith("got exception: pos_min == -1, but n_past = ")
    assert b.error is None
    e.run_until_idle()
    assert b.result["tokens_predicted"] == 8
    assert run(e, SYS + "the cached prefix, continued", n_predict=2, id_slot=0)["tokens_predicted"] == 2
