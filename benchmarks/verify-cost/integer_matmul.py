"""An experiment kept reproducible: int8 weights on ONNX Runtime's ``MatMulInteger`` with each row's activations
quantized on their own, against ``MatMulNBits`` (what ``specrt quantize --bits int8`` writes). Not offered
by specrt: on SmolLM2-135M it fails the int8 quality gate and its 1-row pass is slower
(docs/performance/verify-cost-cpu.md). What specrt offers instead splits each row's activations in two halves
(``specrt quantize --kernel integer``, specrt/export/quant/integer_matmul.py).

Why try it: ``MatMulNBits`` at accuracy level 4 grows almost linearly with rows on CPUs without AVX-512
(benchmarks/verify-cost/matmul-rows-cpu.json: 72 µs for 1 row, 192 µs for 4), and its result for a row moves with the
row count. ``MatMulInteger`` (u8 × s8, MLAS) grows more slowly, and integer sums are exact, so a row's
product would be bit-identical whatever else is in the pass, provided each row has its own scale.
ONNX Runtime's ``quantize_dynamic`` uses one scale per tensor (``DynamicQuantizeLinear``), which would couple
the rows of a verify pass (a drafted token's row would move its neighbours' logits: not exact), so the
per-row quantization is written here:

    s  = max(|x|, last axis) / 127                     one scale per row
    xq = uint8(round(x / s) + 128)                     shared by every MatMul reading x
    y  = float(MatMulInteger(xq, Wq, 128)) * ws * s    Wq: int8 per output column, scale ws

The weights keep 7 bits (|Wq| ≤ 63): MLAS's AVX2 u8 × s8 kernel adds pairs of products in int16
(``vpmaddubsw``), and 2 · 255 · 63 stays below 32767 where 2 · 255 · 127 does not (full 8-bit weights gave
26 % error on a row with one outlier channel). The LM head stays ``MatMulNBits`` int8, blocks of 32.

    python benchmarks/verify-cost/integer_matmul.py FLOAT_BUNDLE --threads 2 [--weight-bits 8] [--smooth 0.65] [--keep-down]
        [--json OUT]

``--weight-bits 8`` keeps full int8 weights, for CPUs whose u8 x s8 kernels add in int32 (AVX-512 VNNI,
AVX-VNNI, AMX), where nothing saturates. ``--smooth ALPHA`` first moves each input channel's range from the
activations into the weights (SmoothQuant, Xiao et al. 2023): x_j / s_j and W[j, :] * s_j with
s_j = max|x_j|^ALPHA / max|W[j, :]|^(1 - ALPHA), max|x_j| calibrated on the float graph over the chat seed
prompts (not the prompts the quality is measured on), so that one scale per row fits the outlier channels.
Here the division is a Mul before the quantization (a deployed graph would fold it into the RMSNorm weight,
v_proj's and up_proj's columns); the quality is the same. ``--keep-down`` leaves the MLP's down projections
(whose input, SiLU(gate)·up, carries the largest outliers) on ``MatMulNBits`` int8.

writes an integer copy of the bundle's target beside it (FLOAT_BUNDLE-integer), then prints its quality
against the float graph (specrt's gate: mean KL, decisive top-1) and its verify-cost curve (verify_cost.py;
time it beside the int8 bundle in one run with ``verify_cost.py INT8_BUNDLE FLOAT_BUNDLE-integer``).
"""


from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

WEIGHT_MAX = 63  # 7-bit weights: no int16 saturation in MLAS's AVX2 u8 x s8 kernel (module docstring)
ACT_MAX = 127
ZERO_POINT = 128  # activations are symmetric int8 stored as uint8, the type MLAS's fast kernels take


def quantize_columns(weight: np.ndarray, limit: int = WEIGHT_MAX) -> tuple[np.ndarray, np.ndarray]:
    """specrt's symmetric per-output-column int8 (``--kernel integer``'s), 7-bit unless ``limit`` says otherwise."""
    from specrt.export.quant.integer_matmul import quantize_columns as per_column

    return per_column(weight, limit)


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The graph's activation quantization, in numpy (the reference the tests hold the graph to):
    (uint8 values, per-row scale with a trailing 1)."""
    x = x.astype(np.float32)
    scale = np.maximum(np.abs(x).max(axis=-1, keepdims=True) * np.float32(1 / ACT_MAX), np.float32(1e-30))
    return (np.rint(x / scale) + ZERO_POINT).astype(np.uint8), scale


def reference_matmul(x: np.ndarray, q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """What the rewritten MatMul computes, exactly (integer sums in int64)."""
    xq, s = quantize_rows(x)
    acc = (xq.astype(np.int64) - ZERO_POINT) @ q.astype(np.int64)
    return acc.astype(np.float32) * scale * s


@dataclass
class _Rewrite:
    opset: int
    inits: list = field(default_factory=list)
    quantized: dict = field(default_factory=dict)  # activation tensor -> (uint8 tensor, scale tensor)

    def const(self, name: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def activations(self, x: str, nodes: list, smooth: np.ndarray | None = None) -> tuple[str, str]:
        """x's per-row uint8 copy and scale, made once however many MatMuls read x (``smooth``: divided by
        those per-channel factors first)."""
        from onnx import TensorProto, helper

        if x not in self.quantized:
            p = f"{x}.q8"
            if smooth is not None:
                nodes.append(helper.make_node("Mul", [x, self.const(f"{p}.inv_smooth", (1 / smooth).astype(np.float32))],
                                              [f"{p}.smoothed"]))
                x_in = f"{p}.smoothed"
            else:
                x_in = x
            if self.opset >= 18:
                reduce = helper.make_node("ReduceMax", [f"{p}.abs", self.shared("axes_last", np.array([-1], np.int64))],
                                          [f"{p}.max"], keepdims=1)
            else:
                reduce = helper.make_node("ReduceMax", [f"{p}.abs"], [f"{p}.max"], axes=[-1], keepdims=1)
            nodes += [
                helper.make_node("Abs", [x_in], [f"{p}.abs"]),
                reduce,
                helper.make_node("Mul", [f"{p}.max", self.shared("inv_act_max", np.array(1 / ACT_MAX, np.float32))],
                                 [f"{p}.s0"]),
                helper.make_node("Max", [f"{p}.s0", self.shared("tiny", np.array(1e-30, np.float32))], [f"{p}.scale"]),
                helper.make_node("Div", [x_in, f"{p}.scale"], [f"{p}.div"]),
                helper.make_node("Round", [f"{p}.div"], [f"{p}.round"]),
                helper.make_node("Add", [f"{p}.round", self.shared("zp_float", np.array(ZERO_POINT, np.float32))],
                                 [f"{p}.shift"]),
                helper.make_node("Cast", [f"{p}.shift"], [f"{p}.u8"], to=TensorProto.UINT8),
            ]
            self.quantized[x] = (f"{p}.u8", f"{p}.scale")
        return self.quantized[x]

    def shared(self, name: str, value: np.ndarray) -> str:
        full = f"specrt.int8.{name}"
        if not any(i.name == full for i in self.inits):
            self.const(full, value)
        return full


def rewrite_matmuls(model, names: set[str] | None = None, limit: int = WEIGHT_MAX,
                    smooth: dict[str, np.ndarray] | None = None) -> list[str]:
    """Rewrite every float MatMul with a constant 2-D weight (or those named in ``names``) of ``model`` in
    place into the per-row integer form of the module docstring, weights within ±``limit``; ``smooth``: per
    activation tensor, the factors its channels are divided by (and its weights' rows multiplied by).
    Returns the rewritten nodes' names."""
    from onnx import TensorProto, helper, numpy_helper

    g = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 18)
    inits = {i.name: i for i in g.initializer}
    rw = _Rewrite(opset)
    done, nodes, replaced = [], [], set()
    for node in g.node:
        w = inits.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        if (w is None or len(w.dims) != 2 or (names is not None and node.name not in names)
                or w.data_type != TensorProto.FLOAT):
            nodes.append(node)
            continue
        factors = (smooth or {}).get(node.input[0])
        weight = numpy_helper.to_array(w)
        q, scale = quantize_columns(weight if factors is None else weight * factors[:, None], limit)
        xq, xs = rw.activations(node.input[0], nodes, factors)
        y = node.output[0]
        nodes += [
            helper.make_node("MatMulInteger", [xq, rw.const(f"{w.name}.int8", q), rw.shared("zp", np.array(ZERO_POINT, np.uint8))],
                             [f"{y}.i32"], name=node.name),
            helper.make_node("Cast", [f"{y}.i32"], [f"{y}.f32"], to=TensorProto.FLOAT),
            helper.make_node("Mul", [f"{y}.f32", rw.const(f"{w.name}.int8.scales", scale)], [f"{y}.cols"]),
            helper.make_node("Mul", [f"{y}.cols", xs], [y]),
        ]
        replaced.add(w.name)
        done.append(node.name)
    if done:
        from specrt.export.quant.integer_matmul import replace_nodes

        replace_nodes(g, nodes, rw.inits, replaced)
    return done


def channel_ranges(model, names: list[str], bundle: Path, prompts: list[str]) -> dict[str, np.ndarray]:
    """max |x_j| per channel of each activation tensor in ``names``, over every position of ``prompts`` run
    through ``model`` (the float target, those tensors made outputs) in one prefill each."""
    import tempfile

    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from specrt.bundle import contract as C
    from specrt.bundle.manifest import load_manifest
    from specrt.export.quant.quality import prompt_ids
    from specrt.runtime.masks import causal_mask

    manifest = load_manifest(bundle)
    dims = manifest.target.dims
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(helper.make_tensor_value_info(x, TensorProto.FLOAT, None) for x in names)
    ranges: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "probe.onnx"
        onnx.save_model(probe, str(path), save_as_external_data=True, location="probe.onnx.data")
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        wanted = [o.name for o in session.get_outputs()][-len(names):]
        inputs = {i.name for i in session.get_inputs()}
        for ids in prompt_ids(bundle, manifest, prompts, 1):
            n = len(ids)
            room = n if manifest.target.graph == C.GQA_GRAPH else 0  # a gqa graph's cache holds the new rows too
            feeds = {C.INPUT_IDS: ids[None], C.POSITION_IDS: np.arange(n)[None], C.ATTENTION_MASK: causal_mask(n, 0).copy(),
                     C.LOGITS_INDEX: np.array([n - 1])}
            for i in range(dims.num_layers):
                for name in (C.past_key(i), C.past_value(i)):
                    feeds[name] = np.zeros((1, dims.num_kv_heads, room, dims.head_dim), np.float32)
            for x, value in zip(names, session.run(wanted, {k: v for k, v in feeds.items() if k in inputs})):
                seen = np.abs(value.reshape(-1, value.shape[-1])).max(axis=0)
                ranges[x] = seen if x not in ranges else np.maximum(ranges[x], seen)
    return ranges


def smoothing_factors(ranges: dict[str, np.ndarray], weights: dict[str, list[np.ndarray]],
                      alpha: float) -> dict[str, np.ndarray]:
    """SmoothQuant's s_j = max|x_j|^alpha / max|W[j, :]|^(1 - alpha) per activation tensor, over every weight
    ([K, N]) that reads it."""
    out = {}
    for x, ws in weights.items():
        w_max = np.max([np.abs(w).max(axis=1) for w in ws], axis=0)
        out[x] = (np.maximum(ranges[x], 1e-5) ** alpha / np.maximum(w_max, 1e-5) ** (1 - alpha)).astype(np.float32)
    return out


def write_integer_bundle(src: Path, out: Path, limit: int = WEIGHT_MAX, smooth: float | None = None,
                         keep_down: bool = False, calibration: list[str] | None = None) -> dict:
    """A copy of bundle ``src`` whose target's body MatMuls are rewritten (``keep_down``: but those reading a
    Mul, the MLP's down projections), the rest ``MatMulNBits`` int8 at blocks of 32; ``smooth``: SmoothQuant's
    alpha, calibrated on ``calibration``. Returns what was done."""
    import logging
    import shutil

    import onnx
    from onnx import numpy_helper
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    from specrt.export.quant.lookups import head_matmuls, untie_lm_head

    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(src, out)
    (out / "target.onnx.data").unlink(missing_ok=True)
    model = onnx.load(str(src / "target.onnx"))
    untie_lm_head(model)
    heads = set(head_matmuls(model))
    inits = {i.name: i for i in model.graph.initializer}
    made_by = {o: n.op_type for n in model.graph.node for o in n.output}
    chosen = [n for n in model.graph.node if n.op_type == "MatMul" and n.name not in heads and n.input[1] in inits
              and not (keep_down and made_by.get(n.input[0]) == "Mul")]
    factors = None
    if smooth is not None:
        weights: dict[str, list[np.ndarray]] = {}
        for n in chosen:
            weights.setdefault(n.input[0], []).append(numpy_helper.to_array(inits[n.input[1]]))
        factors = smoothing_factors(channel_ranges(model, sorted(weights), src, calibration or []), weights, smooth)
    rewrite_matmuls(model, {n.name for n in chosen}, limit, factors)
    # what is left float: the LM head (and with keep_down the down projections)
    q = MatMulNBitsQuantizer(model, bits=8, block_size=32, is_symmetric=True, accuracy_level=4)
    q.process()
    onnx.save_model(q.model.model, str(out / "target.onnx"))
    from dataclasses import replace

    from specrt.bundle.files import graph_cost
    from specrt.bundle.manifest import load_manifest

    manifest = load_manifest(src)  # labelled as what it is, for verify_cost.py's table
    form = (f"MatMulInteger, per-row activations, {'8' if limit > WEIGHT_MAX else '7'}-bit weights"
            + (f", smoothed (alpha {smooth:g})" if smooth is not None else "") + (", down on MatMulNBits" if keep_down else ""))
    models = {**manifest.models, "target": replace(manifest.target, quantization={
        "bits": 8, "format": form, "block_size": None, "accuracy_level": None},
        **graph_cost(out / "target.onnx").manifest_fields())}
    replace(manifest, models=models).write(out)
    return {"format": form, "weight_limit": limit, "smooth_alpha": smooth, "keep_down": keep_down,
            "integer_matmuls": len(chosen), "calibration_prompts": len(calibration or [])}


SEEDS = Path(__file__).resolve().parents[1] / "prompts" / "eagle-seeds-r4.json"  # calibration: the head's seeds


def chat_prompts(bundle: Path, path: Path, count: int | None = None) -> list[str]:
    """The first ``count`` prompts of ``path`` as a user's messages, rendered with the bundle's chat template
    (as they are, where it has none)."""
    import json

    from specrt.bundle.manifest import load_manifest
    from specrt.runtime.chat import ChatTemplate

    texts = json.loads(path.read_text())[:count]
    entry = load_manifest(bundle).tokenizer
    if entry.chat_template is None:
        return texts
    template = ChatTemplate.from_file(bundle / entry.chat_template, entry.special_tokens)
    return [template.render([{"role": "user", "content": t}]) for t in texts]


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json
    import sys

    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here), str(here.parent / "common")]  # verify_cost.py beside this file; bench_prompts.py
    from bench_prompts import HELDOUT
    from verify_cost import fit, time_rows

    from specrt.bundle.manifest import load_manifest
    from specrt.data import prompts
    from specrt.export.quant.quality import distribution_parity

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle", type=Path, help="a float (fp32) bundle")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--weight-bits", type=int, choices=(7, 8), default=7,
                    help="8: full int8 weights, where u8 x s8 sums are int32 (VNNI, AMX); 7 (default): AVX2-safe")
    ap.add_argument("--smooth", type=float, metavar="ALPHA", help="SmoothQuant's migration strength (e.g. 0.65)")
    ap.add_argument("--keep-down", action="store_true", help="the MLP's down projections stay MatMulNBits int8")
    ap.add_argument("--out", type=Path, help="the integer bundle [default: BUNDLE-integer]")
    ap.add_argument("--reference", type=Path, help="a quantized bundle of the same model (e.g. `specrt quantize "
                    "--bits int8`) whose quality is measured beside, on the same prompts")
    ap.add_argument("--json", type=Path, help="adds this run to the file's runs (a new file: the first)")
    args = ap.parse_args(argv)
    out = args.out or args.bundle.with_name(args.bundle.name + "-integer")
    manifest = load_manifest(args.bundle)
    done = write_integer_bundle(args.bundle, out, 127 if args.weight_bits == 8 else WEIGHT_MAX, args.smooth,
                                args.keep_down, chat_prompts(args.bundle, SEEDS, 64))
    def quality(bundle: Path) -> tuple[dict, dict]:
        """Against the float graph, on the shipped prompts (the gate's) and on the held-out chat prompts the
        benches decode."""
        return (distribution_parity(args.bundle, bundle, manifest, "target", prompts("all")),
                distribution_parity(args.bundle, bundle, manifest, "target", chat_prompts(args.bundle, HELDOUT)))

    parity, chat = quality(out)
    row = time_rows(out, args.threads, 128, args.repeats)
    row["fit"], row["parity"], row["parity_chat"], row["rewrite"] = fit(row), parity, chat, done
    print(f"{out} ({done['format']}): mean KL {parity['mean_kl']:.4f}, top-1 {parity['top1_agreement']:.3f}; "
          f"chat prompts {chat['mean_kl']:.4f}, {chat['top1_agreement']:.3f} (int8 gate: KL <= 0.01, "
          f"top-1 >= 0.95); t(1) {row['ms']['1']:.2f} ms; "
          + " ".join(f"{k}:{v:.2f}" for k, v in row["fit"]["ratio"].items())
          + f"; {row['rows_vs_single']['rows']} rows vs one at a time: max |Δlogit| "
          f"{row['rows_vs_single']['max_abs_logit_diff']:.2e}")
    if args.json:
        data = json.loads(args.json.read_text()) if args.json.exists() else {"runs": []}
        data = data if "runs" in data else {"runs": [data]}  # a file of one run, as this script first wrote
        data["runs"].append(row)
        if args.reference:
            ref = load_manifest(args.reference).target.quantization or {}
            ref_parity, ref_chat = quality(args.reference)
            data["reference"] = {"bundle": str(args.reference), "format": ref.get("format"),
                                 "block_size": ref.get("block_size"), "parity": ref_parity, "parity_chat": ref_chat}
        args.json.write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {args.json} ({len(data['runs'])} runs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
