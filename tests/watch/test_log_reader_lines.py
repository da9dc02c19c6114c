"""Lines no golden log has (failures, DBG lines, rare evictions) read into the engine's event kinds,
and a reader started in the middle of a log."""

import math
from pathlib import Path

import numpy as np

from slotlab.engine import event_types as T
from slotlab.panel.state import PanelState
from slotlab.watch.log_reader import LOG, LogReader, requests_json
from slotlab.watch.patterns import TABLE

from logtext import request, slot, srv, start

DIR = Path(__file__).resolve().parent.parent / "golden" / "traces"


#: every line the tests of this module feed (for the table test)
CORPUS: list[str] = []


def read(lines):
    CORPUS.extend(lines)
    rd = LogReader()
    events = [e for ln in lines for e in rd.feed(ln)] + rd.flush()
    assert rd.problems == []
    for e in events:
        if e.kind != LOG:
            assert isinstance(e.payload, T.REGISTRY[e.kind]), e
    return rd, events


def kinds(events, *only):
    return [e.kind for e in events if e.kind in only]


def one(events, kind):
    found = [e for e in events if e.kind == kind]
    assert len(found) == 1, f"{kind}: {len(found)} events"
    return found[0]


def lru(sid, *cache, n_other=1, other_line=" - skipping, slot is empty"):
    """A selection of slot `sid` by LRU with the RAM-cache step `cache` lines; the other slot empty
    (`other_line`: its similarity check when it holds tokens)."""
    other = 1 - sid
    return [slot("get_availabl", other, -1, other_line),
            slot("get_availabl", sid, -1, "selected slot by LRU, t_last = -1"),
            srv("get_availabl", "updating prompt cache"), *cache,
            srv("get_availabl", "prompt cache update took 0.02 ms")]


BASE0 = srv("load", " - looking for better prompt, base f_keep = -1.000, f_sim = 0.000")
STATE0 = srv("update", " - cache state: 0 prompts, 0.000 MiB (limits: 128.000 MiB, 4096 tokens, 134217728 est)")


def idle_save(sid, n, mib="0.400", listing=None):
    """The idle-slot save after a launch: the slot's prompt saved to a new entry, listing, clear."""
    listing = listing or [
        srv("update", f" - cache state: 1 prompts, {mib} MiB (limits: 128.000 MiB, 4096 tokens, 7000 est)"),
        srv("update", f"   - prompt 0x55f9b46ee8d0: {n:7d} tokens, checkpoints:  0, {float(mib):9.3f} MiB")]
    return [slot("process_sing", sid, -1, "saving idle slot to prompt cache"),
            srv("prompt_save", f" - saving prompt with length {n}, total state size = {mib} MiB (draft: 0.000 MiB)"),
            *listing, slot("prompt_clear", sid, -1, f"clearing prompt with {n} tokens")]


def with_entry():
    """Start-up, a request on slot 1 (23 tokens held), a request on slot 0 that saves slot 1 as entry 0."""
    return (start() + lru(1, srv("load", " - looking for better prompt, base f_keep = -1.000, f_sim = 0.000"), STATE0)
            + request(1, 0, 20)
            + lru(0, srv("load", " - looking for better prompt, base f_keep = -1.000, f_sim = 0.000"), STATE0,
                  other_line=" - checking sim = 0.000 (0/30) > 0.100")  # slot 1 holds 23 tokens
            + [slot("launch_slot_", 0, 5, "processing task, is_child = 0")] + idle_save(1, 23)
            + request(0, 5, 30)[1:])


def test_the_selection_lines_get_the_launched_task_and_a_decision():
    rd, ev = read(with_entry())
    sel = [e for e in ev if e.kind in (T.SLOT_SKIP, T.SLOT_SIM, T.SLOT_SELECTED_BY_LRU, T.CACHE_UPDATE_BEGIN,
                                       T.CACHE_LOAD_BASE)]
    assert [e.task for e in sel] == [0, 0, 0, 0, 5, 5, 5, 5]  # the server printed task -1 on all of them
    d = [e for e in ev if e.kind == T.SLOT_DECISION]
    assert [(e.slot, e.task, e.payload.how, e.payload.update_cache) for e in d] == [(1, 0, "lru", True),
                                                                                    (0, 5, "lru", True)]
    alloc = one(ev, T.CACHE_ALLOC)
    d = alloc.payload.as_dict()
    assert (alloc.slot, alloc.task, d["id_slot"], d["id_task"], d["n_tokens"]) == (1, -1, 1, 0, 23)
    assert alloc.payload.size == round(0.4 * 2**20)
    assert one(ev, T.SLOT_CLEAR).payload.as_dict() == {"reason": "idle_clear", "n_tokens": 23}
    assert [r["id_slot"] for r in requests_json(ev)] == [1, 0]


def test_a_failed_restore_from_the_ram_cache():
    lines = with_entry() + lru(
        1,
        srv("load", " - looking for better prompt, base f_keep = -1.000, f_sim = 0.000"),
        srv("load", "   - prompt with length      23, lcp =      20, f_keep = 0.870, f_sim = 0.952"),
        srv("load", " - found better prompt with f_keep = 0.870, f_sim = 0.952"),
        srv("load", "failed to restore state with size 419430", "E"),
        slot("prompt_load", 1, -1, "failed to load prompt from cache", "W"),
        slot("prompt_clear", 1, -1, "clearing prompt with 0 tokens"),
        srv("update", " - cache state: 1 prompts, 0.400 MiB (limits: 128.000 MiB, 4096 tokens, 7000 est)"),
        srv("update", "   - prompt 0x55f9b46ee8d0:      23 tokens, checkpoints:  0,     0.400 MiB"),
    ) + request(1, 9, 21)
    rd, ev = read(lines)
    f = one(ev, T.CACHE_RESTORE_FAILED)
    assert (f.payload.entry_id, f.payload.which, f.payload.size, f.task, f.level) == (0, "tgt", 419430, 9, "ERR")
    assert one(ev, T.CACHE_LOAD_FAILED).task == 9
    clears = [e.payload.reason for e in ev if e.kind == T.SLOT_CLEAR]
    assert clears == ["idle_clear", "load_failed"]
    assert T.CACHE_LOADED not in {e.kind for e in ev}
    assert [e for e in ev if e.kind == T.SLOT_DECISION][-1].payload.load is False
    scores = [e for e in ev if e.kind == T.CACHE_LOAD_SCORES][-1].payload.as_dict()
    assert scores["winner_id"] == 0 and scores["scores"][0]["winner"] is True
    assert list(PanelState.rebuild(ev).entries) == [0]  # the entry stays cached


def test_a_load_moves_the_entry_and_its_checkpoints_into_the_slot():
    lines = with_entry() + lru(
        1,
        srv("load", " - looking for better prompt, base f_keep = -1.000, f_sim = 0.000"),
        srv("load", "   - prompt with length      23, lcp =      20, f_keep = 0.870, f_sim = 0.952"),
        srv("load", " - found better prompt with f_keep = 0.870, f_sim = 0.952"),
        STATE0,
    ) + request(1, 9, 21, n_past=20)
    rd, ev = read(lines)
    ld = one(ev, T.CACHE_LOADED)
    assert (ld.slot, ld.task, ld.payload.entry_id, ld.payload.n_tokens) == (1, 9, 0, 23)
    # exact float32 ratios (the prompt length comes from `new prompt`, after the launch), not the printed 0.952
    assert ld.payload.f_keep == float(np.float32(20) / np.float32(23))
    assert ld.payload.f_sim == float(np.float32(20) / np.float32(21))
    launched = [e for e in ev if e.kind == T.TASK_LAUNCHED][-1]
    assert launched.payload.n_tokens == 21
    kinds_after = [e.kind for e in ev if e.task == 9 and e.kind in (T.SLOT_DECISION, T.TASK_LAUNCHED, T.PROMPT_START)]
    assert kinds_after == [T.SLOT_DECISION, T.TASK_LAUNCHED, T.PROMPT_START]  # the engine's order
    dec = [e for e in ev if e.kind == T.SLOT_DECISION][-1].payload.as_dict()
    assert (dec["load"], dec["f_sim_best"], dec["f_keep_best"]) == (True, ld.payload.f_sim, ld.payload.f_keep)
    ev_load = [e for e in ev if e.kind == T.CACHE_EVICT]
    assert [(e.payload.reason, e.payload.entry_id) for e in ev_load] == [("loaded", 0)]
    plan = [e for e in ev if e.kind == T.PROMPT_PLAN][-1].payload.as_dict()
    assert (plan["origin"], plan["lcp"], plan["n_past"]) == ("cache #0", 20, 20)
    st = PanelState.rebuild(ev)
    assert st.entries == {} and st.history[1][-1][1:] == (20, 1, ("cache", "prefill"))


def test_a_failed_allocation_shrinks_the_cache():
    lines = with_entry() + [
        slot("get_availabl", 0, -1, " - skipping, slot is empty"),
        slot("get_availabl", 1, -1, " - skipping, slot is empty"),
        slot("get_availabl", 1, -1, "selected slot by LRU, t_last = -1"),
        slot("launch_slot_", 1, 12, "processing task, is_child = 0"),
        slot("process_sing", 0, -1, "saving idle slot to prompt cache"),
        srv("prompt_save", " - saving prompt with length 33, total state size = 0.500 MiB (draft: 0.000 MiB)"),
        srv("alloc", "failed to allocate memory for prompt cache state: std::bad_alloc", "E"),
        srv("alloc", " - cache size limit reduced to 0.160 MiB", "W"),
        srv("update", " - cache size limit reached, removing oldest entry (size = 0.400 MiB)", "W"),
        srv("update", " - cache state: 0 prompts, 0.000 MiB (limits: 0.160 MiB, 4096 tokens, 4096 est)"),
        slot("prompt_clear", 0, -1, "clearing prompt with 33 tokens"),
    ]
    rd, ev = read(lines)
    f = one(ev, T.CACHE_ALLOC_FAILED)
    assert (f.payload.size_tgt, f.payload.error, f.level) == (round(0.5 * 2**20), "std::bad_alloc", "ERR")
    r = one(ev, T.CACHE_LIMIT_REDUCED)
    assert (r.payload.limit_size, r.payload.limit_size_old) == (round(0.16 * 2**20), 128 << 20)
    ev_ = one(ev, T.CACHE_EVICT)
    assert (ev_.payload.reason, ev_.payload.entry_id, ev_.payload.n_tokens) == ("shrink", 0, 23)
    assert kinds(ev, T.CACHE_ALLOC) == [T.CACHE_ALLOC]  # only entry 0 was ever allocated
    assert PanelState.rebuild(ev).gauge["limit_size"] == round(0.16 * 2**20)


def test_over_limit_skip_duplicate_skip_and_the_limits_evictions():
    lines = with_entry() + [
        slot("get_availabl", 0, -1, " - skipping, slot is empty"),
        slot("get_availabl", 1, -1, " - skipping, slot is empty"),
        slot("get_availabl", 1, -1, "selected slot by LRU, t_last = -1"),
        slot("launch_slot_", 1, 12, "processing task, is_child = 0"),
        slot("process_sing", 0, -1, "saving idle slot to prompt cache"),
        srv("prompt_save", " - saving prompt with length 900, total state size = 200.000 MiB (draft: 0.000 MiB)"),
        srv("alloc", " - prompt state size 200.000 MiB exceeds cache size limit 128.000 MiB, skipping", "W"),
        slot("prompt_clear", 0, -1, "clearing prompt with 900 tokens"),
    ] + request(1, 12, 40)[1:] + [
        slot("get_availabl", 0, -1, " - skipping, slot is empty"),
        slot("get_availabl", 1, -1, " - checking sim = 0.025 (1/40) > 0.100"),
        slot("get_availabl", 0, -1, "selected slot by LRU, t_last = -1"),
        slot("launch_slot_", 0, 14, "processing task, is_child = 0"),
        slot("process_sing", 1, -1, "saving idle slot to prompt cache"),
        srv("prompt_save", " - saving prompt with length 43, total state size = 0.700 MiB (draft: 0.000 MiB)"),
        srv("update", " - cache token limit (50, est: 50) reached, removing oldest entry (size = 0.400 MiB)", "W"),
        srv("update", " - cache state: 1 prompts, 0.700 MiB (limits: 128.000 MiB, 50 tokens, 50 est)"),
        srv("update", "   - prompt 0x55f9b46ee9d0:      43 tokens, checkpoints:  0,     0.700 MiB"),
        slot("prompt_clear", 1, -1, "clearing prompt with 43 tokens"),
        slot("process_sing", 1, -1, "saving idle slot to prompt cache"),
        srv("prompt_save", " - saving prompt with length 43, total state size = 0.700 MiB (draft: 0.000 MiB)"),
        srv("alloc", " - prompt is already in the cache, skipping"),
    ]
    rd, ev = read(lines)
    s = one(ev, T.CACHE_SKIP_OVER_LIMIT)
    assert (s.payload.size, s.payload.limit_size, s.payload.n_tokens, s.level) == (200 << 20, 128 << 20, 900, "WRN")
    d = one(ev, T.CACHE_SKIP_DUPLICATE)
    assert d.payload.n_tokens == 43 and d.payload.entry_id == -1  # the log does not say which entry holds it
    ev_ = one(ev, T.CACHE_EVICT)
    assert (ev_.payload.reason, ev_.payload.entry_id) == ("token_limit", 0)
    assert [(e["id"], e["n_tokens"]) for e in PanelState.rebuild(ev).entries.values()] == [(1, 43)]


def test_a_fatal_decode_error_fails_every_running_request():
    lines = start() + lru(1, BASE0, STATE0) + [
        slot("launch_slot_", 1, 3, "processing task, is_child = 0"),
        slot("operator()", 1, 3, "new prompt, n_ctx_slot = 4096, n_keep = 0, task.n_tokens = 50"),
        slot("operator()", 1, 3, "cached n_tokens = 0, memory_seq_rm [0, end)"),
        srv("decode", "Context size has been exceeded. off = 0, n_batch = 1, ret = 1", "E"),
        srv("send_error", "task id = 3, error: Context size has been exceeded.", "E"),
        slot("release", 1, 3, "stop processing: n_tokens = 50, truncated = 0"),
        slot("prompt_clear", 1, -1, "clearing prompt with 50 tokens"),
    ]
    rd, ev = read(lines)
    f = one(ev, T.DECODE_FAILED)
    assert (f.payload.as_dict(), f.level) == ({"ret": 1, "off": 0, "n_batch": 1}, "ERR")
    e = one(ev, T.TASK_ERROR)
    assert (e.slot, e.task, e.message, e.payload.as_dict()) == (1, 3, "Context size has been exceeded.",
                                                   {"code": 500, "type": "server_error"})
    assert one(ev, T.SLOT_CLEAR).payload.reason == "decode_failed"
    assert T.TASK_DONE not in {x.kind for x in ev}
    (r,) = requests_json(ev)
    assert (r["status"], r["id_slot"], r["error"]["message"]) == (500, None, "Context size has been exceeded.")


def test_a_cancelled_request():
    lines = start() + lru(1, BASE0, STATE0) + [
        slot("launch_slot_", 1, 3, "processing task, is_child = 0"),
        slot("operator()", 1, 3, "new prompt, n_ctx_slot = 4096, n_keep = 0, task.n_tokens = 50"),
        srv("stop", "cancel task, id_task = 3", "W"),
        slot("release", 1, 3, "stop processing: n_tokens = 50, truncated = 0"),
        srv("stop", "cancel task, id_task = 3", "W"),  # a second one (the HTTP side): a plain line
    ]
    rd, ev = read(lines)
    c = one(ev, T.TASK_CANCELLED)
    assert (c.slot, c.task) == (1, 3)
    assert [r["status"] for r in requests_json(ev)] == [499]
    assert [e.message for e in ev if e.kind == LOG][-1] == "cancel task, id_task = 3"


def test_cache_reuse_with_its_debug_lines():
    lines = start() + lru(1, BASE0, STATE0) + [
        slot("launch_slot_", 1, 3, "processing task, is_child = 0"),
        slot("operator()", 1, 3, "new prompt, n_ctx_slot = 4096, n_keep = 0, task.n_tokens = 40"),
        slot("operator()", 1, 3, "trying to reuse chunks with size > 4, n_past = 10", "D"),
        slot("operator()", 1, 3, "reusing chunk with size 8, shifting KV cache [14, 22) -> [10, 18)"),
        slot("operator()", 1, 3, "after context reuse, new n_past = 18", "D"),
        slot("operator()", 1, 3, "cached n_tokens = 18, memory_seq_rm [18, end)"),
    ]
    rd, ev = read(lines)
    assert kinds(ev, T.CACHE_REUSE_BEGIN, T.CACHE_REUSE_SHIFT, T.CACHE_REUSE_END) == [
        T.CACHE_REUSE_BEGIN, T.CACHE_REUSE_SHIFT, T.CACHE_REUSE_END]
    assert one(ev, T.CACHE_REUSE_SHIFT).payload.as_dict() == {"src": [14, 22], "dst": [10, 18]}
    p = one(ev, T.PROMPT_PLAN).payload.as_dict()
    assert (p["lcp"], p["n_past"], p["shifts"], p["divergence"]) == (10, 18, [(14, 22, 10, 18)], 10)
    snap = [e for e in ev if e.kind == T.SLOT_SNAPSHOT and e.slot == 1][-1]
    assert snap.payload.shifts == [(14, 22, 10, 18)]


def test_checkpoint_chain_too_close_and_supersede():
    ck = "created context checkpoint {} of 3 (pos_min = 0, pos_max = {}, n_tokens = {}, size = 0.250 MiB)"
    lines = start() + lru(0, BASE0, STATE0) + [
        slot("launch_slot_", 0, 3, "processing task, is_child = 0"),
        slot("operator()", 0, 3, "new prompt, n_ctx_slot = 4096, n_keep = 0, task.n_tokens = 400"),
        slot("operator()", 0, 3, "cached n_tokens = 0, memory_seq_rm [0, end)"),
        slot("create_check", 0, 3, ck.format(1, 99, 100)),
        slot("create_check", 0, 3, ck.format(2, 199, 200)),
        slot("create_check", 0, 3, ck.format(3, 299, 300)),
        slot("create_check", 0, 3, "erasing context checkpoint too close to an earlier one "
                                   "(pos_min = 0, pos_max = 199, n_tokens = 200, size = 0.250 MiB)"),
        slot("create_check", 0, 3, "superseding context checkpoint at n_tokens = 300"),
        slot("create_check", 0, 3, ck.format(2, 299, 300)),
        slot("operator()", 0, 3, "empty prompt - releasing slot", "W"),
    ]
    rd, ev = read(lines)
    evs = [(e.payload.reason, e.payload.n_tokens, e.payload.pos_min, e.payload.pos_max)
           for e in ev if e.kind == T.CHECKPOINT_EVICT]
    assert evs == [("too_close", 200, 0, 199), ("supersede", 300, 0, 299)]
    st = PanelState.rebuild(ev)
    assert [c[:3] for c in st.slots[0].checkpoints] == [(0, 99, 100), (0, 299, 300)]
    assert one(ev, T.PROMPT_EMPTY).level == "WRN"


def test_a_deferral_named_by_its_debug_line():
    lines = start() + lru(1, BASE0, STATE0) + [
        slot("launch_slot_", 1, 3, "processing task, is_child = 0"),
        slot("operator()", 1, 3, "new prompt, n_ctx_slot = 4096, n_keep = 0, task.n_tokens = 50"),
        slot("operator()", 1, 3, "cached n_tokens = 0, memory_seq_rm [0, end)"),
        slot("init_sampler", 1, 3, "init sampler, took 0.01 ms, tokens: text = 50, total = 50"),
        slot("get_availabl", 1, 3, "selected slot by id (1)"),
        slot("get_availabl", 1, 3, " - skipping, is_processing = 1"),
        srv("process_sing", "requested slot is unavailable, defer task, id_task = 9", "D"),
        slot("process_sing", 1, 3, "__TEST_TAG_CACHE_IDLE_SLOT__", "D"),
    ]
    rd, ev = read(lines)
    d = one(ev, T.TASK_DEFERRED)
    assert (d.task, d.level) == (9, "DBG")
    assert [e.task for e in ev if e.kind in (T.SLOT_SELECTED_BY_ID, T.SLOT_SKIP)][-2:] == [9, 9]
    dec = [e for e in ev if e.kind == T.SLOT_DECISION][-1]
    assert (dec.slot, dec.task, dec.payload.how, dec.payload.id_requested, dec.payload.f_keep) == (1, 9, "id", 1, 0.0)
    assert one(ev, T.IDLE_SLOT_SAVED).slot == 1
    # the same with the busy slot still empty (prompt not processed yet): f_keep = 0/0, as in the engine
    rd, ev = read([ln for ln in lines if "init sampler" not in ln])
    assert math.isnan([e for e in ev if e.kind == T.SLOT_DECISION][-1].payload.f_keep)


def test_a_disabled_cache_progress_lines_and_a_failed_speculative_batch():
    lines = [srv("load_model", "initializing, n_slots = 1, n_ctx_slot = 4096, kv_unified = 'false'"),
             srv("load_model", "prompt cache is disabled - use `--cache-ram N` to enable it"),
             srv("llama_server", "model loaded"),
             slot("get_availabl", 0, -1, "selected slot by LRU, t_last = -1"),
             slot("launch_slot_", 0, 0, "processing task, is_child = 0"),
             slot("operator()", 0, 0, "new prompt, n_ctx_slot = 4096, n_keep = 0, task.n_tokens = 3000"),
             slot("operator()", 0, 0, "cached n_tokens = 0, memory_seq_rm [0, end)"),
             slot("print_timing", 0, 0, "prompt processing, n_tokens =   2048, progress = 0.68, t =   3.10 s / 660.00 "
                                        "tokens per second"),
             slot("print_timing", 0, 0, "n_gen =      7, tg =  20.00 t/s, tg_3s =  20.00 t/s"),
             slot("operator()", 0, 0, "accepted  3/ 4 draft tokens"),
             srv("decode", "failed to process speculative batch", "E"),
             srv("send_error", "task id = 0, error: decode() failed: failed to process speculative batch", "E"),
             slot("release", 0, 0, "stop processing: n_tokens = 3007, truncated = 0")]
    rd, ev = read(lines)
    assert one(ev, T.CACHE_INIT).payload.as_dict() == {}
    init = one(ev, T.INIT).payload.as_dict()
    assert (init["n_slots"], init["kv_unified"], init["cache_ram"]) == (1, False, 0)
    assert one(ev, T.DECODE_FAILED).payload.as_dict() == {"ret": -1, "off": -1, "n_batch": -1}  # the line has no numbers
    assert one(ev, T.SPEC_VERIFY).payload.as_dict() == {"n_draft": 4, "n_accepted": 3}
    snaps = [e.payload.as_dict() for e in ev if e.kind == T.SLOT_SNAPSHOT]
    assert (snaps[-2]["prompt_n"], snaps[-2]["n_gen"]) == (2048, 7)
    assert [r["status"] for r in requests_json(ev)] == [500]


def test_reading_from_the_middle_of_a_log():
    """No start-up lines: the first listing tells the cache's entries; later lines refer to them."""
    lines = [
        srv("update", " - cache state: 2 prompts, 0.900 MiB (limits: 1.000 MiB, 4096 tokens, 5000 est)"),
        srv("update", "   - prompt 0x55f9b46ee8d0:      23 tokens, checkpoints:  0,     0.400 MiB"),
        srv("update", "   - prompt 0x55f9b46ee9d0:      30 tokens, checkpoints:  0,     0.500 MiB"),
        slot("process_sing", 1, -1, "saving idle slot to prompt cache"),
        srv("prompt_save", " - saving prompt with length 35, total state size = 0.550 MiB (draft: 0.000 MiB)"),
        srv("alloc", " - making room for prompt cache entry, removing oldest entry (size = 0.400 MiB)", "W"),
        srv("update", " - cache state: 2 prompts, 1.050 MiB (limits: 1.000 MiB, 4096 tokens, 5000 est)"),
        srv("update", "   - prompt 0x55f9b46ee9d0:      30 tokens, checkpoints:  0,     0.500 MiB"),
        srv("update", "   - prompt 0x55f9b46eead0:      35 tokens, checkpoints:  0,     0.550 MiB"),
        slot("release", 0, 77, "stop processing: n_tokens = 60, truncated = 0"),
    ]
    rd, ev = read(lines)
    assert rd.n_resyncs == 1
    allocs = [(e.payload.entry_id, e.payload.n_tokens) for e in ev if e.kind == T.CACHE_ALLOC]
    assert allocs == [(0, 23), (1, 30), (2, 35)]
    ev_ = one(ev, T.CACHE_EVICT)
    assert (ev_.payload.reason, ev_.payload.entry_id, ev_.payload.n_tokens) == ("make_room", 0, 23)
    st = PanelState.rebuild(ev)
    assert [(e["id"], e["n_tokens"]) for e in st.entries.values()] == [(1, 30), (2, 35)]
    assert st.slots[0].n_tokens == 60  # a slot first seen at its release


def test_the_proposals_servers_lines_a_per_entry_skip_and_an_lru_placement():
    """The two lines a patched llama-server prints (patches/proposals): -kvcpc's per-entry skip, and
    --cache-ram-lru's placement of a new entry before older ones (the reader's list follows it)."""
    lines = with_entry() + [
        slot("get_availabl", 0, -1, " - skipping, slot is empty"),
        slot("get_availabl", 1, -1, "selected slot by LRU, t_last = -1"),
        slot("launch_slot_", 1, 12, "processing task, is_child = 0"),
        slot("process_sing", 0, -1, "saving idle slot to prompt cache"),
        srv("prompt_save", " - saving prompt with length 900, total state size = 2.000 MiB (draft: 0.000 MiB)"),
        srv("alloc", " - prompt with 900 tokens exceeds the per-entry token limit 512, skipping", "W"),
    ] + request(1, 12, 40)[1:] + [
        slot("get_availabl", 1, -1, "selected slot by LRU, t_last = 5"),
        slot("launch_slot_", 1, 13, "processing task, is_child = 0"),
        slot("process_sing", 0, -1, "saving idle slot to prompt cache"),
        srv("prompt_save", " - saving prompt with length 31, total state size = 0.500 MiB (draft: 0.000 MiB)"),
        srv("alloc", " - prompt cache LRU: entry with t_last = 3 placed at 0 of 2"),
        slot("prompt_clear", 0, -1, "clearing prompt with 31 tokens"),
    ]
    rd, ev = read(lines)
    s = one(ev, T.CACHE_SKIP_ENTRY_LIMIT)
    assert (s.payload.n_tokens, s.payload.limit_tokens_entry, s.level) == (900, 512, "WRN")
    p = one(ev, T.CACHE_LRU_PLACED)
    assert (p.payload.t_last, p.payload.position, p.payload.n_entries) == (3, 0, 2)
    assert [e.n_tokens for e in rd.prompt_cache.entries] == [31, 23]  # placed at the front, not appended


def test_every_line_of_the_table_is_read_somewhere():
    """Each pattern of the reader's table matches a line of a golden log or of these tests."""
    from slotlab.watch.lines import parse_line
    from slotlab.watch.patterns import match

    if not CORPUS:  # run alone: feed the other tests' lines first
        for name, fn in list(globals().items()):
            if name.startswith("test_") and name != "test_every_line_of_the_table_is_read_somewhere":
                fn()
    seen = set()
    logs = [*DIR.glob("*.llama-server.log"), *(DIR.parent / "traces_proposals").glob("*.llama-server.log")]
    lines = [ln for p in logs for ln in p.read_text().splitlines()] + CORPUS
    for line in lines:
        ln = parse_line(line)
        hit = match(ln.src, ln.msg) if ln.src else None
        if hit:
            seen.add(hit[0])
    assert set(TABLE) - seen == set()


def test_the_readme_lists_every_line_with_its_level():
    readme = (Path(__file__).resolve().parent.parent.parent / "slotlab" / "watch" / "README.md").read_text()
    rows = [r for r in readme.splitlines() if r.startswith("| ")]
    for name, (_, level) in TABLE.items():
        row = next((r for r in rows if f"`{name}`" in r.split(" | ")[2]), None)
        assert row is not None, f"README has no row for {name}"
        assert level in row.split(" | ")[1], f"README: {name} is {level}"

