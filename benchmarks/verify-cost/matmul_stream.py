"""How much of a target pass its matmul kernels are, and how fast they stream the weights: each bundle's own
matmuls (its quantized weights, scales and attributes, the LM head included) cut out of its graph into one that
runs them alone, back to back, beside the whole pass and the host's probed read bandwidth; for an integer-kernel
bundle also the pass with its per-row activation ops cut (timing only: what a fused kernel would save).

    python benchmarks/verify-cost/matmul_stream.py BUNDLE [BUNDLE ...] [--rows 1,5] [--past 66] [--threads 2]
                                                   [--json benchmarks/verify-cost/matmul-stream-cpu.json]

A decode step reads every weight once, so the bandwidth its matmuls reach bounds the step from below. On a 2-core
CPU a quantized kernel can stream well below what the memory delivers (it is then bound by its own arithmetic),
and the rest of the pass (attention, norms, the integer kernel's activation ops) adds to it. Each row count
feeds the matmuls what the whole graph feeds them: R rows of activations (``MatMulIntegerToFloat``: the 2R rows
of the two 7-bit halves). Activations are random, the weights the bundle's; medians of ``--reps`` passes.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # verify_rows.py, shared by the runners

MATMULS = {"MatMul", "MatMulNBits", "MatMulIntegerToFloat"}


def matmuls_alone(model) -> tuple[object, list[tuple[str, int, int]], int, dict[str, int]]:
    """(graph running ``model``'s constant-weight matmuls alone, its inputs as (name, K, rows per activation
    row), the bytes of their constant inputs, matmul count by op type). Every matmul reads one input per
    (K, dtype); its outputs are all graph outputs, so none is pruned."""
    import onnx
    from onnx import helper

    g = model.graph
    inits = {i.name: i for i in g.initializer}
    # A tied LM head reads its weight through a Transpose of the embedding (folded when the session loads)
    transposed = {n.output[0]: n for n in g.node if n.op_type == "Transpose" and n.input[0] in inits}
    nodes, inputs, used, counts = [], {}, {}, {}
    for node in g.node:
        if node.op_type not in MATMULS or len(node.input) < 2:
            continue
        t = transposed.get(node.input[1])
        w = inits[t.input[0]] if t is not None else inits.get(node.input[1])
        if w is None:
            continue
        if t is not None:
            nodes.append(t)
            used[w.name] = w
        if node.op_type == "MatMulNBits":
            k = next(a.i for a in node.attribute if a.name == "K")
            dtype, rows = onnx.TensorProto.FLOAT, 1
        else:
            k = w.dims[1] if t is not None else w.dims[0]
            dtype = onnx.TensorProto.UINT8 if node.op_type == "MatMulIntegerToFloat" else onnx.TensorProto.FLOAT
            rows = 2 if node.op_type == "MatMulIntegerToFloat" else 1  # the [hi; lo] halves
        name = f"x.{k}.{dtype}"
        inputs[name] = (name, k, rows, dtype)
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.input[0] = name
        nodes.append(copy)
        used.update({i: inits[i] for i in node.input[1:] if i in inits})
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    outs = [helper.make_tensor_value_info(n.output[0], onnx.TensorProto.FLOAT, None) for n in nodes
            if n.op_type in MATMULS]
    ins = [helper.make_tensor_value_info(name, dtype, [1, "rows", k]) for name, k, _, dtype in inputs.values()]
    alone = helper.make_model(helper.make_graph(nodes, "matmuls", ins, outs, list(used.values())),
                              opset_imports=model.opset_import, ir_version=model.ir_version)
    weight_bytes = sum(_bytes(i) for i in used.values())
    return alone, [(name, k, rows) for name, k, rows, _ in inputs.values()], weight_bytes, counts


def without_activation_ops(model) -> bool:
    """Cut an integer-kernel graph's per-row activation ops (specrt/export/quant/integer_matmul.py: 10 before each
    quantized input, 12 in bundles made before 2026-12-05, 4 after each matmul) to a Concat + Cast before and a
    Split after, in place: the same
    matmuls on rows of the same shapes, wrong numbers, for timing what those ops cost. False: nothing to cut."""
    from onnx import TensorProto, helper

    g = model.graph
    matmuls = [n for n in g.node if n.op_type == "MatMulIntegerToFloat" and n.input[0].endswith(".i8.u8")]
    if not matmuls:
        return False
    ys = {n.output[0][:-len(".halves")] for n in matmuls}
    post = {f"{y}{s}" for y in ys for s in (".hi", ".lo", ".lo_scaled", ".sum", "")}
    nodes, cast = [], set()
    for node in g.node:
        quantized = node.op_type == "MatMulIntegerToFloat" and node.input[0].endswith(".i8.u8")
        if ".i8." in node.output[0] or (node.output[0] in post and not quantized):
            continue  # the activation's ops before, and the halves' sum and scaling after
        if quantized:
            x = node.input[0][:-len(".i8.u8")]
            if x not in cast:
                cast.add(x)
                nodes += [helper.make_node("Concat", [x, x], [f"{x}.rows2"], axis=-2),
                          helper.make_node("Cast", [f"{x}.rows2"], [node.input[0]], to=TensorProto.UINT8)]
            y = node.output[0][:-len(".halves")]
            nodes += [node, helper.make_node("Split", [node.output[0]], [y, f"{y}.unused"], axis=-2, num_outputs=2)]
            continue
        nodes.append(node)
    del g.node[:]
    g.node.extend(nodes)
    return True


def _bytes(init) -> int:
    from onnx import numpy_helper

    return int(numpy_helper.to_array(init).nbytes)


def time_alone(path: Path, inputs: list[tuple[str, int, int]], rows: list[int], threads: int, reps: int
               ) -> dict[int, float]:
    """Median milliseconds of one run of the matmuls-alone graph per row count, on specrt's own session options."""
    from specrt.runtime.backends.onnxruntime import _session

    sess = _session(path, threads)
    types = {i.name: i.type for i in sess.get_inputs()}
    rng = np.random.default_rng(0)
    out = {}
    for r in rows:
        feed = {name: (rng.integers(1, 128, (1, r * per, k), dtype=np.uint8) if types[name] == "tensor(uint8)"
                       else rng.standard_normal((1, r * per, k)).astype(np.float32)) for name, k, per in inputs}
        for _ in range(3):
            sess.run(None, feed)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            sess.run(None, feed)
            times.append(time.perf_counter() - t0)
        out[r] = 1e3 * statistics.median(times)
    return out


class Bundle:
    """One bundle's whole pass and its matmuls alone (the graph cut out once, into ``workdir``)."""

    def __init__(self, bundle: str, workdir: Path) -> None:
        import onnx

        from specrt.bundle.manifest import load_manifest

        self.bundle, self.entry = bundle, load_manifest(bundle).target
        model = onnx.load(str(Path(bundle) / self.entry.file))
        alone, self.inputs, self.weight_bytes, self.counts = matmuls_alone(model)
        del model
        self.path = workdir / f"{Path(bundle).name}.onnx"
        onnx.save(alone, str(self.path), save_as_external_data=True, location=f"{self.path.stem}.data")
        del alone
        self.cut: Path | None = None  # the bundle with its target's activation ops cut (integer kernel only)
        model = onnx.load(str(Path(bundle) / self.entry.file))
        if without_activation_ops(model):
            self.cut = workdir / f"{Path(bundle).name}-cut"
            self.cut.mkdir()
            for f in Path(bundle).iterdir():  # copies: a bundle refuses links out of its folder
                if f.name != self.entry.file and f.is_file():
                    shutil.copy2(f, self.cut / f.name)
            onnx.save(model, str(self.cut / self.entry.file))

    def weights(self) -> str:
        q = self.entry.quantization or {}
        return f"int{q['bits']} ({q.get('kernel', 'nbits')})" if q else self.entry.dtype

    def measure(self, rows: list[int], past: int, threads: int, reps: int) -> dict[str, dict[int, float]]:
        """Median milliseconds per row count: the whole pass, the matmuls alone, and (integer kernel) the pass
        without its activation ops."""
        from verify_rows import pass_ms

        out = {"pass_ms": pass_ms(self.bundle, rows, past, threads, reps),
               "matmuls_ms": time_alone(self.path, self.inputs, rows, threads, reps)}
        if self.cut is not None:
            out["cut_ms"] = pass_ms(str(self.cut), rows, past, threads, reps)
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundles", nargs="+")
    ap.add_argument("--rows", default="1,5")
    ap.add_argument("--past", type=int, default=66, help="cached positions before the timed passes")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    from specrt.measure.bandwidth import host_bandwidth

    rows = [int(r) for r in a.rows.split(",")]
    probes, runs = [], {Path(b).name: {} for b in a.bundles}
    with tempfile.TemporaryDirectory() as d:
        bundles = [Bundle(b, Path(d)) for b in a.bundles]
        for r in range(a.rounds):  # every bundle once a round: a slow spell of the VM lands on all of them
            probes.append(host_bandwidth(repeats=3, threads=a.threads).read_gbps)
            for b in bundles:
                got = b.measure(rows, a.past, a.threads, a.reps)
                for k, ms in got.items():
                    runs[Path(b.bundle).name].setdefault(k, []).append({str(q): v for q, v in ms.items()})
                print(f"round {r + 1}: {Path(b.bundle).name:14s} " + ", ".join(
                    f"{q} rows " + " / ".join(f"{ms[q]:.2f}" for ms in got.values()) + " ms" for q in rows),
                    flush=True)
    read = statistics.median(probes)
    print(f"host read bandwidth, {a.threads} threads: {read:.1f} GB/s (median of {a.rounds})")
    results = {}
    for b in bundles:
        name = Path(b.bundle).name
        med = {k: {str(q): statistics.median(x[str(q)] for x in runs[name][k]) for q in rows} for k in runs[name]}
        results[name] = {"weights": b.weights(), "matmuls": b.counts, "matmul_weight_bytes": b.weight_bytes,
                         **med, "rounds": runs[name]}
        for q in rows:
            alone, whole = med["matmuls_ms"][str(q)], med["pass_ms"][str(q)]
            gbps = b.weight_bytes / alone / 1e6
            cut = f", without its activation ops {med['cut_ms'][str(q)]:6.2f} ms" if "cut_ms" in med else ""
            print(f"{name:14s} {q:2d} rows: pass {whole:6.2f} ms, matmuls alone {alone:6.2f} ms "
                  f"({alone / whole:.0%}), {gbps:5.1f} GB/s ({gbps / read:.0%} of the probe){cut}")
    if a.json:
        import onnxruntime as ort

        cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("model name")), platform.processor())
        a.json.write_text(json.dumps({
            "date": date.today().isoformat(), "machine": {"cpu": cpu, "threads": a.threads},
            "onnxruntime": ort.__version__, "read_gbps": read, "read_gbps_rounds": probes, "past": a.past,
            "rows": rows, "rounds": a.rounds,
            "bundles": results}, indent=1) + "\n")
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
