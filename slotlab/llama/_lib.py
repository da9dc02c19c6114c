"""Loading llama-cpp-python's C library once, and routing llama.cpp's log into Python.

The log callback keeps the last lines in a ring buffer, so a failed model load or context creation
can name the reason llama.cpp gave (e.g. ``unknown model architecture: 'foo'``) instead of a bare
NULL pointer. Lines also go to the ``slotlab.llama`` logger (DEBUG), never straight to stderr, so a
notebook stays readable."""

from __future__ import annotations

import collections
import ctypes
import logging
import threading

import llama_cpp as _llama_cpp

lib = _llama_cpp
log = logging.getLogger("slotlab.llama")

# ggml_log_level (ggml.h): NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 (continues the previous line).
# llama-cpp-python's own _logger.py maps an older order; this is the vendored header's.
WARN, ERROR, CONT = 3, 4, 5
_LEVELS = {0: logging.DEBUG, 1: logging.DEBUG, 2: logging.DEBUG, WARN: logging.WARNING, ERROR: logging.ERROR}

_recent: collections.deque[tuple[int, str]] = collections.deque(maxlen=200)
_lock = threading.Lock()
_partial: list[str] = []
_last_level = 2


@lib.llama_log_callback
def _on_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:  # pragma: no cover - C calls it
    global _last_level
    try:
        s = text.decode("utf-8", errors="replace")
        if level == CONT:
            level = _last_level
        _last_level = level
        with _lock:
            _partial.append(s)
            if not s.endswith("\n"):
                return
            line = "".join(_partial).rstrip("\n")
            _partial.clear()
            _recent.append((level, line))
        log.log(_LEVELS.get(level, logging.DEBUG), "%s", line)
    except Exception:  # a callback must never raise into C
        pass


_initialised = False


def init() -> None:
    """Initialise the backend and take over the log callback (idempotent)."""
    global _initialised
    if _initialised:
        return
    lib.llama_log_set(_on_log, ctypes.c_void_p(0))
    lib.llama_backend_init()
    _initialised = True


def recent_errors(n: int = 8) -> list[str]:
    """The last error / warning lines llama.cpp printed (newest last)."""
    with _lock:
        lines = [line for level, line in _recent if level in (WARN, ERROR)]
    return lines[-n:]


def clear_recent() -> None:
    with _lock:
        _recent.clear()


def supports_gpu_offload() -> bool:
    init()
    return bool(lib.llama_supports_gpu_offload())


def system_info() -> str:
    init()
    return lib.llama_print_system_info().decode("utf-8", errors="replace").strip()
