"""Backends run one exported decoder. They register themselves; the loop sees only :class:`Decoder`."""

from .base import Decoder, DecoderOutput, Heads, available_backends, create_decoder, create_heads, register_backend

# Importing a backend module registers it.
from . import onnxruntime as _onnxruntime  # noqa: F401,E402

__all__ = ["Decoder", "DecoderOutput", "Heads", "available_backends", "create_decoder", "create_heads",
           "register_backend"]
