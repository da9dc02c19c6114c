"""Static pictures for the course and the reports: matplotlib figures of slotlab's state and events,
returned as PNG so they are committed inside the notebooks and show with no kernel (GitHub, nbviewer,
VS Code). Each module draws one concept; `png.py` turns a figure into a deterministic PNG."""


def write_outputs(module, data, *, png=None, html=None, title: str) -> None:
    """Write `data` through `module`'s `write_png` / `write_html` (each taking the data, a path and a
    title) to the paths given, and say each on stderr: the command lines' `--png` / `--html`."""
    import sys

    for path, write in ((png, "write_png"), (html, "write_html")):
        if path:
            getattr(module, write)(data, path, title=title)
            print(f"wrote {path}", file=sys.stderr)
