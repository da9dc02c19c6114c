"""Small helpers the notebooks use, so their cells read like the story they tell."""

from __future__ import annotations

from slotlab.engine.scheduler import Engine


def ask(engine: Engine, prompt, n_predict: int = 4, **kw) -> dict:
    """Submit one greedy request (ignore_eos, so token counts are deterministic) and run it to the
    end in step mode; returns the result (raises the server's error if it failed)."""
    t = engine.submit(prompt, n_predict=n_predict, ignore_eos=True, **kw)
    engine.run_until(lambda: t.done)
    if t.error is not None:
        raise RuntimeError(f"{t.error.message} ({t.error.type}, HTTP {t.error.code})")
    return t.result


def summary(result: dict) -> str:
    """One line per request: the numbers llama-server reports."""
    tm = result["timings"]
    return (f"slot {result['id_slot']}: cache_n {tm['cache_n']:5d}  prompt_n {tm['prompt_n']:5d}  "
            f"tokens_evaluated {result['tokens_evaluated']:5d}  tokens_cached {result['tokens_cached']:5d}")


def action(engine: Engine, act: str, id_slot: int, filename: str | None = None):
    """A slot action run to completion; returns (status, reply) like the HTTP endpoint."""
    t = engine.slot_action(act, id_slot, filename)
    engine.run_until(lambda: t.done)
    if t.error is not None:
        return t.error.code, {"error": t.error.to_json()}
    return 200, {k: v for k, v in t.result.items() if k != "timings"}


def hexdump(data: bytes, start: int = 0, n: int = 64, width: int = 16) -> str:
    lines = []
    for off in range(start, min(len(data), start + n), width):
        chunk = data[off:off + width]
        hx = " ".join(f"{b:02x}" for b in chunk)
        asc = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{off:08x}  {hx:<{width * 3}} {asc}")
    return "\n".join(lines)


def why(engine: Engine, last: int = 10) -> str:
    """The last `last` requests' why lines, folded from the engine's events (slotlab.explain)."""
    from slotlab.explain import Explainer

    lines = list(Explainer().fold(engine.events.replayable()).lines)[-last:]
    return "\n".join(f"task {t}: {text}" for t, _, text in lines)
