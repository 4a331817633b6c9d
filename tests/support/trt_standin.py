"""Stand-in ``tensorrt`` modules shaped by the names of the real bindings (tests/data/tensorrt-api/).

The builder's and the runtime's whole call sequences run against them on a CPU (an "engine" is the
ONNX graph it was built from, executed by ONNX Runtime on the addresses bound to its execution
context, see fake_device.OrtEngineContext): a class, method or enum member exists
in the stand-in of a version only if that version's bindings carry the name (or, for precision
flags, the member's own docstring, since "BF16" also names a DataType). So code written against one
TensorRT fails here as it would against the other: ``trt.BuilderFlag.FP16`` is an AttributeError on
11.4, as on the real 11.4.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import numpy as np
import onnx

API_DIR = Path(__file__).parents[1] / "data" / "tensorrt-api"
VERSIONS = sorted(p.stem for p in API_DIR.glob("*.txt"))
PRECISION_FLAG_DOCS = {"FP16": "Enable FP16 layer selection.", "BF16": "Enable BF16 layer selection.",
                       "INT8": "Enable Int8 layer selection."}


class Names:
    """The strings of one bindings version; a name is present whole or as the tail of a longer
    identifier (the linker merges equal string tails)."""

    def __init__(self, version: str) -> None:
        lines = [s for s in (API_DIR / f"{version}.txt").read_text().splitlines() if not s.startswith("#")]
        self.strings = set(lines)
        self.tails = {s[i:] for s in lines if " " not in s for i in range(len(s))}

    def __contains__(self, name: str) -> bool:
        return name in self.tails


def _enum(names: Names, type_name: str, members: dict[str, int], docs: dict[str, str] | None = None):
    assert type_name in names, type_name
    present = {m: v for m, v in members.items()
               if m in names and (docs is None or m not in docs or docs[m] in names.strings)}
    return type(type_name, (), present)


def make_tensorrt(version: str) -> types.ModuleType:
    """A ``tensorrt`` module for ``version`` that records what the builder asked of it."""
    names = Names(version)
    trt = types.ModuleType("tensorrt")
    trt.__version__ = version
    trt.calls = []
    trt.BuilderFlag = _enum(names, "BuilderFlag", {"FP16": 0, "BF16": 1, "INT8": 2, "TF32": 3},
                            PRECISION_FLAG_DOCS)
    trt.NetworkDefinitionCreationFlag = _enum(names, "NetworkDefinitionCreationFlag",
                                              {"EXPLICIT_BATCH": 0, "STRONGLY_TYPED": 1})
    trt.MemoryPoolType = _enum(names, "MemoryPoolType", {"WORKSPACE": 0})
    trt.nptype = _nptype
    for cls in (Logger, _builder(trt, names), _onnx_parser(names), _runtime(names)):
        setattr(trt, cls.__name__, cls)
    return trt


def _method(names: Names, cls: type, name: str, fn) -> None:
    if name in names:  # absent from this version's bindings: an AttributeError, as there
        setattr(cls, name, fn)


def _nptype(trt_type):  # tensorrt_bindings/__init__.py: DataType -> numpy type
    return np.dtype(trt_type).type


class Logger:
    WARNING, ERROR, INFO = 2, 1, 3

    def __init__(self, severity: int = 2) -> None:
        self.severity = severity


def _builder_config(names: Names) -> tuple[type, type]:
    """``IOptimizationProfile`` and ``IBuilderConfig`` (with the timing cache it makes) of one version."""

    class IOptimizationProfile:
        def __init__(self) -> None:
            self.shapes: dict[str, tuple] = {}

    def set_shape(self, name, lo, opt, hi):
        if not all(a <= b <= c for a, b, c in zip(lo, opt, hi)):
            raise ValueError(f"{name}: min <= opt <= max does not hold for {lo} {opt} {hi}")
        self.shapes[name] = (tuple(lo), tuple(opt), tuple(hi))

    _method(names, IOptimizationProfile, "set_shape", set_shape)

    class ITimingCache:
        def __init__(self, blob: bytes) -> None:
            self.blob = blob

    _method(names, ITimingCache, "serialize", lambda self: b"timing" + self.blob[:0])

    class IBuilderConfig:
        def __init__(self) -> None:
            self.flags, self.profiles, self.pools, self.cache = [], [], {}, None

    _method(names, IBuilderConfig, "set_memory_pool_limit", lambda self, pool, size: self.pools.__setitem__(pool, size))
    _method(names, IBuilderConfig, "set_flag", lambda self, flag: self.flags.append(flag))
    _method(names, IBuilderConfig, "add_optimization_profile",
            lambda self, p: self.profiles.append(p) or len(self.profiles) - 1)
    _method(names, IBuilderConfig, "create_timing_cache", lambda self, blob: ITimingCache(bytes(blob)))
    _method(names, IBuilderConfig, "set_timing_cache",
            lambda self, cache, ignore_mismatch: setattr(self, "cache", cache) or True)
    _method(names, IBuilderConfig, "get_timing_cache", lambda self: self.cache)
    return IOptimizationProfile, IBuilderConfig


def _builder(trt: types.ModuleType, names: Names) -> type:
    """``Builder``: networks, configs and profiles; a build records its call and serializes the ONNX path."""
    profile_class, config_class = _builder_config(names)

    class INetworkDefinition:
        def __init__(self, flags: int) -> None:
            self.flags = flags
            self.strongly_typed = bool(flags & (1 << getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", 99)))

    class Builder:
        def __init__(self, logger: Logger) -> None:
            self.logger = logger

    def build_serialized_network(self, network, config):
        trt.calls.append(("build", network, config))
        return memoryview(json.dumps({"onnx": network.source, "strongly_typed": network.strongly_typed,
                                      "profiles": len(config.profiles)}).encode())

    _method(names, Builder, "create_network", lambda self, flags=0: INetworkDefinition(flags))
    _method(names, Builder, "create_builder_config", lambda self: config_class())
    _method(names, Builder, "create_optimization_profile", lambda self: profile_class())
    _method(names, Builder, "build_serialized_network", build_serialized_network)
    return Builder


def _onnx_parser(names: Names) -> type:
    class OnnxParser:
        def __init__(self, network, logger) -> None:
            self.network, self.errors = network, []

    def parse_from_file(self, path: str) -> bool:
        onnx.load(path, load_external_data=False)  # a real parse of the graph's structure
        self.network.source = path
        return True

    _method(names, OnnxParser, "parse_from_file", parse_from_file)
    _method(names, OnnxParser, "get_error", lambda self, i: self.errors[i])
    OnnxParser.num_errors = property(lambda self: len(self.errors)) if "num_errors" in names else None
    return OnnxParser


def _runtime(names: Names) -> type:
    """``Runtime``: an "engine" deserializes to its ONNX graph, whose contexts run it on ONNX Runtime."""
    from support.fake_device import OrtEngineContext

    class IExecutionContext(OrtEngineContext):
        def __init__(self, engine) -> None:
            import onnxruntime as ort

            super().__init__(ort.InferenceSession(engine.onnx, providers=["CPUExecutionProvider"]))
            self.profile = None

    _method(names, IExecutionContext, "set_optimization_profile_async",
            lambda self, index, stream: setattr(self, "profile", index) or True)
    for name in ("set_input_shape", "set_tensor_address", "execute_async_v3"):
        assert name in names, name  # inherited from the host stand-in: the real context has them too

    class ICudaEngine:
        def __init__(self, blob: bytes) -> None:
            record = json.loads(bytes(blob))
            self.onnx, self.num_optimization_profiles = record["onnx"], record["profiles"]

    _method(names, ICudaEngine, "create_execution_context", lambda self: IExecutionContext(self))

    class Runtime:
        def __init__(self, logger: Logger) -> None:
            self.logger = logger

    _method(names, Runtime, "deserialize_cuda_engine", lambda self, blob: ICudaEngine(blob))
    return Runtime


def fake_cudart(major: int = 9, minor: int = 0):
    """The ``cuda.bindings.runtime`` calls made around builds and engine loading, for a GPU of
    compute capability major.minor."""
    props = types.SimpleNamespace(major=major, minor=minor, integrated=0)
    runtime = types.ModuleType("cuda.bindings.runtime")
    runtime.cudaGetDeviceProperties = lambda device: (0, props)
    runtime.cudaGetDeviceCount = lambda: (0, 1)
    runtime.cudaError_t = types.SimpleNamespace(cudaErrorInsufficientDriver=35)
    bindings = types.ModuleType("cuda.bindings")
    bindings.runtime = runtime
    cuda = types.ModuleType("cuda")
    cuda.bindings = bindings
    return {"cuda": cuda, "cuda.bindings": bindings, "cuda.bindings.runtime": runtime}
