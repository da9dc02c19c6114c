"""The errors a user sees. Every failure that reaches a user is one of these, with a sentence that
names the problem (a path, a flag, a value) instead of a traceback from inside ctypes."""


class SlotlabError(Exception):
    """Base class of every error slotlab raises on purpose."""


class ModelError(SlotlabError):
    """The model file cannot be used: missing, not GGUF, unsupported architecture, load failure."""


class ConfigError(SlotlabError, ValueError):
    """A parameter (a llama-server flag or its keyword twin) is out of range or inconsistent."""


class ShiftNotSupported(SlotlabError):
    """`llama_memory_seq_add` was asked for on a memory that cannot shift positions
    (for Gemma 3: SWA without `--swa-full`)."""


class StateError(SlotlabError):
    """A sequence state blob or slot file could not be read, written or restored."""


class TraceError(SlotlabError, ValueError):
    """A trace, request log or session log that cannot be read; the message names the file, the line
    (or the request) and the field. One class for every reader (engine/replay.py, sim/traces.py,
    conversation.py), so a caller catches one thing."""
