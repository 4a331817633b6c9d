"""``specrt build``: TensorRT engines from a bundle's ONNX graphs (TensorRT's Python API, imported lazily).

Pure parts (optimization profiles, engine-cache keys, Jetson defaults) are plain functions tested on
the CPU; :func:`build_engine` needs TensorRT and an NVIDIA GPU and says so clearly when either is absent.
"""

from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from ..bundle import safety
from ..bundle.contract import (
    ATTENTION_MASK,
    EAGLE_FEATURES,
    EAGLE_TAPS,
    INPUT_IDS,
    LOGITS_INDEX,
    POSITION_IDS,
    SUMMARY_ENGINE,
    SUMMARY_LOGITS,
    SUMMARY_TOP_K,
    summary_graph_path,
)
from ..bundle.manifest import ModelEntry
from ..errors import ConfigError, SpecrtError

PRECISIONS = ("fp32", "fp16", "bf16", "int8", "fp8")
GRAPH_PRECISION = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}  # ONNX export dtype → engine


class TensorRTUnavailable(SpecrtError):
    """TensorRT or an NVIDIA GPU is missing."""


@dataclass(frozen=True)
class BuildOptions:
    # None: the graph's own precision. Networks are strongly typed (TensorRT 11 removed the FP16/BF16
    # builder flags; 10.12 deprecated them), so an engine computes in the types the ONNX graph has.
    precision: str | None = None
    max_context: int = 2048
    max_prompt: int = 1024  # prefill profile: Q up to this
    max_verify: int = 64  # decode/verify profile: Q up to γ+1 or a tree's node count
    max_batch: int = 1
    workspace_mb: int = 4096
    jetson: bool = False

    def __post_init__(self) -> None:
        if self.precision is not None and self.precision not in PRECISIONS:
            raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.precision in ("int8", "fp8"):
            # Both need scales TensorRT cannot invent: a calibrator or Q/DQ nodes in the ONNX graph.
            raise ConfigError(f"{self.precision} engines need a quantized ONNX graph (Q/DQ nodes); specrt does not "
                              "produce one yet: build fp16 or bf16")
        for name in ("max_context", "max_prompt", "max_verify", "max_batch", "workspace_mb"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_prompt > self.max_context or self.max_verify > self.max_context:
            raise ConfigError("max_prompt and max_verify must not exceed max_context")


def profiles(entry: ModelEntry, opts: BuildOptions) -> list[dict[str, tuple[tuple[int, ...], ...]]]:
    """(min, opt, max) shapes per input for two profiles: prefill (P = 0, Q up to max_prompt) and
    decode/verify (Q up to max_verify, P up to max_context - Q). Matches how the runtime calls the graph."""
    d = entry.dims
    b = opts.max_batch

    # An EAGLE-3 head also reads the target's taps and H-wide features, one row per new position.
    rows = {EAGLE_TAPS: entry.tap_width, EAGLE_FEATURES: d.hidden_size} if entry.kind == "eagle3" else {}

    def profile(q: tuple[int, int, int], p: tuple[int, int, int]) -> dict:
        shapes = {INPUT_IDS: tuple((b, x) for x in q), POSITION_IDS: tuple((b, x) for x in q),
                  ATTENTION_MASK: tuple((b, 1, x, y + x) for x, y in zip(q, p)),
                  **{name: tuple((b, x, width) for x in q) for name, width in rows.items()}}
        if entry.logits_index:  # the runtime asks for every row's logits on TensorRT: R = Q
            shapes[LOGITS_INDEX] = tuple((x,) for x in q)
        for i in range(d.num_layers):
            kv = tuple((b, y, d.num_kv_heads, d.head_dim) for y in p)
            shapes[f"past_key.{i}"] = kv
            shapes[f"past_value.{i}"] = kv
        return shapes

    prefill = profile((1, min(128, opts.max_prompt), opts.max_prompt), (0, 0, 0))
    longest_past = opts.max_context - opts.max_verify
    # opt within [min, max]: TensorRT refuses a profile whose opt past exceeds its max, which
    # max_context // 2 did once max_verify > max_context / 2.
    verify = profile((1, min(8, opts.max_verify), opts.max_verify),
                     (0, min(opts.max_context // 2, longest_past), longest_past))
    return [prefill, verify]


def heads_profiles(hidden_size: int, opts: BuildOptions) -> list[dict[str, tuple[tuple[int, ...], ...]]]:
    """Medusa heads read the hidden rows of one verify pass: Q up to max_verify."""
    b, q = opts.max_batch, opts.max_verify
    return [{"hidden": ((b, 1, hidden_size), (b, min(8, q), hidden_size), (b, q, hidden_size))}]


def summary_profiles(vocab_sizes: list[int], opts: BuildOptions) -> list[dict[str, tuple[tuple[int, ...], ...]]]:
    """The logits summary reads the rows of one pass (up to the larger of max_prompt and max_verify) of
    any of the bundle's models (target and draft vocabularies may differ)."""
    q = max(opts.max_prompt, opts.max_verify)
    lo, hi = min(vocab_sizes), max(vocab_sizes)
    return [{SUMMARY_LOGITS: ((1, lo), (min(8, q), hi), (q, hi))}]  # inv_temperature is static: [1]


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def engine_key(onnx_sha256: str, trt_version: str, compute_capability: str, opts: BuildOptions,
               shapes: list[dict]) -> str:
    """Cache key: anything that changes the engine changes the key (graph, TensorRT, GPU, precision, profiles)."""
    payload = json.dumps({"onnx": onnx_sha256, "tensorrt": trt_version, "sm": compute_capability,
                          "precision": opts.precision, "workspace_mb": opts.workspace_mb,
                          "profiles": shapes}, sort_keys=True, default=list)
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def jetson_defaults(free_memory_mb: int, opts: BuildOptions) -> BuildOptions:
    """Orin/Thor: a workspace that leaves room in unified memory (half of what is free, ≤ 4 GB). The
    precision is the bundle's (export with --dtype fp16 for fp16 engines)."""
    from dataclasses import replace

    return replace(opts, workspace_mb=max(256, min(4096, free_memory_mb // 2)), jetson=True)


def free_memory_mb() -> int:
    """Memory free now, in MiB (on a Jetson: the unified memory the GPU shares with the CPU)."""
    import os

    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20


def resolve_precision(entries: list[ModelEntry], requested: str | None) -> str:
    """The engines' precision: the graphs' own (a strongly typed network computes in the ONNX types).
    Asking for another one is a one-line error naming the export that gives it."""
    quantized = [e for e in entries if e.quantization]
    if quantized:
        q = quantized[0].quantization
        op = "MatMulIntegerToFloat" if q.get("kernel") == "integer" else "MatMulNBits"
        raise ConfigError(f"this bundle is int{q['bits']} weight-only (ONNX Runtime's {op}), which TensorRT "
                          "cannot parse; build engines from the float bundle it came "
                          "from (weight-only TensorRT engines need a Q/DQ graph, which specrt does not produce yet)")
    fused = [e for e in entries if e.graph in ("fused", "gqa", "gqa-static")]
    if fused:
        raise ConfigError(f"{fused[0].file} is the {fused[0].graph} ONNX Runtime graph (opset-23 or contrib "
                          "attention nodes, not parsed by TensorRT here); re-export with --graph portable for "
                          "TensorRT engines")
    found = {GRAPH_PRECISION.get(e.dtype, e.dtype) for e in entries}
    if len(found) != 1:
        raise ConfigError(f"the bundle's graphs have different precisions ({', '.join(sorted(found))})")
    (graph,) = found
    if requested is not None and requested != graph:
        raise ConfigError(f"--precision {requested}: engines take the precision of the bundle's graphs, which are "
                          f"{graph}; export with --dtype {requested} for {requested} engines (or drop --precision)")
    return graph


def require_tensorrt():
    """Import TensorRT and check for a GPU, or raise a one-line error naming what to install."""
    try:
        import tensorrt as trt
    except (ImportError, OSError) as e:  # the wheel without its libraries raises OSError
        hint = ("use the TensorRT that JetPack installs" if platform.machine() == "aarch64"
                else "pip install 'specrt[trt]'")
        raise TensorRTUnavailable(f"TensorRT is not available ({e}); {hint}") from None
    try:
        from cuda.bindings import runtime as cudart

        err, count = cudart.cudaGetDeviceCount()
        if int(err) == int(cudart.cudaError_t.cudaErrorInsufficientDriver):
            raise TensorRTUnavailable("the NVIDIA driver is older than the CUDA this cuda-bindings needs (not a "
                                      "missing GPU): install the cuda-bindings matching the driver, e.g. "
                                      "pip install 'cuda-bindings>=12.6,<13' for a CUDA 12 driver; see specrt doctor")
        if int(err) != 0 or count < 1:
            raise TensorRTUnavailable("no NVIDIA GPU is visible (cudaGetDeviceCount found none)")
    except ImportError:
        raise TensorRTUnavailable("cuda-bindings is missing: pip install 'specrt[trt]'") from None
    return trt


def build_engine(onnx_path: Path, engine_path: Path, shapes: list[dict], opts: BuildOptions,
                 timing_cache: Path | None = None) -> None:
    """Parse the ONNX graph and write a serialized engine with the given optimization profiles."""
    trt = require_tensorrt()
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    # Strongly typed: the same call on TensorRT 10.x and 11.x, and the graph's fp32 islands (mask,
    # softmax inputs, logits) stay fp32 instead of being left to the builder's choice.
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise SpecrtError(f"TensorRT cannot parse {onnx_path.name}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, opts.workspace_mb << 20)
    for profile_shapes in shapes:
        profile = builder.create_optimization_profile()
        for name, (lo, mid, hi) in profile_shapes.items():
            profile.set_shape(name, lo, mid, hi)
        config.add_optimization_profile(profile)
    cache_bytes = timing_cache.read_bytes() if timing_cache and timing_cache.is_file() else b""
    cache = config.create_timing_cache(cache_bytes)
    config.set_timing_cache(cache, ignore_mismatch=False)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise SpecrtError(f"TensorRT failed to build an engine for {onnx_path.name} (see the log above)")
    engine_path.write_bytes(bytes(serialized))
    if timing_cache:
        timing_cache.write_bytes(bytes(config.get_timing_cache().serialize()))


def build_bundle_engines(bundle: Path, opts: BuildOptions,
                         progress: Callable[[str, bool], None] | None = None) -> dict:
    """Build (or reuse from the cache) an engine per model, for the Medusa heads and for the logits
    summary, and record them in the manifest. ``progress(role, cached)`` is told before each engine."""
    from dataclasses import replace

    from ..bundle.manifest import load_manifest

    manifest = load_manifest(bundle)
    trt = require_tensorrt()
    from cuda.bindings import runtime as cudart

    _, props = cudart.cudaGetDeviceProperties(0)
    sm = f"{props.major}.{props.minor}"
    if opts.max_context > manifest.max_context:
        raise ConfigError(f"--max-context {opts.max_context} exceeds the bundle's {manifest.max_context}")
    opts = replace(opts, precision=resolve_precision(list(manifest.models.values()), opts.precision))
    cache_dir = bundle / "engines"
    cache_dir.mkdir(exist_ok=True)
    graphs = {role: (entry.file, profiles(entry, opts)) for role, entry in manifest.models.items()}
    if manifest.medusa is not None:
        graphs["medusa"] = (manifest.medusa.file, heads_profiles(manifest.target.dims.hidden_size, opts))
    # The shipped summary graph (an absolute path: bundle / it is it): logits stay on the GPU.
    vocabs = [e.dims.vocab_size for e in manifest.models.values() if e.dims.vocab_size >= SUMMARY_TOP_K]
    if vocabs:
        graphs[SUMMARY_ENGINE] = (str(summary_graph_path()), summary_profiles(vocabs, opts))
    out = {}
    for role, (file, shapes) in graphs.items():
        key = engine_key(file_sha256(bundle / file), trt.__version__, sm, opts, shapes)
        path = cache_dir / f"{role}-{key}.engine"
        cached = safety.is_trusted(path)  # an engine that came with the bundle is rebuilt, whatever its name
        if progress:
            progress(role, cached)
        if not cached:
            build_engine(bundle / file, path, shapes, opts, cache_dir / "timing.cache")
            safety.trust_engine(path)
        out[role] = {"file": str(path.relative_to(bundle)), "key": key, "tensorrt": trt.__version__, "sm": sm,
                     "options": asdict(opts)}
    replace(manifest, engines=out).write(bundle)
    return out
