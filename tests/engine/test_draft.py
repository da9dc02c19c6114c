"""The draft ledger: a draft model (-md, here the same GGUF) in its own context with the same slots."""

from pathlib import Path

import numpy as np
import pytest

from slotlab.engine import slot_file
from slotlab.engine.scheduler import Engine
from slotlab.llama import STATE_SEQ_FLAGS_PARTIAL_ONLY

P = "The history of the lighthouse begins with fires on hilltops. Over centuries,"


def _spec(model, *flags):
    return Engine(["-np", "1", "-c", "2048", "-md", str(model.path), "--spec-draft-n-max", "4", "--spec-type", "draft-simple", *flags], model=model)


def _consistent(e):
    for s in e.slots:
        assert e.ctx.seq_pos_max(s.id) == e.dctx.seq_pos_max(s.id) == len(s.tokens) - 1


def test_speculative_output_equals_plain_greedy(model):
    plain = Engine(["-np", "1", "-c", "2048", "--swa-full"], model=model)
    t = plain.submit(P, n_predict=24)
    plain.run_until_idle()
    e = _spec(model, "--swa-full")
    u = e.submit(P, n_predict=24)
    e.run_until_idle()
    assert u.result["content"] == t.result["content"]
    assert u.result["tokens_cached"] == t.result["tokens_cached"]
    assert e.metrics.spec_draft_tokens_total > 0
    assert e.metrics.spec_accepted_tokens_total == e.metrics.spec_draft_tokens_total  # same model drafts
    _consistent(e)


def _two_cached(model):
    """A one-slot speculative engine after two unrelated requests: the first is in the RAM cache."""
    e = _spec(model, "--swa-full", "-sps", "0")
    for p in (P, "An unrelated text about volcanoes"):
        e.submit(p, n_predict=4)
        e.run_until_idle()
    return e


def test_ram_cache_entries_hold_and_restore_both_ledgers(model):
    e = _two_cached(model)
    ent = e.cache.entries[0]
    assert len(ent.drft) == len(ent.main) > 0  # same model: same state size in both ledgers
    t = e.submit(P + " later", n_predict=4)
    e.run_until_idle()
    assert t.result["timings"]["cache_n"] > 10
    _consistent(e)


def test_a_failed_draft_restore_fails_the_load(model):
    e = _two_cached(model)
    e.dctx.state_seq_set = lambda *a, **k: 0  # the draft context refuses the blob
    t = e.submit(P + " later", n_predict=4)
    e.run_until_idle()
    assert t.result["timings"]["cache_n"] == 0  # slot cleared, full prefill (spec 2.4 c)
    assert any(x.message == "failed to load prompt from cache" for x in e.events.log)
    stale = [x for x in e.cache.entries if len(x.main) == 0]
    assert stale and len(stale[0].drft) > 0  # the entry stays, its target state already freed


def test_checkpoints_carry_draft_data(model):
    e = _spec(model)  # default flags: SWA checkpoints
    e.submit(" ".join(["Record of the harbour master, page %d." % i for i in range(30)]), n_predict=2)
    e.run_until_idle()
    ck = e.slots[0].checkpoints
    assert ck and all(len(c.data_dft) == len(c.data_tgt) > 0 for c in ck)


def test_sdft_appendix_round_trip_and_draft_drop(model, tmp_path):
    e = _spec(model, "--slot-appendices", "--slot-save-path", str(tmp_path))
    e.submit(" ".join(["Entry %d of the ship log." % i for i in range(20)]), n_predict=3)
    e.run_until_idle()
    s = e.slot_action("save", 0, "a.bin")
    e.run_until_idle()
    body = s.result["n_written"]
    app = slot_file.read_appendices(tmp_path / "a.bin", body)
    assert app.checkpoints and len(app.draft_state) > 0 and not app.notes
    e.slot_action("erase", 0)
    e.run_until_idle()
    assert e.dctx.seq_pos_max(0) == -1
    r = e.slot_action("restore", 0, "a.bin")
    e.run_until_idle()
    assert r.error is None and e.slots[0].checkpoints[0].data_dft is not None
    _consistent(e)
    # a file whose draft checkpoint data does not fit: dropped, the target part kept
    raw = (tmp_path / "a.bin").read_bytes()[:body]
    bad = tmp_path / "b.bin"
    bad.write_bytes(raw)
    for c in app.checkpoints:
        c.data_dft = bytes(c.data_dft)[:100]
    slot_file.write_appendices(bad, app.checkpoints, app.draft_state)
    r = e.slot_action("restore", 0, "b.bin")
    e.run_until_idle()
    assert r.error is None
    assert all(len(c.data_dft) == 0 and len(c.data_tgt) > 0 for c in e.slots[0].checkpoints)
    assert any("does not match the draft context - dropped" in x.message for x in e.events.log)
    _consistent(e)
