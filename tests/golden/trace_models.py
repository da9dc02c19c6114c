"""Which model a golden trace runs on: its `-m` (a path relative to the repository root, e.g.
tests/models/qwen35-tiny.gguf), or the default model when the trace names none."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def split_model(flags: list[str]) -> tuple[Path | None, list[str]]:
    """(the trace's model path or None for the default, the flags without -m / --model)."""
    flags = list(flags)
    for opt in ("-m", "--model"):
        if opt in flags:
            i = flags.index(opt)
            path = Path(flags[i + 1])
            del flags[i:i + 2]
            return (path if path.is_absolute() else ROOT / path), flags
    return None, flags
