"""The proposals' rules (slotlab/proposals) on paper, each against the pin's on the same requests.

Every test makes the proposal decide otherwise than the pinned build on one request, and checks the pin
still decides as before without it: a proposal changes its own rule and nothing else. The two verified
ones (cache-ram-lru, kvcpc) are also replayed against a patched llama-server's recordings
(tests/golden/test_proposals_golden.py); these tests cover every proposal, fast, with no model."""

from __future__ import annotations

import numpy as np
import pytest

from slotlab import proposals as P
from slotlab.engine.params import ServerParams
from slotlab.engine.prompt_cache import PromptCache
from slotlab.sim.cli import resolve_profile
from slotlab.sim.paper_replay import paper_engine

#: a full-attention model: every cut-back is possible, so each test shows only its proposal's rule
LLAMA = resolve_profile("llama-3.1-8b")


def _run(flags: list[str], prompts: list[tuple[list[int], dict]]):
    eng, _ = paper_engine(flags, profile=LLAMA)
    out = []
    try:
        for toks, fields in prompts:
            t = eng.submit(toks, n_predict=fields.pop("n_predict", 2), **fields)
            eng.run_until(lambda: t.done)
            assert t.error is None, t.error
            out.append((t.id_slot, t.result["timings"]["cache_n"], t.result["timings"]["prompt_n"]))
        return out, eng.events.log
    finally:
        eng.close()


def _conv(seed: int, n: int) -> list[int]:
    return list(np.random.default_rng(seed).integers(100, 20000, n))


def test_every_proposal_says_where_it_comes_from_and_what_it_changes():
    for p in P.PROPOSALS.values():
        assert p.origin and p.changes and p.summary and p.args, p.name
        assert ("PR #" in p.origin or p.origin in ("slotlab", "b11549")), p.origin
        assert "::" in p.changes or ".cpp:" in p.changes, p.changes
        params = ServerParams.from_args(list(p.args))
        assert [q.name for q in P.active(params)] == [p.name]
        assert p.label() in P.label(params) and ("unverified" in p.label()) == (not p.verified)
    assert ServerParams.from_args([]).to_args() == [] and P.active(ServerParams.from_args([])) == []


def test_a_proposal_is_seen_from_the_first_event():
    _, log = _run(["-np", "1", "--proposal", "find-better", "-c", "2048"], [(_conv(1, 40), {})])
    lines = [e.message for e in log if e.kind == "params"]
    assert any(line.startswith("proposal find-better (PR #28992, unverified)") for line in lines), lines
    init = next(e for e in log if e.kind == "init")
    assert "--proposal" in init.data["flags"]


def test_lru_orders_entries_by_last_use_and_evicts_the_least_recent():
    """The cache alone: three entries saved with t_last 30, 10, 20; FIFO keeps insertion order, LRU
    the order of use, so the byte-limit eviction removes 30 (FIFO) or 10 (LRU)."""
    def fill(lru: bool) -> list[int]:
        c = PromptCache(3000, 0, lru=lru)
        for i, t in enumerate((30, 10, 20)):
            c.alloc(np.arange(i * 100 + 1, i * 100 + 11), [], 1000, t_last=t)
        c.alloc(np.arange(900, 910), [], 1000, t_last=40)  # makes room: one entry goes
        return [e.t_last for e in c.entries]
    assert fill(False) == [10, 20, 40]
    assert fill(True) == [20, 30, 40]


def test_lru_refreshes_an_entry_when_its_prompt_is_saved_again():
    c = PromptCache(0, 0, lru=True)
    a = np.arange(1, 21)
    c.alloc(a, [], 100, t_last=1)
    c.alloc(np.arange(50, 70), [], 100, t_last=2)
    assert c.alloc(a[:10], [], 100, t_last=5) is None  # already cached: the entry holding it is touched
    assert [int(e.tokens[0]) for e in c.entries] == [50, 1]
    fifo = PromptCache(0, 0)
    fifo.alloc(a, [], 100, t_last=1)
    fifo.alloc(np.arange(50, 70), [], 100, t_last=2)
    fifo.alloc(a[:10], [], 100, t_last=5)
    assert [int(e.tokens[0]) for e in fifo.entries] == [1, 50]


def test_kvcpc_limits_each_entry_instead_of_the_whole_cache():
    """--cache-ram -1: the pin's cache holds at most n_ctx tokens in all; -kvcpc 0 keeps every
    conversation (each at most one slot's context), -kvcpc 100 refuses the longer ones."""
    convs = [_conv(s, 300) for s in range(5)]
    reqs = [(c, {}) for c in convs] + [(convs[0], {})]
    base = ["-np", "1", "-c", "1024", "--cache-ram", "-1", "--no-cache-idle-slots"]
    pin, _ = _run(base, [(list(t), dict(f)) for t, f in reqs])
    per_entry, plog = _run(base + ["-kvcpc", "0"], [(list(t), dict(f)) for t, f in reqs])
    small, log = _run(base + ["-kvcpc", "100"], [(list(t), dict(f)) for t, f in reqs])
    assert pin[-1][1] == 0  # the first conversation was evicted by the aggregate limit (1024 tokens)
    assert per_entry[-1][1] == 299  # kept, and loaded back
    assert [e.kind for e in plog if e.kind == "cache_loaded"] and not any(
        e.kind == "cache_evict" and e.data["reason"] == "token_limit" for e in plog)
    assert small[-1][1] == 0 and any(e.kind == "cache_skip_entry_limit" for e in log)
    assert pin[:-1] == per_entry[:-1] == small[:-1]


def test_find_better_loads_the_cache_into_an_empty_pinned_slot():
    """Issue #28139's reproduction: A on slot 0, B on slot 0 (A goes to the cache), A pinned to the
    empty slot 1. The pin re-processes A (f_keep 0/0 is NaN: no cache update); find-better loads it."""
    a, b = _conv(1, 200), _conv(2, 200)
    reqs = [(a, {"id_slot": 0}), (b, {"id_slot": 0}), (a, {"id_slot": 1})]
    base = ["-np", "2", "-c", "2048", "--no-cache-idle-slots"]
    pin, _ = _run(base, [(list(t), dict(f)) for t, f in reqs])
    fb, log = _run(base + ["--proposal", "find-better"], [(list(t), dict(f)) for t, f in reqs])
    assert pin[2] == (1, 0, 200)
    assert fb[2][:2] == (1, 199)
    assert pin[:2] == fb[:2]
    assert [e.data.get("proposal") for e in log if e.kind == "slot_decision"][-1] == "find-better"


def test_no_sps_idle_sends_every_request_through_the_ram_cache_with_one_slot():
    """-np 1: a short prompt sharing the first tokens of a long conversation takes the slot by
    similarity and cuts the conversation back (f_keep >= 0.5 keeps it out of the cache: lost). With
    PR #22083's rule the slot is taken by LRU, the conversation saved first and loaded back after."""
    head = _conv(7, 60)
    long = head + _conv(8, 20)
    short = head + _conv(9, 20)
    reqs = [(long, {}), (short, {}), (long, {})]
    base = ["-np", "1", "-c", "2048", "--no-cache-idle-slots"]
    pin, _ = _run(base, [(list(t), dict(f)) for t, f in reqs])
    prop, _ = _run(base + ["--proposal", "no-sps-idle"], [(list(t), dict(f)) for t, f in reqs])
    assert pin[2][1] == 60  # only the shared head survived the short prompt
    assert prop[2][1] == 79  # the whole conversation came back from the RAM cache
    assert pin[:2] == prop[:2]


def test_idle_completion_only_is_said_to_change_nothing_slotlab_runs():
    p = P.get("idle-completion-only")
    assert not p.modelled and "changes nothing" in p.summary
    with pytest.raises(KeyError, match="slotlab knows"):
        P.get("nope")


def test_a_proposal_is_verified_only_with_a_patched_servers_recordings():
    """`verified` is a claim about tests/golden/traces_proposals/: a trace there turns the proposal on,
    and the patched llama-server's recording of it is there (test_proposals_golden replays them)."""
    import json
    from pathlib import Path

    d = Path(__file__).resolve().parent.parent / "golden" / "traces_proposals"
    recorded = {p.name[: -len(".llama-server.json")] for p in d.glob("*.llama-server.json")}
    on: dict[str, set] = {}
    for p in d.glob("*.json"):
        if p.name.endswith(".llama-server.json") or p.stem.endswith("_pin") or p.stem not in recorded:
            continue
        params = ServerParams.from_args(json.loads(p.read_text())["flags"])
        for q in P.active(params):
            on.setdefault(q.name, set()).add(p.stem)
    assert {n for n, p in P.PROPOSALS.items() if p.verified} == set(on)
