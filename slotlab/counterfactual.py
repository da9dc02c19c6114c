"""What would have saved a miss: re-run the trace up to the missed request under a candidate flag
change and measure what that request reuses then.

`slotlab.explain` says which mechanism lost the tokens and names every flag change that acts on it
(`Miss.candidates`); this module tries them all for real — the same decisions on the same requests, on
a fresh engine — and `confirm` keeps as advice only the changes that reused more, best first, with the
figure. A change that saved nothing is never suggested (it is listed in `tried`, with `saved` <= 0).

The trace itself is replayed on the memory asked for (the real model's context by default); the
counterfactual replays run on the paper memory (`paper_replayer`) for every memory kind — full
attention, SWA, hybrid, recurrent: slotlab/memory/paper/ sizes each of them byte-exact, and the
decisions depend on nothing else — with each request generating the tokens it generated in that
first replay (the replay sets `ignore_eos`, so a generation's length never depends on the cache).
tests/core/test_counterfactual_paper.py proves on every tiny golden trace that the paper
counterfactuals' figures equal the real context's, and measures how much faster they are;
`counterfactuals="real"` (`slotlab replay --why --counterfactuals real`) still replays them on the
real model."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Callable

from slotlab.engine.replay import Trace, replay
from slotlab.explain import Explainer, Miss


@dataclass
class Counterfactual:
    """One tried change: `flags` added to the trace's, what the request reused then, tokens saved."""

    flags: list[str]
    cache_n: int | None
    saved: int
    error: str | None = None

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Diagnosis:
    """A trace's misses with, for each, the tried changes and the best one."""

    misses: list[tuple[int, Miss]]  # (request index, miss)
    tried: dict[int, list[Counterfactual]] = field(default_factory=dict)
    lost_by_cause: dict[str, int] = field(default_factory=dict)
    client_changes: list = field(default_factory=list)  # slotlab.conversation.ClientChange, when known
    counterfactual_memory: str = ""  # "paper" or "real": where the counterfactuals were replayed
    counterfactual_seconds: float = 0.0  # wall time of the counterfactual replays (not in as_json)
    n_replays: int = 0  # counterfactual replays run

    def best(self, i: int) -> Counterfactual | None:
        good = [c for c in self.tried.get(i, []) if c.saved > 0]
        return max(good, key=lambda c: (c.saved, -len(c.flags)), default=None)

    def dropped(self) -> list[tuple[int, Counterfactual]]:
        """Every tried change that saved nothing: (request, change); none of them is suggested."""
        return [(i, c) for i, cs in self.tried.items() for c in cs if c.saved <= 0]

    def lines(self) -> list[str]:
        out = []
        for i, m in self.misses:  # the line carries each confirmed flag with what it saved
            out.append(f"#{i} {m.line()}")
        for c in self.client_changes:
            out.append(c.line())
        tot = ", ".join(f"{c} {n}" for c, n in sorted(self.lost_by_cause.items(), key=lambda kv: -kv[1]))
        out.append(f"tokens lost by cause: {tot or 'none'}")
        return out

    def as_json(self) -> dict:
        return {"misses": [{"request": i, **m.as_dict(), "tried": [c.as_dict() for c in self.tried.get(i, [])],
                            "best": None if self.best(i) is None else self.best(i).as_dict()} for i, m in self.misses],
                "lost_by_cause": dict(self.lost_by_cause),
                "client_changes": [c.as_dict() for c in self.client_changes]}


def confirm(m: Miss, tried: list[Counterfactual], cost: dict | None = None) -> None:
    """Set `m`'s advice from its counterfactuals: the flag changes that reused more, best first (most
    tokens saved, then the fewest flags), then the advice that is not a flag; nothing else."""
    good = sorted((c for c in tried if c.saved > 0), key=lambda c: (-c.saved, len(c.flags)))
    flags = [" ".join(c.flags) for c in good]
    m.suggest = [*dict.fromkeys(flags), *m.advice()]
    m.saved = {" ".join(c.flags): c.saved for c in good}
    m.cost = {f: v for f, v in (cost or {}).items() if f in m.saved}
    m.untested = []
    m.tested = True


def untried(m: Miss, why: str) -> None:
    """A miss whose candidates were not replayed: no flag change is suggested (none is confirmed)."""
    m.untested = []
    m.not_tried = why if m.candidates else ""


def flag_change(suggestion: str) -> list[str] | None:
    """`--ctx-checkpoints 64` -> ['--ctx-checkpoints', '64']; None for advice that is not a flag."""
    if not suggestion.startswith("-"):
        return None
    parts = shlex.split(suggestion)
    return parts if all(p.startswith("-") or not p.isalpha() or p.isdigit() for p in parts[1:]) or len(parts) <= 2 else None


def request_tasks(out: dict) -> list[int | None]:
    """The task id of each request of a replay (None for slot actions)."""
    return [None if t is None else t.id for t in out.get("tasks", [])]


def swa_full_cost(flags: list[str]) -> str | None:
    """What --swa-full costs in memory for a command line: the window cache of each SWA layer grows
    from `pad(n_swa * n_seq + n_ubatch, 256)` cells to the slot's whole context (llama.cpp's iSWA
    cache sizes, as the paper memory builds them). None when the model's header cannot be read."""
    try:
        from slotlab.engine.params import ServerParams
        from slotlab.memory.profile import ModelProfile, default_model_gguf, row_size

        p = ServerParams.from_args(flags)
        prof = ModelProfile.from_gguf(p.model or default_model_gguf())
        if not prof.is_swa_model:
            return None
        n_seq, unified = p.n_slots, p.kv_unified_effective
        n_ctx = p.n_ctx_requested or prof.n_ctx_train
        n_ctx_seq = n_ctx if unified else n_ctx // max(1, n_seq)
        n_stream = 1 if unified else n_seq
        pad = lambda n: (n + 255) // 256 * 256  # noqa: E731
        size_swa = pad(min(n_ctx_seq, prof.n_swa * (n_seq if unified else 1) + p.n_ubatch))
        per_tok = sum(row_size(p.cache_type_k, prof.n_embd_k_gqa(il)) + (0 if prof.mla else
                      row_size(p.cache_type_v, prof.n_embd_v_gqa(il))) for il in prof.layers(True))
        extra = max(0, n_ctx_seq - size_swa) * per_tok * n_stream
        return f"KV cache +{extra / 2**20:.1f} MiB: the window layers hold the whole context"
    except Exception:  # noqa: BLE001 - a cost we cannot compute is left out, never guessed
        return None


def paper_replayer(trace: Trace, *, vocab, outputs=None) -> Callable[[Trace], dict]:
    """A replayer on the paper memory (fast, nothing decoded): `outputs` (per request of `trace`, the
    tokens it generated when recorded, e.g. `recorded_outputs`) scripts the generations of any prefix."""
    from slotlab.sim.paper_replay import replay_on_paper

    def run(t: Trace) -> dict:
        return replay_on_paper(t, vocab=vocab, outputs=None if outputs is None else list(outputs)[:len(t.requests)])

    return run


def generated_outputs(out: dict) -> list:
    """Per request of a replay (`replay()`'s dict), the token ids it generated (None for slot actions
    and errors): what `paper_replayer(outputs=)` scripts so a counterfactual on paper holds the same
    tokens in its slots as the replay did."""
    import numpy as np

    return [None if t is None or t.error is not None or not t.result
            else np.asarray(t.result["tokens"], dtype=np.int32) for t in out.get("tasks", [])]


def diagnose_trace(trace: Trace, *, model=None, memory_factory: Callable | None = None, max_misses: int = 20,
                   max_tries: int = 6, progress: Callable[[str], None] | None = None,
                   replayer: Callable[[Trace], dict] | None = None,
                   counterfactuals: str | Callable[[Trace], dict] | None = None) -> Diagnosis:
    """Replay `trace`, find its misses, and try every flag change that acts on each one's mechanism
    (up to `max_tries`) for the first `max_misses` misses by replaying the trace up to that request with
    the change; `confirm` then keeps only those that reused more. A miss past `max_misses` gets no flag
    advice (nothing confirmed it). `replayer(trace) -> replay()'s dict` replaces the engine replay
    (e.g. `paper_replayer`).

    `counterfactuals`: where the counterfactual replays run. "paper" (the default when the trace is
    replayed on the real model: the paper memory, each request scripted with the tokens it generated in
    that replay, the model's vocabulary tokenizing the prompts), "real" (a fresh engine on the real
    model each time), or a replayer; by default a `replayer` or `memory_factory` given runs them too."""
    run = replayer or (lambda t: replay(t, model=model, memory_factory=memory_factory))
    out = run(trace)
    eng = out["engine"]
    try:
        diag = _diagnose(trace, out, eng, run, model=model, memory_factory=memory_factory, max_misses=max_misses,
                         max_tries=max_tries, progress=progress,
                         counterfactuals=counterfactuals if counterfactuals is not None else
                         ("same" if replayer is not None or memory_factory is not None else "paper"))
    finally:
        eng.close()
    return diag


def _diagnose(trace: Trace, out: dict, eng, run, *, model, memory_factory, max_misses: int, max_tries: int,
              progress, counterfactuals) -> Diagnosis:
    import time

    x = Explainer().fold(eng.events.replayable())
    ids = request_tasks(out)
    by_task = {m.task: m for m in x.misses}
    misses = [(i, by_task[t]) for i, t in enumerate(ids) if t is not None and t in by_task]
    diag = Diagnosis(misses, lost_by_cause=dict(x.lost_by_cause))
    diag.client_changes = _client_changes(trace, eng)
    if callable(counterfactuals):
        run, diag.counterfactual_memory = counterfactuals, "given"
    elif counterfactuals == "paper":
        vocab = model if model is not None else (eng.model if eng.model is not None else
                                                 getattr(eng.memory, "vocab", None))
        unsized = _unsized(vocab)
        if unsized:  # a model the paper memory cannot size (ModelProfile.unsized): the real one answers
            run, diag.counterfactual_memory = (lambda t: replay(t, model=model)), f"real ({unsized})"
        else:
            run = paper_replayer(trace, vocab=vocab, outputs=generated_outputs(out))
            diag.counterfactual_memory = "paper"
    elif counterfactuals == "real":
        run, diag.counterfactual_memory = (lambda t: replay(t, model=model)), "real"
    elif counterfactuals == "same":
        diag.counterfactual_memory = "same"
    else:
        raise ValueError(f"counterfactuals={counterfactuals!r}: 'paper', 'real' or a replayer")
    t0 = time.perf_counter()
    cost = {}
    done: dict[tuple, Counterfactual] = {}
    for n, (i, m) in enumerate(misses):
        if n >= max_misses:
            untried(m, f"past --max-misses {max_misses}")
            continue
        tried = []
        for s in m.candidates:
            fl = flag_change(s)
            if fl is None or len(tried) >= max_tries:
                continue
            if fl == ["--swa-full"] and s not in cost:
                c = swa_full_cost(resolve_model_flags(trace.flags, model))
                if c:
                    cost[s] = c
            key = (tuple(fl), i)
            if key not in done:
                if progress:
                    progress(f"request {i}: trying {' '.join(fl)}")
                sub = Trace([*trace.flags, *fl], trace.requests[:i + 1], trace.path, trace.files)
                diag.n_replays += 1
                try:
                    r = run(sub)
                    r["engine"].close()
                    res = r["results"][i]
                    cn = res.get("cache_n")
                    done[key] = Counterfactual(fl, cn, (cn or 0) - m.n_past)
                except Exception as ex:  # a change the engine refuses (e.g. a flag this memory cannot take)
                    done[key] = Counterfactual(fl, None, 0, f"{type(ex).__name__}: {ex}")
            tried.append(done[key])
        diag.tried[i] = tried
        confirm(m, tried, cost)
    diag.counterfactual_seconds = time.perf_counter() - t0
    return diag


def _unsized(vocab) -> str:
    """Why the paper memory cannot size the model `vocab` was loaded from ("" when it can, or when the
    header cannot be read here: the paper replay then says what is wrong itself)."""
    path = getattr(vocab, "path", None)
    if path is None:
        return ""
    try:
        from slotlab.memory.profile import ModelProfile

        return ModelProfile.from_gguf(path).unsized
    except (OSError, ValueError):
        return ""


def _client_changes(trace: Trace, eng) -> list:
    """The client's changes between the trace's chat calls (requests with `messages`), rendered through
    the replayed model's chat template."""
    from slotlab.conversation import Renderer, calls_of_trace, client_changes

    calls = calls_of_trace(trace.requests, trace.path or "trace")
    if len(calls) < 2:
        return []
    model = eng.model if eng.model is not None else getattr(eng.memory, "vocab", None)
    return client_changes(calls, Renderer.of(model, eng.params))


def resolve_model_flags(flags: list[str], model=None) -> list[str]:
    """The trace's flags with the model the replay runs (for sizes read from its header)."""
    if model is not None and "-m" not in flags and "--model" not in flags:
        return [*flags, "-m", str(model.path)]
    return list(flags)
