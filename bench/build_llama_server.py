"""Build the reference `llama-server` from the llama.cpp vendored by llama-cpp-python==0.3.36.

It is the oracle for fidelity (golden traces) and the baseline of the benchmarks. Usage:
    python -m bench.build_llama_server            # -> build/llama-server/cmake/bin/llama-server
The sdist comes from PyPI (`pip download --no-binary :all:`); AMX is compiled out for the same reason
as in the Makefile, and the server is always run with --no-repack."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

PIN = "0.3.36"
ROOT = Path(__file__).resolve().parent.parent
BUILD = Path(os.environ.get("SLOTLAB_SERVER_BUILD", ROOT / "build" / "llama-server"))
BINARY = BUILD / "cmake" / "bin" / "llama-server"


def server_binary() -> Path | None:
    """The built server, or the one named by $SLOTLAB_LLAMA_SERVER, or None."""
    env = os.environ.get("SLOTLAB_LLAMA_SERVER")
    if env:
        return Path(env) if Path(env).exists() else None
    return BINARY if BINARY.exists() else None


def source_dir() -> Path:
    src = BUILD / "src"
    tree = src / f"llama_cpp_python-{PIN}" / "vendor" / "llama.cpp"
    if tree.exists():
        return tree
    src.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                    f"llama-cpp-python=={PIN}", "-d", str(src)], check=True)
    with tarfile.open(next(src.glob(f"llama_cpp_python-{PIN}.tar.gz"))) as t:
        t.extractall(src)
    return tree


def main() -> int:
    if server_binary() and "--force" not in sys.argv:
        print(f"llama-server already built: {server_binary()}")
        return 0
    if not shutil.which("cmake"):
        print("cmake is needed to build llama-server", file=sys.stderr)
        return 1
    tree = source_dir()
    flags = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" if platform.machine() == "x86_64" else ""
    cmake = ["cmake", "-S", str(tree), "-B", str(BUILD / "cmake"), "-DCMAKE_BUILD_TYPE=Release",
             "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
             f"-DCMAKE_C_FLAGS={flags}", f"-DCMAKE_CXX_FLAGS={flags}"]
    subprocess.run(cmake, check=True)
    jobs = str(os.cpu_count() or 2)
    print(f"building llama-server with {jobs} jobs (10-18 minutes on 2 cores)", flush=True)
    subprocess.run(["cmake", "--build", str(BUILD / "cmake"), "--target", "llama-server", "-j", jobs], check=True)
    print(f"built {BINARY}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
