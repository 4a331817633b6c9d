"""Where a bundle will run (``specrt export --for``), and what export chooses for it where a setting is left unset.

Every choice here is one a user could make with a flag, and every flag given wins. The choices and why are
recorded in the manifest (``chosen``) and printed, so a bundle says what it was made for.

- **cpu**: a CPU decodes at the speed it reads weights. int4 (HQQ) weights where they pass the quality gate,
  else int8, else float (the gate decides, on this model); on gqa graphs (one in-place KV buffer per layer:
  nothing re-bound per step). int4's matmuls read half int8's bytes (at 45 % of the probed bandwidth against
  int8's 59 % on SmolLM2-135M, docs/performance/verify-cost-cpu.md). A GGUF keeps its Q4/Q8 blocks for plain
  decoding and is re-quantized to int4 when a drafter is given (export.pipeline.requantize_gguf). fp32
  activations: ONNX Runtime's CPU kernels have no fast fp16 path.
- **cuda** and **jetson**: ONNX Runtime CUDA: fp16 gqa-static graphs, whose verify steps replay as CUDA graphs
  (docs/gpu.md; causal only, so ``auto`` runs chains); no weight quantization.
- **tensorrt**: fp16 portable graphs, what ``specrt build`` takes (fused and quantized graphs cannot be built).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError

PLATFORMS = ("auto", "cpu", "cuda", "tensorrt", "jetson")
_NVIDIA = {"cuda": ("fp16", "gqa-static", "ONNX Runtime CUDA replays gqa-static verify steps as CUDA graphs"),
           "jetson": ("fp16", "gqa-static", "ONNX Runtime CUDA (NVIDIA's JetPack wheel) replays gqa-static verify "
                      "steps as CUDA graphs"),
           "tensorrt": ("fp16", "portable", "specrt build makes TensorRT engines from portable graphs only")}


@dataclass(frozen=True)
class ExportChoice:
    """What ``specrt export`` makes for ``platform``. ``bits``: the target's weights (None: float, or a GGUF's own
    blocks kept); ``fallback``: the bits tried next, in order, when the quality gate refuses (None: float)."""

    platform: str
    dtype: str  # "fp32" | "fp16"
    graph: str  # an ExportOptions.graph
    auto_graph: str  # what graph "auto" gives a fused architecture
    bits: int | None
    fallback: tuple[int | None, ...]
    why: tuple[str, ...]  # one line per setting chosen, for the screen and the manifest

    def record(self, bits: int | None) -> dict:
        """The manifest's ``chosen``: the platform, what the target ended as, and why."""
        return {"for": self.platform, "dtype": self.dtype, "quantize": f"int{bits}" if bits else "float",
                "why": list(self.why)}


def this_machine() -> tuple[str, str]:
    """(platform, why) for the machine export runs on: cuda where torch sees a CUDA GPU, else cpu."""
    try:
        import torch

        if torch.cuda.is_available():
            return "cuda", f"this machine: {torch.cuda.get_device_name(0)}"
    except ImportError:
        pass
    return "cpu", "this machine: no CUDA GPU that torch can see"


def choose(platform: str, *, dtype: str | None, graph: str, bits: int | None, decided: bool, gguf: bool,
           requantize_gguf: bool) -> ExportChoice:
    """The settings for ``platform`` ("auto": :func:`this_machine`) where the user left them unset (``dtype``
    None, ``graph`` "auto"; ``decided``: the user set the quantization, ``bits`` None meaning float or a proposer's
    alone). ``gguf``: the target is a GGUF file; ``requantize_gguf``: its blocks give way to int4
    (export.pipeline.requantize_gguf, from --gguf-blocks and the drafter)."""
    if platform not in PLATFORMS:
        raise ConfigError(f"--for must be one of {', '.join(PLATFORMS)}, got {platform!r}")
    why: list[str] = []
    if platform == "auto":
        platform, reason = this_machine()
        why.append(f"for {platform}: {reason}")
    if platform in _NVIDIA:
        want_dtype, want_graph, reason = _NVIDIA[platform]
        if dtype is None:
            why.append(f"fp16: {platform} runs fp16 kernels")
        if graph == "auto":
            why.append(f"{want_graph} graphs: {reason}")
        return ExportChoice(platform, dtype or want_dtype, graph if graph != "auto" else want_graph, "fused", bits,
                            (), tuple(why))
    if dtype is None:
        why.append("fp32: ONNX Runtime's CPU kernels have no fast fp16 path")
    fallback: tuple[int | None, ...] = ()
    if decided:
        pass
    elif gguf and not requantize_gguf:
        why.append("the GGUF's Q4/Q8 blocks kept: the fastest plain decoding (--gguf-blocks)")
    else:
        bits, fallback = 4, ((8,) if gguf else (8, None))
        why.append("int4 weights (HQQ) where they pass the quality gate, else int8" + ("" if gguf else ", else float")
                   + (": a drafter verifies several rows a step, which Q4 blocks make dear on a CPU" if gguf else
                      ": a CPU decodes at the speed it reads weights, and int4 reads half int8's bytes"))
    auto_graph = "gqa" if bits else "fused"
    if graph == "auto" and bits:
        why.append("gqa graphs where the architecture has them: one in-place KV buffer per layer, nothing re-bound "
                   "per step")
    return ExportChoice(platform, dtype or "fp32", graph, auto_graph, bits, fallback, tuple(why))
