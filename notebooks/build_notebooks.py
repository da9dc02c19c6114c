"""Write and execute the course notebooks (outputs are committed; nbval compares them in `make test`).

    .venv/bin/python notebooks/build_notebooks.py [NAME ...]
Each notebook runs on the embedded default model in step mode (no thread, greedy, ignore_eos, so
every number is deterministic), explains what happens and why, and asserts what it claims."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import nbformat as nbf
from nbclient import NotebookClient

HERE = Path(__file__).parent


def _load() -> dict[str, list]:
    """name -> cells, from the chapter modules in notebooks/course/ (nbNN_*.py)."""
    sys.path.insert(0, str(HERE))
    out = {}
    for path in sorted((HERE / "course").glob("nb[0-9][0-9]_*.py")):
        mod = importlib.import_module(f"course.{path.stem}")
        out[mod.NAME] = mod.CELLS
    return out


NOTEBOOKS: dict[str, list] = _load()


def build(name: str) -> None:
    if name in NOTEBOOKS:
        nb = nbf.v4.new_notebook()
        nb.cells = NOTEBOOKS[name]
    else:  # a hand-written notebook: re-execute it in place
        nb = nbf.read(HERE / f"{name}.ipynb", 4)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    client = NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(HERE)}},
                            store_widget_state=False)
    client.execute()
    for c in nb.cells:
        c.metadata.pop("execution", None)
    nb.metadata.pop("widgets", None)
    path = HERE / f"{name}.ipynb"
    nbf.write(nb, path)
    print(f"{path.name}: {path.stat().st_size / 1024:.0f} KiB")


if __name__ == "__main__":
    for n in sys.argv[1:] or ["00-what-slotlab-runs-on", *NOTEBOOKS]:
        build(n)
