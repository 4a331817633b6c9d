"""What one TensorRT pass binds: the shape ranges an engine admits, the name → (shape, address) plan of a
forward, the bindings set on an execution context, and the device buffers a pass writes (new K/V in a
scratch block when the cache cannot take them in place, the logits and hidden rows, the logits summary).

:mod:`specrt.runtime.backends.tensorrt` opens the engines and runs the decoder over these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...bundle import contract as C
from ...errors import ContextLengthError, SpecrtError
from .cuda import ALIGNMENT, DeviceKVCache, DeviceMemory, aligned
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


class PassOutputs:
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


class LogitsSummary:
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
