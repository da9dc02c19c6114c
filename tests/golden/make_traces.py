"""Write the scenario traces in tests/golden/traces/ (deterministic text, no randomness).

    python -m tests.golden.make_traces && python -m tests.golden.record_traces
    (traces_tiny/, on the tiny hybrid and recurrent models: tests/golden/make_tiny_traces.py)

Follow-up prompts are built from fixed text, never from generated text, so a request's decisions do
not depend on what the model wrote earlier (generation can differ slightly between batch shapes)."""

from __future__ import annotations

import json
from pathlib import Path

DIR = Path(__file__).with_name("traces")
SWA = ["--swa-full"]  # isolate the scheduler and the cache from checkpoints (see the issue)

TOPICS = ["rivers", "lighthouses", "volcanoes", "bread baking", "chess openings", "tidal pools", "glaciers",
          "beekeeping", "radio astronomy", "origami", "sourdough", "caves"]


def doc(topic: str, n_sentences: int, seed: int = 0) -> str:
    """A deterministic paragraph about `topic` (about 12 tokens a sentence)."""
    return " ".join(f"Note {seed}.{i} on {topic}: item {i * 7 + seed} is filed under shelf {i % 5} for later." for i in range(n_sentences))


def chat(system: str, turns: list[tuple[str, str]], user: str) -> str:
    s = f"System: {system}\n"
    for u, a in turns:
        s += f"User: {u}\nAssistant: {a}\n"
    return s + f"User: {user}\nAssistant:"


def req(prompt: str, n_predict: int = 4, **kw) -> dict:
    return {"prompt": prompt, "n_predict": n_predict, **kw}


def traces() -> dict[str, dict]:
    t: dict[str, dict] = {}
    sys_a = "You are a concise travel assistant. " + doc("travel", 3)
    sys_b = "You are a helpful cooking assistant. " + doc("kitchens", 3)
    a1, a2, a3 = "Where should I go in May?", "Is Lisbon too hot then?", "What about Porto instead?"
    b1, b2 = "How do I proof bread?", "And at high altitude?"
    # 1. interleaved multi-user chats on the server defaults (4 slots, unified, 8 GiB cache)
    t["multi_user_chat"] = {"flags": ["-c", "8192", *SWA], "requests": [
        req(chat(sys_a, [], a1), 6),
        req(chat(sys_b, [], b1), 6),
        req(chat(sys_a, [(a1, "Portugal.")], a2), 6),
        req("Translate to French: the cat sleeps on the warm windowsill.", 4),
        req(chat(sys_b, [(b1, "Let it rise.")], b2), 6),
        req(chat(sys_a, [(a1, "Portugal."), (a2, "It is mild.")], a3), 6),
        req(chat(sys_b, [(b1, "Let it rise."), (b2, "Longer.")], "Thanks!"), 6),
    ]}
    # 2. FIFO eviction by bytes: a 6 MiB cache, ~2.5 MiB entries
    t["cache_ram_fifo_bytes"] = {"flags": ["-np", "1", "-c", "4096", "--cache-ram", "6", *SWA], "requests": [
        req(doc(topic, 7, i), 2) for i, topic in enumerate(TOPICS[:6])] + [req(doc(TOPICS[4], 7, 4) + " More?", 2)]}
    # 3. --cache-ram -1: no byte limit, the total is capped at n_ctx tokens
    t["cache_ram_unlimited_token_cap"] = {"flags": ["-np", "1", "-c", "1024", "--cache-ram", "-1", *SWA], "requests": [
        req(doc(topic, 12, i), 2) for i, topic in enumerate(TOPICS[:7])]}
    # 4. high similarity threshold: a follow-up sharing 60 % no longer picks the slot by LCP
    base = doc("glaciers", 6)
    t["sps_high"] = {"flags": ["-np", "2", "-kvu", "-c", "4096", "-sps", "0.9", *SWA], "requests": [
        req(base, 3), req(base + " " + doc("moraines", 4, 1), 3), req(base + " Summarize.", 3)]}
    # 5. similarity selection off: LRU only, every request saves and loads through the cache
    t["sps_zero"] = {"flags": ["-np", "2", "-kvu", "-c", "4096", "-sps", "0", *SWA], "requests": [
        req(base, 3), req(doc("caves", 5), 3), req(base + " Summarize.", 3), req(doc("caves", 5) + " Why?", 3)]}
    # 6. non-unified KV: idle slots keep their KV, the cache deduplicates repeated saves
    t["non_unified_idle_keep"] = {"flags": ["-np", "2", "-c", "4096", *SWA], "requests": [
        req(doc("beekeeping", 5), 3), req(doc("origami", 5), 3), req(doc("beekeeping", 5) + " Next?", 3),
        req(doc("sourdough", 5), 3), req(doc("origami", 5) + " Fold?", 3)]}
    # 7. id_slot: an empty requested slot (f_keep = 0/0 = NaN: no cache load), a wrapped id, a busy slot
    t["id_slot"] = {"flags": ["-np", "2", "-kvu", "-c", "4096", *SWA], "requests": [
        req(doc("rivers", 5), 3),
        req(doc("rivers", 5) + " More?", 3, id_slot=0),
        req(doc("volcanoes", 5), 3, id_slot=-1),
        req(doc("volcanoes", 5) + " Why?", 3, id_slot=3),
        req(doc("tidal pools", 5), 24, wait=False),
        req(doc("tidal pools", 5) + " Where?", 3, id_slot=0),  # slot 0 is busy: saved, then deferred
    ]}
    # 8/9. the sequential two-axis rule is order dependent (spec appendix B): A (80 tok, lcp 60) and
    # B (300 tok, lcp 90) for a new 100-token prompt; which one loads depends on which was cached first
    new = doc("chess openings", 9)
    a = doc("chess openings", 5) + " " + doc("zz", 2, 9)
    b = doc("chess openings", 8) + " " + doc("endgames", 20, 3)
    filler = doc("unrelated weather", 3)
    flags_b = ["-np", "2", "-kvu", "-c", "4096", "-sps", "0", *SWA]
    t["two_axis_order_ab"] = {"flags": flags_b, "requests": [req(a, 1), req(b, 1), req(filler, 1), req(new, 2)]}
    t["two_axis_order_ba"] = {"flags": flags_b, "requests": [req(b, 1), req(a, 1), req(filler, 1), req(new, 2)]}
    # 10/11. idle-slot caching on (default) and off
    reqs = [req(doc("radio astronomy", 6), 3), req(doc("caves", 6), 3), req(doc("radio astronomy", 6) + " Next?", 3),
            req(doc("glaciers", 6), 3), req(doc("caves", 6) + " Deeper?", 3)]
    t["idle_slots_default"] = {"flags": ["-np", "3", "-kvu", "-c", "4096", *SWA], "requests": reqs}
    t["idle_slots_off"] = {"flags": ["-np", "3", "-kvu", "-c", "4096", "--no-cache-idle-slots", *SWA], "requests": reqs}
    # 12. KV pressure in a unified pool: the idle slot is purged so the new prompt fits
    t["kv_pressure_purge"] = {"flags": ["-np", "2", "-kvu", "-c", "1024", "--no-cache-idle-slots", "-b", "512", *SWA],
                              "requests": [req(doc("volcanoes", 40), 2), req(doc("beekeeping", 26), 2),
                                           req(doc("volcanoes", 40) + " Again?", 2)]}
    # 13. concurrency with "wait": false: the third request is deferred until a slot is released
    t["concurrent_deferred"] = {"flags": ["-np", "2", "-kvu", "-c", "4096", *SWA], "requests": [
        req(doc("sourdough", 4), 16, wait=False), req(doc("glaciers", 4), 16, wait=False),
        req(doc("sourdough", 4) + " Crumb?", 3), req(doc("glaciers", 4) + " Melt?", 3)]}
    # 13b. a unified pool two slots outgrow together: the second prompt finds no free cells, no slot is
    # idle to purge, the batch halves down to 1 and the fatal "Context size has been exceeded." takes
    # every processing slot with it (spec 6.3); then a short request on the emptied pool
    t["kv_unified_pool_full"] = {"flags": ["-np", "2", "-kvu", "-c", "1024", "-b", "512", *SWA], "requests": [
        req(doc("volcanoes", 25), 24, wait=False), req(doc("beekeeping", 25), 24, wait=False),
        req(doc("glaciers", 4), 3)]}
    # 13c. --kv-unified-per-slot without -c: the pool is sized n_parallel x N (2 x 1024) and each slot
    # capped at N, so a prompt longer than N is refused though the pool could hold it
    t["kv_unified_per_slot"] = {"flags": ["-np", "2", "-kvu", "--kv-unified-per-slot", "1024", *SWA], "requests": [
        req(doc("rivers", 100), 2), req(doc("rivers", 40), 2), req(doc("caves", 40), 2)]}
    # 14. bad input: a prompt longer than the slot context, then a normal request
    t["prompt_too_long"] = {"flags": ["-np", "2", "-c", "1024", *SWA], "requests": [
        req(doc("rivers", 60), 2), req(doc("rivers", 3), 2)]}
    # default flags (no --swa-full): Gemma 3's sliding window makes context checkpoints decide n_past
    t["defaults_chat_checkpoints"] = {"flags": ["-c", "8192"], "requests": [
        req(chat(sys_a, [], a1) + " " + doc("itineraries", 30), 6),
        req(chat(sys_a, [(a1 + " " + doc("itineraries", 30), "Portugal.")], a2), 6),
        req(chat(sys_a, [(a1 + " " + doc("itineraries", 30), "Portugal."), (a2, "Mild.")], a3), 6),
        req(chat(sys_a, [], a1) + " " + doc("itineraries", 12), 6),
        req(doc("glaciers", 40), 4),
        req(chat(sys_a, [(a1 + " " + doc("itineraries", 30), "Portugal.")], "Any festivals?"), 6),
    ]}
    t["defaults_single_slot_checkpoints"] = {"flags": ["-np", "1", "-c", "4096", "-ub", "128", "-b", "256"], "requests": [
        req(doc("caves", 40), 3), req(doc("caves", 40) + " Deeper?", 3), req(doc("caves", 20) + " Shorter?", 3),
        req(doc("caves", 30), 3), req(doc("caves", 2), 3)]}
    t.update(checkpoint_and_file_traces())
    return t


GEMMA_DELIMS = [{"role": "user", "delimiter": "<start_of_turn>user\n"},
                {"role": "assistant", "delimiter": "<start_of_turn>model\n"}]


def gemma_chat(turns: list[tuple[str, str]], user: str) -> str:
    s = "<start_of_turn>user\nYou are a careful archivist.<end_of_turn>\n<start_of_turn>model\nReady.<end_of_turn>\n"
    for u, a in turns:
        s += f"<start_of_turn>user\n{u}<end_of_turn>\n<start_of_turn>model\n{a}<end_of_turn>\n"
    return s + f"<start_of_turn>user\n{user}<end_of_turn>\n<start_of_turn>model\n"


def checkpoint_and_file_traces() -> dict[str, dict]:
    t: dict[str, dict] = {}
    long = doc("harbours", 48)  # ~1000 tokens: longer than the 512-token window
    # SWA checkpoints: follow-ups diverging near the end (inside the window) and early (outside it)
    t["swa_checkpoints_diverge"] = {"flags": ["-np", "1", "-c", "4096"], "requests": [
        req(long, 3),
        req(long + " Where is the nearest one?", 3),          # extends the prompt
        req(doc("harbours", 46) + " Stop here.", 3),           # diverges ~40 tokens before the end
        req(doc("harbours", 10) + " Start over.", 3),          # diverges far outside the window
        req(doc("harbours", 10) + " Start over. Again.", 3),
    ]}
    # checkpoints at user-message starts from message_delimiters (a Gemma chat)
    turns = [(doc(f"ledger {i}", 8, i), f"Filed {i}.") for i in range(4)]
    t["checkpoints_message_spans"] = {"flags": ["-np", "1", "-c", "8192", "-cms", "128"], "requests": [
        req(gemma_chat(turns[:2], "Summarize."), 3, message_delimiters=GEMMA_DELIMS),
        req(gemma_chat(turns[:3], "Summarize again."), 3, message_delimiters=GEMMA_DELIMS),
        req(gemma_chat(turns[:4], "And now?"), 3, message_delimiters=GEMMA_DELIMS),
        req(gemma_chat(turns[:2], "Go back."), 3, message_delimiters=GEMMA_DELIMS),
    ]}
    # --ctx-checkpoints small enough to evict (FIFO and too-close rules)
    t["ctx_checkpoints_evict"] = {"flags": ["-np", "1", "-c", "8192", "--ctx-checkpoints", "2", "-cms", "64"], "requests": [
        req(gemma_chat(turns[:1], "One."), 3, message_delimiters=GEMMA_DELIMS),
        req(gemma_chat(turns[:2], "Two."), 3, message_delimiters=GEMMA_DELIMS),
        req(gemma_chat(turns[:3], "Three."), 3, message_delimiters=GEMMA_DELIMS),
        req(gemma_chat(turns[:4], "Four."), 3, message_delimiters=GEMMA_DELIMS),
        req(gemma_chat(turns[:1], "Back to one."), 3, message_delimiters=GEMMA_DELIMS),
    ]}
    a, b, c = doc("alpha", 6, 1), doc("bravo", 6, 2), doc("charlie", 6, 3)
    # --cache-reuse with --swa-full: a middle chunk deleted, one inserted, and a request turning it off
    t["cache_reuse_delete_middle"] = {"flags": ["-np", "1", "-c", "4096", "--swa-full", "--cache-reuse", "16"],
                                      "requests": [req(f"{a} {b} {c}", 3), req(f"{a} {c}", 3)]}
    t["cache_reuse_insert"] = {"flags": ["-np", "1", "-c", "4096", "--swa-full", "--cache-reuse", "16"],
                               "requests": [req(f"{a} {c}", 3), req(f"{a} {b} {c}", 3)]}
    t["cache_reuse_request_off"] = {"flags": ["-np", "1", "-c", "4096", "--swa-full", "--cache-reuse", "16"],
                                    "requests": [req(f"{a} {b} {c}", 3), req(f"{a} {c}", 3, n_cache_reuse=0),
                                                 req(f"{a} {b} {c}", 3), req(f"{a} {c} {b}", 3, n_cache_reuse=8)]}
    # --cache-reuse without --swa-full: not supported on Gemma 3's SWA memory (warning, no shift)
    t["cache_reuse_without_swa_full"] = {"flags": ["-np", "1", "-c", "4096", "--cache-reuse", "16"],
                                         "requests": [req(f"{a} {b} {c}", 3), req(f"{a} {c}", 3, n_cache_reuse=16)]}
    # slot files: save -> erase -> restore -> reuse, restore into the other slot, bad names, missing file
    p1, p2 = doc("orchards", 5), doc("quarries", 5)
    t["slot_files"] = {"flags": ["-np", "2", "-c", "4096", "--swa-full"], "keep_files": ["orchards.bin"], "requests": [
        req(p1, 3, id_slot=0),
        {"action": "save", "id_slot": 0, "filename": "orchards.bin"},
        {"action": "erase", "id_slot": 0},
        {"action": "restore", "id_slot": 0, "filename": "orchards.bin"},
        req(p1 + " Which apples?", 3, id_slot=0),
        {"action": "restore", "id_slot": 1, "filename": "orchards.bin"},
        req(p1 + " Which pears?", 3, id_slot=1),
        req(p2, 3, id_slot=1),
        {"action": "save", "id_slot": 3, "filename": "wrapped.bin"},
        {"action": "save", "id_slot": 0, "filename": "../x"},
        {"action": "save", "id_slot": 0, "filename": ""},
        {"action": "save", "id_slot": 0, "filename": "a:b.bin"},
        {"action": "restore", "id_slot": 0, "filename": "missing.bin"},
        {"action": "erase", "id_slot": 0},
        {"action": "restore", "id_slot": 1, "filename": "other_layout.bin"},
        req(p2 + " Deep?", 3, id_slot=1),
    ], "files": {"other_layout.bin": "../data/unified_np2.bin"}}
    # slot actions among id_slot traffic (issue 20): what follows a save, an erase, a restore, and
    # failed restores (a missing file, a damaged body, a file that is no slot file) in an empty and in a
    # full slot; unified KV so a restored slot competes in LCP selection and is saved as an idle slot
    p3, p4 = doc("windmills", 6), doc("canals", 5)
    t["slot_actions"] = {"flags": ["-np", "2", "-kvu", "-c", "4096", "--swa-full"], "requests": [
        req(p3, 3, id_slot=0),
        {"action": "save", "id_slot": 0, "filename": "windmills.bin"},
        req(p4, 3, id_slot=0),                                  # slot 0 changes hands: its prompt goes to RAM
        {"action": "erase", "id_slot": 0},
        {"action": "restore", "id_slot": 1, "filename": "windmills.bin"},
        req(p3 + " Which sails?", 3),                           # LCP selection finds the restored slot 1
        {"action": "restore", "id_slot": 0, "filename": "missing.bin"},
        {"action": "restore", "id_slot": 0, "filename": "damaged.bin"},
        {"action": "restore", "id_slot": 0, "filename": "windmills.bin"},
        req(p3 + " Which mills?", 3, id_slot=0),
        {"action": "erase", "id_slot": 1},
        {"action": "save", "id_slot": 1, "filename": "empty.bin"},  # an empty slot saves too
        {"action": "restore", "id_slot": 1, "filename": "windmills.bin"},
        req(p4 + " Locks?", 3, id_slot=0),                      # the restored slot 1 goes to RAM as idle
        {"action": "restore", "id_slot": 0, "filename": "not_a_slot.bin"},  # a full slot: cleared, 400
        {"action": "erase", "id_slot": 0},
        req(p3 + " Which sails?", 3),
        {"action": "save", "id_slot": 3, "filename": "wrapped.bin"},  # id 3 of 2 slots
        {"action": "restore", "id_slot": 0, "filename": "wrapped.bin"},
        req(p3 + " Which sails? Again.", 3, id_slot=0),
    ], "files": {"damaged.bin": "../data/damaged.bin", "not_a_slot.bin": "../data/not_a_slot.bin"}}
    # a slot file written by slotlab, with its SCKP appendix, restored by the real server
    def restored(name: str, data: str) -> dict:
        """A file saved elsewhere from the lighthouses prompt, restored into both slots, each continued."""
        return {"flags": ["-np", "2", "-c", "4096"], "requests": [
            {"action": "restore", "id_slot": 0, "filename": name},
            req(doc("lighthouses", 3) + " Which coast?", 3, id_slot=0),
            {"action": "restore", "id_slot": 1, "filename": name},
            req(doc("lighthouses", 2) + " Shorter.", 3, id_slot=1),
        ], "files": {name: f"../data/{data}"}}

    t["slot_file_from_slotlab"] = restored("from_slotlab.bin", "slotlab_sckp.bin")
    # the reverse: a slot file written by the real b11549 server (state version 4, its SCKP appendix),
    # restored by the pin (refused: another state version) and by b11549 (its own)
    t["slot_file_from_b11549"] = restored("from_b11549.bin", "b11549_saved.bin")
    # notebook 07's multi-tenant traffic on the server defaults (SWA): LCP similarity funnels tenants into
    # one slot, and with -sps 0 a RAM-cache load picks another tenant's conversation it cannot use
    system = "You are the support assistant of a bicycle shop. Policies: " + " ".join(
        f"Rule {i}: be kind about item {i}." for i in range(25))

    def convo(u: str, turn: int) -> str:
        past = "".join(f"\nUser {u}: question {k} about my order\nAssistant: answer {k}." for k in range(turn))
        return f"{system}{past}\nUser {u}: question {turn} about my order"

    tenants = [req(convo(u, turn), 4) for turn in range(2) for u in ("Ana", "Ben", "Chen", "Dara")]
    t["multi_tenant_defaults"] = {"flags": ["-c", "8192"], "requests": tenants}
    t["multi_tenant_sps0"] = {"flags": ["-c", "8192", "-sps", "0"], "requests": tenants}
    # a draft model (-md: the same GGUF): RAM-cache entries carry main + draft bytes, restored jointly
    md = ["-md", "{model}", "--spec-type", "draft-simple", "--spec-draft-n-max", "3", "-sps", "0"]
    t["draft_model_cache"] = {"flags": ["-np", "2", "-kvu", "-c", "4096", "--swa-full", *md], "requests": [
        req(doc("comets", 5), 8), req(doc("meteors", 5), 8), req(doc("unrelated", 2), 8),
        req(doc("comets", 5) + " Tails?", 8)]}
    return t


def main() -> None:
    from tests.golden.make_tiny_traces import TINY_DIR, tiny_model_traces

    for d, ts in ((DIR, traces()), (TINY_DIR, tiny_model_traces())):
        d.mkdir(exist_ok=True)
        for name, tr in ts.items():
            (d / f"{name}.json").write_text(json.dumps(tr, indent=1, ensure_ascii=False) + "\n")
            print(name, len(tr["requests"]))


if __name__ == "__main__":
    main()
