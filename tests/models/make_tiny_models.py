"""Tiny random-weight hybrid and recurrent models for the tests, written by llama.cpp's own model saver.

    python -m tests.models.make_tiny_models [--force] [--extra]     # (or `make tiny-models`)

llama.cpp's `test-llama-archs -a ARCH -o DIR -s SEED` builds a small model of any architecture it
supports (2 layers, n_embd 256, a 128-token test vocabulary, n_ctx_train 256) with weights drawn
from a fixed seed, and saves it as GGUF. The outputs are meaningless; the memory (KV cells,
recurrent state, checkpoints) is the real architecture's, which is what slotlab's decisions depend on.

This script builds `test-llama-archs` from the llama.cpp vendored by llama-cpp-python 0.3.36 in a
build directory of its own (build/llama-tests: the server build in build/llama-server stays as it
is), then writes the models listed in MODELS into tests/models/ (with --extra also those of EXTRA). It is
idempotent: a model whose file exists with the recorded SHA-256 is left alone, and the tool is only
built when a model is missing. The tests need none of this for the committed models; the EXTRA ones
are generated when a test asks for them and the tool is built (else those tests skip, saying so)."""

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

# file name -> (architecture, the saver's output name, SHA-256 of the file as generated here): committed,
# ~5 MB each. qwen35: hybrid (attention + gated delta-net layers, M-RoPE); mamba2: pure recurrent;
# granitehybrid: attention + mamba2 layers; nemotron_h: attention + mamba2 + MLP-only layers; lfm2:
# short convolutions + attention with a sliding window (a hybrid iSWA memory); jamba: attention +
# mamba (v1: no group count) layers.
MODELS = {
    "qwen35-tiny.gguf": ("qwen35", "qwen35-dense.gguf", "1fb1c000022f4274aa599b52d558c0f8166b2a995b78f945cf032b197593fba2"),
    "mamba2-tiny.gguf": ("mamba2", "mamba2-dense.gguf", "33bd63b398a5cb492917425723101ebf7374a270f32a2d8bc11f733a9ed71926"),
    "granitehybrid-tiny.gguf": ("granitehybrid", "granitehybrid-dense.gguf",
                                "842760b62f9eaa92caaba2229abe07786ac5c535c8b30b857e05388cbdc09ead"),
    "nemotron_h-tiny.gguf": ("nemotron_h", "nemotron_h-dense.gguf",
                             "a2cdaa694776fee019e9cd450c0e4e3212f69c2aff4536cf3b9811b34d21b0d5"),
    "lfm2-tiny.gguf": ("lfm2", "lfm2-dense.gguf", "0c60a99c0c210976a71d4a9da43b3320f6f3141d34356770390109af8fd7085d"),
    "jamba-tiny.gguf": ("jamba", "jamba-dense.gguf", "85d41454e86fe3581a0fd6ccae74ca7c445888fff87db63369b6a4c33f5ef26a"),
}
# more architectures, not committed (qwen3next and falcon-h1 are ~10 MB; the others share a committed
# model's memory code): written by --extra into tests/models/, or by `generated()` into the build
# directory when a test asks for one and test-llama-archs is built. qwen3next: qwen35's memory without
# M-RoPE (so it can shift); falcon-h1: every layer both attention and mamba2; kimi-linear: a KDA state
# slotlab cannot size (the test of that error).
EXTRA = {
    "qwen3next-tiny.gguf": ("qwen3next", "qwen3next-moe.gguf", "04f62e9b40349a816d53da44a5f6eab50b8bf40a507dd78574f558a7afc8f42b"),
    "falcon-h1-tiny.gguf": ("falcon-h1", "falcon-h1-dense.gguf",
                            "38466924ed0165fd4f8f88e166696c300034560a76c0d44e519f3394d23cbde3"),
    "mamba-tiny.gguf": ("mamba", "mamba-dense.gguf", None),
    "lfm2moe-tiny.gguf": ("lfm2moe", "lfm2moe-moe.gguf", None),
    "nemotron_h_moe-tiny.gguf": ("nemotron_h_moe", "nemotron_h_moe-dense.gguf", None),
    "qwen35moe-tiny.gguf": ("qwen35moe", "qwen35moe-moe.gguf", None),
    "kimi-linear-tiny.gguf": ("kimi-linear", "kimi-linear-moe.gguf", None),
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


def generate(name: str, arch: str, saved: str, out_dir: Path = DIR) -> Path:
    tool = build_tool()
    with tempfile.TemporaryDirectory(prefix="tiny-models-") as tmp:
        subprocess.run([str(tool), "-a", arch, "-s", str(SEED), "-o", tmp], check=True, capture_output=True)
        out = out_dir / name
        shutil.copyfile(Path(tmp) / saved, out)
    return out


def generated(name: str) -> Path | None:
    """The path of model `name` (MODELS or EXTRA): the committed file, one written by --extra, or one
    generated now into the build directory; None when it is not there and test-llama-archs is not built
    (`python -m tests.models.make_tiny_models --extra` builds it)."""
    for d in (DIR, BUILD / "models"):
        if (d / name).exists():
            return d / name
    if name not in EXTRA or not TOOL.exists():
        return None
    (BUILD / "models").mkdir(parents=True, exist_ok=True)
    arch, saved, _ = EXTRA[name]
    return generate(name, arch, saved, BUILD / "models")


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
