"""slotlab.figures.slot_file: `sections` parses a slot file (header, token payload, state, SCKP with its
checkpoints, SDFT) into byte counts that add up to the file, and the picture renders small. The file is
built here with slot_file's own writers (no model)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from slotlab.engine import slot_file as sf
from slotlab.engine.prompt_cache import Checkpoint
from slotlab.figures import png
from slotlab.figures import slot_file as fig_sf


def write(path, n_tokens=7, state=1000, checkpoints=(), draft=b""):
    words = sf.pack_tokens(np.arange(n_tokens))
    body = struct.pack("<III", 0x67677371, 3, len(words)) + words.tobytes() + bytes(state)
    path.write_bytes(body)
    sf.write_appendices(path, list(checkpoints), draft)
    return len(body)


def test_stock_file_is_header_tokens_state(tmp_path):
    p = tmp_path / "s.bin"
    body = write(p)
    secs = fig_sf.sections(p, body)
    assert [(s.kind, s.offset, s.size) for s in secs] == [("header", 0, 12), ("tokens", 12, 4 * 11),
                                                          ("state", 56, 1000)]
    assert secs[0].text == "magic 'ggsq', version 3, 11 words" and secs[1].text == "7 tokens"


def test_appendices_are_parsed_and_sum_to_the_file(tmp_path):
    p = tmp_path / "a.bin"
    cks = [Checkpoint(5, 0, 4, data_tgt=bytes(300)), Checkpoint(7, 2, 6, data_tgt=bytes(200), data_dft=bytes(10))]
    body = write(p, checkpoints=cks, draft=bytes(50))
    secs = fig_sf.sections(p, body)
    assert [s.kind for s in secs] == ["header", "tokens", "state", "SCKP header", "checkpoint", "checkpoint", "SDFT"]
    assert [s.size for s in secs[3:]] == [12, 16 + 24 + 300, 16 + 24 + 210, 8 + 16 + 50]
    assert sum(s.size for s in secs) == p.stat().st_size
    assert secs[5].text == "checkpoint 1: pos 2..6, n_tokens 7"
    data = png.to_png(fig_sf.figure([("stock", p, body), ("appendix", p, body)]))
    assert len(data) < png.MAX_BYTES


def test_a_body_that_does_not_fit_is_refused(tmp_path):
    p = tmp_path / "x.bin"
    body = write(p)
    with pytest.raises(ValueError):
        fig_sf.sections(p, body + 1)
