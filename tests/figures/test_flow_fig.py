"""slotlab.figures.flow: the decision flow names the server's functions in the server's order, and the
outcome it writes beside each step is what the engine decided for that request (fake memory with a
512-token window for the decisions; the real model in notebook 01, which asserts the same path); the
picture is a small deterministic PNG."""

from pathlib import Path

import pytest

from slotlab.engine.scheduler import Engine
from slotlab.figures import flow, png
from slotlab.memory.fake import FakeMemory

SYS = "You are a precise assistant. "
#: the pin's server source, where a checkout has built the reference server (build/ is not in the repository)
SERVER = (Path(__file__).resolve().parents[2] / "build" / "llama-server" / "src" / "llama_cpp_python-0.3.36" / "vendor"
          / "llama.cpp" / "tools" / "server" / "server-context.cpp")


def run(e, prompt, n=4):
    t = e.submit(prompt, n_predict=n, ignore_eos=True)
    e.run_until(lambda: t.done)
    assert t.error is None
    return t


@pytest.fixture(scope="module")
def eng():
    e = Engine("-np 4 -kvu -c 8192", memory=FakeMemory(n_slots=4, n_ctx=8192, n_swa=512, kv_unified=True))
    alice = SYS + "User Alice: which ports handle container ships in the north sea, and which of them are deepest?"
    run(e, alice)                                                   # task 0: LRU, an empty server
    run(e, SYS + "User Bob: how long does customs clearance take?")   # task 1: LCP, f_keep < 0.5: save, then load
    run(e, alice + " And tugs?")                                    # task 2: Alice's entry comes back
    run(e, "Translate to German: the weather is lovely today.")     # task 3: LRU; the idle slot saved and cleared
    yield e
    e.close()


def test_the_steps_are_the_servers_in_its_order():
    assert [s.key for s in flow.STEPS] == ["request", "slot", "cache", "n_past", "shift", "checkpoint", "prefill",
                                           "release", "idle"]
    names = " ".join(s.functions for s in flow.STEPS)
    for fn in ("get_available_slot", "prompt_save", "prompt_load", "get_common_prefix", "create_checkpoint",
               "launch_slot_with_task", "release", "llama_decode"):
        assert fn in names
    if SERVER.exists():  # the pin's source: each function named is defined or called there, in this order
        src = SERVER.read_text()
        at = [src.index(fn) for fn in ("get_available_slot(const server_task", "bool prompt_save",
                                       "bool prompt_load", "void update_slots()")]
        assert all(a > 0 for a in at)
        assert "create_checkpoint(slot, n_tokens_cur" in src and "saving idle slot to prompt cache" in src


def test_the_path_is_what_the_engine_decided(eng):
    bob = flow.path(eng, 1)
    d = next(e for e in eng.events.log if e.kind == "slot_decision" and e.task == 1)
    t = eng.tasks[1].result["timings"]
    assert d.payload.how == "lcp" and d.payload.update_cache
    assert bob["slot"] == f"slot {d.slot} by LCP similarity, f_sim {d.payload.f_sim:.3f}"
    assert bob["cache"].startswith("saved ") and "as entry #0" in bob["cache"]
    assert bob["checkpoint"] == "none usable: full re-processing, n_past 0" and t["cache_n"] == 0
    assert bob["prefill"].startswith(f"{t['prompt_n']} tokens prefilled")
    assert bob["shift"] == "none" and bob["release"].startswith(f"slot {d.slot} idle with ")
    first = flow.path(eng, 0)
    assert first["slot"].endswith("by LRU") and first["cache"] == "nothing to save; no entry loaded"
    back = flow.path(eng, 2)   # Alice's follow-up: her entry comes back from the RAM cache
    assert "loaded entry #0" in back["cache"]
    assert back["checkpoint"].startswith("restored [0, ") and not bob["idle"]
    other = flow.path(eng, 3)
    saved = [e.slot for e in flow._after_launch(eng, 3) if e.kind == "idle_slot_saved"]
    assert saved == [3] and other["slot"] == "slot 2 by LRU"   # Alice's slot, idle once task 3 launched elsewhere
    assert other["idle"] == "after this launch: 1 idle slot(s) saved, 1 cleared"
    assert set(first) == set(bob) == {s.key for s in flow.STEPS}


def test_the_picture_is_small_and_deterministic(eng):
    a = png.to_png(flow.figure(eng, 1))
    assert a[:8] == b"\x89PNG\r\n\x1a\n" and len(a) < png.MAX_BYTES
    assert png.to_png(flow.figure(eng, 1)) == a != png.to_png(flow.figure())
    texts = [t.get_text() for t in flow.figure(eng, 1).axes[0].texts]
    for s in flow.STEPS:
        assert s.title in texts and s.functions in texts
    assert flow.path(eng, 1)["checkpoint"] in texts
