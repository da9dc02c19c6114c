"""Copy llama.cpp's own HTTP server tests (`tools/server/tests`) and the chat templates they load
(`models/templates`, by the relative path `../../../models/templates`) from the llama.cpp that
llama-cpp-python==0.3.36 vendors into `tests/llamacpp/vendor/`, unmodified and in llama.cpp's own
layout, with llama.cpp's MIT LICENSE.

Why a copy in the repo: CI has no llama.cpp source tree unless `make llama-server` ran, and the tests
must be byte-for-byte the pinned ones (the runner patches only the model presets, at run time, in a
scratch copy). Re-run after a llama-cpp-python bump:

    python -m tests.llamacpp.vendor_server_tests     (fetches the sdist through bench.build_llama_server)"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from bench.build_llama_server import PIN, source_dir

VENDOR = Path(__file__).with_name("vendor")
# what the tests read, relative to the llama.cpp root
PARTS = ["tools/server/tests", "models/templates"]


def main() -> int:
    tree = source_dir()
    if VENDOR.exists():
        shutil.rmtree(VENDOR)
    for part in PARTS:
        shutil.copytree(tree / part, VENDOR / part,
                        ignore=shutil.ignore_patterns("__pycache__", "tmp", ".pytest_cache"))
    shutil.copy(tree / "LICENSE", VENDOR / "LICENSE")
    (VENDOR / "VENDORED.md").write_text(
        f"From the llama.cpp vendored by the PyPI sdist llama-cpp-python=={PIN} (`vendor/llama.cpp`), "
        f"unmodified, in llama.cpp's layout:\n" + "".join(f"- `{p}`\n" for p in PARTS) +
        "\nMIT licensed: see LICENSE. Refreshed by `python -m tests.llamacpp.vendor_server_tests`; "
        "run by `python -m tests.llamacpp.run_server_tests`.\n")
    n = sum(1 for p in VENDOR.rglob("*") if p.is_file())
    print(f"copied {', '.join(PARTS)} from {tree} -> {VENDOR} ({n} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
