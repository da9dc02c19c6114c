"""The course's reading order (issue 24, "order for a newcomer"): README's table lists every notebook
once, in an order that teaches full attention before the sliding window and its checkpoints; each
chapter that points to the next one in its last cell names the chapter that follows it in that table;
and every link from one notebook to another resolves. No kernel, no model: reads the committed files."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]
NB = sorted((ROOT / "notebooks").glob("*.ipynb"))
ROW = re.compile(r"^\| (\d+) \| `(\d\d-[\w-]+)` \|", re.M)
NEXT = re.compile(r"Next(?: in the reading order)?: \[[^\]]*\]\((\d\d-[\w-]+)\.ipynb\)")
LINK = re.compile(r"\]\((\d\d-[\w-]+)\.ipynb(?:#[^)]*)?\)")


def reading_order() -> list[str]:
    rows = ROW.findall((ROOT / "README.md").read_text())
    assert [int(n) for n, _ in rows] == list(range(1, len(rows) + 1)), "the table's 'read' column counts 1, 2, ..."
    return [name for _, name in rows]


def test_the_table_lists_every_notebook_once():
    order = reading_order()
    assert sorted(order) == sorted(p.stem for p in NB)


def test_full_attention_and_idle_slots_come_before_the_sliding_window():
    order = reading_order()
    at = {name[:2]: i for i, name in enumerate(order)}
    assert at["05"] == at["02"] + 1                      # idle slots right after the RAM cache
    assert max(at["02"], at["05"], at["04"]) < at["06"] < at["03"]   # --swa-full chapters, then checkpoints, then files
    assert order[-2:][0].startswith("12-") and order[-1].startswith("13-")  # beyond the flags, then time and fleets


def test_next_links_follow_the_table():
    order = reading_order()
    pointed = 0
    for p in NB:
        last = nbformat.read(p, 4).cells[-1].source
        for target in NEXT.findall(last):
            assert order.index(target) == order.index(p.stem) + 1, f"{p.name} points to {target}"
            pointed += 1
    assert pointed >= 7


def test_links_between_notebooks_resolve():
    names = {p.stem for p in NB}
    for p in NB:
        for c in nbformat.read(p, 4).cells:
            if c.cell_type == "markdown":
                for target in LINK.findall(c.source):
                    assert target in names, f"{p.name} links to {target}.ipynb, which does not exist"
