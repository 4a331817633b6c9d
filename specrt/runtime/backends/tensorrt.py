"""TensorRT backend: the engines ``specrt build`` wrote, run with the KV cache resident on the GPU.

Each forward binds the past as the first ``length`` rows of the device cache and the engine's new-K/V
outputs straight into the rows after them, so the cache update costs no copy; the inputs (ids, positions,
mask: a few KB) go up and only the hidden rows of the Q new tokens come back to the host; the logits stay
in device memory and are read through the logits summary engine (top logits and the normaliser, a
whole row only when they cannot decide), or, for an engine built before it existed, copied up whole.
One execution context per optimization profile (prefill, decode/verify), each set once, so a step never
switches profiles; verify passes replay CUDA graphs captured per bucket width (see :class:`_Graph`).
Medusa heads run on their own engine when ``specrt build`` made one, else on ONNX Runtime.
This module opens and checks the engines and runs them; what one pass binds (shapes, addresses, output
and scratch buffers, the summary's) is :mod:`specrt.runtime.backends.tensorrt_io`.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from ...bundle import contract as C
from ...bundle import safety
from ...bundle.manifest import Manifest, ModelEntry, load_manifest
from ...errors import ConfigError, ContextLengthError, SpecrtError
from .base import DecoderOutput, register_backend
from .buckets import DEFAULT_BUCKETS, choose_bucket, pad_to, static_mask
from .cuda import ALIGNMENT, CudaMemory, DeviceKVCache, DeviceMemory
from .onnxruntime import OrtHeads
from .tensorrt_io import (
    PREFILL,
    VERIFY,
    EngineLimits,
    LogitsSummary,
    PassOutputs,
    Scratch,
    bind,
    choose_profile,
    tensor_plan,
)


def _import_tensorrt():
    try:
        import tensorrt as trt
    except (ImportError, OSError) as e:  # the pip stub without its libraries raises OSError
        hint = "use JetPack's TensorRT" if platform.machine() == "aarch64" else "pip install 'specrt[trt]'"
        raise ConfigError(f"TensorRT is not available ({e}); {hint}") from None
    return trt


def _trt_available() -> bool:
    try:
        _import_tensorrt()
        from cuda.bindings import runtime  # noqa: F401
    except (ConfigError, ImportError):
        return False
    return True


def _has_engines(bundle_dir: Path) -> bool:
    try:
        return bool(load_manifest(Path(bundle_dir)).engines)
    except Exception:  # auto-selection must not fail on a bundle the chosen backend will report on
        return False


def role_of(manifest: Manifest, entry: ModelEntry) -> str:
    return next((r for r, e in manifest.models.items() if e.file == entry.file), entry.file)


def engine_record(manifest: Manifest, role: str, bundle_dir: Path) -> dict[str, Any]:
    """The manifest's engine for ``role`` (target, draft, medusa), or an error saying how to build one."""
    record = manifest.engines.get(role)
    if not record:
        raise ConfigError(f"the bundle has no TensorRT engine for its {role}: run "
                          f"`specrt build --bundle {bundle_dir}` on this machine")
    return record


def check_engine(record: dict[str, Any], trt_version: str, sm: str) -> None:
    """Engines are tied to the TensorRT version and GPU they were built with; say so instead of crashing."""
    if record.get("tensorrt") != trt_version or record.get("sm") != sm:
        raise ConfigError(f"engine {record.get('file')} was built with TensorRT {record.get('tensorrt')} for "
                          f"sm {record.get('sm')}; this machine has TensorRT {trt_version}, sm {sm}: rerun "
                          "`specrt build`")


@dataclass
class OpenEngine:
    """A deserialized engine with what must outlive its contexts, and a context maker per profile."""

    engine: Any
    runtime: Any
    memory: CudaMemory
    record: dict[str, Any]

    def context(self, profile: int) -> Any:
        ctx = self.engine.create_execution_context()
        ctx.set_optimization_profile_async(profile, self.memory.stream)
        return ctx


def open_engine(bundle_dir: Path, manifest: Manifest, role: str, memory: CudaMemory | None = None) -> OpenEngine:
    """``memory``: the stream (and allocations) to share with an engine already open, e.g. the summary
    engine that reads a decoder's logits in order on the decoder's stream."""
    trt = _import_tensorrt()
    memory = memory or CudaMemory()
    from cuda.bindings import runtime as cudart

    _, props = cudart.cudaGetDeviceProperties(0)
    record = engine_record(manifest, role, bundle_dir)
    check_engine(record, trt.__version__, f"{props.major}.{props.minor}")
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine(safety.trusted_engine_bytes(Path(bundle_dir) / record["file"]))
    if engine is None:
        raise ConfigError(f"TensorRT could not load {record['file']}: rerun `specrt build`")
    return OpenEngine(engine, runtime, memory, record)


class TrtHeads:
    """Medusa heads on their TensorRT engine: hidden rows go up, top-k ids and log-probs come back."""

    def __init__(self, bundle_dir: Path, file: str, threads: int | None = None, *, context: Any = None,
                 memory: DeviceMemory | None = None, dtypes: dict[str, np.dtype] | None = None,
                 max_rows: int | None = None) -> None:
        del file, threads
        manifest = load_manifest(Path(bundle_dir))
        medusa = manifest.medusa
        assert medusa is not None
        self._engine: OpenEngine | None = None
        if context is None:
            self._engine = opened = open_engine(Path(bundle_dir), manifest, "medusa")
            trt = _import_tensorrt()
            context, memory = opened.context(0), opened.memory
            dtypes = {n: np.dtype(trt.nptype(opened.engine.get_tensor_dtype(n))) for n in ("hidden", "ids", "logprobs")}
            max_rows = int(opened.record["options"]["max_verify"])
        assert memory is not None and dtypes is not None and max_rows is not None
        self.context, self.memory, self.dtypes, self.max_rows = context, memory, dtypes, max_rows
        self.out_shape = (medusa.num_heads, medusa.topk)
        hidden_size = manifest.target.dims.hidden_size
        self.ptrs = {"hidden": memory.malloc(max_rows * hidden_size * dtypes["hidden"].itemsize),
                     "ids": memory.malloc(max_rows * medusa.num_heads * medusa.topk * dtypes["ids"].itemsize),
                     "logprobs": memory.malloc(max_rows * medusa.num_heads * medusa.topk
                                               * dtypes["logprobs"].itemsize)}

    def __call__(self, hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows = hidden.shape[1]
        if rows > self.max_rows:
            raise ContextLengthError(f"{rows} hidden rows exceed the Medusa engine's max of {self.max_rows}")
        m, ctx = self.memory, self.context
        m.to_device(self.ptrs["hidden"], np.ascontiguousarray(hidden, dtype=self.dtypes["hidden"]))
        bind(ctx, {"hidden": (hidden.shape, self.ptrs["hidden"]),
                   **{name: (None, ptr) for name, ptr in self.ptrs.items() if name != "hidden"}})
        if not ctx.execute_async_v3(m.stream):
            raise SpecrtError("TensorRT failed to run the Medusa heads (see its log above)")
        ids = np.empty((1, rows, *self.out_shape), self.dtypes["ids"])
        logprobs = np.empty((1, rows, *self.out_shape), self.dtypes["logprobs"])
        m.to_host(ids, self.ptrs["ids"])
        m.to_host(logprobs, self.ptrs["logprobs"])
        m.synchronize()
        return ids.astype(np.int64, copy=False), logprobs


def _heads(bundle_dir: Path, file: str, threads: int | None = None):
    """TensorRT heads when ``specrt build`` made a Medusa engine, else ONNX Runtime's."""
    if "medusa" in load_manifest(Path(bundle_dir)).engines:
        return TrtHeads(bundle_dir, file, threads)
    return OrtHeads(bundle_dir, file, threads)


class _Graph:
    """The verify step of one bucket width captured as a CUDA graph, on its own execution context.

    Shapes and addresses are static: the past is the first ``rows`` rows of every cache plane (a mask
    hides what is not valid yet), the new K/V go to a scratch block laid out like the cache's planes,
    and after each replay ONE strided copy moves the Q real rows into the cache at its current length.
    Writing to scratch is what makes capture safe: warm-up and capture never touch valid cache rows.
    """

    def __init__(self, decoder: TrtDecoder, cache: DeviceKVCache, bucket: int, rows: int) -> None:
        d, m = decoder.entry.dims, decoder.memory
        self.bucket, self.rows, self.cache = bucket, rows, cache
        self.ctx = decoder.context_factory(VERIFY)
        self.scratch = Scratch(m, cache, bucket)
        self.outputs = PassOutputs(m, bucket, d, decoder.kv_dtype, decoder.extra_outputs)
        self.io = {C.INPUT_IDS: m.malloc(bucket * 8), C.POSITION_IDS: m.malloc(bucket * 8),
                   C.ATTENTION_MASK: m.malloc(bucket * (rows + bucket)), **self.outputs.ptrs,
                   **{name: m.malloc(bucket * decoder.row_bytes(name)) for name in decoder.extra_inputs},
                   **decoder.row_index(bucket)}
        decoder.bind(self.ctx, tensor_plan(rows, bucket, cache, self.io, d, new_kv=self.scratch.new_kv,
                                           rows=decoder.extra_widths))
        m.memset(self.io[C.ATTENTION_MASK], 1, bucket * (rows + bucket))  # a defined warm-up input
        m.memset(self.io[C.INPUT_IDS], 0, bucket * 8)
        m.memset(self.io[C.POSITION_IDS], 0, bucket * 8)
        for name in decoder.extra_inputs:
            m.memset(self.io[name], 0, bucket * decoder.row_bytes(name))
        decoder.execute(self.ctx)  # TensorRT wants one run before capture (deferred allocations)
        self.graph = m.capture(lambda: decoder.execute(self.ctx))

    def run(self, decoder: TrtDecoder, input_ids: np.ndarray, position_ids: np.ndarray, mask: np.ndarray,
            extra: Mapping[str, np.ndarray]) -> PassOutputs:
        m, cache, b = decoder.memory, self.cache, self.bucket
        q_len, past = len(input_ids), cache.length
        m.to_device(self.io[C.INPUT_IDS], pad_to(np.asarray(input_ids, np.int64), b))
        m.to_device(self.io[C.POSITION_IDS], pad_to(np.asarray(position_ids, np.int64), b, fill=past))
        m.to_device(self.io[C.ATTENTION_MASK], static_mask(np.asarray(mask, bool), past, self.rows, b))
        for name, rows in extra.items():  # the padding rows keep their zeros: their outputs are never read
            m.to_device(self.io[name], decoder.device_rows(name, rows))
        m.replay(self.graph)
        self.scratch.commit(cache, q_len)
        return self.outputs


@register_backend("tensorrt", _trt_available, heads=_heads, accepts=_has_engines)
class TrtDecoder:
    """:class:`~specrt.runtime.backends.base.Decoder` over a TensorRT engine.

    Prefill and any pass wider than the largest bucket run eagerly on a context per profile, with the
    past and new K/V bound in place; verify passes that fit a bucket replay a captured CUDA graph
    (:class:`_Graph`, captured on first use per cache and bucket). ``context_factory`` (profile →
    execution context) and ``memory`` are normally made from the bundle; passing them in is how the
    bookkeeping is tested on machines without a GPU.
    """

    def __init__(self, bundle_dir: Path, entry: ModelEntry, threads: int | None = None, role: str = "target",
                 low_memory: bool | None = None, *,
                 context_factory: Callable[[int], Any] | None = None, memory: DeviceMemory | None = None,
                 limits: EngineLimits | None = None, graphs: bool = True,
                 buckets: tuple[int, ...] = DEFAULT_BUCKETS, summary_context: Any = None) -> None:
        """``summary_context``: an execution context of the logits summary engine (normally opened from
        the bundle when ``specrt build`` made one); without it the logits are copied up whole."""
        del threads, role, low_memory  # TensorRT runs on the GPU; host threads and memory are not its to set
        self.entry, self.kv_dtype = entry, np.dtype(entry.dtype)
        self._engine: OpenEngine | None = None  # runtime and engine must outlive the contexts made from them
        self._summary_engine: OpenEngine | None = None
        if context_factory is None:
            context_factory, memory, limits, summary_context = self._load(Path(bundle_dir), entry)
        assert memory is not None and limits is not None
        self.context_factory, self.memory, self.limits = context_factory, memory, limits
        self.contexts = [context_factory(PREFILL), context_factory(VERIFY)]
        self.provider = "TensorRT"
        self.buckets = tuple(b for b in buckets if b <= limits.max_verify) if graphs else ()
        self.graphs: dict[tuple[int, int, int], _Graph] = {}  # (cache base, cache rows, bucket) → graph
        self.graph_status = (f"CUDA graphs: verify passes of up to {max(self.buckets)} rows" if self.buckets
                             else "CUDA graphs off: opened with graphs=False")
        d, q = entry.dims, limits.max_q
        # EAGLE-3: a target exported for a head also outputs its taps; a head reads taps and features.
        self.extra_inputs = ({C.EAGLE_TAPS: entry.tap_width, C.EAGLE_FEATURES: d.hidden_size}
                             if entry.kind == "eagle3" else {})
        self.extra_outputs = {C.EAGLE_TAPS: entry.tap_width} if entry.kind == "decoder" and entry.tap_width else {}
        self.extra_widths = {**self.extra_inputs, **self.extra_outputs}
        self.outputs = PassOutputs(memory, q, d, self.kv_dtype, self.extra_outputs)
        self.io = {C.INPUT_IDS: memory.malloc(q * 8), C.POSITION_IDS: memory.malloc(q * 8),
                   C.ATTENTION_MASK: memory.malloc(limits.mask_elements), **self.outputs.ptrs,
                   **{name: memory.malloc(q * self.row_bytes(name)) for name in self.extra_inputs},
                   **self.row_index(q)}
        self._scratch: Scratch | None = None  # new K/V of eager passes at a misaligned length
        self._inputs = {C.INPUT_IDS, C.POSITION_IDS, C.ATTENTION_MASK, *self.extra_inputs,
                        *((C.LOGITS_INDEX,) if entry.logits_index else ()),
                        *(C.past_key(i) for i in range(d.num_layers)),
                        *(C.past_value(i) for i in range(d.num_layers))}
        # Host-mapped outputs (Jetson) are read in place: there is no copy for a summary to save.
        self.summary = (LogitsSummary(summary_context, memory, d.vocab_size, q)
                        if summary_context is not None and not self.outputs.mapped else None)

    def _load(self, bundle_dir: Path, entry: ModelEntry):
        manifest = load_manifest(bundle_dir)
        opened = open_engine(bundle_dir, manifest, role_of(manifest, entry))
        self._engine = opened
        summary = None
        if C.SUMMARY_ENGINE in manifest.engines and entry.dims.vocab_size >= C.SUMMARY_TOP_K:
            self._summary_engine = open_engine(bundle_dir, manifest, C.SUMMARY_ENGINE, opened.memory)
            summary = self._summary_engine.context(0)
        return opened.context, opened.memory, EngineLimits.from_options(opened.record["options"]), summary

    supports_eagle = True

    def row_index(self, rows: int) -> dict[str, int]:
        """A graph with ``logits_index``: a device buffer holding 0 .. rows-1, written once; a pass of Q
        rows binds its first Q (every row's logits). Empty for graphs without the input."""
        if not self.entry.logits_index:
            return {}
        ptr = self.memory.malloc(rows * 8)
        self.memory.to_device(ptr, np.arange(rows, dtype=np.int64))
        return {C.LOGITS_INDEX: ptr}

    def row_bytes(self, name: str) -> int:
        return self.extra_widths[name] * self.kv_dtype.itemsize

    def device_rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        """An EAGLE-3 input's (Q, width) rows in the graph's float type, checked against its width."""
        rows = np.ascontiguousarray(rows, dtype=self.kv_dtype)
        if rows.ndim != 2 or rows.shape[1] != self.extra_inputs[name]:
            raise SpecrtError(f"internal: {name} rows of shape {rows.shape}, the engine reads "
                              f"(Q, {self.extra_inputs[name]})")
        return rows

    def new_cache(self, max_context: int) -> DeviceKVCache:
        # The engine was built for at most limits.max_context positions; a longer context fails loudly
        # in choose_profile, naming the build option, rather than here at load time.
        return DeviceKVCache(self.entry.dims, min(max_context, self.limits.max_context), self.kv_dtype, self.memory)

    def bind(self, ctx: Any, plan: dict[str, tuple[tuple[int, ...], int]]) -> None:
        bind(ctx, {name: (shape if name in self._inputs else None, ptr) for name, (shape, ptr) in plan.items()})

    def execute(self, ctx: Any) -> None:
        if not ctx.execute_async_v3(self.memory.stream):
            raise SpecrtError("TensorRT failed to run a forward pass (see its log above)")

    def _graph_for(self, cache: DeviceKVCache, q_len: int) -> _Graph | None:
        """The captured step for this width, or None (eager) when no bucket fits or the past is too long."""
        bucket = choose_bucket(q_len, self.buckets) if self.buckets and cache.length else None
        rows = min(cache.max_context, self.limits.max_context - self.limits.max_verify)
        if bucket is None or cache.length > rows:
            return None
        key = (cache.base, cache.max_context, bucket)
        if key not in self.graphs:
            self.graphs[key] = _Graph(self, cache, bucket, rows)
        return self.graphs[key]

    def forward(self, cache: DeviceKVCache, input_ids: np.ndarray, position_ids: np.ndarray,
                mask: np.ndarray, extra: Mapping[str, np.ndarray] | None = None,
                logits_rows: int | None = None) -> DecoderOutput:
        """``extra``: an EAGLE-3 head's eagle_taps / eagle_features rows, (Q, width) each. ``logits_rows`` is
        not used: the engine computes every row's logits (its logits_index is 0 .. Q-1, set once)."""
        del logits_rows
        q_len, extra = len(input_ids), dict(extra or {})
        if set(extra) != set(self.extra_inputs):
            raise SpecrtError(f"internal: this engine reads {sorted(self.extra_inputs) or 'no extra inputs'}, "
                              f"was given {sorted(extra) or 'none'}")
        cache.ensure_room(q_len)
        graph = self._graph_for(cache, q_len)
        if graph is not None:
            outputs = graph.run(self, input_ids, position_ids, mask, extra)
        else:
            outputs = self._eager(cache, input_ids, position_ids, mask, extra)
        logits, hidden, made = outputs.fetch(q_len, logits=self.summary is None)
        self.memory.synchronize()
        # host-mapped (Jetson): read in place, nothing copied
        rows = 0 if self.outputs.mapped else hidden.nbytes + sum(r.nbytes for r in made.values())
        if self.summary is not None:
            return DecoderOutput(None, hidden, copied_bytes=rows, extra=made,
                                 device_logits=self.summary.rows(outputs.ptrs[C.LOGITS], q_len))
        return DecoderOutput(logits=logits, hidden=hidden, extra=made,
                             copied_bytes=rows + (0 if self.outputs.mapped else logits.nbytes))

    def scratch_for(self, cache: DeviceKVCache) -> Scratch | None:
        """Where an eager pass writes its new K/V: in place (None) when the cache's length puts them on
        an aligned address, else the decoder's scratch block."""
        if (cache.length * cache.row_bytes) % ALIGNMENT == 0:
            return None
        if self._scratch is None or self._scratch.row_bytes != cache.row_bytes:
            self._scratch = Scratch(self.memory, cache, self.limits.max_q)
        return self._scratch

    def _eager(self, cache: DeviceKVCache, input_ids: np.ndarray, position_ids: np.ndarray, mask: np.ndarray,
               extra: Mapping[str, np.ndarray]) -> PassOutputs:
        q_len, past, m = len(input_ids), cache.length, self.memory
        ctx = self.contexts[choose_profile(past, q_len, self.limits)]
        m.to_device(self.io[C.INPUT_IDS], np.ascontiguousarray(input_ids, dtype=np.int64))
        m.to_device(self.io[C.POSITION_IDS], np.ascontiguousarray(position_ids, dtype=np.int64))
        m.to_device(self.io[C.ATTENTION_MASK], np.ascontiguousarray(mask, dtype=bool))
        for name, rows in extra.items():
            m.to_device(self.io[name], self.device_rows(name, rows))
        scratch = self.scratch_for(cache)
        self.bind(ctx, tensor_plan(past, q_len, cache, self.io, self.entry.dims,
                                   new_kv=scratch.new_kv if scratch else None, rows=self.extra_widths))
        self.execute(ctx)
        if scratch:
            scratch.commit(cache, q_len)
        return self.outputs
