"""Golden traces on the tiny hybrid (qwen35) and pure recurrent (mamba2) models of tests/models/.

    python -m tests.golden.make_traces && python -m tests.golden.record_traces --tiny

The models (tests/models/make_tiny_models.py) have a 128-token test vocabulary that cuts text into
5-byte chunks, one token each, and a 256-token training context, which llama-server makes the cap of
every slot's context. So the prompts here are short (at most 152 tokens) and every piece of a prompt
(a message delimiter, a message) is padded to a multiple of 5 bytes: a message then always tokenizes
the same wherever it sits, a delimiter's tokens are found in the prompt (message spans, hence
checkpoints at user messages), and a follow-up that extends a prompt shares all of its tokens.

On these models no memory can be rolled back (seq_rm FULL: the recurrent state holds only the last
position), so every reuse of a cached prefix goes through a context checkpoint, and a prompt that
diverges before the oldest usable checkpoint is re-processed from the start. Each scenario runs once
on each model: `hybrid_*` on qwen35, `recurrent_*` on mamba2."""

from __future__ import annotations

from pathlib import Path

TINY_DIR = Path(__file__).with_name("traces_tiny")
MODELS = {"hybrid": "tests/models/qwen35-tiny.gguf", "recurrent": "tests/models/mamba2-tiny.gguf"}

# message delimiters of a made-up chat template, 10 bytes (2 tokens) each
D = {"system": "<|syst|>\n\n", "user": "<|user|>\n\n", "assistant": "<|asst|>\n\n", "tool": "<|tool|>\n\n"}
DELIMS = [{"role": r, "delimiter": d} for r, d in D.items()]


def pad(s: str) -> str:
    """`s` padded with spaces to whole 5-byte tokens."""
    return s + " " * (-len(s) % 5)


def chat(msgs: list[tuple[str, str]]) -> str:
    """A prompt of (role, text) messages, ending with an open assistant turn."""
    return "".join(D[r] + pad(t) for r, t in msgs) + D["assistant"]


def req(prompt: str, n_predict: int = 4, delims: bool = True, **kw) -> dict:
    r = {"prompt": prompt, "n_predict": n_predict, **kw}
    if delims:
        r["message_delimiters"] = DELIMS
    return r


def scenarios() -> dict[str, tuple[list[str], list[dict], dict]]:
    """name -> (flags without -m, requests, extra trace fields)."""
    s: dict[str, tuple[list[str], list[dict], dict]] = {}

    # 1. a multi-turn agent loop: each turn appends the assistant's tool call and the tool's result
    sys_agent = ("You are a build agent. Tools: run(cmd), read(path), write(path, text). "
                 "Answer with exactly one tool call per turn, then stop.")
    task = "The test suite fails on main. Find the failing case and fix it."
    calls = [('run("make test")', "FAILED tests/test_io.py::test_roundtrip - 1 failed, 41 passed"),
             ('read("tests/test_io.py")', "def test_roundtrip(): assert load(save(x)) == x  # line 12"),
             ('read("src/io.py")', "def save(x): return json.dumps(x, sort_keys=False)  # line 30"),
             ('write("src/io.py", "sort_keys=True")', "wrote 1 line to src/io.py"),
             ('run("make test")', "42 passed in 1.20s"),
             ('run("git diff --stat")', "src/io.py | 2 +- ; 1 file changed")]
    loop = []
    for k in range(len(calls) + 1):
        msgs = [("system", sys_agent), ("user", task)]
        for call, result in calls[:k]:
            msgs += [("assistant", call), ("tool", result)]
        loop.append(req(chat(msgs)))
    s["agent_loop"] = (["-np", "1", "-c", "512"], loop, {})

    # 2. a client that rewrites a few bytes early in the prompt every turn (a billing / timestamp
    # header in the system prompt): nothing before the change survives, so every turn re-processes
    # the whole prompt; the last request repeats the header and hits
    sys_bill = "You are a support assistant for a bicycle shop. Be brief and kind."
    turns = [("Where is my order 1182?", "It ships today."), ("Can I change the address?", "Yes, until noon."),
             ("Is the helmet in stock?", "Two are left."), ("Do you sell bells?", "Yes, three kinds.")]
    bill = []
    for k in range(len(turns)):
        header = f"x-billing: cch=7f3a{k:02d}; ts=2025-06-01T10:0{k}:00Z"
        msgs = [("system", header + " " + sys_bill)]
        for u, a in turns[:k]:
            msgs += [("user", u), ("assistant", a)]
        bill.append(req(chat(msgs + [("user", turns[k][0])])))
    bill.append(req(chat(msgs + [("user", turns[k][0]), ("assistant", turns[k][1]), ("user", "Thanks!")])))
    s["changing_header"] = (["-c", "1024"], bill, {})

    # 3. a branch back to an earlier turn (an edited message, a regenerated answer)
    sys_t = "You are a travel planner. Keep answers to one line."
    qa = [("Plan three days in Lisbon.", "Day 1 Alfama, day 2 Belem, day 3 Sintra."),
          ("Add a food tour.", "Day 2 evening: Time Out Market."),
          ("Swap day 1 and day 3.", "Day 1 Sintra, day 3 Alfama."),
          ("What about rain?", "Museums: Gulbenkian and Tile Museum.")]

    def travel(k: int, user: str) -> str:
        msgs = [("system", sys_t)]
        for u, a in qa[:k]:
            msgs += [("user", u), ("assistant", a)]
        return chat(msgs + [("user", user)])

    s["branch_back"] = (["-np", "1", "-c", "256"], [
        req(travel(0, qa[0][0])), req(travel(1, qa[1][0])), req(travel(2, qa[2][0])), req(travel(3, qa[3][0])),
        req(travel(4, "Thanks.")),
        req(travel(2, "Instead add a day in Porto.")),     # back to turn 2, another question
        req(travel(2, "Instead add a day in Porto?")),     # the same branch, a regenerated last message
        req(travel(1, "Skip the food tour.")),             # further back
        req(travel(4, "Thanks again.")),                   # the original, longest branch
    ], {})

    # 4. two agents sharing one system prompt on -np 2
    sys_shared = ("You are one of two research agents. Shared notes: the dataset has 12 columns, "
                  "the target is price, rows before 2020 are noisy. Report one finding per turn.")
    fa = ["Check the price column.", "Mean 41.2, median 39.0.", "Look at rows after 2020.", "Variance halves."]
    fb = ["Check the date column.", "Dates span 2014 to 2024.", "Count the noisy rows.", "3120 rows."]

    def agent(f: list[str], k: int, name: str) -> str:
        msgs = [("system", sys_shared), ("user", f"Agent {name}: start.")]
        for i in range(k):
            msgs += [("assistant", f[2 * i]), ("user", f[2 * i + 1])]
        return chat(msgs)

    # by similarity both agents land in one slot (the shared system prompt is most of either prompt) and
    # take turns on the checkpoint at the end of the system prompt; pinned (id_slot) each keeps its own.
    # (No concurrent requests here: on a model this small the server's timing would decide the order.)
    order = [(fa, 0, "A"), (fb, 0, "B"), (fa, 1, "A"), (fb, 1, "B"), (fa, 2, "A"), (fb, 2, "B"), (fa, 1, "A")]
    s["two_agents_np2"] = (["-np", "2", "-c", "512"], [req(agent(*o)) for o in order], {})
    s["two_agents_np2_pinned"] = (["-np", "2", "-c", "512"],
                                  [req(agent(*o), id_slot=0 if o[2] == "A" else 1) for o in order], {})

    # 5. --ctx-checkpoints 2 and --checkpoint-min-step spacing: small batches so the prompt is cut at
    # user messages, checkpoints at most 2 per slot, too-close ones dropped first
    notes = [f"Note {i}: shelf {i % 3} holds crate {i * 7}, checked on day {i + 1}." for i in range(8)]

    def ledger(k: int, user: str) -> str:
        msgs = [("system", "You keep a warehouse ledger.")]
        for i in range(k):
            msgs += [("user", notes[i]), ("assistant", f"Logged {i}.")]
        return chat(msgs + [("user", user)])

    s["ctx_checkpoints_min_step"] = (["-np", "1", "-c", "256", "--ctx-checkpoints", "2", "-cms", "24",
                                      "-b", "64", "-ub", "32"], [
        req(ledger(2, "Count.")), req(ledger(4, "Count.")), req(ledger(6, "Count.")),
        req(ledger(6, "Count again.")), req(ledger(3, "Back to three.")), req(ledger(1, "Back to one.")),
    ], {})

    # 6. the RAM cache holding recurrent entries (state + checkpoints): three conversations through one
    # slot, each restored from the cache with its checkpoints; a cache of two entries evicts the oldest
    topics = ["glaciers", "beekeeping", "lighthouses"]

    def topic(t: str, k: int) -> str:
        msgs = [("system", f"You answer questions about {t}.")]
        for i in range(k):
            msgs += [("user", f"Question {i} about {t}?"), ("assistant", f"Answer {i} about {t}.")]
        return chat(msgs + [("user", f"Question {k} about {t}?")])

    ram = [req(topic(t, 2)) for t in topics] + [req(topic(t, 3)) for t in topics] + [req(topic(topics[0], 4))]
    s["ram_cache"] = (["-np", "1", "-c", "256"], ram, {})
    # -c 1024: the cache's token limit (n_ctx) above the bytes limit; the slot stays capped at 256
    a, b, c = topics
    small = [req(topic(a, 2)), req(topic(b, 2)), req(topic(a, 3)), req(topic(c, 2)), req(topic(a, 4)),
             req(topic(b, 3)), req(topic(c, 3)), req(topic(a, 5))]
    s["ram_cache_small"] = (["-np", "1", "-c", "1024", "--cache-ram", "{cache_small}"], small, {})

    # 7. slot save / restore: the stock file holds no checkpoints, so a restored hybrid or recurrent
    # slot can only be continued by re-processing (llama.cpp #26676), in the same slot or another
    conv = [("system", "You are a chess coach."), ("user", "Review 1. e4 e5 2. Nf3 Nc6 3. Bb5."),
            ("assistant", "The Ruy Lopez; solid."), ("user", "And 3... a6?")]
    s["slot_files"] = (["-np", "2", "-c", "512"], [
        req(chat(conv), id_slot=0),
        {"action": "save", "id_slot": 0, "filename": "coach.bin"},
        {"action": "erase", "id_slot": 0},
        {"action": "restore", "id_slot": 1, "filename": "coach.bin"},
        req(chat(conv + [("assistant", "Morphy defence."), ("user", "Then 4. Ba4?")]), id_slot=1),
        {"action": "restore", "id_slot": 0, "filename": "coach.bin"},
        req(chat(conv), id_slot=0),
        {"action": "save", "id_slot": 1, "filename": "coach2.bin"},
        {"action": "restore", "id_slot": 1, "filename": "coach2.bin"},
        req(chat(conv + [("assistant", "Morphy defence."), ("user", "Then 4. Ba4?"),
                         ("assistant", "Main line."), ("user", "Thanks.")]), id_slot=1),
    ], {})

    # 7b. slot actions among id_slot traffic (issue 20): a save, an erase, restores into the same and
    # the other slot, failed restores (missing file, damaged body, not a slot file) into an empty and a
    # full slot, and what the next requests get
    talk = [("system", "You are a chess coach."), ("user", "Review 1. d4 d5 2. c4."), ("assistant", "The Queen's Gambit."),
            ("user", "And 2... e6?")]
    more = talk + [("assistant", "Declined; classical."), ("user", "Then 3. Nc3?")]
    s["slot_actions"] = (["-np", "2", "-kvu", "-c", "512"], [
        req(chat(talk), id_slot=0),
        {"action": "save", "id_slot": 0, "filename": "gambit.bin"},
        {"action": "erase", "id_slot": 0},
        {"action": "restore", "id_slot": 1, "filename": "gambit.bin"},
        req(chat(more), id_slot=1),
        {"action": "restore", "id_slot": 0, "filename": "missing.bin"},
        {"action": "restore", "id_slot": 0, "filename": "damaged.bin"},
        {"action": "restore", "id_slot": 0, "filename": "gambit.bin"},
        req(chat(talk), id_slot=0),
        {"action": "restore", "id_slot": 1, "filename": "not_a_slot.bin"},  # a full slot: cleared, 400
        req(chat(more)),
        {"action": "save", "id_slot": 1, "filename": "more.bin"},
        {"action": "erase", "id_slot": 1},
        {"action": "restore", "id_slot": 1, "filename": "more.bin"},
        req(chat(more + [("assistant", "Main line."), ("user", "Thanks.")]), id_slot=1),
    ], {"files": {"damaged.bin": "../data/damaged.bin", "not_a_slot.bin": "../data/not_a_slot.bin"}})

    # 8. idle-slot clearing: a new task saves the idle slots to the RAM cache and clears them (default),
    # and with --no-cache-idle-slots they keep their memory
    def ticket(u: str, k: int) -> str:
        msgs = [("system", f"{u} opened a support ticket. Be brief.")]  # little shared: LRU picks the slot
        for i in range(k):
            msgs += [("user", f"{u}: issue {i} with my order."), ("assistant", f"Fixed issue {i}.")]
        return chat(msgs + [("user", f"{u}: issue {k} with my order.")])

    idle = [req(ticket("Ana", 1)), req(ticket("Ben", 1)), req(ticket("Ana", 2)), req(ticket("Chen", 1)),
            req(ticket("Dara", 1)), req(ticket("Ben", 2)), req(ticket("Ana", 3))]
    s["idle_slots"] = (["-np", "3", "-kvu", "-c", "768"], idle, {})
    s["idle_slots_off"] = (["-np", "3", "-kvu", "-c", "768", "--no-cache-idle-slots"], idle, {})
    return s


# --cache-ram (MiB) holding two entries but not three on each model (an entry is the slot's state and
# its checkpoints: ~0.7 MiB on qwen35, ~2.6 MiB on mamba2, whose whole state is recurrent)
CACHE_SMALL = {"hybrid": "2", "recurrent": "6"}


def tiny_model_traces() -> dict[str, dict]:
    out: dict[str, dict] = {}
    for kind, model in MODELS.items():
        for name, (flags, requests, extra) in scenarios().items():
            flags = [f.replace("{cache_small}", CACHE_SMALL[kind]) for f in flags]
            out[f"{kind}_{name}"] = {"flags": ["-m", model, *flags], "requests": requests, **extra}
    return out
