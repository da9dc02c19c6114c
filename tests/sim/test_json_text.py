"""`slotlab simulate --json` writes the report as indented JSON with each per-request row on a line
of its own (the rows through the C encoder): the same document as `json.dumps` of it, whatever the
rows and the other fields hold."""

import json

from slotlab.sim.cli import json_text


def test_the_document_reads_back_equal_with_one_row_a_line():
    rows = [{"i": i, "error": None if i % 2 else 'a "quoted" \\ \n text \x00results\x00', "ttft": i / 3}
            for i in range(5)]
    doc = {"flags": ["-np", "4", '"results": []'], "totals": {"n": 5, "results": "not rows"}, "results": rows,
           "notes": ["after the rows"]}
    text = json_text(doc)
    assert json.loads(text) == doc
    lines = text.splitlines()
    for r in rows:  # each row compact, on its own line
        assert any(ln.strip().rstrip(",") == json.dumps(r) for ln in lines)


def test_without_rows_it_is_plain_indented_json():
    for doc in ({"flags": [], "totals": {}}, {"results": []}, {"results": "x"}):
        assert json_text(doc) == json.dumps(doc, indent=1)
