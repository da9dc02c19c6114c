"""Every behaviour reference in the code resolves to docs/server-behaviour.md.

Code comments cite sections of the behaviour page ("spec 2.4", "spec 1.1-1.3", "spec Appendix B")
and llama.cpp line tags ("ST:1793-1868" = lines of tools/server/server-task.cpp at the pinned
commit). This checks, without a model:

* each cited section number has a heading of that number in the page;
* each tag is in the page's legend (section 0.1);
* when the pinned llama.cpp tree is present (build/llama-server/src/llama_cpp_python-0.3.36/vendor/
  llama.cpp, as `python -m bench.build_llama_server` extracts it; $SLOTLAB_SERVER_BUILD moves
  build/llama-server like it does for the bench), each tagged line range, in the code and in the page
  itself, lies inside its file.

Failures name the file:line of every unresolved reference.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "server-behaviour.md"
SCANNED = ("slotlab", "tests", "bench", "notebooks")
PIN = "0.3.36"
BUILD = Path(os.environ.get("SLOTLAB_SERVER_BUILD", ROOT / "build" / "llama-server"))
TREE = BUILD / "src" / f"llama_cpp_python-{PIN}" / "vendor" / "llama.cpp"

# "spec 2.4", "spec section 2", "spec 1.1-1.3", "spec 5.1, 8", "spec 3.5 and 4"; not "spec 4.2 steps 1-3"
_NUM = r"\d+(?:\.\d+)*"
SPEC_RE = re.compile(rf"\bspec\s+(?:sections?\s+)?({_NUM}(?:\s*(?:,|-|–|\band\b)\s*{_NUM}(?!\w|\.\d))*)")
SPEC_ITEM_RE = re.compile(rf"({_NUM})(?:\s*[-–]\s*({_NUM}))?")
APPENDIX_RE = re.compile(r"\bspec\s+(?i:appendix)\s+([A-Z])\b")
TAG_RE = re.compile(r"\b([A-Z]{2,5}):(\d+)(?:-(\d+))?\b")
HEADING_RE = re.compile(rf"^#{{1,6}}\s+({_NUM})\.?\s")
APPENDIX_HEADING_RE = re.compile(r"^#{1,6}\s+Appendix\s+([A-Z])\b")
LEGEND_ROW_RE = re.compile(r"^\|\s*`([A-Z]{2,5})`\s*\|\s*`([^`]+)`\s*\|")


def _sections(a: str, b: str | None) -> list[str]:
    """One cited item; a range within one parent (1.1-1.3) stands for every number in it."""
    if b is None:
        return [a]
    pa, pb = a.split("."), b.split(".")
    if len(pa) == len(pb) and pa[:-1] == pb[:-1] and int(pa[-1]) <= int(pb[-1]):
        head = ".".join(pa[:-1])
        return [f"{head}.{i}" if head else str(i) for i in range(int(pa[-1]), int(pb[-1]) + 1)]
    return [a, b]


def _code_files() -> list[Path]:
    me = Path(__file__).resolve()
    out = []
    for d in SCANNED:
        for p in sorted((ROOT / d).rglob("*.py")):
            if p.resolve() != me and ".ipynb_checkpoints" not in p.parts:
                out.append(p)
    return out


def _where(path: Path, lineno: int) -> str:
    return f"{path.relative_to(ROOT)}:{lineno}"


def _code_refs():
    """(where, kind, value) for every reference in the scanned code; kind is spec / appendix / tag."""
    refs = []
    for path in _code_files():
        for i, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            for m in SPEC_RE.finditer(line):
                for item in SPEC_ITEM_RE.finditer(m.group(1)):
                    for s in _sections(item.group(1), item.group(2)):
                        refs.append((_where(path, i), "spec", s))
            for m in APPENDIX_RE.finditer(line):
                refs.append((_where(path, i), "appendix", m.group(1)))
            for m in TAG_RE.finditer(line):
                refs.append((_where(path, i), "tag", m.group(0)))
    return refs


def _doc():
    """Headings (section numbers, appendix letters), the legend (tag -> path) and the page's own tags."""
    assert DOC.exists(), f"{DOC.relative_to(ROOT)} is missing"
    sections, appendices, legend, tags = set(), set(), {}, []
    in_legend = False
    for i, line in enumerate(DOC.read_text(encoding="utf-8").splitlines(), 1):
        h = HEADING_RE.match(line)
        if h:
            sections.add(h.group(1))
            in_legend = h.group(1) == "0.1"
        a = APPENDIX_HEADING_RE.match(line)
        if a:
            appendices.add(a.group(1))
            in_legend = False
        row = LEGEND_ROW_RE.match(line) if in_legend else None
        if row:
            legend[row.group(1)] = row.group(2)
            continue
        for m in TAG_RE.finditer(line):
            tags.append((_where(DOC, i), m.group(0)))
    return sections, appendices, legend, tags


def test_the_scan_finds_references():
    refs = _code_refs()
    assert any(k == "spec" for _, k, _ in refs) and any(k == "tag" for _, k, _ in refs), (
        "no 'spec N.N' or TAG:LINE reference found in the code: the scan is broken")


def test_every_spec_section_cited_in_code_has_a_heading():
    sections, appendices, _, _ = _doc()
    bad = [f"{w}: spec {v} has no heading '{v} ...' in docs/server-behaviour.md"
           for w, k, v in _code_refs() if k == "spec" and v not in sections]
    bad += [f"{w}: spec Appendix {v} has no heading 'Appendix {v}. ...' in docs/server-behaviour.md"
            for w, k, v in _code_refs() if k == "appendix" and v not in appendices]
    assert not bad, "unresolved section references:\n" + "\n".join(bad)


def test_every_line_tag_is_in_the_legend():
    _, _, legend, doc_tags = _doc()
    assert legend, "docs/server-behaviour.md has no legend table under '### 0.1'"
    bad = [f"{w}: {v}: tag {v.split(':')[0]} is not in the legend (docs/server-behaviour.md, 0.1)"
           for w, k, v in _code_refs() if k == "tag" and v.split(":")[0] not in legend]
    bad += [f"{w}: {v}: tag {v.split(':')[0]} is not in the legend" for w, v in doc_tags
            if v.split(":")[0] not in legend]
    assert not bad, "unresolved line tags:\n" + "\n".join(bad)


@pytest.mark.skipif(not TREE.is_dir(), reason=f"the pinned llama.cpp tree is not at {TREE} "
                    "(run `python -m bench.build_llama_server`, or set SLOTLAB_SERVER_BUILD)")
def test_every_line_range_lies_inside_its_file_in_the_pinned_tree():
    _, _, legend, doc_tags = _doc()
    n_lines: dict[str, int | None] = {}
    for tag, rel in legend.items():
        f = (TREE / rel).resolve()
        n_lines[tag] = len(f.read_bytes().splitlines()) if f.is_file() else None
    bad = [f"docs/server-behaviour.md (legend): {tag} -> {legend[tag]} does not exist in {TREE}"
           for tag, n in n_lines.items() if n is None]
    every = [(w, v) for w, k, v in _code_refs() if k == "tag"] + doc_tags
    for where, ref in every:
        m = TAG_RE.fullmatch(ref)
        tag, a = m.group(1), int(m.group(2))
        b = int(m.group(3)) if m.group(3) else a
        n = n_lines.get(tag)
        if n is None:
            continue  # reported above (or by the legend test)
        if not (1 <= a <= b <= n):
            bad.append(f"{where}: {ref} is outside {legend[tag]} ({n} lines)" if b > n or a < 1
                       else f"{where}: {ref} is not a range (start > end)")
    assert not bad, "line tags that do not resolve in the pinned tree:\n" + "\n".join(bad)
