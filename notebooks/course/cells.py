"""The two kinds of cell the course is written in. A code cell marked `ignore=True` gets
`# NBVAL_IGNORE_OUTPUT`: its output (a live widget, an interactive plotly figure) is not compared by
nbval, everything else is."""

import nbformat as nbf

IGNORE = "# NBVAL_IGNORE_OUTPUT\n"


def md(s: str):
    return nbf.v4.new_markdown_cell(s.strip())


def code(s: str, ignore: bool = False):
    return nbf.v4.new_code_cell((IGNORE if ignore else "") + s.strip())
