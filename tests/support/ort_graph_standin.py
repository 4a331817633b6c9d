"""A stand-in for ONNX Runtime's CUDA-graph mode over a real CPU session, so the captured-step bookkeeping of
``specrt.runtime.backends.ort_graphs`` runs on any CPU.

What it plays of ORT (the CUDA provider with ``enable_cuda_graph``): a run names its graph with the
``gpu_graph_id`` run option (-1: a plain run; none at all would be graph 0, which ORT keeps for itself, so
that is refused here); the first run of an id is a warm-up, the next one captures, and every later one
replays what was captured. A replay reads the addresses bound at capture, whatever the binding says now,
and copies nothing to host-bound outputs; the stand-in asserts instead that every captured run binds the
same names, shapes, types and addresses as at capture, all of them in (stand-in) device memory. Each run
is then executed on the CPU session, reading and writing those addresses as the GPU would.

And what its kernels refuse that the CPU's accept: the CUDA GroupQueryAttention kernel fails every run of a
node with an ``attention_bias`` input (:func:`cuda_gqa_refusal`), so a graph that regains one fails here too.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from support.fake_device import HostMemory

WARMUP_RUNS = 1  # runs of a graph id before ORT captures it
GQA_BIAS = 10  # com.microsoft.GroupQueryAttention's attention_bias input


def cuda_gqa_refusal(model) -> str | None:
    """What ONNX Runtime's CUDA provider says when it runs this graph (an ``onnx.ModelProto``), or None: its
    GroupQueryAttention kernel returns INVALID_ARGUMENT for any attention_bias, in every release to date
    (contrib_ops/cuda/bert/group_query_attention.cc)."""
    for n in model.graph.node:
        if n.op_type == "GroupQueryAttention" and len(n.input) > GQA_BIAS and n.input[GQA_BIAS]:
            return (f"[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Non-zero status code returned while running "
                    f"GroupQueryAttention node. Name:'{n.name}' Status Message: attention_bias is not supported in "
                    "GroupQueryAttention cuda kernel.")
    return None


class RecordingBinding:
    """An ``IOBinding`` that remembers what each name is bound to: (device, dtype, shape, address)."""

    def __init__(self, real) -> None:
        self.real = real
        self.bound: dict[tuple[str, bool], tuple[str, str, tuple[int, ...], int]] = {}

    def _record(self, name: str, output: bool, device: str, dtype, shape, ptr: int) -> None:
        self.bound[name, output] = (device, np.dtype(dtype).name, tuple(shape), int(ptr))

    def bind_input(self, name, device, device_id, dtype, shape, ptr) -> None:
        self._record(name, False, device, dtype, shape, ptr)
        self.real.bind_input(name, device, device_id, dtype, shape, ptr)

    def bind_output(self, name, device="cpu", device_id=0, dtype=None, shape=None, ptr=None) -> None:
        if ptr is None:  # ORT allocates it: no fixed address
            self.bound[name, True] = (device, "", (), 0)
            self.real.bind_output(name, device)
            return
        self._record(name, True, device, dtype, shape, ptr)
        self.real.bind_output(name, device, device_id, dtype, shape, ptr)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


class CudaGraphStandIn:
    """Wraps an ``ort.InferenceSession`` over the graph at ``path``; ``events`` lists (graph id, "eager" | "warmup" |
    "capture" | "replay")."""

    def __init__(self, session, memory: HostMemory, path: Path) -> None:
        import onnx

        self.session, self.memory = session, memory
        self.refusal = cuda_gqa_refusal(onnx.load(str(path), load_external_data=False))
        self.events: list[tuple[int, str]] = []
        self.captured: dict[int, dict] = {}
        self.shapes: dict[int, tuple[int, ...]] = {}  # graph id -> the input_ids shape it runs
        self._runs: Counter[int] = Counter()

    def io_binding(self) -> RecordingBinding:
        return RecordingBinding(self.session.io_binding())

    def run_with_iobinding(self, binding: RecordingBinding, run_options=None) -> None:
        if self.refusal:  # ORT raises its own untyped error from the kernel, in any run of the session
            raise RuntimeError(self.refusal)
        graph_id = run_options.get_run_config_entry("gpu_graph_id") if run_options is not None else ""
        assert graph_id, "a run without gpu_graph_id would be captured as ORT's own graph 0"
        graph_id = int(graph_id)
        if graph_id == -1:
            self.events.append((graph_id, "eager"))
        else:
            assert graph_id > 0, "graph id 0 is ORT's own"
            self._check_device(binding)
            n = self._runs[graph_id]
            self._runs[graph_id] += 1
            if n < WARMUP_RUNS:
                self.events.append((graph_id, "warmup"))
            elif n == WARMUP_RUNS:
                self.captured[graph_id] = dict(binding.bound)
                self.shapes[graph_id] = binding.bound["input_ids", False][2]
                self.events.append((graph_id, "capture"))
            else:
                assert binding.bound == self.captured[graph_id], f"graph {graph_id} replayed with other bindings"
                self.events.append((graph_id, "replay"))
        self.session.run_with_iobinding(binding.real, run_options)

    def _check_device(self, binding: RecordingBinding) -> None:
        for (name, _), (_, dtype, shape, ptr) in binding.bound.items():
            nbytes = int(np.prod(shape)) * np.dtype(dtype or "uint8").itemsize
            assert ptr and self.memory.owns(ptr, nbytes), f"{name} is not bound in device memory"

    def __getattr__(self, name: str) -> Any:  # get_inputs, get_outputs, get_providers
        return getattr(self.session, name)
