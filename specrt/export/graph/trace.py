"""Tracing a :class:`DecoderWrapper` to ONNX with the contract's names and dynamic axes."""

from __future__ import annotations

import contextlib
import logging
import warnings
from pathlib import Path
from typing import Iterator

import torch

from ...bundle import contract as C
from .architectures import DecoderAdapter, DecoderWrapper

EXPORTERS = ("dynamo", "torchscript")
# Trace sizes >= 2 on every dynamic axis: a size-1 axis gets specialised to a constant by the tracer.
TRACE_Q, TRACE_P = 3, 2
# Above this the dynamo graph's weights go to ``<file>.data``, written one tensor at a time. Inline, the
# whole protobuf is built and serialised in memory: the Qwen3-0.6B fp16 export (1.2 GB of weights)
# peaked at 4.4 GB above the model that way. (Protobuf's own limit, 2 GB, is the hard ceiling.)
EXTERNAL_DATA_BYTES = 256 * 2**20


def _trace_inputs(dims: C.ModelDims, dtype: torch.dtype):
    ids = torch.zeros(1, TRACE_Q, dtype=torch.int64)
    pos = torch.arange(TRACE_P, TRACE_P + TRACE_Q).unsqueeze(0)
    mask = torch.ones(1, 1, TRACE_Q, TRACE_P + TRACE_Q, dtype=torch.bool).tril(TRACE_P)
    past = tuple(torch.zeros(1, TRACE_P, dims.num_kv_heads, dims.head_dim, dtype=dtype)
                 for _ in range(2 * dims.num_layers))
    return ids, pos, mask, past, trace_index()


def trace_index() -> torch.Tensor:
    """The traced logits_index: 2 rows of the 3 (a size of its own, and not 1, which export would fix)."""
    return torch.arange(TRACE_Q - 2, TRACE_Q)


@contextlib.contextmanager
def quiet_tracer() -> Iterator[None]:
    """Silence tracer chatter (deprecations, 'torchvision is not installed' notes) for one export."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def _rename_dynamic_axes(path: Path, specs: list[C.TensorSpec]) -> None:
    """Give every graph input/output the contract's axis names (dynamo invents names like ``s54``), and its
    fixed sizes where the tracer left a symbol (torchscript names a rotated key's head axis ``Add...``)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    by_name = {s.name: s for s in specs}
    for value in [*model.graph.input, *model.graph.output]:
        spec = by_name[value.name]
        for dim, want in zip(value.type.tensor_type.shape.dim, spec.shape):
            if isinstance(want, str):
                dim.ClearField("dim_value")
                dim.dim_param = want
            elif dim.HasField("dim_param"):
                dim.ClearField("dim_param")
                dim.dim_value = want
    onnx.save(model, str(path))


def export_decoder(adapter: DecoderAdapter, path: Path, dtype: str, opset: int = 18,
                   exporter: str = "dynamo", taps: tuple[int, ...] = ()) -> None:
    """Write ``path`` (plus an external-data file for models over 2 GB) for one decoder.

    A fused adapter (``adapter.fused``) is exported with the dynamo exporter at opset 23 whatever
    ``opset`` says: its single-node ops exist only there. ``taps``: the target layers whose entering
    hidden states the graph outputs as ``eagle_taps`` (an EAGLE-3 head's; empty: no such output).
    """
    dims = adapter.dims()
    ins, outs = C.decoder_io(dims, dtype, "decoder", len(taps) * dims.hidden_size, logits_index=True)
    wrapper = DecoderWrapper(adapter, taps)
    trace_module(wrapper, _trace_inputs(dims, getattr(torch, dtype)), ins, outs, path, opset, exporter,
                 adapter.fused)


def trace_module(wrapper: torch.nn.Module, args: tuple, ins: list[C.TensorSpec], outs: list[C.TensorSpec],
                 path: Path, opset: int, exporter: str, fused: bool) -> None:
    """Export ``wrapper(*args)`` (one argument the tuple of past K/V, named ``past``) with the contract's
    names and axes.

    Every other argument's axes come from its spec, in order: ``batch``/``query``/``logits_rows`` axes are
    dynamic, the mask's last axis (P + Q) is left to the exporter to relate and is renamed afterwards, like
    every dynamo name.
    """
    if exporter not in EXPORTERS:
        raise ValueError(f"exporter must be one of {EXPORTERS}, got {exporter!r}")
    if fused:
        from .fused_ops import FUSED_OPSET, translation_table

        if exporter != "dynamo":
            raise ValueError("a fused graph needs the dynamo exporter")
        opset = FUSED_OPSET
    kwargs = dict(input_names=[s.name for s in ins], output_names=[s.name for s in outs], opset_version=opset)
    large = sum(p.numel() * p.element_size() for p in wrapper.parameters()) > EXTERNAL_DATA_BYTES
    with quiet_tracer(), torch.no_grad():
        if exporter == "dynamo":
            import inspect

            from torch.export import Dim

            dims = {"batch": Dim("batch"), "query": Dim("query"), "past": Dim("past"),
                    "logits_rows": Dim("logits_rows"), "context": Dim("context")}
            names = list(inspect.signature(wrapper.forward).parameters)[:len(args)]
            kv = (C.past_key(0)[:-1], C.past_value(0)[:-1])
            rest = iter(s for s in ins if not s.name.startswith(kv))
            shapes: dict[str, object] = {}
            for name, arg in zip(names, args):
                if name == "past":
                    shapes[name] = tuple({0: dims["batch"], 1: dims["past"]} for _ in arg)
                    continue
                spec = next(rest)
                if spec.name == C.ATTENTION_MASK:
                    # P + Q cannot be a derived Dim here; AUTO lets the exporter relate it, renamed below.
                    shapes[name] = {0: dims["batch"], 2: dims["query"], 3: Dim.AUTO}
                else:
                    shapes[name] = {i: dims[d] for i, d in enumerate(spec.shape) if isinstance(d, str)}
            kwargs["dynamic_shapes"] = shapes
            if fused:
                kwargs["custom_translation_table"] = translation_table()
            program = torch.onnx.export(wrapper, args, dynamo=True, verbose=False, **kwargs)
            program.save(str(path), external_data=large)
        else:
            torch.onnx.export(wrapper, args, str(path), dynamo=False, dynamic_axes=C.dynamic_axes(ins + outs),
                              **kwargs)
    _rename_dynamic_axes(path, ins + outs)
