"""The llama.cpp build slotlab models: the tree llama-cpp-python 0.3.36 vendors.

llama-cpp-python exposes no build number or commit (its bindings carry none; the number lives in
llama.cpp's `common` library, which is not exported), so it is written here, once: the sdist's
CHANGELOG names the commit ("update llama.cpp to ggml-org/llama.cpp@0c1e57098"), which is llama.cpp's
build b11312. `slotlab info`, the panel's header and `slotlab watch` (slotlab/watch/builds.py, which
compares it with the build a log names) read it from here."""

LLAMA_CPP_BUILD = 11312
LLAMA_CPP_COMMIT = "0c1e570"
