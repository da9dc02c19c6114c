"""The engine on the real model: drivers, introspection and bad input."""

import json

import numpy as np
import pytest

from slotlab.engine.scheduler import Engine, EngineDied
from slotlab.engine.task import TaskState
from slotlab.errors import ConfigError

PROMPT = ("Note 1: the lighthouse keeper logs every passing ship in a blue book. " * 3).strip()


@pytest.fixture
def engine(model):
    e = Engine(["-np", "2", "-kvu", "-c", "2048", "--cache-ram", "64", "--swa-full"], model=model)
    yield e
    e.close()


def test_live_mode_matches_step_mode(model):
    step = Engine(["-np", "2", "-c", "2048", "--swa-full"], model=model)
    a = step.submit(PROMPT, n_predict=6)
    b = step.submit(PROMPT + " And then?", n_predict=6)
    step.run_until_idle()
    live = Engine(["-np", "2", "-c", "2048", "--swa-full"], model=model)
    live.start()
    live.pause()  # queue both before the thread takes either, as step mode does
    try:
        la = live.submit(PROMPT, n_predict=6)
        lb = live.submit(PROMPT + " And then?", n_predict=6)
        live.resume()
        ra, rb = la.wait(60), lb.wait(60)
    finally:
        live.stop()
    assert (ra["id_slot"], ra["content"]) == (a.result["id_slot"], a.result["content"])
    assert (rb["id_slot"], rb["content"]) == (b.result["id_slot"], b.result["content"])


def test_readers_get_the_lock_between_steps_of_a_live_generation(engine):
    """`/slots` during a long generation answers within a step or two, as the server's loop answers it
    between batches; a plain lock let the engine thread take it back at once (a 5 s timeout in CI)."""
    import time

    engine.start()
    t = engine.submit(PROMPT, n_predict=300, ignore_eos=True)
    try:
        deadline = time.monotonic() + 60
        while not any(s.is_processing and s.stats.n_gen > 2 for s in engine.slots):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        waits, busy = [], []
        for _ in range(20):
            t0 = time.monotonic()
            js = engine.slots_json()
            waits.append(time.monotonic() - t0)
            busy.append(any(s["is_processing"] for s in js))
            time.sleep(0.005)
        decoded = [s["next_token"][0]["n_decoded"] for s in engine.slots_json() if s["is_processing"]]
    finally:
        engine.cancel(t)
        engine.stop()
    # each read waited for at most the step in flight, not for the generation to end
    assert all(busy) and decoded and decoded[0] < 300, (busy, decoded)
    assert max(waits) < 2.0, waits


def test_second_turn_reuses_the_slot_and_metrics_count_it(engine):
    t1 = engine.submit(PROMPT, n_predict=4)
    engine.run_until_idle()
    t2 = engine.submit(PROMPT + " Which ships?", n_predict=4)
    engine.run_until_idle()
    assert t2.result["id_slot"] == t1.result["id_slot"]
    n1 = t1.result["tokens_evaluated"]
    assert t2.result["timings"]["cache_n"] == n1  # the whole first prompt reused
    assert t1.result["tokens_cached"] == n1 + 4 - 1  # the last sampled token is never decoded
    m = engine.metrics
    assert m.prompt_tokens_cached_total == n1
    assert m.prompt_tokens_total == n1 + t2.result["timings"]["prompt_n"]
    slots = engine.slots_json()
    s = slots[t2.result["id_slot"]]
    assert s["n_prompt_tokens"] == t2.result["tokens_cached"] and not s["is_processing"]
    assert s["n_prompt_tokens_cache"] == 0  # stats are zeroed by release, as in the server


def test_events_carry_server_log_text_and_export(engine, tmp_path):
    engine.submit(PROMPT, n_predict=2)
    engine.run_until_idle()
    kinds = {e.kind for e in engine.events.log}
    assert {"slot_selected_by_lru", "task_launched", "prompt_batch", "decode", "slot_release"} <= kinds
    lru = engine.events.filter(["slot_selected_by_lru"])[0]
    assert lru.message == "selected slot by LRU, t_last = -1" and lru.slot == 1
    n = engine.events.to_jsonl(tmp_path / "ev.jsonl")
    lines = (tmp_path / "ev.jsonl").read_text().splitlines()
    assert n == len(lines) and json.loads(lines[0])["seq"] == 0


def test_injected_allocation_failure_shrinks_the_cache(model):
    calls = []

    def allocate(n):
        calls.append(n)
        if len(calls) == 2:
            raise MemoryError("injected")
        return np.zeros(n, dtype=np.uint8)

    e = Engine(["-np", "1", "-c", "2048", "--cache-ram", "64", "--swa-full", "-sps", "0"], model=model, allocate=allocate)
    for topic in ("ships", "tides", "stars"):
        e.submit(f"A long note about {topic}. " * 10, n_predict=2)
        e.run_until_idle()
    ev = [x for x in e.events.log if x.kind in ("cache_alloc_failed", "cache_limit_reduced")]
    assert [x.kind for x in ev] == ["cache_alloc_failed", "cache_limit_reduced"]
    assert e.cache.limit_size < 64 * 2**20
    assert "cache size limit reduced to" in ev[1].message
    e.close()


def test_prompt_longer_than_slot_context(engine):
    t = engine.submit("word " * 3000, n_predict=2)
    engine.run_until_idle()
    assert t.error.code == 400 and t.error.type == "exceed_context_size_error"
    assert "exceeds the available context size (2048 tokens)" in t.error.message
    assert all(not s.is_processing for s in engine.slots)


def test_empty_token_prompt_and_bad_fields(engine):
    t = engine.submit([], n_predict=2)
    engine.run_until_idle()
    assert t.result["content"] == "" and t.result["tokens_evaluated"] == 0
    with pytest.raises(ConfigError, match="n_predict"):
        engine.submit("hi", n_predict=-5)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.submit([1, 2, 10**9])


def test_id_slot_wraps_like_the_server(engine):
    t = engine.submit(PROMPT, n_predict=2, id_slot=5)  # 5 % 2 -> slot 1
    u = engine.submit(PROMPT, n_predict=2, id_slot=-2)  # (2**64 - 2) % 2 -> slot 0
    engine.run_until_idle()
    assert (t.result["id_slot"], u.result["id_slot"]) == (1, 0)


def test_dead_engine_thread_is_reported(engine):
    """An exception outside `update_slots`' phases (here the task queue) ends the loop, as it ends
    llama-server's: every waiting task gets the error and the engine refuses new work."""
    engine.start()
    engine.pause()
    def broken_pop(*a):
        raise RuntimeError("the queue broke")

    engine.core.tq.pop = broken_pop  # sabotage: the next process_new_tasks crashes the loop
    t = engine.submit(PROMPT, n_predict=2)
    engine.resume()
    with pytest.raises(Exception, match="engine stopped"):
        t.wait(30)
    with pytest.raises(EngineDied):
        engine.submit(PROMPT)
    assert t.state is TaskState.DONE


def test_a_phase_that_raises_mid_batch_answers_its_tasks_with_the_servers_error(model):
    """Two tasks generating in one batch on the real context; the decode of that batch raises: both
    get `decode() failed: ...` (500, server_error), the events show the ERR lines, and the engine,
    live, serves the next request with the same answer as a fresh engine gives. Then one slot's
    sampler raises in post_decode: only its task ends ("got exception: ..."), the other finishes."""
    flags = ["-np", "2", "-c", "2048", "--swa-full", "--cache-ram", "0"]
    e = Engine(flags, model=model)
    a = e.submit(PROMPT, n_predict=16, ignore_eos=True)
    b = e.submit("A different prompt about the sea", n_predict=16, ignore_eos=True)
    e.run_until(lambda: all(s.stats.n_gen >= 2 for s in e.slots))
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
    failed = [x for x in e.events.log if x.seq >= seq0 and x.level == "ERR"]
    assert [x.kind for x in failed] == ["phase_failed", "task_error", "task_error"]
    assert failed[0].message == "decode() failed: the memory broke"
    e.start()  # the live loop keeps serving
    c = e.submit("Q: name three rivers.", n_predict=6, cache_prompt=False)  # computed as on a fresh engine
    c.wait(60)
    e.stop()
    fresh = Engine(flags, model=model)
    f = fresh.submit("Q: name three rivers.", n_predict=6, cache_prompt=False)
    fresh.run_until(lambda: f.done)
    assert c.error is None and c.result["content"] == f.result["content"] and c.result["tokens_predicted"] == 6
    # one slot's part of post_decode raises: `iterate` ends that task alone
    a = e.submit(PROMPT + " Again.", n_predict=12, ignore_eos=True)
    b = e.submit("A different prompt about the sea", n_predict=12, ignore_eos=True)
    e.run_until(lambda: all(s.stats.n_gen >= 1 for s in e.slots))

    def no_logits(i):
        raise ValueError("no logits for this row")

    e.slots[a.id_slot].sampler.sample = no_logits
    e.run_until_idle()
    assert (a.error.code, a.error.message) == (500, "got exception: no logits for this row")
    assert b.error is None and b.result["tokens_predicted"] == 12
    assert [x.slot for x in e.events.filter(["slot_exception"])] == [a.id_slot]
    e.close()
    fresh.close()


def test_kv_pressure_halves_the_batch_when_nothing_idle_can_be_purged(model):
    """Unified pool, both slots busy: `try_clear_idle_slots` finds nothing, so the server's answer is
    to halve n_batch until the chunk fits (spec 6.3), down to 1 and the fatal context error."""
    e = Engine(["-np", "2", "-kvu", "-c", "1024", "--no-cache-idle-slots", "--swa-full"], model=model)
    a = e.submit("word " * 500, n_predict=200, ignore_eos=True)
    e.run_until(lambda: a.done or e.slots[a.id_slot].stats.n_gen > 0)
    b = e.submit("other " * 600, n_predict=2, ignore_eos=True)  # cannot fit beside a's ~500 cells
    e.run_until_idle()
    retries = [x for x in e.events.log if x.kind == "decode_retry"]
    purges = e.events.filter(["slot_purge"])
    assert retries and (not purges or purges[0].seq > retries[0].seq)
    n_batch = e.ctx.n_batch  # min(-b 2048, n_ctx 1024) = 1024 in the library
    halvings = [x.payload.n_batch for x in retries]
    assert halvings[0] == n_batch // 2 and halvings[-1] == 1  # after a success n_batch starts over
    # the pool cannot hold both: halving ends at n_batch 1 with the server's fatal error for every
    # processing slot; nothing hangs
    assert a.done and b.done
    errs = [t.error.message for t in (a, b) if t.error is not None]
    assert all(m == "Context size has been exceeded." for m in errs)
    e.close()
