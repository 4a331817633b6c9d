"""Backends run one exported decoder. They register themselves; the loop sees only :class:`Decoder`."""

import importlib.util

# Importing a backend module registers it.
from . import onnxruntime as _onnxruntime  # noqa: F401,E402
from . import tensorrt as _tensorrt  # noqa: F401,E402  (imports TensorRT only when used)
from .base import (
    Decoder,
    DecoderOutput,
    Heads,
    available_backends,
    create_decoder,
    create_heads,
    register_backend,
    register_external,
)

__all__ = ["Decoder", "DecoderOutput", "Heads", "available_backends", "create_decoder", "create_heads",
           "register_backend", "register_external"]


def _torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None  # a lookup, not an import: the runtime stays torch-free


# PyTorch on the bundle's source checkpoint (CUDA graphs on GPUs); never chosen by "auto". It is torch-side
# code, so the runtime knows it by name only.
register_external("torch", "specrt.export.torch_backend:TorchDecoder", _torch_available)
