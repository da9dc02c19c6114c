"""A cause for every miss, and the flag that would have saved it (slotlab.explain, slotlab.counterfactual).

Each scenario makes one mechanism lose tokens the server held; the test asserts the cause the explainer
names, then replays the trace up to that request with the suggested flag and requires the saving.
Runs on the fake memory (a sliding window of 512 like Gemma 3's unless --swa-full): seconds."""

from __future__ import annotations

import pytest

from slotlab.counterfactual import diagnose_trace, flag_change
from slotlab.engine.replay import parse_trace
from slotlab.explain import NOT_TESTED
from slotlab.memory.fake import FakeMemory

SYS = "You are the support assistant of a bicycle shop. Policies: be kind, be brief, be exact. " * 2


def fake(params):
    """The fake memory for a parsed command line: SWA 512 unless --swa-full."""
    unified = params.kv_unified_effective
    n_ctx = params.n_ctx_requested or 4096
    return FakeMemory(n_slots=params.n_slots, n_ctx=n_ctx, kv_unified=unified, n_swa=0 if params.swa_full else 512,
                      n_ubatch=params.n_ubatch, n_batch=params.n_batch)


def diag(flags: str, requests: list[dict], **kw):
    trace = parse_trace({"flags": flags.split(), "requests": requests})
    return diagnose_trace(trace, memory_factory=fake, **kw)


def only_miss(d, cause: str):
    assert [m.cause for _, m in d.misses] == [cause], d.lines()
    return d.misses[0][1]


def test_no_checkpoint_on_a_window_memory_is_saved_by_swa_full():
    """Defaults but no checkpoints: a follow-up that cuts back into the slot must re-process all."""
    r = [{"prompt": SYS + "user: my brakes squeal", "n_predict": 4},
         {"prompt": SYS + "user: my brakes squeal. assistant: ok. user: and the chain?", "n_predict": 4}]
    d = diag("-np 1 -c 4096 --cache-ram 0 --ctx-checkpoints 0", r)
    i, m = d.misses[0]
    assert (i, m.cause) == (1, "no_checkpoint") and m.n_past == 0 and m.lost > 100
    assert "pos_min 0 >= 0" in m.detail and "--swa-full" in m.suggest
    best = d.best(1)
    assert best is not None and best.saved > 100
    assert best.flags in (["--swa-full"], ["--ctx-checkpoints", "64"])


def test_checkpoints_erased_by_the_cap_name_the_cap_and_a_bigger_cap_saves():
    # many user turns at -cms 0 fill a cap of 2; a branch back to turn 1 finds its checkpoint gone
    turns = [SYS + "".join(f" user: question {k}. assistant: answer {k}." for k in range(j)) for j in range(1, 6)]
    r = [{"prompt": t, "n_predict": 2, "message_delimiters": [{"role": "user", "delimiter": " user:"}]} for t in turns]
    r.append({"prompt": turns[0] + " user: a different second question", "n_predict": 2,
              "message_delimiters": [{"role": "user", "delimiter": " user:"}]})
    d = diag("-np 1 -c 4096 --cache-ram 0 --ctx-checkpoints 2 --checkpoint-min-step 0", r)
    i, m = d.misses[-1]
    assert i == 5 and m.cause in ("no_checkpoint", "checkpoint_early")
    if m.cause == "no_checkpoint":
        assert "erased by the --ctx-checkpoints cap" in m.detail and "--ctx-checkpoints 4" in m.candidates
    assert d.best(5) is not None and d.best(5).saved > 0
    # only what reused more is advised, best first, each with its figure; a cap of 4 saved nothing here
    tried = {" ".join(c.flags): c.saved for c in d.tried[5]}
    assert tried["--ctx-checkpoints 4"] <= 0 and "--ctx-checkpoints 4" not in m.suggest
    assert m.flags() == sorted((f for f, n in tried.items() if n > 0), key=lambda f: -tried[f])
    assert m.flags()[0] == "--swa-full" and m.saved["--swa-full"] == tried["--swa-full"] == m.lost
    assert f"--swa-full (+{m.lost} tokens reused" in m.line()


def test_overwritten_conversation_is_saved_by_the_ram_cache():
    """Two users on one slot without a RAM cache: Bob's prompt overwrites Alice's conversation."""
    alice = SYS + "user: Alice asks about tyres"
    r = [{"prompt": alice, "n_predict": 4},
         {"prompt": "Bob has a totally different question about opening hours", "n_predict": 4},
         {"prompt": alice + " and tubes", "n_predict": 4}]
    d = diag("-np 1 -c 4096 --cache-ram 0 --swa-full", r)
    m = only_miss(d, "dropped")
    assert "overwritten" in m.detail and m.suggest[0] == "--cache-ram 8192"
    assert d.best(2).saved >= len(SYS)  # the RAM cache keeps Alice's prefix across Bob's request


def test_busy_holder_is_saved_by_another_slot():
    alice = SYS + "user: Alice asks about tyres"
    r = [{"prompt": alice, "n_predict": 2, "id_slot": 0},
         {"prompt": alice + " -- and a long answer, please", "n_predict": 40, "wait": False},  # slot 0, busy
         {"prompt": alice + " and tubes", "n_predict": 2}]
    d = diag("-np 2 -c 4096 --cache-ram 0 --swa-full", r)
    m = only_miss(d, "busy")
    assert "slot 0 held" in m.detail and m.suggest == ["send it with id_slot 0 (it then waits for that slot)"]
    assert d.tried[2] == []  # no flag to try: the honest advice is a request field


def test_similarity_threshold_names_the_sps_that_would_have_picked_the_holder():
    alice = SYS + "user: Alice asks about tyres"
    longer = alice + " and also " + "many other things in a very long follow-up message " * 12
    r = [{"prompt": "x", "n_predict": 2, "id_slot": 0},  # slot 0 released first: the LRU one
         {"prompt": alice, "n_predict": 2, "id_slot": 1},
         {"prompt": longer, "n_predict": 2}]
    d = diag("-np 2 -c 4096 --cache-ram 0 -sps 0.9 --swa-full", r)
    m = only_miss(d, "threshold")
    fl = flag_change(m.suggest[0])
    assert fl[0] == "-sps" and float(fl[1]) < 0.9
    assert d.best(2) is not None and d.best(2).saved > 100


def test_cache_prompt_false_is_its_own_cause():
    r = [{"prompt": SYS + "one", "n_predict": 2}, {"prompt": SYS + "two", "n_predict": 2, "cache_prompt": False}]
    d = diag("-np 1 -c 4096 --cache-ram 0 --swa-full", r)
    assert only_miss(d, "cache_prompt_off").lost > 100


def test_totals_by_cause_add_up():
    alice = SYS + "user: Alice asks about tyres"
    r = [{"prompt": alice, "n_predict": 4}, {"prompt": "Bob: opening hours?", "n_predict": 4},
         {"prompt": alice + " and tubes", "n_predict": 4}]
    d = diag("-np 1 -c 4096 --cache-ram 0 --swa-full", r, max_misses=0)
    assert sum(d.lost_by_cause.values()) == sum(m.lost for _, m in d.misses) > 0
    assert d.lines()[-1].startswith("tokens lost by cause: dropped")


@pytest.mark.parametrize("s,want", [("--ctx-checkpoints 64", ["--ctx-checkpoints", "64"]), ("-sps 0.05", ["-sps", "0.05"]),
                                    ("--swa-full", ["--swa-full"]), ("more slots (-np)", None)])
def test_flag_change_parses_only_flags(s, want):
    assert flag_change(s) == want


def test_a_slot_kept_by_similarity_overwrites_unsaved_and_a_higher_sps_saves_it():
    """The default-flag trap: Bob shares the system prompt, so his request keeps Alice's slot
    (f_keep >= 0.5) without saving her conversation; only -sps above that f_sim (LRU, which saves to
    the RAM cache) would have kept it."""
    alice = SYS + "user (Alice): my brakes squeal"
    r = [{"prompt": alice, "n_predict": 4}, {"prompt": SYS + "user (Bob): when do you open?", "n_predict": 4},
         {"prompt": alice + " assistant: check the pads. user (Alice): and the chain?", "n_predict": 4}]
    d = diag("-np 1 -c 4096 --cache-ram 64 --swa-full", r)
    i, m = d.misses[-1]
    assert i == 2 and m.cause == "dropped" and "without saving it to the RAM cache" in m.detail
    fl = flag_change(m.suggest[0])
    assert fl[0] == "-sps" and d.best(2) is not None and d.best(2).flags == fl and d.best(2).saved > 0


ALICE = SYS + "user (Alice): " + "my rear wheel wobbles after the last ride over cobbles, and the spokes look bent. " * 4


def test_a_request_pinned_to_another_slot_names_the_pin():
    r = [{"prompt": ALICE, "n_predict": 2, "id_slot": 0}, {"prompt": ALICE + " and the front one?", "n_predict": 2,
                                                            "id_slot": 1}]
    m = only_miss(diag("-np 2 -c 4096 --cache-ram 0 --swa-full", r), "pinned")
    assert "asked for slot 1" in m.detail and m.suggest == ["id_slot -1"]


def test_a_kept_slot_hides_a_better_ram_entry_and_a_higher_sps_finds_it():
    r = [{"prompt": ALICE, "n_predict": 2},
         {"prompt": SYS + "u: hi", "n_predict": 2},  # f_keep < 0.5 on Alice's slot: Alice is saved to RAM
         {"prompt": ALICE + " and the front one?", "n_predict": 2}]  # keeps the short slot (f_keep >= 0.5)
    d = diag("-np 1 -c 4096 --cache-ram 64 --swa-full", r)
    i, m = d.misses[-1]
    assert i == 2 and m.cause == "slot_kept" and m.where.startswith("entry #")
    assert flag_change(m.suggest[0])[0] == "-sps" and d.best(2) is not None and d.best(2).saved > 100


def test_an_entry_below_the_f_keep_floor_is_never_loaded():
    r = [{"prompt": ALICE + " " + "more details " * 30, "n_predict": 2},
         {"prompt": "completely unrelated: opening hours?", "n_predict": 2},  # LRU: Alice's long prompt saved
         {"prompt": SYS + "user (Carol): a short new question", "n_predict": 2}]  # shares only SYS with it
    m = only_miss(diag("-np 1 -c 4096 --cache-ram 64 --swa-full", r), "floor")
    assert "< 0.25" in m.detail and m.where.startswith("entry #")


def test_an_entry_that_loses_on_one_axis_only_is_the_two_axis_rule():
    """-sps 0 (the RAM cache is searched every time): the slot keeps f_keep ~0.95 on the system prompt,
    the entry holding the longer prefix keeps only about half of its own tokens, so it never beats the
    slot on both axes (spec Appendix B) and the longer prefix is re-processed."""
    a, c = " user: Alice's wheel wobbles.", " assistant: " + "true the wheel and check every spoke carefully. " * 6
    r = [{"prompt": SYS + a + c, "n_predict": 2},
         {"prompt": SYS + "x", "n_predict": 2},
         {"prompt": SYS + a + " and the brakes?", "n_predict": 2}]
    d = diag("-np 1 -c 4096 --cache-ram 64 -sps 0 --swa-full", r)
    i, m = d.misses[-1]
    assert i == 2 and m.cause == "two_axis" and m.where.startswith("entry #")


def test_a_failed_restore_is_its_own_cause():
    class FailingRestore(FakeMemory):
        def state_set(self, data, seq, *, draft=False, partial=False):
            return 0 if not partial else super().state_set(data, seq, draft=draft, partial=partial)

    def failing(params):
        return FailingRestore(n_slots=params.n_slots, n_ctx=4096, n_swa=0)

    r = [{"prompt": ALICE, "n_predict": 2}, {"prompt": "zz unrelated", "n_predict": 2},
         {"prompt": ALICE + " and the front one?", "n_predict": 2}]
    d = diagnose_trace(parse_trace({"flags": "-np 1 -c 4096 --cache-ram 64 --swa-full".split(), "requests": r}),
                       memory_factory=failing, max_misses=0)
    assert [m.cause for _, m in d.misses] == ["restore_failed"]


def test_an_evicted_entry_names_the_eviction_and_a_bigger_cache_saves_it():
    bob = "Bob asks about opening hours. " * 25  # ~750 tokens: 0.75 MiB on the fake memory
    carol = "Carol asks about gift cards. " * 25
    r = [{"prompt": ALICE, "n_predict": 2}, {"prompt": bob, "n_predict": 2}, {"prompt": carol, "n_predict": 2},
         {"prompt": ALICE + " and the front one?", "n_predict": 2}]
    d = diag("-np 1 -c 4096 --cache-ram 1 --swa-full", r)
    i, m = d.misses[-1]
    assert i == 3 and m.cause == "dropped" and "(make_room, event" in m.detail and m.where.startswith("entry #")
    assert m.suggest[0] == "--cache-ram 2" and d.best(3) is not None and d.best(3).saved > 100


def _live_misses(flags: str, requests: list[dict]):
    """The misses a live engine's events show (no trace to replay: the panel's and watch's case)."""
    from slotlab.engine.scheduler import Engine
    from slotlab.explain import Explainer

    e = Engine(flags, memory=FakeMemory(n_slots=1, n_swa=512))
    for r in requests:
        t = e.submit(r["prompt"], n_predict=r.get("n_predict", 4), message_delimiters=r.get("message_delimiters"))
        e.run_until(lambda: t.done)
    x = Explainer().fold(e.events.replayable())
    e.close()
    return list(x.misses)


CHAT = [SYS + " user: my brakes squeal", SYS + " user: my brakes squeal assistant: pads. user: and the chain?"]


def test_untested_advice_names_cms_only_where_message_delimiters_put_checkpoints():
    """-cms spaces the checkpoints taken at user-message starts: without message delimiters there are
    none, so a live explanation must not count it among the untested candidates; with them it may (they
    are data: the line prints none of them)."""
    plain = _live_misses("-np 1 -c 4096 --cache-ram 0 -cms 64", [{"prompt": p} for p in CHAT])
    (m,) = plain
    assert m.cause == "checkpoint_early" and not m.tested
    assert "--checkpoint-min-step 0" in m.candidates and "--checkpoint-min-step 0" not in m.untested
    assert m.untested == ["--swa-full"] and m.suggest == []
    # untested flags are never printed as advice: the line says how to test them
    assert NOT_TESTED in m.line() and "--swa-full" not in m.line()
    delim = [{"role": "user", "delimiter": " user:"}]
    spans = _live_misses("-np 1 -c 4096 --cache-ram 0 -cms 64",
                         [{"prompt": p + " user: x" * 3, "message_delimiters": delim} for p in CHAT])
    assert any("--checkpoint-min-step 0" in m.untested for m in spans)


def test_every_flag_suggested_in_json_was_tried_and_saved():
    r = [{"prompt": p, "n_predict": 4} for p in CHAT]
    d = diag("-np 1 -c 4096 --cache-ram 0 -cms 64", r)
    doc = d.as_json()
    assert doc["misses"] and "client_changes" in doc
    for m in doc["misses"]:
        saved = {" ".join(c["flags"]): c["saved"] for c in m["tried"]}
        assert "--checkpoint-min-step 0" in saved  # tried, because it acts on checkpoints ...
        assert "--checkpoint-min-step 0" not in m["suggest"]  # ... but without delimiters it saved nothing
        for s in m["suggest"]:
            if flag_change(s) is not None:
                assert saved.get(s, 0) > 0, (s, saved)
    assert d.dropped() and all(c.saved <= 0 for _, c in d.dropped())


def test_a_miss_past_max_misses_gets_no_flag_advice():
    r = [{"prompt": p, "n_predict": 4} for p in CHAT]
    d = diag("-np 1 -c 4096 --cache-ram 0", r, max_misses=0)
    (_, m), = d.misses
    assert m.candidates and m.flags() == [] and m.untested == [] and "not tried (past --max-misses 0)" in m.line()
