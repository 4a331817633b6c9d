"""specrt: speculative decoding, exported to ONNX and run by a lean numpy + ONNX Runtime runtime.

    import specrt
    gen = specrt.load("bundle/")
    print(gen.generate("def fib(n):", max_new_tokens=64).text)

Decoding options are keyword arguments of ``generate``/``stream``/``chat`` or one
:class:`DecodeOptions` value (``gen.generate(prompt, specrt.DecodeOptions(method="none"))``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"

from .runtime.options import DecodeOptions

if TYPE_CHECKING:
    from .runtime.generator import SpeculativeGenerator


def load(bundle=None, backend: str = "auto", threads: int | None = None,
         low_memory: bool | None = None, shared_threads: bool = False) -> "SpeculativeGenerator":
    """Load a bundle folder (default: the shipped demo bundle). See :class:`SpeculativeGenerator`."""
    from .runtime.generator import load as _load

    return _load(bundle, backend=backend, threads=threads, low_memory=low_memory, shared_threads=shared_threads)


__all__ = ["DecodeOptions", "load", "__version__"]
