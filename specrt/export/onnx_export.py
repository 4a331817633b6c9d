"""Tracing a :class:`DecoderWrapper` to ONNX with the contract's names and dynamic axes."""

from __future__ import annotations

import contextlib
import logging
import warnings
from pathlib import Path
from typing import Iterator

import torch

from ..bundle import contract as C
from .architectures import DecoderAdapter, DecoderWrapper

EXPORTERS = ("dynamo", "torchscript")
# Trace sizes >= 2 on every dynamic axis: a size-1 axis gets specialised to a constant by the tracer.
_TRACE_Q, _TRACE_P = 3, 2
# Above this the dynamo graph's weights go to ``<file>.data``, written one tensor at a time. Inline, the
# whole protobuf is built and serialised in memory: the Qwen3-0.6B fp16 export (1.2 GB of weights)
# peaked at 4.4 GB above the model that way. (Protobuf's own limit, 2 GB, is the hard ceiling.)
EXTERNAL_DATA_BYTES = 256 * 2**20


def _trace_inputs(dims: C.ModelDims, dtype: torch.dtype):
    ids = torch.zeros(1, _TRACE_Q, dtype=torch.int64)
    pos = torch.arange(_TRACE_P, _TRACE_P + _TRACE_Q).unsqueeze(0)
    mask = torch.ones(1, 1, _TRACE_Q, _TRACE_P + _TRACE_Q, dtype=torch.bool).tril(_TRACE_P)
    past = tuple(torch.zeros(1, _TRACE_P, dims.num_kv_heads, dims.head_dim, dtype=dtype)
                 for _ in range(2 * dims.num_layers))
    return ids, pos, mask, past


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
    """Give every graph input/output the contract's axis names (dynamo invents names like ``s54``)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    by_name = {s.name: s for s in specs}
    for value in [*model.graph.input, *model.graph.output]:
        spec = by_name[value.name]
        for dim, want in zip(value.type.tensor_type.shape.dim, spec.shape):
            if isinstance(want, str):
                dim.ClearField("dim_value")
                dim.dim_param = want
    onnx.save(model, str(path))


def export_decoder(adapter: DecoderAdapter, path: Path, dtype: str, opset: int = 18,
                   exporter: str = "dynamo") -> None:
    """Write ``path`` (plus an external-data file for models over 2 GB) for one decoder.

    A fused adapter (``adapter.fused``) is exported with the dynamo exporter at opset 23 whatever
    ``opset`` says: its single-node ops exist only there.
    """
    if exporter not in EXPORTERS:
        raise ValueError(f"exporter must be one of {EXPORTERS}, got {exporter!r}")
    if adapter.fused:
        from .fused_ops import FUSED_OPSET, translation_table

        if exporter != "dynamo":
            raise ValueError("a fused graph needs the dynamo exporter")
        opset = FUSED_OPSET
    dims = adapter.dims()
    ins, outs = C.decoder_io(dims, dtype)
    wrapper = DecoderWrapper(adapter)
    args = _trace_inputs(dims, getattr(torch, dtype))
    kwargs = dict(input_names=[s.name for s in ins], output_names=[s.name for s in outs], opset_version=opset)
    large = sum(p.numel() * p.element_size() for p in wrapper.parameters()) > EXTERNAL_DATA_BYTES
    with quiet_tracer(), torch.no_grad():
        if exporter == "dynamo":
            from torch.export import Dim

            batch, query, past = Dim("batch"), Dim("query"), Dim("past")
            kwargs["dynamic_shapes"] = {
                "input_ids": {0: batch, 1: query}, "position_ids": {0: batch, 1: query},
                # P + Q cannot be a derived Dim here; AUTO lets the exporter relate it, renamed below.
                "attention_mask": {0: batch, 2: query, 3: Dim.AUTO},
                "past": tuple({0: batch, 1: past} for _ in args[3]),
            }
            if adapter.fused:
                kwargs["custom_translation_table"] = translation_table()
            program = torch.onnx.export(wrapper, args, dynamo=True, verbose=False, **kwargs)
            program.save(str(path), external_data=large)
        else:
            torch.onnx.export(wrapper, args, str(path), dynamo=False, dynamic_axes=C.dynamic_axes(ins + outs),
                              **kwargs)
    _rename_dynamic_axes(path, ins + outs)
