"""Backends run one exported decoder. They register themselves; the loop sees only :class:`Decoder`."""

from .base import Decoder, DecoderOutput, Heads, available_backends, create_decoder, create_heads, register_backend

# Importing a backend module registers it.
from . import onnxruntime as _onnxruntime  # noqa: F401,E402
from . import tensorrt as _tensorrt  # noqa: F401,E402  (imports TensorRT only when used)

__all__ = ["Decoder", "DecoderOutput", "Heads", "available_backends", "create_decoder", "create_heads",
           "register_backend"]


def _torch_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None  # a lookup, not an import: the runtime stays torch-free


@register_backend("torch", _torch_available)
def _torch_decoder(bundle_dir, entry, threads=None, role="target", low_memory=None):
    """PyTorch on the bundle's source checkpoint (CUDA graphs on GPUs); never chosen by "auto"."""
    from ...engines.torch_backend import TorchDecoder

    return TorchDecoder(bundle_dir, entry, threads=threads)
