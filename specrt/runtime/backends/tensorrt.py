"""TensorRT backend: the engines ``specrt build`` wrote, run with the KV cache resident on the GPU.

Each forward binds the past as the first ``length`` rows of the device cache and the engine's new-K/V
outputs straight into the rows after them, so the cache update costs no copy; the inputs (ids, positions,
mask: a few KB) go up and only the hidden rows of the Q new tokens come back to the host; the logits stay
in device memory and are read through the logits summary engine (top logits and the normaliser, a
whole row only when they cannot decide), or, for an engine built before it existed, copied up whole.
One execution context per optimization profile (prefill, decode/verify), each set once, so a step never
switches profiles; verify passes replay CUDA graphs captured per bucket width (see :class:`_Graph`).
Medusa heads run on their own engine when ``specrt build`` made one, else on ONNX Runtime.
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
from .cuda import ALIGNMENT, CudaMemory, DeviceKVCache, DeviceMemory, aligned
from .onnxruntime import OrtHeads
from .summary import SummaryLogits, row_readers, summary_buffers

PREFILL, VERIFY = 0, 1  # profile indices, in the order specrt.export.tensorrt.profiles writes them


@dataclass(frozen=True)
class EngineLimits:
    """The shape ranges the engine was built for (``specrt build`` options)."""

    max_context: int
    max_prompt: int
    max_verify: int

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> EngineLimits:
        return cls(int(options["max_context"]), int(options["max_prompt"]), int(options["max_verify"]))

    @property
    def max_q(self) -> int:
        return max(self.max_prompt, self.max_verify)

    @property
    def mask_elements(self) -> int:
        """Largest Q·(P+Q) either profile admits."""
        return max(self.max_prompt ** 2, self.max_verify * self.max_context)


def choose_profile(past: int, q_len: int, limits: EngineLimits) -> int:
    """Prefill profile for a first chunk (P = 0), decode/verify for the rest; an error names the limit."""
    if past == 0 and q_len <= limits.max_prompt:
        return PREFILL
    if q_len <= limits.max_verify and past <= limits.max_context - limits.max_verify:
        return VERIFY
    if past == 0:
        raise ContextLengthError(f"a {q_len}-token prompt exceeds the engine's max prompt of {limits.max_prompt}; "
                                 "rebuild with a larger `specrt build --max-prompt`")
    if q_len > limits.max_verify:
        raise ContextLengthError(f"{q_len} tokens in one pass exceed the engine's max of {limits.max_verify} "
                                 "(gamma + 1 or the tree size); rebuild with a larger `specrt build --max-verify`")
    raise ContextLengthError(f"{past} cached positions exceed the engine's max context "
                             f"({limits.max_context} - {limits.max_verify}); rebuild with a larger --max-context")


def tensor_plan(past: int, q_len: int, cache: DeviceKVCache, io: dict[str, int], dims: C.ModelDims,
                new_kv: list[tuple[int, int]] | None = None, rows: dict[str, int] | None = None
                ) -> dict[str, tuple[tuple[int, ...], int]]:
    """Name → (shape, device address) for one forward: the past is a prefix of each cache plane and the
    new K/V land right after it (``ptr + past * row_bytes``) unless ``new_kv`` gives other (key, value)
    addresses per layer (a scratch block: see :class:`Scratch`); ``io`` holds the fixed I/O buffers.
    ``rows``: further [1, Q, width] tensors by name (an EAGLE-3 target's taps, a head's taps and features).
    A graph with ``logits_index`` (``io`` has its buffer: 0, 1, 2, ...) computes every row's logits here."""
    kv, offset = (dims.num_kv_heads, dims.head_dim), past * cache.row_bytes
    plan: dict[str, tuple[tuple[int, ...], int]] = {
        C.INPUT_IDS: ((1, q_len), io[C.INPUT_IDS]),
        C.POSITION_IDS: ((1, q_len), io[C.POSITION_IDS]),
        C.ATTENTION_MASK: ((1, 1, q_len, past + q_len), io[C.ATTENTION_MASK]),
        C.LOGITS: ((1, q_len, dims.vocab_size), io[C.LOGITS]),
        C.HIDDEN: ((1, q_len, dims.hidden_size), io[C.HIDDEN]),
        **{name: ((1, q_len, width), io[name]) for name, width in (rows or {}).items()},
        **({C.LOGITS_INDEX: ((q_len,), io[C.LOGITS_INDEX])} if C.LOGITS_INDEX in io else {}),
    }
    destinations = new_kv or [(kp + offset, vp + offset) for kp, vp in zip(cache.key_ptrs, cache.value_ptrs)]
    for i, (kp, vp, (nk, nv)) in enumerate(zip(cache.key_ptrs, cache.value_ptrs, destinations)):
        plan[C.past_key(i)] = ((1, past, *kv), kp)
        plan[C.past_value(i)] = ((1, past, *kv), vp)
        plan[C.new_key(i)] = ((1, q_len, *kv), nk)
        plan[C.new_value(i)] = ((1, q_len, *kv), nv)
    return plan


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


class Scratch:
    """Where new K/V go when the cache cannot take them in place: TensorRT needs 256-byte aligned
    addresses, and ``ptr + past * row_bytes`` is aligned only when past * row_bytes is a multiple of
    256 (always for 256-byte rows, every 4th position for 64-byte rows, never guaranteed for 384).
    Planes like the cache's (K0, V0, K1, ...), each starting aligned; after the pass ONE strided copy
    moves the Q rows of every plane into the cache at its length."""

    def __init__(self, memory: DeviceMemory, cache: DeviceKVCache, rows: int) -> None:
        self.memory, self.row_bytes, self.planes = memory, cache.row_bytes, cache.planes
        self.pitch = aligned(rows * cache.row_bytes)
        self.base = memory.malloc(self.planes * self.pitch)
        ptrs = [self.base + p * self.pitch for p in range(self.planes)]
        self.new_kv = list(zip(ptrs[::2], ptrs[1::2]))

    def commit(self, cache: DeviceKVCache, q_len: int) -> None:
        """Copy the first ``q_len`` rows of every scratch plane into the cache right after its valid rows."""
        rb = self.row_bytes
        self.memory.copy_2d(cache.base + cache.length * rb, cache.plane_bytes, self.base, self.pitch, q_len * rb,
                            self.planes)


def bind(ctx: Any, plan: dict[str, tuple[tuple[int, ...] | None, int]]) -> None:
    """Set each tensor's shape (inputs: a shape; outputs: None) and address on an execution context.
    TensorRT answers a refused setting (a shape outside the profile, an address it cannot use) with
    False and carries on; going on would run on stale bindings, so a refusal is an error here."""
    for name, (shape, ptr) in plan.items():
        if ptr % ALIGNMENT:
            raise SpecrtError(f"internal: {name!r} would be bound at {ptr:#x}, not {ALIGNMENT}-byte aligned")
        if shape is not None and not ctx.set_input_shape(name, tuple(shape)):
            raise SpecrtError(f"TensorRT refused the shape {tuple(shape)} for {name!r} (outside the engine's "
                              "optimization profile: rebuild with larger --max-prompt/--max-verify/--max-context)")
        if not ctx.set_tensor_address(name, ptr):
            raise SpecrtError(f"TensorRT refused the address {ptr:#x} for {name!r} (TensorRT needs 256-byte "
                              "aligned device addresses)")


class _Outputs:
    """Where an engine writes logits and hidden rows: device buffers copied back after each pass, or on
    integrated GPUs (Jetson: one memory for CPU and GPU) host-mapped memory, read with no copy at all."""

    def __init__(self, memory: DeviceMemory, rows: int, dims: C.ModelDims, dtype: np.dtype,
                 extra: dict[str, int] | None = None) -> None:
        """``extra``: further outputs by name and width (an EAGLE-3 target's taps), rows as the hidden's."""
        self.memory, self.mapped = memory, bool(getattr(memory, "integrated", False))
        self.ptrs: dict[str, int] = {}
        self.host: dict[str, np.ndarray] = {}
        self.extra = dict(extra or {})
        for name, shape, dt in ((C.LOGITS, (rows, dims.vocab_size), np.dtype(np.float32)),
                                (C.HIDDEN, (rows, dims.hidden_size), dtype),
                                *((name, (rows, width), dtype) for name, width in self.extra.items())):
            nbytes = rows * shape[1] * dt.itemsize
            if self.mapped:
                self.ptrs[name], raw = memory.mapped(nbytes)
                self.host[name] = raw.view(dt).reshape(shape)
            else:
                self.ptrs[name], self.host[name] = memory.malloc(nbytes), np.empty(shape, dt)

    def fetch(self, q_len: int, logits: bool = True) -> tuple[np.ndarray | None, np.ndarray, dict[str, np.ndarray]]:
        """The first ``q_len`` rows (logits, hidden, extra outputs), valid once the stream is synchronized;
        ``logits=False`` leaves the logits in device memory (None)."""
        rows, hidden = self.host[C.LOGITS][:q_len] if logits else None, self.host[C.HIDDEN][:q_len]
        extra = {name: self.host[name][:q_len] for name in self.extra}
        if not self.mapped:
            if rows is not None:
                self.memory.to_host(rows, self.ptrs[C.LOGITS])
            for name, host in ((C.HIDDEN, hidden), *extra.items()):
                self.memory.to_host(host, self.ptrs[name])
        return rows, hidden, extra


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
        self.outputs = _Outputs(m, bucket, d, decoder.kv_dtype, decoder.extra_outputs)
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
            extra: Mapping[str, np.ndarray]) -> _Outputs:
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
        d, q = entry.dims, limits.max_q
        # EAGLE-3: a target exported for a head also outputs its taps; a head reads taps and features.
        self.extra_inputs = ({C.EAGLE_TAPS: entry.tap_width, C.EAGLE_FEATURES: d.hidden_size}
                             if entry.kind == "eagle3" else {})
        self.extra_outputs = {C.EAGLE_TAPS: entry.tap_width} if entry.kind == "decoder" and entry.tap_width else {}
        self.extra_widths = {**self.extra_inputs, **self.extra_outputs}
        self.outputs = _Outputs(memory, q, d, self.kv_dtype, self.extra_outputs)
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
        self.summary = (_Summary(summary_context, memory, d.vocab_size, q)
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
               extra: Mapping[str, np.ndarray]) -> _Outputs:
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


class _Summary:
    """The logits summary engine over a decoder's logits in device memory, on the decoder's stream: its
    outputs (a few hundred bytes a row) are what comes up, and a whole row only when asked."""

    def __init__(self, context: Any, memory: DeviceMemory, vocab: int, max_rows: int) -> None:
        self.context, self.memory, self.vocab = context, memory, vocab
        self.host = summary_buffers(max_rows)
        self.ptrs = {name: memory.malloc(a.nbytes) for name, a in self.host.items()}
        self.inv_t = memory.malloc(4)

    def rows(self, logits_ptr: int, q_len: int) -> SummaryLogits:
        row_bytes = self.vocab * 4

        def summarize(start: int, rows: int, inv_t: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            skip = 0
            if (start * row_bytes) % ALIGNMENT:  # TensorRT binds aligned addresses only: from row 0 then
                start, rows, skip = 0, start + rows, start
            m = self.memory
            m.to_device(self.inv_t, np.array([inv_t], np.float32))
            bind(self.context, {C.SUMMARY_LOGITS: ((rows, self.vocab), logits_ptr + start * row_bytes),
                                C.SUMMARY_INV_T: ((1,), self.inv_t),
                                **{name: (None, ptr) for name, ptr in self.ptrs.items()}})
            if not self.context.execute_async_v3(m.stream):
                raise SpecrtError("TensorRT failed to run the logits summary (see its log above)")
            out = []
            for name in (C.SUMMARY_VALUES, C.SUMMARY_IDS, C.SUMMARY_LSE):  # the rows asked for alone
                a = self.host[name][skip:rows]
                m.to_host(a, self.ptrs[name] + skip * self.host[name][0].nbytes)
                out.append(a)
            m.synchronize()
            return tuple(a.copy() for a in out)

        fetch_row, fetch_logit = row_readers(self.memory, logits_ptr, self.vocab)
        return SummaryLogits(q_len, self.vocab, summarize, fetch_row, fetch_logit=fetch_logit)
