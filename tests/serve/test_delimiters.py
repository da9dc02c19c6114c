"""The message delimiters of a chat, as the real llama-server derives them from the chat template, and
the checkpoints they put at user-message starts (golden: tests/serve/record_delimiters.py, recorded from
the reference llama-server b11312 on the default model).

Before this, slotlab sent ChatML's own three (with a system one and newlines the server does not have)
and none at all for any other template, so a Gemma-style chat got no user-message checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slotlab.engine.params import ServerParams
from slotlab.engine.replay import Trace, replay
from slotlab.serve.chat import ChatTemplate
from slotlab.serve.delimiters import specialized

HERE = Path(__file__).parent
GOLDEN = json.loads((HERE / "golden_delimiters.json").read_text())
TEMPLATES = HERE.parents[0] / "llamacpp" / "vendor" / "models" / "templates"
NAMES = sorted(GOLDEN["configs"])


def _template(model, rec) -> ChatTemplate:
    flags = [f for f in rec["flags"] if f == "--no-jinja"]
    if rec["template_file"]:
        flags = [*flags, "--jinja", "--chat-template-file", str(TEMPLATES / rec["template_file"])]
    return ChatTemplate(model, ServerParams.from_args(flags))


@pytest.mark.parametrize("name", NAMES)
def test_delimiters_are_the_servers(model, name):
    rec = GOLDEN["configs"][name]
    t = _template(model, rec)
    got = {d["role"]: d["delimiter"] for d in reversed(t.delimiters())}  # the first of a role wins
    assert t.apply(GOLDEN["chat"], now=rec["time"]) == rec["prompt"], name
    if rec["specialized"]:  # a specialized parser's fixed list (the server logs only its name)
        assert specialized(t.source) is not None, (name, rec["specialized"])
    elif "--no-jinja" in rec["flags"]:
        assert got == {}
    else:  # the autoparser's analysis, as the server logged it (-lv 5)
        assert (got.get("user", ""), got.get("assistant", "")) == (rec["user_msg_start"], rec["assistant_msg_start"]), \
            (name, got)


@pytest.mark.parametrize("name", NAMES)
def test_checkpoints_at_the_servers_positions(model, name):
    """The same prompt, with slotlab's delimiters, on slotlab's engine: the checkpoints the server took."""
    rec = GOLDEN["configs"][name]
    delims = _template(model, rec).delimiters()
    flags = ["-np", "1", "-c", "4096", *[f for f in rec["flags"] if f != "--no-jinja"]]
    req = {"prompt": rec["prompt"], "n_predict": 1, "message_delimiters": delims}
    out = replay(Trace(flags, [req]), model=model)
    try:
        got = [e.data["n_tokens"] for e in out["engine"].events.log if e.kind == "checkpoint_created"]
        r = out["results"][0]
    finally:
        out["engine"].close()
    assert r["prompt_n"] == rec["prompt_n"], name
    assert got == rec["checkpoints"], (name, got, rec["checkpoints"])


def test_user_message_checkpoints_need_the_delimiters():
    """The golden is not vacuous: on the Gemma template the server checkpoints at user starts (more than
    the two before the prompt's end that any SWA prompt gets)."""
    rec = GOLDEN["configs"]["gemma2"]
    assert len(rec["checkpoints"]) > 2 and rec["user_msg_start"] == "<start_of_turn>user"
