"""Write the slot files some golden traces restore: made by slotlab, restored by the real server.

    python -m tests.golden.make_slot_files
- data/unified_np2.bin: from a unified 2-slot context (a non-unified server must refuse it);
- data/slotlab_sckp.bin: from a default-flag 2-slot context, with slotlab's SCKP checkpoint appendix
  (--slot-appendices, an opt-in extension)
  after the standard body (a stock server restores the body and ignores the appendix)."""

from __future__ import annotations

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


def main() -> None:
    DATA.mkdir(exist_ok=True)
    make(["-np", "2", "-kvu", "-c", "4096", "--swa-full"], doc("rivers", 1), DATA / "unified_np2.bin")
    make(["-np", "2", "-c", "4096", "--slot-appendices"], doc("lighthouses", 3), DATA / "slotlab_sckp.bin")


if __name__ == "__main__":
    main()
