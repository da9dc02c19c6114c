"""Write the slot files some golden traces restore: made by slotlab, restored by the real server.

    python -m tests.golden.make_slot_files
- data/unified_np2.bin: from a unified 2-slot context (a non-unified server must refuse it);
- data/slotlab_sckp.bin: from a default-flag 2-slot context, with slotlab's SCKP checkpoint appendix
  (--slot-appendices, an opt-in extension)
  after the standard body (a stock server restores the body and ignores the appendix);
- data/damaged.bin: a slot file's header (magic, state version 3, 4 tokens) over a body no memory can
  read (one stream of 2**24 cells): the server reads the tokens, then fails to restore the state;
- data/not_a_slot.bin: a text file (wrong magic: refused before any token is read).
The last two hold no model data, so they fail the same way on every model (golden `slot_actions`)."""

from __future__ import annotations

import struct
import tempfile
from pathlib import Path

from slotlab.engine.scheduler import Engine
from tests.golden.make_traces import doc

DATA = Path(__file__).with_name("data")


def make(flags: list[str], prompt: str, out: Path) -> None:
    with tempfile.TemporaryDirectory() as d:
        e = Engine([*flags, "--slot-save-path", d])
        t = e.submit(prompt, n_predict=2, id_slot=0)
        e.run_until_idle()
        s = e.slot_action("save", 0, "x.bin")
        e.run_until_idle()
        assert t.result and s.result, (t.error, s.error)
        out.write_bytes((Path(d) / "x.bin").read_bytes())
        print(out.name, out.stat().st_size, "bytes; body", s.result["n_written"], "checkpoints", len(e.slots[0].checkpoints))
        e.close()


def damaged(out: Path) -> None:
    """A header the server accepts (magic 'ggsq', version 3, 4 tokens) and a body it cannot restore."""
    tokens = [2, 10, 20, 30]
    body = struct.pack("<II", 1, 1 << 24) + bytes(56)  # n_stream 1, then more cells than any cache holds
    out.write_bytes(struct.pack("<III", 0x67677371, 3, len(tokens)) + struct.pack(f"<{len(tokens)}i", *tokens) + body)


def main() -> None:
    DATA.mkdir(exist_ok=True)
    damaged(DATA / "damaged.bin")
    (DATA / "not_a_slot.bin").write_bytes(b"this is not a llama.cpp slot file\n")
    make(["-np", "2", "-kvu", "-c", "4096", "--swa-full"], doc("rivers", 1), DATA / "unified_np2.bin")
    make(["-np", "2", "-c", "4096", "--slot-appendices"], doc("lighthouses", 3), DATA / "slotlab_sckp.bin")


if __name__ == "__main__":
    main()
