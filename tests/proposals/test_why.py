"""`simulate --why` names the change to llama-server that would have saved a miss no flag saves.

The trace is upstream issue #28139's reproduction (tests/proposals/data/pinned_to_an_empty_slot.json,
the real default model's tokenizer): A pinned to slot 0, B pinned to slot 0 (A goes to the RAM cache),
A pinned to the empty slot 1. The pinned build skips the cache there (f_keep = 0/0 is NaN, the
`f_keep < 0.5` test fails; the golden `id_slot` traces record the pin doing so), no flag changes that,
and PR #28992's find_better would load A back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TRACE = Path(__file__).resolve().parent / "data" / "pinned_to_an_empty_slot.json"


def test_why_names_the_proposal_for_a_miss_no_flag_saves():
    out = subprocess.run([sys.executable, "-m", "slotlab.cli", "simulate", str(TRACE), "--why", "--json"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    (miss,) = d["misses"]
    assert miss["task"] == 2 and not miss["saved"]  # no flag change saved it
    assert miss["proposal"].startswith("a change to llama-server would: find-better (PR #28992, unverified)")
    props = {p["name"]: p for p in d["advice"]["proposals"]}
    assert props["find-better"]["saved"] == miss["lost"] > 0 and not props["find-better"]["verified"]
    assert all(p["saved"] == 0 for n, p in props.items() if n != "find-better")
    assert d["results"][2]["cache_n"] == 0  # the pin re-processed A


def test_why_says_it_in_words():
    out = subprocess.run([sys.executable, "-m", "slotlab.cli", "simulate", str(TRACE), "--why"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "proposal: find-better (PR #28992, unverified) would prefill" in out.stdout
    assert "a change to llama-server would: find-better" in out.stdout
