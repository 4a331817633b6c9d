"""Typed errors. The CLI turns any :class:`SpecrtError` into a one-line message and exit code 1."""

from __future__ import annotations


# How every error that asks for torch says to install it. The pin alone resolves multi-GB CUDA wheels on an ordinary
# x86-64 Linux: PyTorch's CPU index gives the CPU build (leave --index-url out on a machine with an NVIDIA GPU).
INSTALL_TORCH = "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"


class SpecrtError(Exception):
    """Base class of every error specrt raises on purpose."""


class ConfigError(SpecrtError, ValueError):
    """An argument or option is out of range (temperature < 0, gamma > 64, ...)."""


class BundleError(SpecrtError):
    """A bundle folder is missing, incomplete, corrupt or of another format version."""


class ModelLoadError(SpecrtError):
    """A Hugging Face model or tokenizer could not be found or loaded."""


class UnsupportedArchitectureError(SpecrtError):
    """The model's architecture has no registered exporter."""


class VocabMismatchError(SpecrtError):
    """Target and draft tokenizers map some ids to different strings."""


class ParityError(SpecrtError):
    """ONNX Runtime output differs from PyTorch beyond the declared tolerance."""


class ClusterError(SpecrtError):
    """A Ray cluster could not be reached, or could not place or start the serving replicas."""


class ContextLengthError(SpecrtError):
    """A generation would need more positions than the bundle's max context."""


class OutputPathError(SpecrtError):
    """The output folder exists and is not empty (without --force) or cannot be written."""


class ChatTemplateError(SpecrtError, ValueError):
    """A chat template refused the messages (its ``raise_exception``), or does not compile or render."""


class ExportProcessError(SpecrtError):
    """The child process that exported one model died or failed in a way it could not report as a typed error."""


class TrainingDivergedError(ConfigError):
    """A training run's loss stopped being finite (the demo pair's, an EAGLE-3 head's): its learning rate is too high."""


class QualityGateError(ConfigError):
    """A quantized model drifted past the quality gate against its float graph (``mean_kl``: how far)."""

    def __init__(self, message: str, mean_kl: float = float("nan")) -> None:
        super().__init__(message)
        self.mean_kl = mean_kl


class EagleHeadError(ConfigError):
    """An EAGLE-3 head folder is missing, of another layout (EAGLE-1/2), or made for another target."""


class DFlashDraftError(ConfigError):
    """A DFlash draft folder is missing, of another layout, or made for another target."""
