"""A short scenario on the default model (SWA, so checkpoints are needed) with one slot and a RAM cache
that holds two prompts: request 1 fills the slot, request 2 extends it (its last checkpoint is
restored), requests 3-5 are new topics (each saves the slot's prompt; the third save evicts the oldest
entry to make room), request 6 returns to topic C (loaded from the RAM cache).

    #   prompt       what the server does
    0   A            fresh
    1   A + More?    checkpoint restored (n_past = |A| - 4 or so)
    2   B            A saved
    3   C            B saved
    4   D            C saved, A evicted (make_room)
    5   C + Again?   D saved, C loaded from the RAM cache (evicted: loaded)"""

from __future__ import annotations

FLAGS = ["-np", "1", "-c", "2048", "--cache-ram", "12"]


def topic(name: str, k: int, n: int = 8) -> str:
    return " ".join(f"Note {k}.{i} on {name}: item {k * 7 + i} is filed under shelf {i % 5} for later." for i in range(n))


A, B, C, D = topic("caves", 0), topic("rivers", 1), topic("bread", 2), topic("chess", 3)
REQUESTS = [{"prompt": A, "n_predict": 2}, {"prompt": A + " More?", "n_predict": 2}, {"prompt": B, "n_predict": 2},
            {"prompt": C, "n_predict": 2}, {"prompt": D, "n_predict": 2}, {"prompt": C + " Again?", "n_predict": 2}]


def body(r: dict) -> dict:
    """The /completion body the golden recorder sends for a trace request (greedy, ignore_eos)."""
    return {"prompt": r["prompt"], "n_predict": r["n_predict"], "temperature": 0.0, "ignore_eos": True, "id_slot": -1}


def trace() -> dict:
    return {"flags": list(FLAGS), "requests": [dict(r) for r in REQUESTS]}
