"""Slot files: both directions with the real llama-server, the SCKP/SDFT extension, and robustness
against damaged files (never a crash, never an allocation beyond the file, the server's error text,
the failed slot left empty as the server leaves it, no other slot touched)."""

import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slotlab.engine import slot_file
from slotlab.engine.scheduler import Engine
from tests.golden.make_traces import doc

GOLDEN = Path(__file__).parents[1] / "golden"


def _engine(model, tmp_path, *flags):
    return Engine(["-np", "2", "-c", "4096", *flags, "--slot-save-path", str(tmp_path)], model=model)


def _run(e, t):
    e.run_until(lambda: t.done)
    return t


def test_file_written_by_llama_server_restores_in_slotlab(model, tmp_path):
    shutil.copy(GOLDEN / "traces" / "slot_files.files" / "orchards.bin", tmp_path / "orchards.bin")
    e = _engine(model, tmp_path, "--swa-full")
    r = _run(e, e.slot_action("restore", 1, "orchards.bin"))
    assert r.error is None and r.result["n_restored"] == 106
    t = _run(e, e.submit(doc("orchards", 5) + " Which apples?", n_predict=3, id_slot=1))
    assert t.result["timings"]["cache_n"] == 104  # as the server reported for the same request
    e.close()


def test_appendix_keeps_checkpoints_that_the_stock_format_loses(model, tmp_path):
    """Default flags (SWA, no --swa-full): with slotlab's SCKP appendix (--slot-appendices, opt-in) the
    restored slot still has its checkpoint, so a follow-up reuses the prefix; the stock server (and
    slotlab by default) must re-process everything (golden trace slot_file_from_slotlab: cache_n 0)."""
    prompt = doc("lighthouses", 3)
    shutil.copy(GOLDEN / "data" / "slotlab_sckp.bin", tmp_path / "s.bin")
    cache_n = {}
    for appendices in (True, False):
        e = _engine(model, tmp_path, *(["--slot-appendices"] if appendices else []))
        r = _run(e, e.slot_action("restore", 0, "s.bin"))
        assert r.result["n_read"] == 1274240  # the body: what the library consumed, as the server reports
        assert len(e.slots[0].checkpoints) == (1 if appendices else 0)
        if appendices:
            assert e.slots[0].checkpoints[0].id_task == -1
        t = _run(e, e.submit(prompt + " Which coast?", n_predict=3, id_slot=0))
        cache_n[appendices] = t.result["timings"]["cache_n"]
        e.close()
    assert cache_n[False] == 0 and cache_n[True] > 50


def test_save_writes_appendix_only_when_there_is_something_to_keep(model, tmp_path):
    e = _engine(model, tmp_path, "--swa-full", "--slot-appendices")
    _run(e, e.submit(doc("caves", 2), n_predict=2, id_slot=0))
    s = _run(e, e.slot_action("save", 0, "plain.bin"))
    assert (tmp_path / "plain.bin").stat().st_size == s.result["n_written"]  # byte-identical layout to the server's
    e.close()


# --- damaged files ---------------------------------------------------------------------------------

SERVER_ERRORS = {
    "Unable to restore slot: No available space in KV cache or invalid slot save file",
    "Unable to restore slot: Unexpected end of server tokens state",
    "Unable to restore slot: Unsupported server tokens state version",
    "Unable to restore slot: Trailing data in server tokens state",
    "Unable to restore slot: Cannot restore media tokens without an mmproj",
    "Unable to restore slot: Restored prompt does not fit in the slot context",
    "Unable to restore slot: Invalid tokens in slot save file",
}


@pytest.fixture(scope="module")
def damaged_env(model, tmp_path_factory):
    d = tmp_path_factory.mktemp("slots")
    e = Engine(["-np", "2", "-c", "2048", "--slot-appendices", "--slot-save-path", str(d)], model=model)
    _run(e, e.submit(doc("sagas", 3), n_predict=2, id_slot=0))  # SWA checkpoints: the save has an SCKP appendix
    _run(e, e.slot_action("save", 0, "good.bin"))
    good = (d / "good.bin").read_bytes()
    body = e.tasks[max(e.tasks)].result["n_written"]
    _run(e, e.submit(doc("fjords", 2), n_predict=2, id_slot=1))  # the other slot, which must stay untouched
    yield e, d, good, body
    e.close()


def _restore_damaged(env, data: bytes):
    e, d, good, body = env
    other = (e.slots[1].tokens.tolist(), e.ctx.seq_pos_max(1))
    (d / "bad.bin").write_bytes(data)
    r = _run(e, e.slot_action("restore", 0, "bad.bin"))
    s0 = e.slots[0]
    if r.error is not None:
        assert r.error.code == 400 and r.error.message in SERVER_ERRORS, r.error.message
        assert len(s0.tokens) == 0 and e.ctx.seq_pos_max(0) == -1  # prompt_clear(), as the server
    else:
        assert len(s0.tokens) > 0 and e.ctx.seq_pos_max(0) == len(s0.tokens) - 1
        assert all(c.id_task == -1 for c in s0.checkpoints)
    assert (e.slots[1].tokens.tolist(), e.ctx.seq_pos_max(1)) == other
    return r


def test_truncation_at_every_appendix_offset_and_sampled_body_offsets(damaged_env):
    e, d, good, body = damaged_env
    assert len(good) > body  # there is an appendix
    cuts = list(range(body, len(good), max(1, (len(good) - body) // 97))) + [body + k for k in range(0, 40)]
    cuts += list(range(0, body, max(1, body // 40)))
    outcomes = set()
    for cut in sorted(set(cuts)):
        r = _restore_damaged(damaged_env, good[:cut])
        outcomes.add("ok" if r.error is None else r.error.message)
        if cut >= body and r.error is None:
            # a damaged appendix never fails the restore: the main state stays, checkpoints may go
            assert len(e.slots[0].checkpoints) in (0, 1)
    assert "ok" in outcomes and len(outcomes) >= 2


def test_length_fields_set_to_huge_values(damaged_env):
    e, d, good, body = damaged_env
    # SCKP count, then the first data_tgt length (after i64 n_tokens + 2 x i32)
    for off, fmt in ((body + 8, "<I"), (body + 12 + 16, "<Q")):
        bad = bytearray(good)
        struct.pack_into(fmt, bad, off, 2**63 if fmt == "<Q" else 2**32 - 1)
        r = _restore_damaged(damaged_env, bytes(bad))
        assert r.error is None and e.slots[0].checkpoints == []
    bad = bytearray(good)
    struct.pack_into("<I", bad, 8, 2**31)  # the body's token count
    assert _restore_damaged(damaged_env, bytes(bad)).error is not None


def test_wrong_magic_and_version(damaged_env):
    e, d, good, body = damaged_env
    for off, val in ((body, 0x12345678), (body + 4, 7)):
        bad = bytearray(good)
        struct.pack_into("<I", bad, off, val)
        assert _restore_damaged(damaged_env, bytes(bad)).error is None
        assert e.slots[0].checkpoints == []
        ev = e.events.filter(["slot_appendix_skipped"])[-1]
        assert ("magic" in ev.message) if off == body else ("version 7" in ev.message)
    bad = bytearray(good)
    struct.pack_into("<I", bad, 0, 0xDEADBEEF)  # the body's own magic
    assert _restore_damaged(damaged_env, bytes(bad)).error is not None


def test_file_of_another_model_layout_is_refused(damaged_env):
    other = (GOLDEN / "data" / "unified_np2.bin").read_bytes()
    r = _restore_damaged(damaged_env, other)
    assert r.error is not None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_random_damage_never_crashes(damaged_env, data):
    e, d, good, body = damaged_env
    buf = bytearray(good)
    for _ in range(data.draw(st.integers(1, 4))):
        where = data.draw(st.one_of(st.integers(0, 64), st.integers(body - 8, len(buf) - 1)))
        where = max(0, min(where, len(buf) - 1))
        buf[where] = data.draw(st.integers(0, 255))
    cut = data.draw(st.one_of(st.just(len(buf)), st.integers(0, len(buf))))
    _restore_damaged(damaged_env, bytes(buf[:cut]))


def test_restore_without_free_cells_in_a_unified_pool_fails_cleanly(model, tmp_path):
    """Spec 2.4 / 5.4: in a unified pool a restore can fail for lack of free cells; the server answers
    `No available space in KV cache or invalid slot save file`, leaves the slot empty, touches no other."""
    e = Engine(["-np", "2", "-kvu", "-c", "1024", "--swa-full", "--no-cache-idle-slots",
                "--slot-save-path", str(tmp_path)], model=model)
    _run(e, e.submit("alpha " * 400, n_predict=2, id_slot=0))
    assert _run(e, e.slot_action("save", 0, "big.bin")).error is None
    _run(e, e.slot_action("erase", 0))
    _run(e, e.submit("beta " * 700, n_predict=2, id_slot=1))  # slot 1 now holds most of the pool
    other = (len(e.slots[1].tokens), e.ctx.seq_pos_max(1))
    r = _run(e, e.slot_action("restore", 0, "big.bin"))
    assert r.error is not None and r.error.code == 400
    assert r.error.message == "Unable to restore slot: No available space in KV cache or invalid slot save file"
    assert len(e.slots[0].tokens) == 0 and e.ctx.seq_pos_max(0) == -1
    assert (len(e.slots[1].tokens), e.ctx.seq_pos_max(1)) == other
    e.close()


# --- b11549's own checkpoint appendix (--server-build 11549) ----------------------------------------

def test_server_build_11549_keeps_checkpoints_in_its_slot_files(model, tmp_path):
    """Default flags (SWA): under --server-build 11549 a save appends the slot's checkpoints (SCKP, no
    draft block; the answer's n_written counts them), a restore reads them back with that build's
    rules (id_task -1, at most --ctx-checkpoints, the last ones), so save -> erase -> restore -> continue
    reuses the prefix where the pin re-processes everything."""
    prompt = doc("lighthouses", 3)
    got = {}
    for build in ("11312", "11549"):
        e = _engine(model, tmp_path, "--server-build", build)
        _run(e, e.submit(prompt, n_predict=3, id_slot=0))
        n_ck = len(e.slots[0].checkpoints)
        s = _run(e, e.slot_action("save", 0, f"{build}.bin"))
        size = (tmp_path / f"{build}.bin").stat().st_size
        assert s.result["n_written"] == size  # b11549: body + appendix; the pin: the body, no appendix
        _run(e, e.slot_action("erase", 0))
        r = _run(e, e.slot_action("restore", 0, f"{build}.bin"))
        assert r.result["n_read"] == size
        assert len(e.slots[0].checkpoints) == (n_ck if build == "11549" else 0)
        assert all(c.id_task == -1 for c in e.slots[0].checkpoints)
        msgs = [x.message for x in e.events.log if x.kind in ("slot_saved", "slot_restored")]
        t = _run(e, e.submit(prompt + " Which coast?", n_predict=3, id_slot=0))
        got[build] = (n_ck, t.result["timings"]["cache_n"], msgs)
        e.close()
    assert got["11312"][1] == 0 and got["11549"][1] > 50 and got["11549"][0] >= 1
    assert any(m.startswith(f"appended {got['11549'][0]} context checkpoint(s)") for m in got["11549"][2])
    assert any(m.startswith(f"restored {got['11549'][0]} context checkpoint(s) from") for m in got["11549"][2])
    # a smaller --ctx-checkpoints keeps the last ones only
    e = _engine(model, tmp_path, "--server-build", "11549", "--ctx-checkpoints", "1")
    _run(e, e.slot_action("restore", 0, "11549.bin"))
    assert len(e.slots[0].checkpoints) == min(1, got["11549"][0])
    e.close()


def test_b11549_appendix_reading_rules(tmp_path):
    """slot_file.read_checkpoints_b11549 as load_slot_checkpoints reads: a foreign magic is silently no
    appendix, a wrong version or an empty target state 'invalid', a short one 'truncated', each ignoring
    every checkpoint; lengths are checked against the bytes after the state."""
    from slotlab.engine.prompt_cache import Checkpoint

    body = b"B" * 40
    ck = [Checkpoint(n_tokens=10 * i + 10, pos_min=0, pos_max=10 * i + 9, id_task=3, data_tgt=b"t" * 8,
                     data_dft=b"", data_spec=b"") for i in range(3)]
    p = tmp_path / "f.bin"
    p.write_bytes(body)
    n = slot_file.write_appendices(p, ck)
    a = slot_file.read_checkpoints_b11549(p, len(body), 32)
    assert [c.n_tokens for c in a.checkpoints] == [10, 20, 30] and a.n_bytes == n and not a.notes
    assert [c.n_tokens for c in slot_file.read_checkpoints_b11549(p, len(body), 2).checkpoints] == [20, 30]
    raw = p.read_bytes()
    cases = {
        "foreign": (body + b"XXXX" + raw[len(body) + 4:], None),
        "version": (body + raw[len(body):len(body) + 4] + struct.pack("<I", 2) + raw[len(body) + 8:], "invalid"),
        "truncated": (raw[:-5], "truncated"),
        "huge length": (raw[:len(body) + 28] + struct.pack("<Q", 1 << 40) + raw[len(body) + 36:], "truncated"),
    }
    for what, (data, note) in cases.items():
        p.write_bytes(data)
        a = slot_file.read_checkpoints_b11549(p, len(body), 32, "f.bin")
        assert a.checkpoints == [] and a.n_bytes == 0, what
        assert a.notes == ([] if note is None else [f"{note} context checkpoint appendix in 'f.bin' - ignored"]), what
    p.write_bytes(body)
    slot_file.write_appendices(p, [Checkpoint(n_tokens=5, pos_min=0, pos_max=4, id_task=1, data_tgt=b"",
                                              data_dft=b"", data_spec=b"")])
    assert slot_file.read_checkpoints_b11549(p, len(body), 32, "f.bin").notes == [
        "invalid context checkpoint appendix in 'f.bin' - ignored"]
