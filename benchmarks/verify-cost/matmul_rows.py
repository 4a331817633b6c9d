"""One projection's time against its row count: why a verify pass costs more rows at int8/int4 on a CPU.

A decode step multiplies 1 row by each weight; a verify pass multiplies gamma + 1 rows. Memory-bound
kernels cost about the same for both; compute-bound ones cost more per row. This times one SmolLM2-sized
projection (576 -> 1536, the MLP's up projection) on one thread for each kernel a specrt bundle can use:
fp32 ``MatMul``, ``MatMulNBits`` (the int8/int4 weights of ``specrt quantize``) at accuracy levels 0/1/4,
and ``MatMulInteger`` with dynamic activation quantization (``quantize_dynamic``), for comparison.

    python benchmarks/verify-cost/matmul_rows.py --json benchmarks/verify-cost/matmul-rows-cpu.json

Figures are the 10th percentile of many runs (the machine's quietest), in microseconds.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

ROWS = (1, 2, 4, 8, 16)


def _matmul_model(k: int, n: int, opset: int) -> onnx.ModelProto:
    w = np.random.default_rng(0).standard_normal((k, n)).astype(np.float32) * 0.05
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])],
                          [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _nbits(model: onnx.ModelProto, bits: int, level: int, block: int) -> onnx.ModelProto:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    q = MatMulNBitsQuantizer(model, block_size=block, is_symmetric=True, accuracy_level=level, bits=bits)
    q.process()
    return q.model.model


def _dynamic_int8(model: onnx.ModelProto) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as d:
        onnx.save(model, f"{d}/f.onnx")
        quantize_dynamic(f"{d}/f.onnx", f"{d}/q.onnx", weight_type=QuantType.QInt8, per_channel=True)
        return onnx.load(f"{d}/q.onnx")


def time_rows(model: onnx.ModelProto, k: int, runs: int) -> dict[int, float]:
    """Microseconds per run (10th percentile) for each row count, one thread."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so)
    out = {}
    for m in ROWS:
        x = np.random.default_rng(1).standard_normal((m, k)).astype(np.float32)
        for _ in range(20):
            sess.run(None, {"x": x})
        ts = []
        for _ in range(runs):
            t0 = time.perf_counter()
            sess.run(None, {"x": x})
            ts.append(time.perf_counter() - t0)
        out[m] = float(np.percentile(ts, 10) * 1e6)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=576)
    ap.add_argument("--n", type=int, default=1536)
    ap.add_argument("--block", type=int, default=64, help="MatMulNBits block size")
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    kernels: dict[str, onnx.ModelProto] = {"fp32 MatMul": _matmul_model(a.k, a.n, 21)}
    for bits in (8, 4):
        for level in (0, 1, 4):
            # a fresh float model each time: the quantizer rewrites the one it is given
            kernels[f"int{bits} MatMulNBits level {level}"] = _nbits(_matmul_model(a.k, a.n, 21), bits, level, a.block)
    kernels["int8 MatMulInteger (dynamic)"] = _dynamic_int8(_matmul_model(a.k, a.n, 17))
    rows = {}
    for name, model in kernels.items():
        rows[name] = t = time_rows(model, a.k, a.runs)
        cells = "  ".join(f"{m:>2} rows {us:7.0f} µs" for m, us in t.items())
        print(f"{name:32s} {cells}   4 rows / 1: {t[4] / t[1]:.2f}x", flush=True)
    if a.json:
        cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("model name")), platform.processor())
        flags = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), "")
        a.json.write_text(json.dumps({
            "shape": [a.k, a.n], "block": a.block, "threads": 1, "onnxruntime": ort.__version__,
            "machine": {"cpu": cpu, "avx512": "avx512f" in flags, "avx2": "avx2" in flags},
            "date": time.strftime("%Y-%m-%d"), "microseconds": {k: {str(m): v for m, v in t.items()}
                                                             for k, t in rows.items()}}, indent=1) + "\n")
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
