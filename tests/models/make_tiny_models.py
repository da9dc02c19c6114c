"""Tiny random-weight hybrid and recurrent models for the tests, written by llama.cpp's own model saver.

    python -m tests.models.make_tiny_models [--force] [--extra]     # (or `make tiny-models`)

llama.cpp's `test-llama-archs -a ARCH -o DIR -s SEED` builds a small model of any architecture it
supports (2 layers, n_embd 256, a 128-token test vocabulary, n_ctx_train 256) with weights drawn
from a fixed seed, and saves it as GGUF. The outputs are meaningless; the memory (KV cells,
recurrent state, checkpoints) is the real architecture's, which is what slotlab's decisions depend on.

This script builds `test-llama-archs` from the llama.cpp vendored by llama-cpp-python 0.3.36 in a
build directory of its own (build/llama-tests: the server build in build/llama-server stays as it
is), then writes the models listed in MODELS into tests/models/. It is idempotent: a model whose file
exists with the recorded SHA-256 is left alone, and the tool is only built when a model is missing.
The tests need none of this: the models are committed."""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.build_llama_server import ROOT, source_dir

DIR = Path(__file__).resolve().parent
BUILD = Path(os.environ.get("SLOTLAB_TESTS_BUILD", ROOT / "build" / "llama-tests"))
TOOL = BUILD / "bin" / "test-llama-archs"
SEED = 42  # weights: mt19937(seed ^ hash(tensor name)) per tensor, stdev 0.1

# file name -> (architecture, the saver's output name, SHA-256 of the file as generated here).
# qwen35: hybrid (attention + gated delta-net recurrent layers); mamba2: pure recurrent.
MODELS = {
    "qwen35-tiny.gguf": ("qwen35", "qwen35-dense.gguf", "1fb1c000022f4274aa599b52d558c0f8166b2a995b78f945cf032b197593fba2"),
    "mamba2-tiny.gguf": ("mamba2", "mamba2-dense.gguf", "33bd63b398a5cb492917425723101ebf7374a270f32a2d8bc11f733a9ed71926"),
}
# more architectures of the same kind, written only with --extra (not committed, no test uses them)
EXTRA = {
    "lfm2-tiny.gguf": ("lfm2", "lfm2-dense.gguf", None),  # hybrid: attention + short convolutions
    "granitehybrid-tiny.gguf": ("granitehybrid", "granitehybrid-dense.gguf", None),  # hybrid: attention + mamba2
}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def build_tool() -> Path:
    if TOOL.exists():
        return TOOL
    if not shutil.which("cmake"):
        raise SystemExit("cmake is needed to build test-llama-archs")
    tree = source_dir()
    flags = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" if platform.machine() == "x86_64" else ""
    subprocess.run(["cmake", "-S", str(tree), "-B", str(BUILD), "-DCMAKE_BUILD_TYPE=Release",
                    "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=ON",
                    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_TOOLS=OFF",
                    f"-DCMAKE_C_FLAGS={flags}", f"-DCMAKE_CXX_FLAGS={flags}"], check=True)
    jobs = str(os.cpu_count() or 2)
    subprocess.run(["cmake", "--build", str(BUILD), "--target", "test-llama-archs", "-j", jobs], check=True)
    return TOOL


def generate(name: str, arch: str, saved: str) -> Path:
    tool = build_tool()
    with tempfile.TemporaryDirectory(prefix="tiny-models-") as tmp:
        subprocess.run([str(tool), "-a", arch, "-s", str(SEED), "-o", tmp], check=True)
        out = DIR / name
        shutil.copyfile(Path(tmp) / saved, out)
    return out


def main(argv: list[str]) -> int:
    force = "--force" in argv
    models = {**MODELS, **EXTRA} if "--extra" in argv else MODELS
    for name, (arch, saved, digest) in models.items():
        path = DIR / name
        if path.exists() and not force and (digest is None or sha256(path) == digest):
            print(f"{name}: up to date ({path.stat().st_size} bytes)")
            continue
        generate(name, arch, saved)
        got = sha256(path)
        if digest is not None and got != digest:
            print(f"{name}: generated with SHA-256 {got}, recorded {digest} (different compiler/CPU?)", file=sys.stderr)
        print(f"{name}: {arch}, seed {SEED}, {path.stat().st_size} bytes, sha256 {got}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
