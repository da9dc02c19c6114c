"""Replay a trace on the paper memory: `slotlab replay --memory paper TRACE`.

The same requests in the same order as `slotlab.engine.replay.replay`, on a `SimMemory` (a
`PaperMemory`) sized from the model's GGUF header, with the RAM cache's and checkpoints' state blobs
as `PaperBlob`s (`PaperAllocator`: real sizes, no bytes). Text prompts are tokenized with the real
model's vocabulary (`vocab=`, a loaded `slotlab.llama.Model`); nothing is decoded.

`outputs` (optional): per request, the token ids it generated when it was recorded (e.g. the real
server's answers, tokenized): the paper sampler returns them instead of placeholders, so decisions
that depend on what the model wrote (a follow-up prompt that repeats it) come out as recorded."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from slotlab.engine.replay import Trace, install_files, replay, resolve_flags
from slotlab.memory.paper import PaperAllocator
from slotlab.sim.memory import SimMemory

__all__ = ["paper_engine", "replay_on_paper", "recorded_outputs"]


def paper_engine(flags: Sequence[str] | Any, *, vocab=None, profile=None, limit_bytes: int | None = None,
                 observers: Sequence[Callable] = (), hindsight: bool = True):
    """`(engine, allocator)`: an `Engine` on a `SimMemory` for llama-server `flags` (a list, string or
    ServerParams), and the `PaperAllocator` of its RAM cache's blobs, bound to that cache.
    `observers` / `hindsight`: as `Engine`'s (views subscribed before the first event; whether the
    facts explanations need are kept)."""
    from slotlab.engine.params import ServerParams
    from slotlab.engine.scheduler import Engine

    params = flags if isinstance(flags, ServerParams) else ServerParams.from_args(flags)
    mem = SimMemory.from_params(params, profile=profile, vocab=vocab)
    alloc = PaperAllocator(limit_bytes=limit_bytes)
    eng = Engine(params, memory=mem, allocate=alloc, observers=observers, hindsight=hindsight)
    if eng.core.cache is not None:
        alloc.bind(eng.core.cache)  # peak / budget as the server's heap holds them (PaperAllocator.bind)
    mem.bind(eng.core)
    return eng, alloc


def recorded_outputs(answers: dict | str | Path, vocab) -> list[np.ndarray | None]:
    """Per request of a recorded answer file (`*.llama-server.json`), its `content` tokenized with
    `vocab` (None for slot actions, errors and empty answers)."""
    if not isinstance(answers, dict):
        answers = json.loads(Path(answers).read_text())
    out: list[np.ndarray | None] = []
    for r in answers["results"]:
        c = r.get("content") if "action" not in r else None
        out.append(np.asarray(vocab.tokenize(c, add_special=False, parse_special=False), dtype=np.int32)
                   if c else None)
    return out


def replay_on_paper(trace: Trace, *, vocab=None, model=None, outputs: Sequence | None = None, profile=None,
                    progress: Callable[[int, int], None] | None = None, slot_save_path: str | None = None,
                    observers: Sequence[Callable] = (), hindsight: bool = True) -> dict:
    """`replay(trace)` on a paper memory; the same return value ({"flags", "results", "engine", "tasks"}).
    `vocab` (or `model`, a loaded `slotlab.llama.Model`) tokenizes text prompts; `outputs` scripts the
    generations (module docstring)."""
    vocab = vocab if vocab is not None else model
    flags = resolve_flags(trace.flags, model)
    tmp = None
    if "--slot-save-path" not in flags:
        tmp = tempfile.TemporaryDirectory(prefix="slotlab-slots-")
        flags += ["--slot-save-path", slot_save_path or tmp.name]
    install_files(trace, flags[flags.index("--slot-save-path") + 1])
    eng, _ = paper_engine(flags, vocab=vocab, profile=profile, observers=observers, hindsight=hindsight)
    on_submit = None
    if outputs is not None:
        scripts = eng.memory.scripts

        def on_submit(i: int, task) -> None:  # a request's recorded generation, by its task's id
            o = outputs[i] if i < len(outputs) else None
            if task is not None and o is not None and len(o):
                scripts[task.id] = np.asarray(o, dtype=np.int32)
    try:
        out = replay(trace, engine=eng, progress=progress, on_submit=on_submit)
    finally:
        if tmp is not None:
            tmp.cleanup()
    return out
