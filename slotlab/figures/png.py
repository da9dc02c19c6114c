"""A matplotlib figure as a deterministic, small PNG, displayable in a notebook.

Why PNG and not SVG or plotly: nbval compares every output except images, so a PNG keeps the notebooks
testable while a picture shows where no kernel runs; matplotlib renders offline (plotly's static export
needs a browser download). Determinism: the Agg backend, a fixed DPI and no `Software` / date metadata,
so rebuilding a notebook with the same numbers gives the same bytes and a clean git diff."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg", force=False)  # no display needed; inside Jupyter the inline backend is not used here
import matplotlib.pyplot as plt  # noqa: E402

DPI = 80
#: a notebook must stay under 1 MiB; one picture above this is a mistake (too many pixels, a photo-like fill)
MAX_BYTES = 200_000

plt.rcParams.update({"font.size": 9, "axes.titlesize": 10, "figure.dpi": DPI, "svg.hashsalt": "slotlab"})


def new(width: float = 9.0, height: float = 3.0, **kw):
    """`fig, ax = new(w, h)` (inches at DPI 80, so 9 x 3 is 720 x 240 pixels); kw go to plt.subplots."""
    return plt.subplots(figsize=(width, height), **kw)


def to_png(fig) -> bytes:
    """Render and close `fig` (figures left open leak memory across a long notebook)."""
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    finally:
        plt.close(fig)
    data = buf.getvalue()
    if len(data) > MAX_BYTES:
        raise ValueError(f"picture is {len(data):,} bytes (> {MAX_BYTES:,}): make it smaller")
    return data


def image(fig):
    """`display(image(fig))` in a notebook: an IPython Image (PNG bytes), the figure closed."""
    from IPython.display import Image

    return Image(to_png(fig), format="png")
