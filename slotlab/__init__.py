"""slotlab: llama.cpp server slots, RAM prompt cache and checkpoints, live on a real llama_context."""

from slotlab.errors import SlotlabError, ModelError, ConfigError, ShiftNotSupported

__version__ = "0.1.0"

__all__ = ["SlotlabError", "ModelError", "ConfigError", "ShiftNotSupported", "__version__"]

import logging as _logging

# A library does not print: llama.cpp's warnings go to the "slotlab.llama" logger, shown only when
# the user configures logging (errors that matter are raised as SlotlabError with their text).
_logging.getLogger("slotlab").addHandler(_logging.NullHandler())
