"""slotlab.figures.token_strip: the before / after spans of a `--cache-reuse` shift are the engine's
(the docs' AAABCCCC example on the fake memory, which can shift), and the picture is a small PNG."""

from slotlab.engine.scheduler import Engine
from slotlab.figures import png, token_strip
from slotlab.figures.checkpoints import rewind
from slotlab.memory.fake import FakeMemory

A, B, C = "a" * 30, "b" * 10, "c" * 40  # one token per byte, after a BOS


def test_aaabcccc_keeps_a_drops_b_and_shifts_c():
    e = Engine("-np 1 -c 4096 --cache-reuse 8", memory=FakeMemory(n_slots=1))
    for p in (A + B + C, A + C):
        t = e.submit(p, n_predict=2, ignore_eos=True)
        e.run_until(lambda: t.done)
    r = rewind(e, 1)
    res = e.tasks[1].result
    assert r.shifts == [(41, 81, 31, 71)] and r.lcp == 31 and r.n_held == e.tasks[0].result["tokens_cached"] == 82
    before, after = token_strip.segments(r)
    assert before == [(0, 31, "kept"), (31, 41, "dropped"), (41, 81, "chunk"), (81, 82, "dropped")]
    # the whole prompt matched: one token is evaluated again (n_past 70 of 71)
    assert after == [(0, 31, "kept"), (31, 70, "shifted"), (70, 71, "prefill")] and res["timings"]["cache_n"] == 70
    data = token_strip.figure(e, 1).data
    assert data == token_strip.figure(e, 1).data and len(data) < png.MAX_BYTES
