"""Write the slot files some golden traces restore: made by slotlab, restored by the real server.

    python -m tests.golden.make_slot_files [--b11549]
- data/unified_np2.bin: from a unified 2-slot context (a non-unified server must refuse it);
- data/slotlab_sckp.bin: from a default-flag 2-slot context, with slotlab's SCKP checkpoint appendix
  (--slot-appendices, an opt-in extension)
  after the standard body (a stock server restores the body and ignores the appendix);
- data/damaged.bin: a slot file's header (magic, state version 3, 4 tokens) over a body no memory can
  read (one stream of 2**24 cells): the server reads the tokens, then fails to restore the state;
- data/not_a_slot.bin: a text file (wrong magic: refused before any token is read);
- data/b11549_saved.bin (`--b11549`, with `make llama-server-b11549`): the lighthouses prompt saved by the
  real b11549 server (state version 4, its checkpoint appendix): the pin and slotlab refuse it.
The last two hold no model data, so they fail the same way on every model (golden `slot_actions`)."""

from __future__ import annotations

import struct
import sys
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


def make_b11549(flags: list[str], prompt: str, out: Path) -> None:
    """The same as `make`, written by the real b11549 server (make llama-server-b11549): its state
    version 4 and its SCKP checkpoint appendix."""
    from bench.build_llama_server import server_binary
    from slotlab.llama.model import default_model_path
    from tests.golden.llama_server import LlamaServer

    binary = server_binary("b11549")
    if binary is None:
        raise SystemExit("llama-server b11549 is not built: make llama-server-b11549")
    with tempfile.TemporaryDirectory() as d, \
            LlamaServer(default_model_path(), [*flags, "--slot-save-path", d], command=[str(binary)]) as srv:
        st, body = srv.post("/completion", {"prompt": prompt, "n_predict": 2, "id_slot": 0, "temperature": 0})
        assert st == 200, body
        st, rep = srv.post("/slots/0?action=save", {"filename": "x.bin"})
        assert st == 200, rep
        out.write_bytes((Path(d) / "x.bin").read_bytes())
        print(out.name, out.stat().st_size, "bytes (b11549); n_written", rep["n_written"])


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
    if "--b11549" in sys.argv:  # needs the b11549 server
        make_b11549(["-np", "2", "-c", "4096"], doc("lighthouses", 3), DATA / "b11549_saved.bin")


if __name__ == "__main__":
    main()
