"""Host stand-ins for a GPU, so the GPU backends' bookkeeping runs on any CPU.

``HostMemory`` implements :class:`specrt.runtime.backends.cuda.DeviceMemory` on numpy buffers (and refuses the
overlapping copies CUDA leaves undefined); ``OrtEngineContext`` plays a TensorRT execution context by
running the bundle's ONNX graph on whatever the backend bound: the shapes it set and the addresses it
gave, reading inputs from and writing outputs to those addresses exactly as an engine would.
"""

from __future__ import annotations

import ctypes

import numpy as np

ORT_TYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(bool)": np.bool_, "tensor(float)": np.float32,
             "tensor(float16)": np.float16}


def view(ptr: int, shape, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    if n == 0:
        return np.empty(shape, dtype)
    return np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(ptr)).view(dtype).reshape(shape)


class HostMemory:
    stream = None

    def __init__(self, integrated: bool = False) -> None:
        self.integrated = integrated
        self._blocks: list[np.ndarray] = []
        self.copies_2d = self.host_copies = 0

    def malloc(self, nbytes: int) -> int:
        raw = np.full(max(nbytes, 1) + 256, 0xAB, np.uint8)  # garbage, as cudaMalloc gives
        block = raw[-raw.ctypes.data % 256:][:max(nbytes, 1)]  # 256-byte aligned, as cudaMalloc's
        self._blocks.append(block)
        return block.ctypes.data

    def owns(self, ptr: int, nbytes: int) -> bool:
        """Whether [ptr, ptr + nbytes) lies in one block this memory allocated (device memory, not a host array)."""
        return any(b.ctypes.data <= ptr and ptr + nbytes <= b.ctypes.data + b.nbytes for b in self._blocks)

    def mapped(self, nbytes: int):
        assert self.integrated, "host-mapped outputs are for integrated GPUs only"
        ptr = self.malloc(nbytes)
        return ptr, self._blocks[-1][:nbytes]

    def memset(self, ptr: int, value: int, nbytes: int) -> None:
        ctypes.memset(ptr, value, nbytes)

    def to_device(self, dst: int, src: np.ndarray) -> None:
        ctypes.memmove(dst, src.ctypes.data, src.nbytes)

    def to_host(self, dst: np.ndarray, src: int) -> None:
        self.host_copies += 1
        ctypes.memmove(dst.ctypes.data, src, dst.nbytes)

    def copy_2d(self, dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, height: int) -> None:
        self.copies_2d += 1
        for r in range(height):
            s, d = src + r * src_pitch, dst + r * dst_pitch
            assert s + width <= d or d + width <= s, "overlapping device copy (undefined in CUDA)"
            ctypes.memmove(d, s, width)

    def synchronize(self) -> None:
        pass

    def capture(self, work):
        return work  # like stream capture: recorded, not run; replay runs it with the same bindings

    def replay(self, graph) -> None:
        graph()


class OrtEngineContext:
    """Duck-types the parts of ``tensorrt.IExecutionContext`` the TensorRT backend calls."""

    def __init__(self, session) -> None:
        self.session = session
        self.types = {x.name: ORT_TYPES[x.type] for x in [*session.get_inputs(), *session.get_outputs()]}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.addresses: dict[str, int] = {}
        self.runs = 0

    def set_input_shape(self, name: str, shape) -> bool:
        self.shapes[name] = tuple(shape)
        return True

    def set_tensor_address(self, name: str, ptr: int) -> bool:
        if ptr % 256:
            return False  # as TensorRT: tensor addresses must be 256-byte aligned
        self.addresses[name] = ptr
        return True

    def execute_async_v3(self, stream) -> bool:
        feeds = {n: view(self.addresses[n], self.shapes[n], self.types[n]).copy()
                 for n in (x.name for x in self.session.get_inputs())}
        for out, value in zip(self.session.get_outputs(), self.session.run(None, feeds)):
            view(self.addresses[out.name], value.shape, value.dtype)[...] = value
        self.runs += 1
        return True
