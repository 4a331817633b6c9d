"""GPU memory for the runtime without torch: a thin checked wrapper over CUDA's runtime API
(``cuda.bindings``, imported lazily) and a KV cache that lives in device memory.

The cache is ONE allocation, ``[layers, K|V, max_context, H_kv, D]``: every layer's past is a prefix of
its plane (so an engine reads it in place and writes its new K/V right after it, as on the host), and a
row range of all 2·layers planes is a single strided copy (``cudaMemcpy2DAsync``), which keeps tree
compaction to a few calls whatever the depth of the model.
"""

from __future__ import annotations

import ctypes
from typing import Callable, Protocol

import numpy as np

from ...bundle.contract import ModelDims
from ...errors import SpecrtError
from ..kvcache import CacheLength


class CudaError(SpecrtError):
    """A CUDA runtime call failed, or no CUDA runtime is usable here."""


ALIGNMENT = 256  # TensorRT requires tensor addresses aligned to this; cudaMalloc returns such bases


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to a multiple of :data:`ALIGNMENT`."""
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


class DeviceMemory(Protocol):
    """What the GPU backends need from a device: raw allocations and asynchronous copies on one stream."""

    stream: object
    integrated: bool  # GPU and CPU share memory (Jetson): outputs can be host-mapped instead of copied

    def malloc(self, nbytes: int) -> int: ...

    def mapped(self, nbytes: int) -> tuple[int, np.ndarray]:
        """Host memory the device writes directly: (device address, uint8 host array over it)."""

    def memset(self, ptr: int, value: int, nbytes: int) -> None: ...

    def to_device(self, dst: int, src: np.ndarray) -> None: ...

    def to_host(self, dst: np.ndarray, src: int) -> None: ...

    def copy_2d(self, dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, height: int) -> None:
        """Device to device: ``height`` rows of ``width`` bytes, rows ``*_pitch`` bytes apart."""

    def synchronize(self) -> None: ...

    def capture(self, work: Callable[[], object]) -> object:
        """Record what ``work`` enqueues on the stream as a CUDA graph (not running it); return it."""

    def replay(self, graph: object) -> None: ...


class CudaMemory:
    """:class:`DeviceMemory` on the current CUDA device through ``cuda.bindings.runtime``."""

    def __init__(self, device: int = 0) -> None:
        try:
            from cuda.bindings import runtime as cudart
        except ImportError:
            raise CudaError("cuda-bindings is missing: pip install 'specrt[gpu]'") from None
        self._rt = cudart
        self._check(cudart.cudaSetDevice(device), "cudaSetDevice")
        self.stream = self._check(cudart.cudaStreamCreate(), "cudaStreamCreate")
        props = self._check(cudart.cudaGetDeviceProperties(device), "cudaGetDeviceProperties")
        self.integrated = bool(props.integrated)
        self._owned: list[int] = []
        self._owned_host: list[int] = []
        self._graphs: list[object] = []  # instantiated graphs, destroyed with this memory

    def _check(self, result, what: str):
        err, *rest = result if isinstance(result, tuple) else (result,)
        if int(err) != 0:
            name = self._rt.cudaGetErrorName(err)[1]
            raise CudaError(f"{what} failed: {name.decode() if isinstance(name, bytes) else name}")
        return rest[0] if len(rest) == 1 else rest

    def malloc(self, nbytes: int) -> int:
        ptr = int(self._check(self._rt.cudaMalloc(max(nbytes, 1)), f"cudaMalloc({nbytes} bytes)"))
        self._owned.append(ptr)
        return ptr

    def mapped(self, nbytes: int) -> tuple[int, np.ndarray]:
        rt = self._rt
        host = int(self._check(rt.cudaHostAlloc(max(nbytes, 1), rt.cudaHostAllocMapped), "cudaHostAlloc"))
        self._owned_host.append(host)
        device = int(self._check(rt.cudaHostGetDevicePointer(host, 0), "cudaHostGetDevicePointer"))
        return device, np.ctypeslib.as_array((ctypes.c_uint8 * max(nbytes, 1)).from_address(host))[:nbytes]

    def memset(self, ptr: int, value: int, nbytes: int) -> None:
        self._check(self._rt.cudaMemsetAsync(ptr, value, nbytes, self.stream), "cudaMemsetAsync")

    def to_device(self, dst: int, src: np.ndarray) -> None:
        kind = self._rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        self._check(self._rt.cudaMemcpyAsync(dst, src.ctypes.data, src.nbytes, kind, self.stream), "copy to device")

    def to_host(self, dst: np.ndarray, src: int) -> None:
        kind = self._rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self._check(self._rt.cudaMemcpyAsync(dst.ctypes.data, src, dst.nbytes, kind, self.stream), "copy to host")

    def copy_2d(self, dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, height: int) -> None:
        kind = self._rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        self._check(self._rt.cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, height, kind, self.stream),
                    "cudaMemcpy2DAsync")

    def synchronize(self) -> None:
        self._check(self._rt.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")

    def capture(self, work: Callable[[], object]) -> object:
        rt = self._rt
        mode = rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        self._check(rt.cudaStreamBeginCapture(self.stream, mode), "cudaStreamBeginCapture")
        try:
            work()
        except BaseException:
            # End the capture so the stream stays usable; its own error (the capture is invalid now)
            # would only hide the one that matters, so it is not checked.
            rt.cudaStreamEndCapture(self.stream)
            raise
        graph = self._check(rt.cudaStreamEndCapture(self.stream), "cudaStreamEndCapture")
        try:
            executable = self._check(rt.cudaGraphInstantiate(graph, 0), "cudaGraphInstantiate")
        finally:
            rt.cudaGraphDestroy(graph)  # the executable is independent of the graph it was made from
        self._graphs.append(executable)
        return executable

    def replay(self, graph: object) -> None:
        self._check(self._rt.cudaGraphLaunch(graph, self.stream), "cudaGraphLaunch")

    def __del__(self) -> None:  # the process may be exiting: never raise from here
        rt = getattr(self, "_rt", None)
        if rt is None:
            return
        if getattr(self, "stream", None) is not None:
            rt.cudaStreamSynchronize(self.stream)  # nothing in flight uses what is freed below
        for graph in getattr(self, "_graphs", []):
            rt.cudaGraphExecDestroy(graph)
        for ptr in getattr(self, "_owned", []):
            rt.cudaFree(ptr)
        for ptr in getattr(self, "_owned_host", []):
            rt.cudaFreeHost(ptr)
        if getattr(self, "stream", None) is not None:
            rt.cudaStreamDestroy(self.stream)


def compaction_copies(start: int, keep: np.ndarray) -> list[tuple[int, int, int]]:
    """Row moves ``(src_row, dst_row, rows)`` that make ``start + keep[j]`` land at ``start + j``.

    ``keep`` is increasing, so rows only move left; consecutive kept rows travel together, split so
    that no copy's source overlaps its destination (overlapping copies are undefined in CUDA).
    """
    moves: list[tuple[int, int, int]] = []
    j = 0
    while j < keep.size:
        shift = int(keep[j]) - j
        run = 1
        while j + run < keep.size and int(keep[j + run]) - (j + run) == shift:
            run += 1
        if shift:
            for k in range(0, run, shift):  # chunks no longer than the shift never overlap themselves
                n = min(shift, run - k)
                moves.append((start + int(keep[j + k]), start + j + k, n))
        j += run
    return moves


class DeviceKVCache(CacheLength):
    """The KV cache in device memory; same layout per layer as :class:`~specrt.runtime.kvcache.KVCache`
    (``heads_major`` too: then a plane is one head's rows, and a layer's H_kv planes lie back to back,
    the dense [1, H_kv, max_context, D] buffer GroupQueryAttention reads)."""

    def __init__(self, dims: ModelDims, max_context: int, dtype: str | np.dtype, memory: DeviceMemory,
                 heads_major: bool = False) -> None:
        super().__init__(max_context)
        self.memory, self.heads_major = memory, heads_major
        itemsize = np.dtype(dtype).itemsize
        if heads_major:
            self.row_bytes = dims.head_dim * itemsize  # one head's row: what compaction moves per plane
            self.plane_bytes = max_context * self.row_bytes
            self.planes = 2 * dims.num_layers * dims.num_kv_heads
            layer_bytes = dims.num_kv_heads * self.plane_bytes
        else:
            self.row_bytes = dims.num_kv_heads * dims.head_dim * itemsize
            # Planes (one per layer and K|V) start on aligned addresses whatever a row's size; the pad
            # after each plane's last row is never read (the strided copies use plane_bytes as pitch).
            self.plane_bytes = aligned(max_context * self.row_bytes)
            self.planes = 2 * dims.num_layers
            layer_bytes = self.plane_bytes
        self.base = memory.malloc(self.planes * self.plane_bytes)
        memory.memset(self.base, 0, self.planes * self.plane_bytes)
        memory.synchronize()  # an engine on another stream (ORT's) may read it next
        self.key_ptrs = [self.base + 2 * i * layer_bytes for i in range(dims.num_layers)]
        self.value_ptrs = [p + layer_bytes for p in self.key_ptrs]

    @property
    def num_layers(self) -> int:
        return len(self.key_ptrs)

    def compact(self, start: int, keep: np.ndarray | list[int]) -> None:
        """As :meth:`KVCache.compact`: one strided copy over all planes per run of kept rows."""
        keep = np.asarray(keep, dtype=np.int64)
        self.check_keep(keep, start, self.max_context)
        rb = self.row_bytes
        for src, dst, rows in compaction_copies(start, keep):
            self.memory.copy_2d(self.base + dst * rb, self.plane_bytes, self.base + src * rb, self.plane_bytes,
                                rows * rb, self.planes)
        self.memory.synchronize()  # the next forward may run on another stream (ORT's)
        self.length = start + keep.size
