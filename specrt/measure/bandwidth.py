"""The machine's sustainable read bandwidth, measured the way STREAM measures it.

An array far beyond the last-level cache (at least 4x it, 512 MiB by default, capped by free memory),
every core reading its own disjoint chunk (numpy releases the GIL inside a reduction, so one thread
per core runs in parallel), best of N repeats. STREAM counts the bytes a kernel names: a read-sum
moves 1 array, a copy 2 (read + write; the write-allocate read is not counted).

The host probe is numpy only. The device probe (CUDA: a reduction and a device-to-device copy) needs
torch with CUDA and raises :class:`ProbeUnavailable` naming what is missing otherwise.
"""

from __future__ import annotations

import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ConfigError, SpecrtError
from ..runtime.backends.onnxruntime import available_memory

DEFAULT_BYTES = 512 * 2**20
MIN_BYTES = 2**20
CACHE_SYSFS = Path("/sys/devices/system/cpu/cpu0/cache")


class ProbeUnavailable(SpecrtError):
    """This probe cannot run here (no torch, no CUDA device); the message says why."""


@dataclass(frozen=True)
class Bandwidth:
    """A measured (or given) sustainable bandwidth, GB/s = 1e9 bytes per second."""

    device: str  # "host, 16 threads", "cuda:0 NVIDIA H200", "given"
    read_gbps: float
    copy_gbps: float | None = None
    array_bytes: int = 0
    repeats: int = 0

    def __post_init__(self) -> None:
        if not self.read_gbps > 0:
            raise ConfigError(f"bandwidth must be > 0 GB/s, got {self.read_gbps}")


def gbps(bytes_moved: int, seconds: float) -> float:
    """Bytes moved per second, in GB/s (1e9)."""
    if seconds <= 0:
        raise ValueError(f"seconds must be > 0, got {seconds}")
    return bytes_moved / seconds / 1e9


def probe_bytes(llc_bytes: int | None, free_bytes: int | None, requested: int | None = None) -> int:
    """The size of the read array: ``requested``, or max(512 MiB, 4 x last-level cache); never more than a
    quarter of free memory (the machine keeps working)."""
    size = requested if requested is not None else max(DEFAULT_BYTES, 4 * (llc_bytes or 0))
    if free_bytes is not None:
        size = min(size, free_bytes // 4)
    if size < MIN_BYTES:
        raise ConfigError(f"the probe needs at least {MIN_BYTES // 2**20} MiB of memory, got {size} bytes")
    return size


def parse_cache_size(text: str) -> int:
    """sysfs cache sizes: '32768K', '1M', '512' (bytes)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)\s*", text)
    if not m:
        raise ValueError(f"not a cache size: {text!r}")
    return int(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2)]


def last_level_cache_bytes(cache_dir: Path = CACHE_SYSFS) -> int | None:
    """The largest cache of cpu0 (its last level), from sysfs; None where sysfs does not say."""
    sizes = []
    for index in cache_dir.glob("index*"):
        try:
            sizes.append(parse_cache_size((index / "size").read_text()))
        except (OSError, ValueError):
            continue
    return max(sizes, default=None)


def host_bandwidth(array_bytes: int | None = None, repeats: int = 3, threads: int | None = None) -> Bandwidth:
    """Read (sum) and copy bandwidth of host memory, best of ``repeats``, one thread per core."""
    if repeats < 1:
        raise ConfigError(f"repeats must be >= 1, got {repeats}")
    threads = threads or os.cpu_count() or 1
    size = probe_bytes(last_level_cache_bytes(), available_memory(), array_bytes)
    buf = np.empty(size // 8)  # read: all of it; copy: first half -> second half (no second array)
    half = buf.size // 2
    chunks = np.array_split(buf, threads)
    src, dst = np.array_split(buf[:half], threads), np.array_split(buf[half:2 * half], threads)
    with ThreadPoolExecutor(threads) as pool:
        def each(fn, *args) -> float:
            t0 = time.perf_counter()
            list(pool.map(fn, *args))
            return time.perf_counter() - t0

        # First touch from the threads that later read: pages land on their NUMA nodes.
        each(lambda a: a.fill(1.0), chunks)
        read = min(each(np.sum, chunks) for _ in range(repeats))
        copy = min(each(np.copyto, dst, src) for _ in range(repeats))
    return Bandwidth(device=f"host, {threads} threads", read_gbps=gbps(buf.nbytes, read),
                     copy_gbps=gbps(2 * 8 * half, copy), array_bytes=buf.nbytes, repeats=repeats)


def cuda_bandwidth(array_bytes: int | None = None, repeats: int = 3, device: int = 0) -> Bandwidth:
    """Read (a sum reduction) and device-to-device copy bandwidth of a CUDA GPU's memory, via torch,
    timed with CUDA events, best of ``repeats``."""
    try:
        import torch
    except ImportError:
        raise ProbeUnavailable("the GPU probe needs torch with CUDA, and torch is not installed") from None
    if not torch.cuda.is_available():
        raise ProbeUnavailable("the GPU probe needs a CUDA device, and torch sees none")
    if repeats < 1:
        raise ConfigError(f"repeats must be >= 1, got {repeats}")
    dev = torch.device("cuda", device)
    props = torch.cuda.get_device_properties(dev)
    free, _ = torch.cuda.mem_get_info(dev)
    size = probe_bytes(getattr(props, "L2_cache_size", 0), free, array_bytes)
    nbytes, read, copy = _cuda_best_times(torch, dev, size // 4, repeats)
    torch.cuda.empty_cache()  # the probe's arrays are gone with the helper's frame
    return Bandwidth(device=f"cuda:{device} {props.name}", read_gbps=gbps(nbytes, read),
                     copy_gbps=gbps(2 * nbytes, copy), array_bytes=nbytes, repeats=repeats)


def _cuda_best_times(torch, dev, n: int, repeats: int) -> tuple[int, float, float]:
    """(bytes of one array, best read-sum seconds, best copy seconds) on ``n`` float32 elements."""
    x = torch.ones(n, dtype=torch.float32, device=dev)
    y = torch.empty_like(x)

    def timed(fn) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        fn()  # warm-up: kernel selection and launch setup outside the timing
        best = float("inf")
        for _ in range(repeats):
            start.record()
            fn()
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1000)  # ms -> s
        return best

    return x.numel() * 4, timed(lambda: x.sum()), timed(lambda: y.copy_(x))


def on_gpu(provider: str) -> bool:
    """Whether a decoder's provider computes on an NVIDIA GPU (then the device probe is the roofline)."""
    return provider in ("CUDAExecutionProvider", "TensorRT", "TensorrtExecutionProvider", "torch-cuda")


def measure(provider: str, array_bytes: int | None = None, repeats: int = 3) -> Bandwidth:
    """The probe that fits the backend: the GPU's memory for GPU providers, host memory otherwise.
    Raises ProbeUnavailable when a GPU backend runs without torch+CUDA to probe it."""
    if on_gpu(provider):
        return cuda_bandwidth(array_bytes, repeats)
    return host_bandwidth(array_bytes, repeats)
