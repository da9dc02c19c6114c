"""A slot file's layout (`POST /slots/{id}?action=save`), section by section, with byte counts.

Why a picture: the hex dump shows the first bytes; what a reader needs is the proportions. The body
that `llama_state_seq_save_file` writes is a 12-byte header, the packed `server_tokens` words and the
sequence state (the KV cells of every layer); that is the whole stock file. slotlab's opt-in
`--slot-appendices` adds an `SCKP` block after it, one record per context checkpoint (each holds the
sliding-window layers' cache for the cells still in the window, so on Gemma 3 a checkpoint is almost
as big as the body), and an `SDFT` block when there is draft state. Drawn next to the stock file of
the same save, the picture shows what a stock restore lacks: the checkpoints that let the next
request cut the memory back (see notebook 03).

`sections(path, body)` parses the real file (header fields, the token payload with
`slot_file.unpack_tokens`, the appendices with `slot_file.read_appendices`); `body` is the byte count
the save reported (`n_written`: the state's own length is not stored in the file). `figure` draws what
`sections` returns, nothing typed by hand."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from slotlab.engine import slot_file as sf
from slotlab.figures import png

COLORS = {"header": "#7f7f7f", "tokens": "#bcbd22", "state": "#4c78a8", "SCKP header": "#e45756",
          "checkpoint": "#f58518", "SDFT": "#b279a2", "trailing": "#c7c7c7"}
#: a section below this share of the widest file is drawn at this share (so a 12-byte header shows)
MIN_SHARE = 0.035
HEADER = 12  # u32 magic, u32 version, u32 n_token_count (32-bit words of the token payload)


@dataclass(frozen=True)
class Section:
    kind: str  # a key of COLORS
    offset: int
    size: int
    text: str  # what it holds, for the label


def sections(path, body: int) -> list[Section]:
    """The sections of the slot file at `path` whose standard body is `body` bytes long."""
    raw = Path(path).read_bytes()
    if not HEADER <= body <= len(raw):
        raise ValueError(f"body {body} does not fit a {len(raw)}-byte file")
    magic, version, n_words = struct.unpack_from("<III", raw)
    words = np.frombuffer(raw, dtype=np.int32, count=n_words, offset=HEADER)
    n_tok = len(sf.unpack_tokens(words))
    tok_end = HEADER + 4 * n_words
    name = magic.to_bytes(4, "big").decode("ascii", "replace")
    out = [Section("header", 0, HEADER, f"magic '{name}', version {version}, {n_words} words"),
           Section("tokens", HEADER, 4 * n_words, f"{n_tok} tokens"),
           Section("state", tok_end, body - tok_end, "sequence state (KV of every layer)")]
    app = sf.read_appendices(path, body)
    pos = body
    if app.checkpoints:
        out.append(Section("SCKP header", pos, 12, f"SCKP, {len(app.checkpoints)} checkpoint(s)"))
        pos += 12
        for i, c in enumerate(app.checkpoints):
            n = 16 + 3 * 8 + c.size()
            out.append(Section("checkpoint", pos, n, f"checkpoint {i}: pos {c.pos_min}..{c.pos_max}, "
                                                     f"n_tokens {c.n_tokens}"))
            pos += n
    if len(app.draft_state) or len(app.spec_state):
        n = 8 + 16 + len(app.draft_state) + len(app.spec_state)
        out.append(Section("SDFT", pos, n, "draft state"))
        pos += n
    if pos < len(raw):
        out.append(Section("trailing", pos, len(raw) - pos, "not an appendix"))
    return out


def _fmt(n: int) -> str:
    return f"{n:,} B" if n < 10_000 else f"{n:,} B ({n / 2**20:.2f} MiB)"


def figure(files, *, width: float = 10.0):
    """One bar per file, `files` = [(title, path, body), ...] (body: the save's `n_written`). Widths
    are bytes to scale against the largest file, except that sections under `MIN_SHARE` of it are
    widened so they show (their labels give the true byte counts)."""
    parsed = [(title, sections(path, body)) for title, path, body in files]
    total = max(sum(s.size for s in secs) for _, secs in parsed)
    fig, ax = png.new(width, 0.4 + 1.35 * len(parsed))
    for row, (title, secs) in enumerate(parsed):
        y = row * 1.35
        x = 0.0
        for j, s in enumerate(secs):
            w = max(s.size / total, MIN_SHARE)
            ax.barh(y, w, left=x, height=0.5, color=COLORS[s.kind], edgecolor="white", lw=1)
            small = s.size / total < 0.15
            above = j % 2 == 0 if small else True
            if small:  # the label outside the bar, alternately above and below
                ax.text(x, y + (0.33 if above else -0.33), f"{s.kind}: {_fmt(s.size)}", ha="left",
                        va="bottom" if above else "top", fontsize=7.5)
            else:
                ax.text(x + w / 2, y, f"{s.kind}: {_fmt(s.size)}\n{s.text}", ha="center", va="center",
                        fontsize=7.5, color="white")
            x += w
        n = sum(s.size for s in secs)
        ax.text(0, y - 0.62, f"{title} — {n:,} bytes", fontsize=8.5, fontweight="bold", va="top")
    ax.text(0, 1.35 * (len(parsed) - 1) + 0.62, f"widths: bytes to scale; a section under {MIN_SHARE:.1%} of "
            "the largest file is widened so it shows (its label gives its true size)", fontsize=7, color="#666",
            va="top")
    ax.set_ylim(1.35 * len(parsed) - 0.3, -0.75)
    ax.set_xlim(0, 1.0 + MIN_SHARE * 4)
    ax.axis("off")
    return fig


def image(files, **kw):
    return png.image(figure(files, **kw))
