"""ONNX Runtime backend: one session per model, created once; the KV cache bound in place via IOBinding.

On the CUDA execution provider the cache lives in device memory (:class:`~specrt.runtime.backends.cuda.DeviceKVCache`)
and is bound by device address, so only ids, positions and the mask go up; the logits stay in device
memory too, and the step reads them through the logits summary graph run on the same provider
(:class:`~specrt.runtime.backends.summary.SummaryLogits`: top logits and the normaliser, a whole row only when
they cannot decide). On a static gqa graph (contract.GQA_STATIC_GRAPH: causal only, no mask goes up) the verify steps
replay CUDA graphs through ORT's own CUDA-graph mode (:mod:`.ort_graphs`); other graphs' shapes grow every step:
eager.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from ...bundle import contract as C
from ...bundle.manifest import ModelEntry
from ...errors import BundleError, ConfigError
from ..kvcache import KVCache
from ..masks import TREES_NEED, is_causal
from .base import DecoderOutput, check_threads, register_backend
from .buckets import DEFAULT_BUCKETS
from .cuda import CudaMemory, DeviceKVCache, DeviceMemory
from .ort_graphs import EAGER_ID, CapturedSteps, graph_problem, open_session, run_options, say_once
from .summary import SummaryLogits, row_readers, summary_buffers


def _ort_available() -> bool:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def choose_providers(available: list[str], cuda_graph: bool = False) -> list:
    """CUDA when this onnxruntime build has it, always with CPU as the fallback; ``cuda_graph``: in ORT's
    CUDA-graph mode (runs then choose their graph with the gpu_graph_id run option)."""
    cuda = ("CUDAExecutionProvider", {"enable_cuda_graph": "1"}) if cuda_graph else "CUDAExecutionProvider"
    return ([cuda] if "CUDAExecutionProvider" in available else []) + ["CPUExecutionProvider"]


# A helper model (draft, Medusa heads) below this size runs on the calling thread: its ops are too small to
# gain from a pool (demo int4 pair, draft method: 527 → 561 tokens/s), and it then leaves the target's
# spinning workers alone.
_SMALL_HELPER_BYTES = 64 * 2**20


# A default CPU session's copies of the weights, per byte of the graph's: fp16 MatMuls run through Casts
# that ONNX Runtime inserts and constant-folds into an fp32 copy of every weight (2); fp32 weights are
# prepacked (1). The graph's own bytes stay resident when they are in the .onnx file (read in: 1), and
# mostly not when they are external data (memory-mapped: page cache the kernel can drop once the copies
# are made; 0.3 is the transient). Peak anonymous memory measured per byte of graph: Llama-3.2-1B dims
# fp16 target 2.3 (external), its draft ~3 (in the file); fp32 1.2 and 2; Phi-3-mini dims, the whole
# process: fp16 2.0, fp32 1.0.
SESSION_COPIES = {"float16": 2.0, "float32": 1.0}
IN_FILE, EXTERNAL = 1.0, 0.3


@dataclass(frozen=True)
class MemoryPlan:
    low_memory: bool
    reason: str  # one line: why this session is the low-memory one; "" for the default session


def default_session_bytes(file_bytes: int, external_bytes: int, dtype: str) -> int:
    """Estimated peak of a default CPU session over a graph with ``file_bytes`` in its .onnx file and
    ``external_bytes`` of external data."""
    copies = SESSION_COPIES[dtype] * (file_bytes + external_bytes)
    return int(copies + IN_FILE * file_bytes + EXTERNAL * external_bytes)


def plan_memory(file_bytes: int, external_bytes: int, dtype: str, available: int | None,
                low_memory: bool | None) -> MemoryPlan:
    """``low_memory``: True/False force the session kind; None picks the low-memory one when the default
    would not fit in ``available`` bytes (None: unknown, so the default)."""
    if low_memory is not None:
        return MemoryPlan(low_memory, "low-memory session: asked for" if low_memory else "")
    need = default_session_bytes(file_bytes, external_bytes, dtype)
    if available is None or need <= available:
        return MemoryPlan(False, "")
    gb = 1e9
    return MemoryPlan(True, f"low-memory session: a default one would hold ~{need / gb:.1f} GB for "
                            f"{(file_bytes + external_bytes) / gb:.1f} GB of {dtype} weights, "
                            f"{available / gb:.1f} GB available")


def available_memory(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """MemAvailable from /proc/meminfo in bytes; None where there is none (not Linux)."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def low_memory_options(opts) -> list[str]:
    """Set ``opts`` (an ``ort.SessionOptions``) for a session that keeps no second copy of the weights;
    returns the optimizers to disable. fp16 MatMuls then cast their weight at run time (the same
    numbers), priority order runs each Cast next to its MatMul so one fp32 weight is alive at a time,
    and without the arena that copy goes back to the OS. Each pass pays for the casts."""
    import onnxruntime as ort

    opts.enable_cpu_mem_arena = False
    opts.add_session_config_entry("session.disable_prepacking", "1")
    opts.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    return ["ConstantFolding", "FuseFp16InitializerToFp32NodeTransformer"]


# ONNX Runtime's log severity for specrt's sessions: fatal only. ORT logs a failing node (a coloured
# "[E:onnxruntime:...] Non-zero status code returned while running ..." line on stderr) and then raises the
# same message, which specrt turns into its one-line error; severity 3 (error) printed both.
QUIET = 4


# The width of the process's shared intra-op pool (ORT's global thread pool) once share_threads made it.
_shared_pool: dict[str, int] = {}
_PER_SESSION_REFUSED = "use_per_session_threads must be false"  # ORT's words once a global pool exists


def share_threads(threads: int | None) -> int:
    """Make every ONNX Runtime session this process creates from now on run on one shared intra-op pool of
    ``threads`` workers (None or 0: ORT's default, one per physical core); returns the pool's width.

    With one pool the target's spinning workers also run the draft's or EAGLE head's passes between target
    passes, on every core, where a pool of its own would fight the target's for the cores or run on one
    thread (SmolLM2-135M's head pass 2.2-2.4 → 1.4-1.7 ms on 2 cores). ORT allows one such pool per process, made
    once, and then refuses sessions with pools of their own, in specrt and in any other code of the process:
    hence a choice of the process's owner (the CLI makes it; an app passes ``shared_threads=True`` to
    :func:`specrt.load`). A later call keeps the first width."""
    import onnxruntime as ort

    threads = check_threads(threads)
    if "threads" not in _shared_pool:
        try:
            ort.set_global_thread_pool_sizes(threads or 0, 1)
        except Exception as e:  # other code of this process made it first: its width stays (0: not known)
            if "already been created" not in str(e):
                raise
            threads = 0
        _shared_pool["threads"] = threads or 0
    return _shared_pool["threads"]


def session_options(shared: bool | None = None):
    """A new ``ort.SessionOptions`` this process's ONNX Runtime accepts: on the shared pool once
    :func:`share_threads` made it (``shared`` None), or as ``shared`` says."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    if "threads" in _shared_pool if shared is None else shared:
        opts.use_per_session_threads = False
    return opts


def _session(path: Path, threads: int | None, helper: bool = False, plan: MemoryPlan = MemoryPlan(False, ""),
             cuda_graph: bool = False):
    """``helper``: a model run between target passes. With pools of their own only the target's spins.
    ``cuda_graph``: the CUDA provider in its CUDA-graph mode (see :mod:`.ort_graphs`).

    The target's workers spin between its nodes (a wake-up per node cost an int4 demo step 1.7 → 2.6 ms);
    a helper's pool must not spin as well, or the two fight for the cores (target step +50 % on 2 cores).
    On the process's shared pool (:func:`share_threads`) every session's nodes run on the same workers.
    """
    import onnxruntime as ort

    def options(shared: bool):
        opts = session_options(shared)
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = QUIET
        if not shared:
            opts.intra_op_num_threads = threads or 0
            if helper:
                opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
                if C.graph_bytes(path) < _SMALL_HELPER_BYTES:
                    opts.intra_op_num_threads = 1
        return opts, low_memory_options(opts) if plan.low_memory else []

    def create(shared: bool):
        opts, disabled = options(shared)
        return ort.InferenceSession(str(path), opts, disabled_optimizers=disabled,
                                    providers=choose_providers(ort.get_available_providers(), cuda_graph))

    shared = "threads" in _shared_pool
    try:
        try:
            return create(shared)
        except Exception as e:
            if shared or _PER_SESSION_REFUSED not in str(e):
                raise
            return create(True)  # other code of this process made ORT's global pool: every session must use it
    except Exception as e:  # onnxruntime raises its own untyped errors for bad files
        raise BundleError(f"cannot load {path}: {one_line(e)}") from None


def one_line(error: Exception, limit: int = 400) -> str:
    """ONNX Runtime's message on one line: its shape errors spread the figures that matter over several."""
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def run_graph(run, file: str, *args):
    """``run(*args)`` (a session's run), its failure one line naming the graph: a graph that does not run as its
    manifest says (a shape the manifest could not tell, an id past its embedding) is the bundle's fault."""
    try:
        return run(*args)
    except Exception as e:  # ORT's own untyped errors (Fail, InvalidArgument, RuntimeException)
        raise BundleError(f"ONNX Runtime could not run {file}: {one_line(e)}") from None


class OrtHeads:
    def __init__(self, bundle_dir: Path, file: str, threads: int | None = None) -> None:
        self.session = _session(Path(bundle_dir) / file, threads, helper=True)
        self.input = self.session.get_inputs()[0]
        self.file = file

    def __call__(self, hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ids, logprobs = run_graph(self.session.run, self.file, None,
                                  {self.input.name: hidden.astype(np.dtype(self.dtype), copy=False)})
        return ids, logprobs

    @property
    def dtype(self) -> str:
        return "float16" if self.input.type == "tensor(float16)" else "float32"


class _Binder:
    """An ``IOBinding`` that binds a name again only when its buffer, shape or type changed (binding a
    name again replaces it; ONNX Runtime reads a bound buffer by address at each run). A steady one-row
    step on a gqa graph then rebinds the attention mask alone, not the ~6 names it did (~8 µs each)."""

    def __init__(self, binding) -> None:
        self.binding = binding
        self._bound: dict[tuple[str, bool], tuple] = {}

    def bind(self, name: str, device: str, dtype: np.dtype, shape: tuple[int, ...] | list[int], ptr: int,
             output: bool = False) -> None:
        key, value = (name, output), (device, dtype, tuple(shape), ptr)
        if self._bound.get(key) != value:
            (self.binding.bind_output if output else self.binding.bind_input)(name, device, 0, dtype, list(shape), ptr)
            self._bound[key] = value


_ORT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(int64)": "int64",
              "tensor(int32)": "int32", "tensor(bool)": "bool"}


def io_problem(session, entry: ModelEntry) -> str | None:
    """What differs between the session's graph and its manifest entry's inputs and outputs, or None."""
    types = lambda args: {a.name: _ORT_TYPES.get(a.type, a.type) for a in args}  # noqa: E731
    return C.io_mismatch(entry.io(), types(session.get_inputs()), types(session.get_outputs()))


@register_backend("onnxruntime", _ort_available, heads=OrtHeads)
class OrtDecoder:
    def __init__(self, bundle_dir: Path, entry: ModelEntry, threads: int | None = None, role: str = "target",
                 low_memory: bool | None = None, *, memory: DeviceMemory | None = None,
                 device_logits: bool | None = None, graphs: bool | None = None,
                 buckets: tuple[int, ...] = DEFAULT_BUCKETS, wrap_session: Callable[[Any], Any] | None = None) -> None:
        """``low_memory``: the session that keeps no fp32 copies of the weights (:func:`low_memory_options`);
        None: when a default one would not fit in the memory available (on the CPU provider only; the CUDA
        provider keeps weights in device memory). ``memory``: where the KV cache lives; default host arrays
        on CPU, CUDA memory on the CUDA provider. ``device_logits``: leave the logits in ``memory`` and
        summarise them there (default: on CUDA). ``graphs``: replay verify steps of up to max(``buckets``)
        rows as CUDA graphs (:mod:`.ort_graphs`; default: on CUDA, where the graph allows it; else eager,
        saying why in one line). ``wrap_session``: applied to the session made (how tests stand in for
        ORT's CUDA-graph mode on a CPU)."""
        import onnxruntime as ort

        path = Path(bundle_dir) / entry.file
        on_cpu = choose_providers(ort.get_available_providers()) == ["CPUExecutionProvider"]
        self.memory_plan = plan_memory(*C.graph_file_bytes(path), entry.dtype,
                                       available_memory() if on_cpu else None, low_memory)
        graphs = not on_cpu if graphs is None else graphs
        why = graph_problem(ort.__version__, entry, cuda=not on_cpu) if graphs else None
        make = lambda cuda_graph: _session(path, threads, role != "target", self.memory_plan, cuda_graph)  # noqa: E731
        self.session, why = open_session(make, graphs and why is None and not on_cpu, why)
        if wrap_session is not None:
            self.session = wrap_session(self.session)
        problem = io_problem(self.session, entry)
        if problem:
            if entry.graph == C.GQA_STATIC_GRAPH and f"unexpected {C.ATTENTION_MASK}" in problem:
                problem += " (a gqa-static graph from before it dropped its mask: export it again)"
            raise BundleError(f"{entry.file} does not match its manifest entry: {problem}")
        self.entry = entry
        self.provider = self.session.get_providers()[0]  # what ORT really uses, not what was asked
        self.kv_device = "cuda" if self.provider == "CUDAExecutionProvider" else "cpu"
        self.memory = memory if memory is not None or self.kv_device == "cpu" else CudaMemory()
        self.kv_dtype = np.dtype(entry.dtype)
        self.binding = _Binder(self.session.io_binding())
        self._bound: list[np.ndarray] = []  # arrays of this pass the binding points at (_bind)
        self._inputs: dict[str, np.ndarray] = {}  # one buffer per input, rewritten in place each pass (_put)
        self._views: dict[int, tuple[dict, dict]] = {}  # output rows and addresses per row count (_outputs)
        self._kv_names = [(C.past_key(i), C.past_value(i), C.new_key(i), C.new_value(i))
                          for i in range(entry.dims.num_layers)]
        self._kv_shape = [entry.dims.num_kv_heads, entry.dims.head_dim]
        # A GroupQueryAttention graph reads and writes each layer's one cache buffer in place: bound once per
        # cache (the cache it is bound to, kept alive by this reference), never per pass.
        self.shared_kv = entry.graph in C.SHARED_KV_GRAPHS
        self.static = entry.graph == C.GQA_STATIC_GRAPH  # lengths from seqlens_k, no mask: causal only
        self._kv_for: KVCache | DeviceKVCache | None = None
        if device_logits is None:
            device_logits = self.kv_device == "cuda"
        # TopK needs at least K ids per row; a vocabulary that small is copied whole anyway.
        self.summary = (_Summary(self.memory, self.kv_device, entry.dims.vocab_size)
                        if device_logits and self.memory is not None and entry.dims.vocab_size >= C.SUMMARY_TOP_K
                        else None)
        # Host buffers for the outputs; no logits rows when they stay in device memory.
        self._logits = np.empty((1, 0, 0 if self.summary else entry.dims.vocab_size), np.float32)
        self._hidden = np.empty((1, 0, entry.dims.hidden_size), self.kv_dtype)
        # A target exported for an EAGLE-3 head also outputs the hidden states its head reads.
        self._taps = np.empty((1, 0, entry.tap_width), self.kv_dtype) if entry.kind == "decoder" and entry.tap_width \
            else None
        if graphs and why is None and self.memory is None:
            why = "the KV cache is in host memory"
        self.graph_note = f"{role}: CUDA graphs off, steps run eagerly: {why}" if graphs and why else None
        summarize = (lambda q_len, ptr: self.summary.rows(q_len, ptr)) if self.summary is not None else None
        self.steps = (CapturedSteps(self.session, entry, self.memory, self.kv_device, summarize, buckets)
                      if graphs and why is None and self.memory is not None else None)
        say_once(self.graph_note)
        self._eager_options = run_options(EAGER_ID) if self.steps is not None else None

    @property
    def graph_status(self) -> str | None:
        """One line for --stats: the captured buckets, or why steps run eagerly; None off CUDA."""
        return self.steps.status if self.steps is not None else self.graph_note

    supports_eagle = True
    supports_dflash = True  # a DFlash draft runs beside it (backends.ort_dflash), reading its taps

    def new_cache(self, max_context: int) -> KVCache | DeviceKVCache:
        if self.memory is None:
            return KVCache(self.entry.dims, max_context, self.kv_dtype, heads_major=self.shared_kv)
        return DeviceKVCache(self.entry.dims, max_context, self.kv_dtype, self.memory, heads_major=self.shared_kv)

    def _outputs(self, q_len: int, rows: int) -> dict[str, np.ndarray]:
        """The outputs of a q_len-row pass with ``rows`` rows of logits by contract name, bound (views and
        their addresses made once per row count; bound again only after another). Logits left on a device:
        see ``forward``."""
        made = self._views.get((q_len, rows))
        if made is None:
            if self._logits.shape[1] < rows:
                self._logits = np.empty((1, rows, self._logits.shape[2]), np.float32)
                self._views.clear()
            if self._hidden.shape[1] < q_len:  # grows to the longest prompt seen, then stays
                self._hidden = np.empty((1, q_len, self.entry.dims.hidden_size), self.kv_dtype)
                if self._taps is not None:
                    self._taps = np.empty((1, q_len, self.entry.tap_width), self.kv_dtype)
                self._views.clear()
            views = {C.LOGITS: self._logits[:, :rows], C.HIDDEN: self._hidden[:, :q_len]}
            if self._taps is not None:
                views[C.EAGLE_TAPS] = self._taps[:, :q_len]
            if self.summary is not None:
                del views[C.LOGITS]
            made = self._views[q_len, rows] = views, {name: view.ctypes.data for name, view in views.items()}
        views, ptrs = made
        for name, view in views.items():
            self.binding.bind(name, "cpu", view.dtype, view.shape, ptrs[name], output=True)
        return views

    def _bind(self, name: str, arr: np.ndarray, output: bool = False) -> None:
        # ORT reads a bound array by address when the session runs: keep it alive until the next pass rebinds.
        self._bound.append(arr)
        self.binding.bind(name, "cpu", arr.dtype, arr.shape, arr.ctypes.data, output)

    def _put(self, name: str, values: np.ndarray, shape: tuple[int, ...], dtype: np.dtype) -> None:
        """Write ``values`` into ``name``'s own input buffer, bound again only when its shape changes: in a
        steady step (same row count) the ids, positions and any extra rows cost a copy, not a binding."""
        buf = self._inputs.get(name)
        if buf is None or buf.shape != shape:
            buf = self._inputs[name] = np.empty(shape, dtype)
            self.binding.bind(name, "cpu", buf.dtype, shape, buf.ctypes.data)
        buf.reshape(np.shape(values))[...] = values  # converts (e.g. float32 rows into an fp16 graph)

    def _bind_cache(self, cache: KVCache | DeviceKVCache) -> None:
        """Bind ``cache``'s buffers as past_key.N and present_key.N (a GQA graph), unless they already are."""
        if self._kv_for is cache:
            return
        shape, dt, dev = (1, self._kv_shape[0], cache.max_context, self._kv_shape[1]), self.kv_dtype, self.kv_device
        for i, (kp, vp) in enumerate(zip(cache.key_ptrs, cache.value_ptrs)):
            self.binding.bind(C.past_key(i), dev, dt, shape, kp)
            self.binding.bind(C.past_value(i), dev, dt, shape, vp)
            self.binding.bind(C.present_key(i), dev, dt, shape, kp, output=True)
            self.binding.bind(C.present_value(i), dev, dt, shape, vp, output=True)
        self._kv_for = cache

    def forward(self, cache: KVCache | DeviceKVCache, input_ids: np.ndarray, position_ids: np.ndarray,
                mask: np.ndarray, extra: Mapping[str, np.ndarray] | None = None,
                logits_rows: int | None = None) -> DecoderOutput:
        """``extra``: an EAGLE-3 head's eagle_taps / eagle_features rows, (Q, width) each. ``logits_rows``:
        on a graph with ``logits_index``, the logits of the last R rows only (None: every row's)."""
        q_len, past = len(input_ids), cache.length
        if self.static and not is_causal(mask, past):  # the generator refuses tree methods first (runs_trees)
            raise ConfigError(f"{self.entry.file} is a gqa-static graph, causal only: it cannot run a token tree's "
                              f"mask; {TREES_NEED}")
        rows = q_len if logits_rows is None or not self.entry.logits_index else min(logits_rows, q_len)
        cache.ensure_room(q_len)
        step = self.steps.bucket_for(cache, q_len) if self.steps is not None else None
        if step is not None:  # a captured verify step: its own buffers and binding, every row's logits
            run = lambda binding, options: run_graph(self.session.run_with_iobinding, self.entry.file,  # noqa: E731
                                                     binding, options)
            return self.steps.run(step, input_ids, position_ids, extra or {}, run)
        b = self.binding
        if self.shared_kv:
            self._bind_cache(cache)  # binding a name again replaces it: the cache's bindings stay
        self._bound = []
        self._put(C.INPUT_IDS, input_ids, (1, q_len), np.dtype(np.int64))
        self._put(C.POSITION_IDS, position_ids, (1, q_len), np.dtype(np.int64))
        if self.static:  # the lengths from seqlens_k; no mask (the op's causality is the pass's mask)
            self._put(C.SEQLENS_K, np.array([past + q_len - 1]), (1,), np.dtype(np.int32))
        else:  # the mask grows by a column every pass: bound anew each time (no copy when it is already bool)
            self._bind(C.ATTENTION_MASK, np.ascontiguousarray(mask, dtype=bool))
        for name, values in (extra or {}).items():
            self._put(name, values, (1, q_len, values.shape[-1]), self.kv_dtype)
        if self.entry.logits_index:
            self._put(C.LOGITS_INDEX, np.arange(q_len - rows, q_len), (rows,), np.dtype(np.int64))
        if not self.shared_kv:
            # The past is the buffer's first `past` rows; the new K/V are written right after them, in place.
            past_shape, new_shape = (1, past, *self._kv_shape), (1, q_len, *self._kv_shape)
            offset, dt, dev = past * cache.row_bytes, self.kv_dtype, self.kv_device
            for (pk, pv, nk, nv), kp, vp in zip(self._kv_names, cache.key_ptrs, cache.value_ptrs):
                b.bind(pk, dev, dt, past_shape, kp)
                b.bind(pv, dev, dt, past_shape, vp)
                b.bind(nk, dev, dt, new_shape, kp + offset, output=True)
                b.bind(nv, dev, dt, new_shape, vp + offset, output=True)
        views = self._outputs(q_len, rows)
        logits, hidden = views.get(C.LOGITS), views[C.HIDDEN]
        if self.summary is not None:
            b.bind(C.LOGITS, self.kv_device, np.dtype(np.float32), (1, rows, self.entry.dims.vocab_size),
                   self.summary.logits_buffer(rows), output=True)
        outputs = {C.EAGLE_TAPS: views[C.EAGLE_TAPS]} if C.EAGLE_TAPS in views else {}
        t0 = time.perf_counter()
        run_graph(self.session.run_with_iobinding, self.entry.file, b.binding, self._eager_options)
        engine_s = time.perf_counter() - t0
        # On the CUDA provider the host-bound outputs are copied down by ORT.
        on_device = self.kv_device == "cuda"
        extra = {name: view[0] for name, view in outputs.items()}
        extra_bytes = sum(view.nbytes for view in extra.values()) if on_device else 0
        if self.summary is not None:
            return DecoderOutput(logits=None, hidden=hidden[0], device_logits=self.summary.rows(rows), extra=extra,
                                 copied_bytes=(hidden.nbytes if on_device else 0) + extra_bytes, engine_s=engine_s)
        return DecoderOutput(logits=logits[0], hidden=hidden[0], extra=extra, engine_s=engine_s,
                             copied_bytes=(logits.nbytes + hidden.nbytes if on_device else 0) + extra_bytes)


class _Summary:
    """A decoder's logits buffer in device memory and the summary graph's session over it (on the same
    provider as the decoder's, so ORT reads the logits where they are)."""

    def __init__(self, memory: DeviceMemory, device: str, vocab: int) -> None:
        self.memory, self.device, self.vocab = memory, device, vocab
        self.session = _session(C.summary_graph_path(), 1, helper=True)
        self.binding = self.session.io_binding()
        self.capacity, self.ptr = 0, 0
        self._out: dict[str, np.ndarray] = {}

    def logits_buffer(self, q_len: int) -> int:
        """The device address the decoder writes ``q_len`` rows of logits to; grows by doubling (a
        longer prompt), and the outputs' host buffers with it."""
        if q_len > self.capacity:
            self.capacity = max(q_len, 2 * self.capacity, 8)
            self.ptr = self.memory.malloc(self.capacity * self.vocab * 4)
            self._out = summary_buffers(self.capacity)
        return self.ptr

    def rows(self, q_len: int, ptr: int | None = None) -> SummaryLogits:
        """``ptr``: where the logits lie (default: this summary's own buffer, where eager passes write them)."""
        ptr, vocab = self.ptr if ptr is None else ptr, self.vocab  # this pass's: a later, longer pass may move it
        if len(next(iter(self._out.values()), ())) < q_len:  # a captured bucket wider than any eager pass
            self._out = summary_buffers(max(q_len, self.capacity))

        def summarize(start: int, rows: int, inv_t: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            b = self.binding
            b.clear_binding_inputs()
            b.clear_binding_outputs()
            b.bind_input(C.SUMMARY_LOGITS, self.device, 0, np.float32, [rows, vocab], ptr + start * vocab * 4)
            b.bind_cpu_input(C.SUMMARY_INV_T, np.array([inv_t], np.float32))
            outs = {name: buf[:rows] for name, buf in self._out.items()}
            for name, buf in outs.items():
                b.bind_output(name, "cpu", 0, buf.dtype, list(buf.shape), buf.ctypes.data)
            self.session.run_with_iobinding(b)
            return outs[C.SUMMARY_VALUES].copy(), outs[C.SUMMARY_IDS].copy(), outs[C.SUMMARY_LSE].copy()

        fetch_row, fetch_logit = row_readers(self.memory, ptr, vocab)
        return SummaryLogits(q_len, vocab, summarize, fetch_row, fetch_logit=fetch_logit)
