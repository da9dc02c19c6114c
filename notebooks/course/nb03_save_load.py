"""Notebook 03-save-load: its cells (markdown and code), written by `notebooks/build_notebooks.py 03-save-load`."""

from course.cells import code, md

NAME = "03-save-load"

CELLS = [
    md("""# 03 · Slot save / restore / erase (`--slot-save-path`)

`POST /slots/{id}?action=save|restore|erase` writes a slot's KV state to a file and reads it back.
The file is `llama_state_seq_save_file`'s body: a header, the slot's tokens (packed as
`server_tokens` state), then the sequence state. That is all the stock server writes: **no context
checkpoints travel with the file.** On a memory that cannot be cut back (Gemma 3's sliding window, a
hybrid or recurrent model) the next request after a restore then re-processes everything, because
any cut-back needs a checkpoint (section "Stock file vs appendix" below).

**slotlab extension, opt-in (`--slot-appendices`):** slotlab can append an `SCKP` checkpoint appendix
(and an `SDFT` draft appendix) after the body; a stock llama-server of the same build restores the
body and ignores them. By default slotlab writes and reads files exactly as the server does."""),
    code("""import tempfile, struct
from pathlib import Path
from slotlab.engine.scheduler import Engine
from slotlab.lab import ask, summary, action, hexdump

d = Path(tempfile.mkdtemp())
eng = Engine(f"-np 2 -c 4096 --slot-save-path {d} --slot-appendices")   # default flags + the opt-in appendix
prompt = " ".join(f"Entry {i} of the lighthouse log: fog at dawn, clear by noon." for i in range(12))
print(summary(ask(eng, prompt, 3, id_slot=0)))
status, reply = action(eng, "save", 0, "log.bin"); print(status, reply)
assert status == 200 and reply["n_saved"] == len(eng.slots[0].tokens)"""),
    md("""## The file, byte by byte
Magic 0x67677371 (`LLAMA_STATE_SEQ_MAGIC`, "ggsq"; written little-endian, so the dump shows the bytes
`71 73 67 67`, "qsgg"), version 3, the number of 32-bit words, then the packed tokens: marker -1,
version 1, the token count, the tokens, a media count of 0. The state follows; after it, the SCKP
appendix (magic 0x504b4353, "SCKP" read the same way round)."""),
    code("""raw = (d / "log.bin").read_bytes()
print(hexdump(raw, 0, 48))
magic, version, n_words = struct.unpack_from("<III", raw)
print(f"magic {magic:08x}, version {version}, {n_words} words")
body = reply["n_written"]
print(f"body {body} bytes, appendix {len(raw) - body} bytes")
print(hexdump(raw, body, 16))
assert raw[:4] == b"qsgg" and magic == 0x67677371 and struct.unpack_from("<I", raw, body)[0] == 0x504B4353
n_ck = struct.unpack_from("<I", raw, body + 8)[0]
print(f"{n_ck} checkpoint(s) in the appendix: {len(raw) - body} bytes beside a {body}-byte body")
assert n_ck == len(eng.slots[0].checkpoints) >= 1"""),
    md("""The appendix is large next to the body because each checkpoint holds the sliding window's
KV (up to 512 cells of every SWA layer), while the body holds only the cells of this short prompt."""),
    md("""## Erase, restore, and the next request reuses the restored tokens"""),
    code("""print(action(eng, "erase", 0))
print(action(eng, "restore", 0, "log.bin"))
print("checkpoints restored from the appendix:", len(eng.slots[0].checkpoints))
r = ask(eng, prompt + " Any storms?", 3, id_slot=0); print(summary(r))
assert r["timings"]["cache_n"] > 0"""),
    md("""Restoring into **another** slot works the same way (the file names no slot)."""),
    code("""print(action(eng, "restore", 1, "log.bin"))
r1 = ask(eng, prompt + " Any ships?", 3, id_slot=1); print(summary(r1))
assert r1["id_slot"] == 1 and r1["timings"]["cache_n"] > 0"""),
    md("""## Stock file vs appendix: the lesson for SWA, hybrid and recurrent models
The same save, erase, restore and follow-up, once with the server's own file (no checkpoints) and once
with slotlab's appendix. Without a checkpoint the restored slot's memory cannot be cut back to the
common prefix (`pos_min` >= `max(0, pos_next - n_swa)`), so the stock server re-processes the whole
prompt: `cache_n` 0. This is what llama.cpp issue #26676 reports on hybrid models."""),
    code("""cache_n = {}
for label, extra in (("stock file", ""), ("with --slot-appendices", " --slot-appendices")):
    e = Engine(f"-np 1 -c 4096 --slot-save-path {d}" + extra, model=eng.model)
    ask(e, prompt, 3)
    action(e, "save", 0, "cmp.bin"); action(e, "erase", 0); action(e, "restore", 0, "cmp.bin")
    cache_n[label] = ask(e, prompt + " Any storms?", 3)["timings"]["cache_n"]
    e.close()
print(cache_n)
assert cache_n["stock file"] == 0 and cache_n["with --slot-appendices"] > 100"""),
    md("""## Failure modes, with the server's texts
A failed restore leaves the slot **empty** (the server clears it), so the next request on that slot
starts from nothing."""),
    code("""for act, slot, name in [("save", 0, "../escape.bin"), ("save", 0, "a:b"), ("save", 0, ""),
                        ("restore", 0, "missing.bin")]:
    print(act, repr(name), *action(eng, act, slot, name))
(d / "cut.bin").write_bytes(raw[: body // 2])
status, rep = action(eng, "restore", 0, "cut.bin"); print("truncated:", status, rep)
print("slot 0 after a failed restore:", len(eng.slots[0].tokens), "tokens")
assert status == 400 and len(eng.slots[0].tokens) == 0
other = Engine(f"-np 2 -kvu -c 4096 --slot-save-path {d}", model=eng.model)   # unified: another layout
status, rep = action(other, "restore", 0, "log.bin"); print("other layout:", status, rep)
assert status == 400"""),
    md("""## Try this
1. Start the engine with `--swa-full`: the memory can be cut back, and the stock file is enough.
2. Save a slot, generate more in it, then restore: what happens to the tokens generated after the save?
3. Truncate the file inside the appendix instead of the body: the restore succeeds, without checkpoints."""),
]
