"""Verify steps replayed as CUDA graphs on ONNX Runtime's CUDA provider, over the static gqa graph.

ORT's CUDA-graph mode (the provider option ``enable_cuda_graph``) records a session run once and replays it:
every input and output must be bound through IOBinding at the same device address with the same shape on
every run of a graph, and the run option ``gpu_graph_id`` says which graph a run is (-1: none, eagerly; 0
is ORT's own). ORT warms a graph id up, captures it on a later run and replays it from then on; a replay
copies nothing to host-bound outputs, so everything here is bound in device memory and copied by us.

The static gqa graph (contract.GQA_STATIC_GRAPH) makes a pass of Q rows the same shapes every step: the
lengths come from ``seqlens_k`` and there is no mask (the graph is causal only: ORT's CUDA GroupQueryAttention
refuses any attention_bias, so plain and chain steps run and tree methods are refused before). So each row
bucket (1, 2, 4, ... up to the widest verify) gets its own buffers and its own binding (:class:`_Bucket`),
allocated and bound once per cache, and its own graph id; a pass of Q rows is padded to its bucket (padding
rows see the past and themselves, and no real row sees them: the op is causal and they come last). The op
writes the bucket's rows in place at past .. past + bucket - 1, so a rejected draft needs no undo: rows after
the accepted length are simply written again by the next pass. A prefill, and a pass wider than every bucket
or too close to the buffer's end, runs eagerly on the same session (gpu_graph_id -1).

Per step the host writes the ids, positions (8 bytes a row) and seqlens_k (4 bytes), and reads back the hidden
rows (and taps) and the logits summary.
Nothing here imports torch or depends on a CUDA version or the CPU's architecture: JetPack's
onnxruntime-gpu (CUDA 12, aarch64) takes the same path.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, Mapping

import numpy as np

from ...bundle import contract as C
from ...bundle.manifest import ModelEntry
from ...errors import SpecrtError
from .base import DecoderOutput
from .buckets import DEFAULT_BUCKETS, choose_bucket, pad_to
from .cuda import DeviceKVCache, DeviceMemory

GRAPH_ID = "gpu_graph_id"  # ORT's run option (kOrtRunOptionsConfigCudaGraphAnnotation)
EAGER_ID = -1  # a run that is neither captured nor replayed
MIN_ORT = (1, 18)  # the first onnxruntime whose CUDA provider keeps one graph per gpu_graph_id


def graph_problem(ort_version: str, entry: ModelEntry, cuda: bool = True) -> str | None:
    """Why this model's verify steps cannot be captured here, one line, or None (they can); ``cuda``: on the
    real CUDA provider (not a stand-in of it), whose kernels set limits of their own."""
    if entry.graph != C.GQA_STATIC_GRAPH:
        return (f"{entry.file} is a {entry.graph} graph, whose shapes grow every step "
                "(export with --graph gqa-static)")
    try:
        version = tuple(int(x) for x in ort_version.split(".")[:2])
    except ValueError:
        version = (0, 0)
    if version < MIN_ORT:
        need = ".".join(map(str, MIN_ORT))
        return f"onnxruntime {ort_version} keeps one graph per session (gpu_graph_id needs {need}+)"
    if cuda and entry.dtype == "float32":  # ORT's CUDA GroupQueryAttention is registered for float16 and bfloat16 only
        return (f"{entry.file} is float32, and ONNX Runtime's CUDA GroupQueryAttention is fp16/bf16 only "
                "(export --dtype float16)")
    return None


_said: list[str] = []  # the line said, once per process


def say_once(line: str | None) -> None:
    """The first fallback's reason, on one line of stderr, once per process: the target's, usually, and the
    draft's or head's is most often the same (each decoder's ``graph_status`` keeps its own)."""
    if line and not _said:
        _said.append(line)
        print(f"specrt: {line}", file=sys.stderr)


def open_session(make: Callable[[bool], Any], cuda_graph: bool, why: str | None) -> tuple[Any, str | None]:
    """(``make(cuda_graph)``'s session, why steps are not captured or None): in CUDA-graph mode where asked for,
    and where ORT refuses that mode for this graph (it leaves a node to the CPU, or copies between
    devices inside the graph), a plain session and ORT's reason."""
    if cuda_graph:
        try:
            return make(True), why
        except SpecrtError as e:  # the backend's one-line BundleError: "cannot load <file>: <ORT's words>"
            why = f"ONNX Runtime refused its CUDA-graph mode ({str(e).split(': ', 1)[-1]})"
    return make(False), why


def run_options(graph_id: int):
    """ORT run options that select graph ``graph_id`` (EAGER_ID: a plain run)."""
    import onnxruntime as ort

    options = ort.RunOptions()
    options.add_run_config_entry(GRAPH_ID, str(graph_id))
    return options


class _Bucket:
    """One row bucket's pass over one cache: its buffers in device memory and its own IOBinding, bound once.

    ``io`` names every device buffer; the binding never changes, which is what lets ORT replay the run it
    captured for ``graph_id``."""

    def __init__(self, owner: CapturedSteps, cache: DeviceKVCache, rows: int, graph_id: int) -> None:
        entry, m, dims = owner.entry, owner.memory, owner.entry.dims
        self.rows, self.graph_id, self.cache, self.runs = rows, graph_id, cache, 0
        kv = owner.kv_dtype
        cap = cache.max_context
        shapes: dict[str, tuple[tuple[int, ...], np.dtype]] = {
            C.INPUT_IDS: ((1, rows), np.dtype(np.int64)), C.POSITION_IDS: ((1, rows), np.dtype(np.int64)),
            C.SEQLENS_K: ((1,), np.dtype(np.int32)),
            **{name: ((1, rows, width), kv) for name, width in owner.extra_inputs.items()},
            **({C.LOGITS_INDEX: ((rows,), np.dtype(np.int64))} if entry.logits_index else {})}
        outputs = {C.LOGITS: ((1, rows, dims.vocab_size), np.dtype(np.float32)),
                   C.HIDDEN: ((1, rows, dims.hidden_size), kv),
                   **({C.EAGLE_TAPS: ((1, rows, entry.tap_width), kv)} if owner.taps else {})}
        self.io = {name: m.malloc(int(np.prod(shape)) * dt.itemsize)
                   for name, (shape, dt) in {**shapes, **outputs}.items()}
        for name in (C.INPUT_IDS, C.POSITION_IDS, *owner.extra_inputs):  # a defined first (warm-up) input
            shape, dt = shapes[name]
            m.memset(self.io[name], 0, int(np.prod(shape)) * dt.itemsize)
        if entry.logits_index:  # every row's logits, written once
            m.to_device(self.io[C.LOGITS_INDEX], np.arange(rows, dtype=np.int64))
        self.binding = owner.session.io_binding()
        dev = owner.device
        for name, (shape, dt) in shapes.items():
            self.binding.bind_input(name, dev, 0, dt, list(shape), self.io[name])
        for name, (shape, dt) in outputs.items():
            self.binding.bind_output(name, dev, 0, dt, list(shape), self.io[name])
        buffer = [1, dims.num_kv_heads, cap, dims.head_dim]
        for i, (kp, vp) in enumerate(zip(cache.key_ptrs, cache.value_ptrs)):
            for past, present, ptr in ((C.past_key(i), C.present_key(i), kp),
                                       (C.past_value(i), C.present_value(i), vp)):
                self.binding.bind_input(past, dev, 0, kv, buffer, ptr)
                self.binding.bind_output(present, dev, 0, kv, buffer, ptr)
        self.hidden = np.empty((rows, dims.hidden_size), kv)  # host copies of the outputs' rows
        self.taps = np.empty((rows, entry.tap_width), kv) if owner.taps else None
        self.options = run_options(graph_id)


class CapturedSteps:
    """A decoder's captured verify steps: one :class:`_Bucket` and graph id per (cache, bucket).

    ``summarize(q_len, ptr)`` reads ``q_len`` rows of logits at device address ``ptr`` through the logits
    summary (None: the rows are copied up whole)."""

    def __init__(self, session: Any, entry: ModelEntry, memory: DeviceMemory, device: str,
                 summarize: Callable[[int, int], Any] | None, buckets: tuple[int, ...] = DEFAULT_BUCKETS) -> None:
        self.session, self.entry, self.memory, self.device = session, entry, memory, device
        self.summarize, self.buckets = summarize, tuple(sorted(buckets))
        self.kv_dtype = np.dtype(entry.dtype)
        self.extra_inputs = ({C.EAGLE_TAPS: entry.tap_width, C.EAGLE_FEATURES: entry.dims.hidden_size}
                             if entry.kind == "eagle3" else {})
        self.taps = entry.kind == "decoder" and bool(entry.tap_width)
        self.steps: dict[tuple[int, int, int], _Bucket] = {}  # (cache base, capacity, bucket) -> its pass
        self.replays = 0  # captured passes run (ORT warms up and captures on the first runs of each id)

    def bucket_for(self, cache: DeviceKVCache, q_len: int) -> _Bucket | None:
        """The bucket this pass replays, or None: run it eagerly (a prefill, a pass wider than every bucket,
        or one whose padded rows would run past the buffer's end)."""
        bucket = choose_bucket(q_len, self.buckets) if cache.length else None
        if bucket is None or cache.length + bucket > cache.max_context:
            return None
        key = (cache.base, cache.max_context, bucket)
        if key not in self.steps:
            self.steps[key] = _Bucket(self, cache, bucket, graph_id=len(self.steps) + 1)  # 0 is ORT's own
        return self.steps[key]

    def run(self, step: _Bucket, input_ids: np.ndarray, position_ids: np.ndarray, extra: Mapping[str, np.ndarray],
            run: Callable[..., Any]) -> DecoderOutput:
        """One causal pass of Q <= bucket rows on ``step``'s buffers (the graph takes no mask: the caller checked
        the pass's); ``run(binding, options)`` runs the session."""
        m, b, q_len = self.memory, step.rows, len(input_ids)
        past = step.cache.length
        m.to_device(step.io[C.INPUT_IDS], pad_to(np.asarray(input_ids, np.int64), b))
        positions = np.asarray(position_ids, np.int64)
        m.to_device(step.io[C.POSITION_IDS], pad_to(positions, b, fill=int(positions[-1])))
        m.to_device(step.io[C.SEQLENS_K], np.array([past + b - 1], np.int32))  # the op writes all b rows
        for name, rows in extra.items():  # padding rows keep what they held: finite, and never read
            m.to_device(step.io[name], np.ascontiguousarray(rows, dtype=self.kv_dtype))
        m.synchronize()  # ORT runs on its own stream
        t0 = time.perf_counter()
        run(step.binding, step.options)
        engine_s = time.perf_counter() - t0
        step.runs += 1
        self.replays += 1
        hidden = step.hidden[:q_len]
        m.to_host(hidden, step.io[C.HIDDEN])
        outputs = {}
        if step.taps is not None:
            m.to_host(step.taps[:q_len], step.io[C.EAGLE_TAPS])
            outputs[C.EAGLE_TAPS] = step.taps[:q_len]
        copied = hidden.nbytes + sum(v.nbytes for v in outputs.values())
        if self.summarize is not None:
            m.synchronize()
            return DecoderOutput(None, hidden, copied_bytes=copied, extra=outputs, engine_s=engine_s,
                                 device_logits=self.summarize(q_len, step.io[C.LOGITS]))
        logits = np.empty((q_len, self.entry.dims.vocab_size), np.float32)
        m.to_host(logits, step.io[C.LOGITS])
        m.synchronize()
        return DecoderOutput(logits, hidden, copied_bytes=copied + logits.nbytes, extra=outputs, engine_s=engine_s)

    @property
    def status(self) -> str:
        """One line for --stats: which buckets were captured and how many passes replayed them."""
        widths = sorted({key[2] for key in self.steps})
        return f"CUDA graphs: buckets {','.join(map(str, widths)) or 'none yet'}, {self.replays} captured passes"
