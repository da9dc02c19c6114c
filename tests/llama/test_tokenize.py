"""slotlab tokenizes a text prompt exactly as llama-server does (recorded from the real server by
tests/golden/record_tokenize.py), so cached/evaluated token counts are comparable."""

import json
from pathlib import Path

import pytest

GOLDEN = json.loads((Path(__file__).parents[1] / "golden" / "tokenize.llama-server.json").read_text())


@pytest.mark.parametrize("rec", GOLDEN["records"], ids=lambda r: repr(r["prompt"][:24]))
def test_tokens_equal_llama_server(model, rec):
    toks = model.tokenize(rec["prompt"])
    assert toks.tolist() == rec["tokens"]
    assert len(toks) == rec["tokens_evaluated"]


def test_detokenize_round_trips_text(model):
    for rec in GOLDEN["records"]:
        # the server's tokens_to_str renders special tokens, BOS included
        assert model.detokenize(rec["tokens"]) == "<bos>" + rec["prompt"]
