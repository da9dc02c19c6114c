"""slotlab.figures.checkpoints: the rewind facts it reads from the events are the engine's decision
(fake memory with a 512-token window, so no model is needed), the picture is a small deterministic
PNG, and `stored_cells` reads the cell positions out of a llama.cpp sequence state."""

import struct

import numpy as np
import pytest

from slotlab.engine.scheduler import Engine
from slotlab.figures import checkpoints as CK
from slotlab.figures import png
from slotlab.memory.fake import FakeMemory

SYS = "You are the support assistant of a bicycle shop. Be kind, brief and exact. "


def run(e, prompt, n=4):
    t = e.submit(prompt, n_predict=n, ignore_eos=True)
    e.run_until(lambda: t.done)
    assert t.error is None
    return t.result


@pytest.fixture(scope="module")
def eng():
    e = Engine("-np 1 -c 4096", memory=FakeMemory(n_slots=1, n_swa=512))
    first = SYS + "user: my brakes squeal when it rains, what should I check first?"
    run(e, first)                                         # task 0
    run(e, SYS + "user: do you sell kids' helmets?")       # task 1: cut back into the system prompt
    run(e, first)                                         # task 2: the first prompt again
    run(e, first + " assistant: the pads. user: and then?")  # task 3: a continuation
    return e


def test_a_cut_back_inside_the_window_still_needs_a_checkpoint(eng):
    r = CK.rewind(eng, 1)
    res = eng.tasks[1].result
    assert r.n_swa == 512 and r.pos_next == r.lcp < 512 and r.pos_min_thold == 0 and r.pos_min == 0
    assert r.needs_checkpoint and r.mode == "forced" and r.chosen is None and r.n_past == res["timings"]["cache_n"] == 0
    assert r.n_held == eng.tasks[0].result["tokens_cached"]
    assert r.checkpoints and all(r.verdict(c).startswith("unusable: pos_max") for c in r.checkpoints)
    assert "none fits, full re-processing (cache_n 0)" in r.sentence()


def test_a_continuation_restores_the_newest_checkpoint_that_ends_before_pos_next(eng):
    r = CK.rewind(eng, 3)
    res = eng.tasks[3].result
    assert r.mode == "restored" and r.chosen is not None and r.chosen[1] <= r.pos_next
    assert r.n_past == res["timings"]["cache_n"] == min(r.chosen[1], r.chosen[2])
    usable = [c for c in r.checkpoints if r.verdict(c) == "usable"]
    assert usable[-1] == r.chosen
    assert f"checkpoint at n_tokens {r.chosen[2]} restored, cache_n {r.n_past}" in r.sentence()


def test_the_latest_request_is_the_default(eng):
    assert CK.rewind(eng).task == 3
    with pytest.raises(ValueError):
        CK.rewind(eng, 99)


def test_held_is_the_window_at_pos_max():
    assert CK.held(0, 881, 512) == (370, 881)
    assert CK.held(0, 369, 512) == (0, 369)
    assert CK.held(7, 7, 0) == (7, 7)


def test_stored_cells_reads_a_sequence_state():
    cells = np.zeros(3, dtype=[("pos", "<i4"), ("n_seq", "<u4"), ("seq", "<i4")])
    cells["pos"], cells["n_seq"] = (370, 371, 372), 1
    blob = struct.pack("<IiII", CK.IO_MAGIC, 0, 1, 3) + cells.tobytes() + b"\x00" * 64
    assert list(CK.stored_cells(np.frombuffer(blob, dtype=np.uint8))) == [370, 371, 372]
    with pytest.raises(ValueError):
        CK.stored_cells(np.frombuffer(struct.pack("<IiII", 0x5F4B4146, 0, 1, 3) + cells.tobytes(), dtype=np.uint8))


def test_the_picture_is_a_small_deterministic_png(eng):
    a, b = CK.figure(eng, [1, 3]).data, CK.figure(eng, [1, 3]).data
    assert a == b and a[:8] == b"\x89PNG\r\n\x1a\n" and len(a) < png.MAX_BYTES
