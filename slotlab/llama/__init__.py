"""The llama layer: the only part of slotlab that touches llama-cpp-python's ctypes API."""

from slotlab.llama._lib import supports_gpu_offload, system_info
from slotlab.llama.batch import Batch
from slotlab.llama.context import (
    STATE_SEQ_FLAGS_NONE,
    STATE_SEQ_FLAGS_PARTIAL_ONLY,
    Context,
    SeqRmType,
    default_threads,
)
from slotlab.llama.model import Model, default_model_path
from slotlab.llama.sampling import Sampler

__all__ = [
    "Batch", "Context", "Model", "Sampler", "SeqRmType", "STATE_SEQ_FLAGS_NONE",
    "STATE_SEQ_FLAGS_PARTIAL_ONLY", "default_model_path", "default_threads",
    "supports_gpu_offload", "system_info",
]
