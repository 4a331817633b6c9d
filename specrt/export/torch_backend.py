"""PyTorch backend: the same Decoder interface on the bundle's source Hugging Face checkpoint.

It is the reference for the GPU loop and runs wherever PyTorch runs: CPU, a CUDA workstation, or
JetPack's PyTorch on a Jetson without TensorRT or onnxruntime-gpu. On CUDA, a forward whose width fits
a bucket runs as a captured CUDA graph over a static KV cache (one graph per bucket, captured on first
use); wider ones run eagerly. Only the logits and hidden rows of the real tokens cross to the host.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ..bundle import contract as C
from ..bundle.manifest import ModelEntry
from ..errors import BundleError, SpecrtError
from ..runtime.backends.base import DecoderOutput
from ..runtime.backends.buckets import (
    DEFAULT_BUCKETS,
    choose_bucket,
    pad_to,
    static_mask,
)
from ..runtime.kvcache import CacheLength


class TorchDeviceLogits:
    """Logits (Q, V) left where the model ran (see :class:`~specrt.runtime.backends.base.DeviceLogits`):
    argmax ids, the top k and the log-sum-exp are computed there and only they are copied up."""

    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits  # a view of the decoder's output, valid until its next pass
        self.copied_bytes = 0
        self.width, self.max_k = int(logits.shape[-1]), None

    def _host(self, t: torch.Tensor) -> np.ndarray:
        out = t.cpu().numpy()
        self.copied_bytes += out.nbytes if self.logits.device.type != "cpu" else 0
        return out

    @torch.inference_mode()
    def argmax(self) -> np.ndarray:
        return self._host(self.logits.argmax(dim=-1))  # the first maximal index, as numpy's

    @torch.inference_mode()
    def top(self, k: int, temperature: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        values, ids = torch.topk(self.logits, min(k, self.logits.shape[-1]), dim=-1)
        lse = self._host(torch.logsumexp(self.logits.double() / temperature, dim=-1))
        return self._host(ids), self._host(values.float()), lse, np.zeros_like(lse)  # float64: exact

    @torch.inference_mode()
    def row(self, i: int) -> np.ndarray:
        return self._host(self.logits[i].float())

    @torch.inference_mode()
    def logit(self, i: int, token: int) -> float:
        return float(self._host(self.logits[i, token:token + 1].float())[0])

    def tail(self, n: int) -> TorchDeviceLogits:
        return TorchDeviceLogits(self.logits[len(self.logits) - n:])


def _output(logits: torch.Tensor, hidden: torch.Tensor, keep_logits: bool, taps: torch.Tensor | None = None
            ) -> DecoderOutput:
    """Hidden rows (and an EAGLE-3 target's taps) on the host; logits either copied up as float32 or left on
    the device."""
    on_gpu = logits.device.type != "cpu"
    host_hidden = hidden.cpu().numpy()
    extra = {C.EAGLE_TAPS: taps.cpu().numpy()} if taps is not None else {}
    side = host_hidden.nbytes + sum(x.nbytes for x in extra.values()) if on_gpu else 0
    if keep_logits:
        return DecoderOutput(None, host_hidden, copied_bytes=side, device_logits=TorchDeviceLogits(logits),
                             extra=extra)
    host_logits = logits.float().cpu().numpy()
    return DecoderOutput(host_logits, host_hidden, extra=extra,
                         copied_bytes=side + (host_logits.nbytes if on_gpu else 0))


def call(wrapper, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, past: tuple[torch.Tensor, ...],
         extra: dict[str, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None,
                                                                 tuple[torch.Tensor, ...]]:
    """(logits, hidden, taps or None, new K/V) of a decoder (``DecoderWrapper``, with taps or not) or of an
    EAGLE-3 head (``HeadWrapper``, which also reads ``extra``: its taps and features rows)."""
    from .eagle.graph import HeadWrapper

    if isinstance(wrapper, HeadWrapper):
        logits, hidden, *new = wrapper(ids, pos, mask, extra[C.EAGLE_TAPS], extra[C.EAGLE_FEATURES], past)
        return logits, hidden, None, tuple(new)  # each layer's K and V: a stacked head has several
    logits, hidden, *rest = wrapper(ids, pos, mask, past)
    if wrapper.taps:
        return logits, hidden, rest[0], tuple(rest[1:])
    return logits, hidden, None, tuple(rest)

class TorchKVCache(CacheLength):
    """Static [1, max_context, H_kv, D] tensors per layer on the model's device; ``length`` is the truth."""

    def __init__(self, num_layers: int, max_context: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        super().__init__(max_context)
        shape = (1, max_context, kv_heads, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @property
    def num_layers(self) -> int:
        return len(self.keys)

    def buffers(self) -> tuple[torch.Tensor, ...]:
        """past_key.0, past_value.0, past_key.1, ... in the contract's order."""
        return tuple(t for pair in zip(self.keys, self.values) for t in pair)

    def compact(self, start: int, keep) -> None:
        keep_np = np.asarray(keep, dtype=np.int64)
        self.check_keep(keep_np, start, self.max_context)
        dev = self.keys[0].device
        src = torch.as_tensor(start + keep_np, device=dev)
        dst = torch.arange(start, start + keep_np.size, device=dev)
        for buf in self.buffers():
            buf[:, dst] = buf[:, src]
        self.length = start + keep_np.size


def static_step(wrapper, cache: TorchKVCache, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor,
                slots: torch.Tensor, extra: dict[str, torch.Tensor] | None = None) -> tuple[torch.Tensor, ...]:
    """One forward over the WHOLE static cache (what a CUDA graph can capture: fixed shapes and
    addresses); the new K/V are scattered into the cache rows ``slots``. (logits, hidden[, taps])."""
    past = cache.buffers()
    logits, hidden, taps, new = call(wrapper, ids, pos, mask, past, extra)
    for buf, kv in zip(past, new):
        buf.index_copy_(1, slots, kv)
    return (logits, hidden) if taps is None else (logits, hidden, taps)


def cuda_capture(step: Callable[[], tuple[torch.Tensor, torch.Tensor]]) -> tuple[Any, tuple[torch.Tensor, ...]]:
    """Warm ``step`` up on a side stream (twice, as CUDA-graph capture requires), then capture it:
    (graph, the static output tensors each replay refills). Capture records kernels, runs none."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step()
    return graph, outputs


class _Graph:
    """One captured :func:`static_step` of a fixed bucket width; inputs are static tensors refilled
    before each replay."""

    def __init__(self, wrapper, cache: TorchKVCache, bucket: int, capture=cuda_capture,
                 extra_widths: dict[str, int] | None = None) -> None:
        extra_widths = extra_widths or {}
        dev = cache.keys[0].device
        if cache.length + bucket > cache.max_context:
            raise ValueError(f"a bucket of {bucket} after {cache.length} rows overruns the cache ({cache.max_context})")
        self.cache = cache  # the graph writes into its tensors: keep them alive (and id(cache) unique as a key)
        self.ids = torch.zeros(1, bucket, dtype=torch.long, device=dev)
        self.pos = torch.zeros(1, bucket, dtype=torch.long, device=dev)
        self.mask = torch.zeros(1, 1, bucket, cache.max_context + bucket, dtype=torch.bool, device=dev)
        # The warm-up runs write their new K/V to these rows: the ones right after the valid length,
        # which hold nothing yet (a graph first captured after a prefill must not touch rows 0..bucket-1).
        self.slots = torch.arange(cache.length, cache.length + bucket, device=dev)
        # An EAGLE-3 head's taps and features rows: static too, zero past the real rows
        self.extra = {name: torch.zeros(1, bucket, width, dtype=cache.keys[0].dtype, device=dev)
                      for name, width in extra_widths.items()}

        def step():
            return static_step(wrapper, cache, self.ids, self.pos, self.mask, self.slots, self.extra)

        self.graph, outputs = capture(step)
        self.logits, self.hidden, *rest = outputs
        self.taps = rest[0] if rest else None


class TorchDecoder:
    def __init__(self, bundle_dir: Path, entry: ModelEntry, threads: int | None = None,
                 device: str | None = None, use_graphs: bool | None = None,
                 buckets: tuple[int, ...] = DEFAULT_BUCKETS, device_logits: bool | None = None,
                 capture: Callable = cuda_capture) -> None:
        """``device_logits``: leave logits on the device and send up only what each step needs
        (default: on a GPU, where the copy of every [Q, V] row is what costs). ``capture``: how a
        static step becomes a replayable graph (:func:`cuda_capture`; tests pass a host stand-in)."""
        from .graph.architectures import DecoderWrapper, adapter_for
        from .loading import load_causal_lm

        source = Path(entry.source)
        if not ((source / "config.json").is_file() or (source.suffix == ".gguf" and source.is_file())):
            raise BundleError(f"the torch backend runs the checkpoint the bundle was exported from, and "
                              f"{entry.source} is not there")
        if threads:
            torch.set_num_threads(threads)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.entry = entry
        self.dtype = getattr(torch, entry.dtype)
        if entry.kind == "eagle3":
            self.wrapper = _head_wrapper(Path(bundle_dir), entry).to(self.device)
            self.extra_widths = {C.EAGLE_TAPS: entry.tap_width, C.EAGLE_FEATURES: entry.dims.hidden_size}
        else:
            model = load_causal_lm(entry.source, entry.dtype).to(self.device)
            self.wrapper = DecoderWrapper(adapter_for(entry.architecture)(model), taps=entry.eagle_taps)
            self.extra_widths = {}
        self.provider = f"torch-{self.device.type}"
        self.use_graphs = self.device.type == "cuda" if use_graphs is None else use_graphs
        self.device_logits = self.device.type == "cuda" if device_logits is None else device_logits
        self.capture = capture
        self.buckets = buckets
        self.graphs: dict[tuple[int, int], _Graph] = {}  # (id(cache), bucket) → graph
        self.graph_status = (None if self.device.type != "cuda" else
                             f"CUDA graphs: steps of up to {max(buckets)} rows" if self.use_graphs else
                             "CUDA graphs off: opened with use_graphs=False")

    def new_cache(self, max_context: int) -> TorchKVCache:
        d = self.entry.dims
        return TorchKVCache(d.num_layers, max_context, d.num_kv_heads, d.head_dim, self.dtype, self.device)

    supports_eagle = True

    @torch.inference_mode()
    def forward(self, cache: TorchKVCache, input_ids: np.ndarray, position_ids: np.ndarray,
                mask: np.ndarray, extra: dict[str, np.ndarray] | None = None,
                logits_rows: int | None = None) -> DecoderOutput:
        """``extra``: an EAGLE-3 head's eagle_taps / eagle_features rows, (Q, width) each. ``logits_rows`` is
        not used: the checkpoint computes every row's logits."""
        del logits_rows
        q_len, past_len = len(input_ids), cache.length
        if set(extra or {}) != set(self.extra_widths):
            raise SpecrtError(f"internal: {self.entry.file} reads {sorted(self.extra_widths) or 'no extra inputs'}, "
                              f"was given {sorted(extra or {}) or 'none'}")
        cache.ensure_room(q_len)
        bucket = choose_bucket(q_len, self.buckets) if self.use_graphs else None
        if bucket is not None and past_len + bucket <= cache.max_context:
            return self._replay(cache, input_ids, position_ids, mask, bucket, extra or {})
        return self._eager(cache, input_ids, position_ids, mask, extra or {})

    def _rows(self, rows: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.asarray(rows), device=self.device).to(self.dtype)[None]

    def _eager(self, cache, input_ids, position_ids, mask, extra) -> DecoderOutput:
        # copied (a few KB): the runtime's masks may be read-only views, which torch will not wrap
        t = lambda a, dt: torch.tensor(a, dtype=dt, device=self.device)  # noqa: E731
        past_len, q_len = cache.length, len(input_ids)
        buffers = cache.buffers()
        logits, hidden, taps, new = call(self.wrapper, t(input_ids, torch.long)[None], t(position_ids, torch.long)[None],
                                         t(mask, torch.bool), tuple(b[:, :past_len] for b in buffers),
                                         {name: self._rows(rows) for name, rows in extra.items()})
        for buf, kv in zip(buffers, new):
            buf[:, past_len:past_len + q_len] = kv
        return _output(logits[0], hidden[0], self.device_logits, None if taps is None else taps[0])

    def _replay(self, cache, input_ids, position_ids, mask, bucket: int, extra) -> DecoderOutput:
        key = (id(cache), bucket)
        if key not in self.graphs:
            self.graphs[key] = _Graph(self.wrapper, cache, bucket, self.capture, self.extra_widths)
        g = self.graphs[key]
        q_len, past_len = len(input_ids), cache.length
        g.ids.copy_(torch.from_numpy(pad_to(np.asarray(input_ids, np.int64), bucket))[None])
        g.pos.copy_(torch.from_numpy(pad_to(np.asarray(position_ids, np.int64), bucket, fill=past_len))[None])
        g.mask.copy_(torch.from_numpy(static_mask(mask, past_len, cache.max_context, bucket)))
        g.slots.copy_(torch.arange(past_len, past_len + bucket))
        for name, rows in extra.items():
            g.extra[name].zero_()
            g.extra[name][:, :q_len] = self._rows(rows)
        g.graph.replay()
        taps = None if g.taps is None else g.taps[0, :q_len]
        return _output(g.logits[0, :q_len], g.hidden[0, :q_len], self.device_logits, taps)


def _head_wrapper(bundle_dir: Path, entry: ModelEntry):
    """The head the bundle's EAGLE-3 graph was exported from, as that graph computes it: its lm_head rows in
    the bundle's ascending vocabulary map, the target's embedding table where the head ships none."""
    from ..bundle.manifest import load_manifest
    from .eagle.checkpoint import load_eagle3
    from .eagle.graph import HeadWrapper, ascending_vocab, export_copy
    from .loading import load_causal_lm

    manifest = load_manifest(bundle_dir)
    _cfg, head, d2t, _t2d = load_eagle3(entry.source)
    order, vocab_map = ascending_vocab(d2t)
    if not np.array_equal(vocab_map, np.load(bundle_dir / entry.vocab_map, allow_pickle=False)):
        raise BundleError(f"the EAGLE-3 head at {entry.source} is not the one this bundle was exported with (its "
                          "vocabulary map differs): re-export, or use --backend onnxruntime")
    embedding = None
    if head.embed_tokens is None:
        embedding = load_causal_lm(manifest.target.source, "float32").get_input_embeddings().weight
    return HeadWrapper(export_copy(head, getattr(torch, entry.dtype), order), embedding, fused=False,
                       positions=manifest.max_context)
