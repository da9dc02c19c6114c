"""Notebook 03-save-load: its cells (markdown and code), written by `notebooks/build_notebooks.py 03-save-load`."""

from course.cells import code, md

NAME = "03-save-load"

CELLS = [
    md("""# 03 · Slot save / restore / erase (`--slot-save-path`)

`POST /slots/{id}?action=save|restore|erase` writes a slot's KV state to a file and reads it back.
The file is `llama_state_seq_save_file`'s body: a header, the slot's tokens (packed as
`server_tokens` state), then the sequence state. That is all the stock server writes (spec 5.3):
**no context checkpoints travel with the file.**

> **The lesson of this notebook.** On a memory that cannot be cut back (Gemma 3's sliding window, a
> hybrid or recurrent model), a restored stock slot file gives the next request **`cache_n` 0**: the
> tokens are back, but any cut-back, even of the two last tokens, needs a checkpoint, and the file
> brought none. With slotlab's checkpoint appendix the same follow-up reuses **190** tokens. The
> section "Stock file vs appendix" below shows both, the server's lines for each and the two files.

**slotlab extension, opt-in (`--slot-appendices`):** slotlab can append an `SCKP` checkpoint appendix
(and an `SDFT` draft appendix) after the body; a stock llama-server of the same build restores the
body and ignores them. By default slotlab writes and reads files exactly as the server does. The SCKP
format follows llama.cpp's pull request #26004 ("server : preserve context checkpoints across slot
save/restore"); it is not in the pinned b11312, and b11549 keeps the checkpoints in its own appendix
(section "b11549" below).

**Defaults in this chapter.** The server's: no `--slot-save-path` (every slot action answers 501),
Gemma 3 without `--swa-full` (a restored window cache cannot be cut back without a checkpoint),
`--ctx-checkpoints 32`, `--checkpoint-min-step 8192`. Here: `--slot-save-path` on a temporary
directory, `-np 2 -c 4096`, and slotlab's opt-in `--slot-appendices` on the first engine. Read this
chapter after 06: its lesson is what a file without checkpoints costs."""),
    code("""import tempfile, struct
from pathlib import Path
from slotlab import explain
from slotlab.engine.scheduler import Engine
from slotlab.lab import ask, summary, action, hexdump
from slotlab.figures import slot_file

d = Path(tempfile.mkdtemp())
# default flags + the opt-in appendix
eng = Engine(f"-np 2 -c 4096 --slot-save-path {d} --slot-appendices")
prompt = " ".join(f"Entry {i} of the lighthouse log: fog at dawn, clear by noon."
                  for i in range(12))
r0 = ask(eng, prompt, 3, id_slot=0); print(summary(r0))
status, reply = action(eng, "save", 0, "log.bin"); print(status, reply)
assert (r0["timings"]["cache_n"], r0["timings"]["prompt_n"], r0["tokens_evaluated"],
        r0["tokens_cached"]) == \\
    (0, 195, 195, 197)
assert (status == 200 and reply["n_saved"] == len(eng.slots[0].tokens) == 197
        and reply["n_written"] == 3637120)"""),
    md("""## The file, byte by byte
The magic is `LLAMA_STATE_SEQ_MAGIC` = `0x67677371`, which `llama.h` calls 'ggsq': read as a number,
most significant byte first, its four bytes are the ASCII codes of `g g s q` (0x67 0x67 0x73 0x71).
The file stores it little-endian, least significant byte first, so the dump shows `71 73 67 67`, "qsgg".
Then the version, 3 (`LLAMA_STATE_SEQ_VERSION`, llama.h:49; the reference llama-server is built from the
same tree, so its slot files and slotlab's load in either, spec 11.1), the number of 32-bit words of the
token payload, and
the payload: marker -1 (`ff ff ff ff`), version 1, the token count, the tokens, a media count of 0.
The sequence state follows. After it comes slotlab's SCKP appendix, whose magic `0x504b4353` was
chosen the other way round: stored little-endian, it reads "SCKP" in the dump.

The save's `n_written` is the body: what `llama_state_seq_save_file` returns (its `file.tell()` after
the state). The file is longer by the appendix; a stock server, which writes none, reports its file's
size."""),
    code("""raw = (d / "log.bin").read_bytes()
print(hexdump(raw, 0, 32))
magic, version, n_words = struct.unpack_from("<III", raw)
print(f"magic 0x{magic:08x} = {magic.to_bytes(4, 'big')} as a number, {raw[:4]} on disk; version {version}, "
      f"{n_words} words")
body = reply["n_written"]
print(hexdump(raw, body, 16))
print(f"n_written {body:,} bytes; the file {len(raw):,} bytes = body + {len(raw) - body:,} bytes of appendix")
assert (body, len(raw), len(raw) - body) == (3_637_120, 6_573_612, 2_936_492)   # n_written stops where SCKP starts
assert hexdump(raw, 0, 32).splitlines() == [
    "00000000  71 73 67 67 03 00 00 00 c9 00 00 00 ff ff ff ff  qsgg............",
    "00000010  01 00 00 00 c5 00 00 00 02 00 00 00 74 28 00 00  ............t(.."]
assert magic == 0x67677371 and magic.to_bytes(4, "big") == b"ggsq" and raw[:4] == b"qsgg"
assert version == 3 and n_words == 201 == 3 + 197 + 1        # marker, version, count + 197 tokens + media count
assert hexdump(raw, body, 16) == "00377f80  53 43 4b 50 01 00 00 00 01 00 00 00 bf 00 00 00  SCKP............"
assert struct.unpack_from("<I", raw, body)[0] == 0x504B4353 and raw[body:body + 4] == b"SCKP\""""),
    md("""## Why the appendix is nearly as large as the body
The appendix holds the slot's checkpoints. A checkpoint is a `PARTIAL_ONLY` state: on Gemma 3, only
the **sliding-window layers'** cache (the full-attention layers can always be cut back), for the cells
still inside the window (`n_swa` = 512 on this 270M model). Gemma 3 has 5 sliding-window layers for each full one, and
this 191-token checkpoint is entirely inside the window, so per cell it holds 15 of the body's 18
layers. The body grows with every token of the conversation; a checkpoint is bounded by the window."""),
    code("""from slotlab.memory.profile import ModelProfile, row_size
prof = ModelProfile.from_gguf(eng.model.path)
kv = lambda layers: sum(row_size("f16", prof.n_embd_k_gqa(il)) + row_size("f16",
    prof.n_embd_v_gqa(il)) for il in layers)
ck = eng.slots[0].checkpoints[0]
n_ck = struct.unpack_from("<I", raw, body + 8)[0]
print(f"body:     {body:,} bytes; {len(eng.slots[0].tokens)} cells x {len(prof.layers())} layers x "
      f"{kv([0]):,} bytes of K+V = {len(eng.slots[0].tokens) * kv(prof.layers()):,}")
print(f"appendix: {len(raw) - body:,} bytes; {n_ck} checkpoint, pos {ck.pos_min}..{ck.pos_max}: "
      f"{ck.pos_max - ck.pos_min + 1} cells x {len(prof.layers(swa=True))} SWA layers x "
      f"{kv([0]):,} bytes "
      f"= {(ck.pos_max - ck.pos_min + 1) * kv(prof.layers(swa=True)):,}")
# the rest of each is cell metadata (positions, sequence ids) and per-layer headers
assert body == 3637120 and len(raw) - body == 2936492 and n_ck == len(eng.slots[0].checkpoints) == 1
assert len(prof.layers()) == 18 and len(prof.layers(swa=True)) == 15 and prof.n_swa == 512
assert ((ck.pos_min, ck.pos_max, ck.n_tokens, ck.size()) == (0, 190, 191, 2936440)
        and kv([0]) == 1024)
assert (len(eng.slots[0].tokens) == 197
        and len(eng.slots[0].tokens) * kv(prof.layers()) == 3_631_104 <= body)
assert (ck.pos_max - ck.pos_min + 1) * kv(prof.layers(swa=True)) == 2_933_760 <= ck.size()"""),
    md("""## Erase, restore, and the next request reuses the restored tokens
Erase empties the slot; restore reads the file back (here with the appendix's checkpoint); the follow-up
(the same prompt plus a question) reuses 190 tokens."""),
    code("""erased = action(eng, "erase", 0); print(erased)
restored = action(eng, "restore", 0, "log.bin"); print(restored)
print("checkpoints restored from the appendix:", len(eng.slots[0].checkpoints))
r = ask(eng, prompt + " Any storms?", 3, id_slot=0); print(summary(r))
assert erased == (200, {"id_slot": 0, "n_erased": 197})
assert (restored == (200,
                     {"id_slot": 0, "filename": "log.bin", "n_restored": 197, "n_read": 3637120}))
assert (r["timings"]["cache_n"], r["timings"]["prompt_n"], r["tokens_evaluated"],
        r["tokens_cached"]) == \\
    (190, 8, 198, 200)"""),
    md("""Restoring into **another** slot works the same way (the file names no slot)."""),
    code("""status, rep = action(eng, "restore", 1, "log.bin"); print(status, rep)
r1 = ask(eng, prompt + " Any ships?", 3, id_slot=1); print(summary(r1))
assert status == 200 and (rep["n_restored"], rep["n_read"]) == (197, 3637120)
assert r1["id_slot"] == 1 and (r1["timings"]["cache_n"], r1["timings"]["prompt_n"]) == (190, 8)
assert (r1["tokens_evaluated"], r1["tokens_cached"]) == (198, 200)"""),
    md("""## Stock file vs appendix: `cache_n` 0 against 190
The same save, erase, restore and follow-up, once with the server's own file (no checkpoints) and once
with slotlab's appendix. The follow-up shares 195 tokens with the 197 the slot holds, so the server
must cut the slot back to 195. Its rule (spec 3.5): with `pos_min` >= `max(0, pos_next - n_swa)`
(here `pos_min` 0 >= `max(0, 195 - 512)` = 0) the memory cannot be cut back, and only a checkpoint at
or before the cut can restore a state to continue from.

* **Stock file**: restore brings the tokens and the KV, no checkpoint. The server prints `forcing full
  prompt re-processing due to lack of cache data` and the follow-up re-processes all 198 tokens:
  `cache_n` 0. This is what a llama-server user sees after restoring a slot of Gemma 3, and of any
  hybrid or recurrent model (llama.cpp issues #25913 and #28194).
* **With `--slot-appendices`**: the checkpoint `[0, 190]` comes back with the file; the server
  restores it and continues from 190 (the checkpoint's last token is evaluated again,
  `TAG_CHECKPOINTS_FIX_POS_MIN`): `cache_n` 190. The 5 tokens between 190 and 195 are processed
  again because the checkpoint was taken at 191 tokens, a few before the end of the first prompt
  (where the server places checkpoints: notebook 06).

On the stock server, `--swa-full` (a full-size cache for the SWA layers; the server's `n_swa` becomes 0)
makes this file reusable, at the cost of the window's memory saving, but only because its 197 tokens
all lie inside the 512-token window. A file holds only the last `n_swa` positions of the window layers,
`--swa-full` or not (`state_write` skips the masked cells: notebook 01, *A restored slot keeps only the
window*), so after restoring a longer conversation a cut-back deeper than the window is re-processed
in full even with `--swa-full`, which takes no checkpoints to fall back on. slotlab's own
explanation of each follow-up (the `slotlab:` lines: a live engine, nothing replayed) names the cause
but offers no flag: nothing ran the traffic with one, and only a run says what a flag saves (`slotlab
simulate REC --why` on a recording does; the line says so). It counts `--swa-full` among the changes
that act on it (`Miss.untested`, data), not `--checkpoint-min-step`, which only spaces the checkpoints
taken at user messages (there are none without message delimiters)."""),
    code("""cache_n, prompt_n, bodies, lines, misses = {}, {}, {}, {}, {}
for label, extra, fn in (("stock", "", "stock.bin"),
                         ("appendix", " --slot-appendices", "appendix.bin")):
    # explanations are a view: attached, each miss's cause rides the event stream as request_miss
    e = Engine(f"-np 1 -c 4096 --slot-save-path {d}" + extra, model=eng.model,
               observers=[explain.attach])
    ask(e, prompt, 3)
    bodies[label] = action(e, "save", 0, fn)[1]["n_written"]
    action(e, "erase", 0); action(e, "restore", 0, fn)
    n0 = len(e.events.log)
    t = ask(e, prompt + " Any storms?", 3)["timings"]
    cache_n[label], prompt_n[label] = t["cache_n"], t["prompt_n"]
    ev = e.events.log[n0:]
    lines[label] = [x.message for x in ev
                    if x.kind in ("checkpoint_none", "checkpoint_check", "checkpoint_restored")]
    misses[label] = [x.message for x in ev if x.kind == "request_miss"]
    print(f"{label}: follow-up cache_n {cache_n[label]}, prompt_n {prompt_n[label]}")
    for m in lines[label]:
        print("  server: ", m)
    for m in misses[label]:
        print("  slotlab:", m)
    e.close()
assert cache_n == {"stock": 0, "appendix": 190} and prompt_n == {"stock": 198, "appendix": 8}
assert bodies == {"stock": 3637112, "appendix": 3637112}
assert lines["stock"] == ["forcing full prompt re-processing due to lack of cache data (likely due "
                          "to SWA or "
                          "hybrid/recurrent memory, see "
                          "https://github.com/ggml-org/llama.cpp/pull/13194"
                          "#issuecomment-2868343055)"]
assert lines["appendix"] == ["checking checkpoint with [0, 190] against 0...",
                             "restored context checkpoint (pos_min = 0, pos_max = 190, n_tokens = "
                             "191, "
                             "n_past = 190, size = 2.800 MiB)"]
assert ("195 of 195 reusable tokens lost" in misses["stock"][0]
        and "cut back to 195 (pos_min 0 >= 0)" in misses["stock"][0])
# live: nothing replayed, so no flag is advice
assert misses["stock"][0].endswith(explain.NOT_TESTED)
assert ("5 of 195 reusable tokens lost" in misses["appendix"][0]
        and "ends at 190" in misses["appendix"][0])
# no message delimiters here: -cms cannot act
assert "checkpoint-min-step" not in misses["appendix"][0]"""),
    md("""Both bodies are the same size; the second file carries the checkpoint after it. The two files as the
parser reads them (`slot_file.sections`): header, tokens, state, then the SCKP block and its checkpoint."""),
    code("""secs = {k: slot_file.sections(d / f"{k}.bin", bodies[k]) for k in ("stock", "appendix")}
assert ([(s.kind, s.size) for s in secs["stock"]] == [("header", 12), ("tokens", 804),
    ("state", 3636296)])
assert [(s.kind, s.size) for s in secs["appendix"]] == [("header", 12), ("tokens", 804),
    ("state", 3636296),
                                                         ("SCKP header", 12),
                                                             ("checkpoint", 2936476)]
slot_file.image([(f"stock file (what llama-server writes): follow-up cache_n {cache_n['stock']}",
                  d / "stock.bin", bodies["stock"]),
                 (f"with --slot-appendices: follow-up cache_n {cache_n['appendix']}",
                  d / "appendix.bin", bodies["appendix"])])"""),
    md("""## b11549: the server keeps the checkpoints itself
Newer llama-server builds do what the appendix does: from b11549 (the tree in PyPI's xllamacpp
2026.10.11549; docs/server-behaviour-by-build.md) `handle_slots_save` appends the slot's context
checkpoints to the file and `handle_slots_restore` reads them back, the change pull request #26004
proposed. `--server-build 11549` runs slotlab under that build's rules (its recordings on the real
b11549 server, tests/golden/traces_b11549/, are replayed exactly). The same save, erase, restore and
follow-up with no slotlab option at all:"""),
    code("""e = Engine(f"-np 1 -c 4096 --slot-save-path {d} --server-build 11549", model=eng.model)
ask(e, prompt, 3)
saved = action(e, "save", 0, "b11549.bin")[1]
action(e, "erase", 0)
restored = action(e, "restore", 0, "b11549.bin")[1]
n0 = len(e.events.log)
t = ask(e, prompt + " Any storms?", 3)["timings"]
b_lines = [x.message for x in e.events.log[n0:]
           if x.kind in ("checkpoint_none", "checkpoint_check", "checkpoint_restored")]
print(f"b11549: wrote {saved['n_written']:,} bytes, read {restored['n_read']:,}; "
      f"follow-up cache_n {t['cache_n']}, prompt_n {t['prompt_n']}")
for m in b_lines:
    print("  server: ", m)
e.close()
appendix = [x.size for x in secs["appendix"] if x.kind in ("SCKP header", "checkpoint")]
assert saved["n_written"] == restored["n_read"] == 6_573_600 == bodies["stock"] + sum(appendix)
assert (t["cache_n"], t["prompt_n"]) == (cache_n["appendix"], prompt_n["appendix"]) == (190, 8)
assert b_lines == lines["appendix"] and "n_tokens = 191" in b_lines[1]"""),
    md("""The b11549 file is the stock body plus the checkpoints, 6,573,600 bytes, and the follow-up reuses
the same 190 tokens as slotlab's appendix: what a restored window (or hybrid, or recurrent) slot keeps
across a file is its checkpoints, and a cut-back lands on the last one before it. Two things do not
cross between builds: b11549's library writes sequence state version 4, which the pinned library
refuses (400), and slotlab writes the pin's version 3 body, which b11549 refuses; so a file moves
between a b11312 and a b11549 server neither way (`slotlab simulate --why` prices the upgrade instead:
"upgrade: on this session b11549 would ...")."""),
    md("""The live panel's picture of the main engine after the two follow-ups: in each slot the first 190
tokens came back through the restored checkpoint ("checkpoint"), the rest was prefilled or generated;
the second plot shows each slot's checkpoints against the SWA window."""),
    code("""from slotlab.panel.static import panel_image
assert [len(s.tokens) for s in eng.slots] == [200, 200]
panel_image(eng)"""),
    md("""## Failure modes, with the server's texts
Invalid names are refused before anything is touched. A restore that fails (below: a missing file,
and a file cut in the middle of its state) **empties the slot**: the server clears the slot's tokens,
KV and checkpoints and answers 400 (spec 5.4 step 6), so what the slot held is lost and the next
request on that slot starts from nothing. Restore into a slot whose cache you do not mind losing. A
file saved with another memory layout (a unified KV cache, `-kvu`) is refused the same way."""),
    code("""for name in ("../escape.bin", "a:b", ""):
    print("save", repr(name), *action(eng, "save", 0, name))
assert len(eng.slots[0].tokens) == 200                    # refused before the slot was touched
(d / "cut.bin").write_bytes(raw[: body // 2])
for slot, name in ((0, "missing.bin"), (1, "cut.bin")):
    held = len(eng.slots[slot].tokens)
    status, rep = action(eng, "restore", slot, name)
    print(f"restore {name!r} into slot {slot}: {status} {rep['error']['message']!r}; "
          f"the slot held {held} tokens, now {len(eng.slots[slot].tokens)}")
    assert (held == 200 and status == 400 and len(eng.slots[slot].tokens) == 0
            and not eng.slots[slot].checkpoints)
    assert (rep["error"]["message"] == "Unable to restore slot: No available space in KV cache or "
            "invalid slot save file")
# unified: another layout
other = Engine(f"-np 2 -kvu -c 4096 --slot-save-path {d}", model=eng.model)
status, rep = action(other, "restore", 0, "log.bin"); print("other layout:", status, rep)
assert status == 400
other.close()"""),
    md("""## Try this
1. Start the stock engine with `--swa-full`: the stock file is enough here (197 tokens, all inside the
   window). Then save a prompt of 1,000 tokens, restore it and cut back 600: re-processed in full.
2. Save a slot, generate more in it, then restore: what happens to the tokens generated after the save?
3. Truncate the file inside the appendix instead of the body: the restore succeeds, without checkpoints.

Next in the reading order: [07 · Tune your server](07-tune-your-server.ipynb)."""),
]
