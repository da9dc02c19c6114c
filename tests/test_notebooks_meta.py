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


def test_committed_notebooks_are_their_chapter_modules():
    """Each committed notebook's cells are exactly what its chapter module (notebooks/course/nbNN_*.py)
    writes: a notebook edited by hand, or a module changed without a rebuild, would teach one thing and
    test another."""
    import importlib.util

    here = Path(__file__).parents[1] / "notebooks"
    spec = importlib.util.spec_from_file_location("build_notebooks", here / "build_notebooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert len(mod.NOTEBOOKS) >= 10
    for name, cells in mod.NOTEBOOKS.items():
        nb = nbformat.read(here / f"{name}.ipynb", 4)
        assert [c.source for c in nb.cells] == [c.source for c in cells], f"{name}: rebuild it (build_notebooks.py {name})"
        assert [c.cell_type for c in nb.cells] == [c.cell_type for c in cells], name
