"""The GPU kit's measurements (issue 63): specrt on ONNX Runtime CUDA beside its PyTorch backend and llama.cpp
CUDA, SmolLM2-135M-Instruct fp16 and its committed EAGLE-3 head, every configuration in its own processes.

    python3 scripts/gpu_kit/measure.py --work /tmp/kit --out $OUT [--dry] [--only ort-greedy,curve]

Run by scripts/gpu_kit/run.sh after its join/install/check stages ($WORK holds obj/, bundle/, llama-build/).
Steps, most important first (issue 63's order), each under its own timeout and all under one deadline
(--budget-s), so a slow step costs the later ones and never the call:

1. ort-greedy  `specrt bench --backend onnxruntime`: none, eagle (γ 4), eagle@auto (+ eagle-tree where the
               bundle's graphs verify trees), held-out chat prompts x 64 tokens, greedy;
2. ort-stats   `specrt run --stats --json` per method on one prompt: the "CUDA graphs" row (the target
               decoder's graph_status), host time per token, the provider really used;
3. torch       `specrt bench --backend torch --methods none` on the same weights (the Q4_1 GGUF read by
               transformers in float16: the ONNX bundle's weights came from the same dequantized values);
4. ort-t07     as 1 at temperature 0.7 (with greedy plain decoding beside it in each repeat);
5. llama       llama.cpp: an F16 GGUF of the same weights (llama-quantize --allow-requantize from the Q4_1 GGUF:
               both dequantize the same blocks), llama-completion plain and llama-speculative-simple with
               `--spec-type draft-eagle3` on the head (converted by llama.cpp's convert_hf_to_gguf.py), one
               process per prompt as side_by_side.py times them; the best --spec-draft-n-max kept;
6. curve       the target's pass time at 1-64 rows after a 128-token context, with CUDA graphs and eager
               (specrt's OrtDecoder, graphs=True/False), reading back the argmax summary as a step does.

Writes $OUT/kit.json (every step's figures and the issue's target ratios), $OUT/bench-ort-greedy.json,
$OUT/bench-ort-t07.json, $OUT/bench-torch.json (the device tool returns at most 8 files).
--dry: the same steps on the CPU, 2 prompts x 16 tokens, 1 repeat, 2 threads.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ROOT / "benchmarks/prompts/chat-heldout.json"
sys.path.insert(0, str(ROOT / "benchmarks/side-by-side"))
from side_by_side import PERF, SPEC_COUNT, SPEC_TIME  # noqa: E402  (llama.cpp's timing lines, parsed as there)

STEPS = ("ort-greedy", "ort-stats", "torch", "ort-t07", "llama", "curve")
CURVE_ROWS = (1, 2, 3, 4, 5, 8, 12, 16, 24, 32, 48, 64)
# llama.cpp's OpenMP pool with 2 threads on a shared 2-core VM collapsed to 0.34 tokens/s (1 thread: 43).
DRY_LLAMA_THREADS = ["-t", "1"]


class Run:
    """Settings and the deadline shared by every step."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.work, self.out, self.dry = a.work, a.out, a.dry
        self.bundle = a.work / "bundle"
        self.deadline = time.monotonic() + a.budget_s
        self.prompts = json.loads(PROMPTS.read_text())[: 2 if a.dry else None]
        self.tokens = 16 if a.dry else a.max_new_tokens
        self.repeats = 1 if a.dry else a.repeats
        self.threads = ["--threads", "2"] if a.dry else []
        self.spec_n = [2] if a.dry else a.spec_n
        self.result: dict = {"dry_run": a.dry, "steps": {}, "machine": machine(a.dry)}
        self.prompt_file = a.work / "prompts.json"
        self.prompt_file.write_text(json.dumps(self.prompts))

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def sh(self, cmd: list[str], limit: float, env: dict | None = None) -> subprocess.CompletedProcess:
        """One process, under min(limit, what the deadline leaves); its stderr's tail goes to ours on failure."""
        t = max(5.0, min(limit, self.left() - 5))
        print(f"[measure] $ {' '.join(map(str, cmd))[:300]}  (timeout {t:.0f} s)", flush=True)
        try:
            run = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=t,
                                 env={**os.environ, **(env or {})})
        except subprocess.TimeoutExpired:
            raise StepError(f"timed out after {t:.0f} s: {' '.join(map(str, cmd))[:200]}") from None
        if run.returncode:
            tail = "\n".join((run.stderr or run.stdout).strip().splitlines()[-15:])
            raise StepError(f"exit {run.returncode}: {' '.join(map(str, cmd))[:200]}\n{tail}")
        return run


class StepError(RuntimeError):
    pass


def machine(dry: bool) -> dict:
    info = {"python": platform.python_version(), "cpu_count": os.cpu_count()}
    try:
        import onnxruntime as ort

        info |= {"onnxruntime": ort.__version__, "onnxruntime_file": ort.__file__,
                 "available_providers": ort.get_available_providers()}
    except ImportError as e:
        info["onnxruntime"] = f"not importable: {e}"
    if not dry:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                            "--format=csv,noheader"], capture_output=True, text=True)
        info["gpu"] = q.stdout.strip() or q.stderr.strip()
    return info


def bench(r: Run, name: str, backend: str, methods: str, bundle: Path, extra: list[str], limit: float) -> dict:
    out = r.out / f"bench-{name}.json"
    r.sh([sys.executable, "-m", "specrt.cli", "bench", "--bundle", bundle, "--backend", backend, "--chat",
          "--prompts", r.prompt_file, "--max-new-tokens", r.tokens, "--repeats", r.repeats, "--methods", methods,
          *r.threads, *extra, "--json", out], limit)
    data = json.loads(out.read_text())
    keep = ("tokens_per_second", "speedup_vs_none", "tokens_per_target_pass", "target_pass_ms", "host_ms_per_token",
            "share_host", "greedy_matches_none", "mean_gamma", "acceptance_rate", "c", "verify_cost",
            "tokens_per_second_over_greedy")
    return {"provider": data["config"].get("provider"), "json": out.name,
            "methods": {m: {k: v for k, v in row.items() if k in keep} for m, row in data["methods"].items()}}


def ort_methods(r: Run) -> str:
    from specrt.bundle.manifest import load_manifest

    trees = load_manifest(r.bundle).runs_trees  # gqa-static graphs verify chains only (contract.CAUSAL_ONLY_GRAPHS)
    return "none,eagle,eagle@auto" + (",eagle-tree" if trees else "")


def step_ort_greedy(r: Run) -> dict:
    return bench(r, "ort-greedy", "onnxruntime", ort_methods(r), r.bundle, [], 240)


def step_ort_t07(r: Run) -> dict:
    return bench(r, "ort-t07", "onnxruntime", ort_methods(r), r.bundle, ["--temperature", "0.7"], 240)


GRAPH_ROW = re.compile(r"CUDA graphs\s*│?\s*(\S+)\s*│?\s*(.*?)\s*│?\s*$", re.M)


def step_ort_stats(r: Run) -> dict:
    """`specrt run --stats` as a user sees it: its table's "CUDA graphs" row, and the run's own stats."""
    rows = {}
    for method in ("none", "eagle"):
        run = r.sh([sys.executable, "-m", "specrt.cli", "run", r.prompts[0], "--chat", "--bundle", r.bundle,
                    "--backend", "onnxruntime", "--method", method, "--max-new-tokens", r.tokens, "--stats", "--json",
                    *r.threads], 90, env={"COLUMNS": "200"})
        stats = json.loads(run.stdout)["stats"]
        graphs = GRAPH_ROW.search(run.stderr)
        title = re.search(r"specrt run · method \S+ · (\S+)", run.stderr)
        rows[method] = {"provider": title.group(1) if title else None,
                        "cuda_graphs": [graphs.group(1), graphs.group(2)] if graphs else "no CUDA graphs row",
                        "graph_notes": [ln.strip() for ln in run.stderr.splitlines() if "CUDA graphs off" in ln][:4],
                        **{k: stats.get(k) for k in ("tokens_per_second", "tokens_per_target_pass", "host_ms_per_token",
                                                     "target_passes", "d2h_bytes_per_target_pass")}}
    return rows


def step_torch(r: Run) -> dict:
    """The PyTorch backend's plain decoding on the same weights: the bundle's manifest with its target's source
    pointed at the Q4_1 GGUF (transformers dequantizes it, in float16 as the bundle's dtype says)."""
    m = json.loads((r.bundle / "specrt.json").read_text())
    gguf = r.work / "obj" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    m["models"]["target"]["source"] = str(gguf)
    if r.dry:  # PyTorch's fp16 matmuls on a CPU: 1.6 s a pass; float32 runs the same code ~30x faster
        m["models"]["target"]["dtype"] = "float32"
    if "eagle" in m["models"] and (r.work / "obj" / "head").is_dir():
        m["models"]["eagle"]["source"] = str(r.work / "obj" / "head")
    tb = r.work / "bundle-torch"
    tb.mkdir(exist_ok=True)
    for f in r.bundle.iterdir():  # the same files, hard-linked (specrt refuses symlinks leading out of a bundle)
        if f.name != "specrt.json" and not (tb / f.name).exists():
            try:
                os.link(f, tb / f.name)
            except OSError:
                shutil.copyfile(f, tb / f.name)
    (tb / "specrt.json").write_text(json.dumps(m, indent=1))
    return bench(r, "torch", "torch", "none", tb, [], 240)


def llama_texts(r: Run) -> list[str]:
    from specrt.bundle.manifest import load_manifest
    from specrt.runtime.chat import ChatTemplate

    tok = load_manifest(r.bundle).tokenizer
    template = ChatTemplate.from_file(r.bundle / tok.chat_template, tok.special_tokens)
    return [template.render([{"role": "user", "content": p}]) for p in r.prompts]


def wait_llama(r: Run, wait_s: float) -> Path:
    rc_file, t0 = r.work / "llama-build.rc", time.monotonic()
    if not (r.work / "llama-build.pid").is_file() and not rc_file.is_file():
        raise StepError("llama.cpp's build was never started (run.sh llama-bg)")
    while not rc_file.is_file():
        if time.monotonic() - t0 > min(wait_s, r.left() - 60):
            raise StepError(f"llama.cpp's build still running after {time.monotonic() - t0:.0f} s")
        time.sleep(2)
    log = (r.work / "llama-build.log").read_text(errors="replace")
    if rc_file.read_text().strip() != "0":
        raise StepError("llama.cpp's build failed:\n" + "\n".join(log.strip().splitlines()[-15:]))
    r.result["llama_build"] = {"waited_s": round(time.monotonic() - t0, 1),
                               "time": re.findall(r"^(real|user)\s+(\S+)", log, re.M)}
    return r.work / "llama-build" / "bin"


def llama_plain(r: Run, binary: Path, gguf: Path, texts: list[str], gpu: list[str]) -> dict:
    tokens = ms = 0.0
    for text in texts:
        run = r.sh([binary, "-m", gguf, "-p", text, "-n", r.tokens, "--temp", "0", "-no-cnv", "-s", "0", *gpu,
                    *(DRY_LLAMA_THREADS if r.dry else [])], 60)
        perf = {m[0]: (float(m[1]), int(m[2])) for m in PERF.findall(run.stderr)}
        tokens += perf["eval"][1] + 1  # the first new token comes from the prompt's pass
        ms += perf["prompt eval"][0] + perf["eval"][0]
    return {"tokens_per_second": tokens / ms * 1000, "tokens": tokens}


def llama_spec(r: Run, binary: Path, gguf: Path, head: Path, n_max: int, texts: list[str], gpu: list[str]) -> dict:
    tokens = seconds = drafted = accepted = 0.0
    for text in texts:
        run = r.sh([binary, "-m", gguf, "-p", text, "-n", r.tokens, "--temp", "0", "-s", "0", "--spec-type",
                    "draft-eagle3", "-md", head, "--spec-draft-n-max", n_max, *gpu,
                    *(["-ngld", "99"] if gpu else []), *(DRY_LLAMA_THREADS if r.dry else [])], 60)
        times = {m[0]: (int(m[1]), float(m[2])) for m in SPEC_TIME.findall(run.stderr)}
        counts = {m[0]: int(m[1]) for m in SPEC_COUNT.findall(run.stderr)}
        tokens += times["decoded"][0]
        seconds += times["encoded"][1] + times["decoded"][1]
        drafted, accepted = drafted + counts["drafted"], accepted + counts["accept"]
    return {"tokens_per_second": tokens / seconds, "acceptance": accepted / max(drafted, 1), "tokens": tokens}


def step_llama(r: Run, wait_s: float) -> dict:
    bin_dir = wait_llama(r, wait_s)
    obj = r.work / "obj"
    f16 = r.work / "smollm2-135m-f16.gguf"
    if not f16.is_file():  # Q4_1 -> F16: the same dequantized blocks the ONNX bundle's fp16 weights hold
        r.sh([bin_dir / "llama-quantize", "--allow-requantize", obj / "SmolLM2-135M-Instruct.Q4_1.gguf", f16,
              "F16"], 120)
    texts = llama_texts(r)
    gpu = [] if r.dry else ["-ngl", "99"]
    out = {"gguf": f16.name, "plain": llama_plain(r, bin_dir / "llama-completion", f16, texts, gpu), "spec": {}}
    for n in r.spec_n:
        try:
            out["spec"][f"draft-eagle3 n_max {n}"] = llama_spec(r, bin_dir / "llama-speculative-simple", f16,
                                                                obj / "smollm2-eagle3-f16.gguf", n, texts, gpu)
        except StepError as e:  # one failed setting leaves the others
            out["spec"][f"draft-eagle3 n_max {n}"] = {"error": str(e)[:2000]}
    ok = {k: v for k, v in out["spec"].items() if "tokens_per_second" in v}
    if ok:
        best = max(ok, key=lambda k: ok[k]["tokens_per_second"])
        out["best_spec"] = {"mode": best, **ok[best]}
    return out


def curve_worker(bundle: Path, graphs: bool, rows: list[int], past: int, reps: int, dry: bool) -> dict:
    """Median ms of one target pass per row count at ``past``, the step's readback included (the argmax of
    every row: the summary a greedy verify reads)."""
    import numpy as np

    from specrt.bundle.manifest import load_manifest
    from specrt.runtime.backends.onnxruntime import OrtDecoder
    from specrt.runtime.masks import causal_mask

    entry = load_manifest(bundle).target
    dec = OrtDecoder(bundle, entry, threads=2 if dry else None, graphs=graphs)
    cache = dec.new_cache(load_manifest(bundle).max_context)  # the generator's cache: the bundle's max context
    ids = np.random.default_rng(0).integers(0, entry.dims.vocab_size, past + max(rows))
    dec.forward(cache, ids[:past], np.arange(past), causal_mask(past, 0))
    cache.advance(past)

    def read(out) -> None:
        if out.device_logits is not None:
            out.device_logits.argmax()
        else:
            out.logits.argmax(-1)

    ms = {}
    for q in rows:
        args = (ids[past:past + q], np.arange(past, past + q), causal_mask(q, past))
        for _ in range(3):  # the first pass of a bucket captures its graph
            read(dec.forward(cache, *args))
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            read(dec.forward(cache, *args))
            times.append(time.perf_counter() - t0)
        ms[str(q)] = 1e3 * statistics.median(times)
    return {"graphs_asked": graphs, "provider": dec.provider, "graph_status": dec.graph_status, "past": past, "ms": ms,
            "ratio_to_1": {k: v / ms["1"] for k, v in ms.items()}}


def step_curve(r: Run) -> dict:
    rows = [1, 2, 4, 8] if r.dry else list(CURVE_ROWS)
    out = {}
    for graphs in (True, False):
        run = r.sh([sys.executable, __file__, "--curve-worker", "--work", r.work, "--out", r.out,
                    "--curve-graphs", str(int(graphs)), "--curve-rows", ",".join(map(str, rows)),
                    *(["--dry"] if r.dry else [])], 120)
        out["graphs" if graphs else "eager"] = json.loads(run.stdout.strip().splitlines()[-1])
    return out


def targets(res: dict) -> dict:
    """Issue 63's targets, as far as the steps that ran allow."""
    s, t = res["steps"], {}
    try:
        ort = s["ort-greedy"]["methods"]
        t["ort_none_tok_s"] = ort["none"]["tokens_per_second"]
        t["ort_best"] = max(((m, v["tokens_per_second"]) for m, v in ort.items()), key=lambda x: x[1])
        t["host_ms_per_token"] = {m: v.get("host_ms_per_token") for m, v in ort.items()}
        t["ort_none_over_torch_none (>= 3)"] = ort["none"]["tokens_per_second"] / \
            s["torch"]["methods"]["none"]["tokens_per_second"]
    except (KeyError, TypeError):
        pass
    try:
        llama = s["llama"]
        t["ort_none_over_llama_plain (>= 1.0)"] = t["ort_none_tok_s"] / llama["plain"]["tokens_per_second"]
        best_llama = max(llama["plain"]["tokens_per_second"], llama.get("best_spec", {}).get("tokens_per_second", 0))
        t["specrt_best_over_llama_best (>= 1.5)"] = t["ort_best"][1] / best_llama
    except (KeyError, TypeError):
        pass
    try:
        g = s["curve"]["graphs"]["ms"]
        t["verify_16_over_1_graphs (<= 1.2)"] = g["16"] / g["1"]
    except (KeyError, TypeError):
        pass
    return t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dry", action="store_true")
    ap.add_argument("--only", default=",".join(STEPS), help="comma-separated steps, in the order above")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=int(os.environ.get("REPEATS", 3)))
    ap.add_argument("--spec-n", default=os.environ.get("LLAMA_SPEC_N", "2,4"),
                    type=lambda s: [int(x) for x in s.split(",")], help="llama.cpp's --spec-draft-n-max values tried")
    ap.add_argument("--budget-s", type=float, default=float(os.environ.get("MEASURE_S", 420)) - 15)
    ap.add_argument("--llama-wait-s", type=float, default=float(os.environ.get("LLAMA_WAIT_S", 300)))
    ap.add_argument("--curve-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--curve-graphs", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--curve-rows", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.curve_worker:
        rows = [int(x) for x in a.curve_rows.split(",")]
        print(json.dumps(curve_worker(a.work / "bundle", bool(a.curve_graphs), rows, 128, 10 if a.dry else 30, a.dry)))
        return 0
    r = Run(a)
    r.result["settings"] = {"prompts": len(r.prompts), "max_new_tokens": r.tokens, "repeats": r.repeats,
                            "llama_spec_n": r.spec_n, "bundle": json.loads((r.bundle / "specrt.json").read_text())
                            .get("models", {}).get("target", {}).get("graph")}
    made = r.work / "kit.json"
    if made.is_file():
        r.result["made"] = json.loads(made.read_text()).get("made")
    steps = {"ort-greedy": lambda: step_ort_greedy(r), "ort-stats": lambda: step_ort_stats(r),
             "torch": lambda: step_torch(r), "ort-t07": lambda: step_ort_t07(r),
             "llama": lambda: step_llama(r, a.llama_wait_s), "curve": lambda: step_curve(r)}
    failed = 0
    for name in [s for s in STEPS if s in a.only.split(",")]:
        t0 = time.monotonic()
        if r.left() < 30:
            r.result["steps"][name] = {"skipped": f"the deadline ({a.budget_s:.0f} s) was reached"}
            print(f"[measure] {name}: SKIPPED, out of time", flush=True)
            continue
        # llama.cpp's background build competing for the CPU while a step ran: its host times read with that in mind
        building = (r.work / "llama-build.pid").is_file() and not (r.work / "llama-build.rc").is_file()
        try:
            r.result["steps"][name] = steps[name]()
            r.result["steps"][name]["seconds"] = round(time.monotonic() - t0, 1)
            r.result["steps"][name]["llama_build_running_at_start"] = building
            print(f"[measure] {name}: done in {time.monotonic() - t0:.0f} s", flush=True)
        except (StepError, OSError, KeyError, ValueError, json.JSONDecodeError) as e:
            failed += 1
            r.result["steps"][name] = {"error": f"{type(e).__name__}: {e}"[:3000],
                                       "seconds": round(time.monotonic() - t0, 1)}
            print(f"[measure] {name}: FAILED: {e}", flush=True)
        r.result["targets"] = targets(r.result)
        (r.out / "kit.json").write_text(json.dumps(r.result, indent=1))  # after every step: a kill keeps the rest
    print(json.dumps(r.result["targets"], indent=1))
    for name, s in r.result["steps"].items():
        print(f"{name:11s} " + ("FAILED" if "error" in s else "skipped" if "skipped" in s else "ok")
              + f"  {s.get('seconds', '')} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
