"""The notebooks stay small, assert what they claim and end with exercises (nbval runs them)."""

from pathlib import Path

import re

import nbformat
import pytest

NB = sorted((Path(__file__).parents[1] / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert len(NB) >= 8


@pytest.mark.parametrize("path", NB, ids=lambda p: p.name)
def test_notebook_is_small_asserts_and_has_exercises(path):
    assert path.stat().st_size < 1024 * 1024
    nb = nbformat.read(path, 4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert code.count("assert ") >= 2
    cells = [c for c in nb.cells if c.cell_type == "code"]
    printing = [c for c in cells if re.search(r"^(print\(|for .*\n\s+print\()|; print\(", c.source, re.M)]
    assert printing and all(c.get("outputs") for c in printing), "committed with outputs (nbval compares them)"
    assert "widgets" not in nb.metadata
    if not path.name.startswith("00-"):
        assert "Try this" in nb.cells[-1].source
