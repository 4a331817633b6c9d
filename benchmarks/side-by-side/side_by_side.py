"""specrt and llama.cpp on the same GGUF weights, each in its own processes, as users run them.

    python benchmarks/side-by-side/side_by_side.py --bundle B[=METHODS] [--bundle ...] --gguf FILE [--gguf ...] \
        --llama-bin DIR [--llama-spec 'GGUF=ARGS' ...] [--genai [LABEL=]MODEL_DIR ...] --prompts P.json [--chat]
        [--max-new-tokens 64] [--rounds 3] [--threads 2] [--temperature 0] [--json OUT] [--bench-args '--gamma 2']

Each round runs every engine once, in turn (the order rotates by round): a bundle is one `specrt bench`
process over all prompts (its methods, default `none`; its tokens/s counts prefill and decoding); a GGUF is
one `llama-completion` process per prompt (greedy, the same thread count; its tokens/s is llama.cpp's own
"prompt eval" + "eval" time over the tokens it produced, the load excluded as specrt's bench excludes
session creation, and both warm up first); `--llama-spec 'GGUF=ARGS'` is llama.cpp's speculative decoding on
that GGUF, one `llama-speculative-simple` process per prompt with ARGS added (e.g. `--spec-type draft-eagle3
-md head.gguf`), timed as its own "encoded" + "decoded" lines, its acceptance recorded; an ONNX Runtime GenAI model folder (`--genai`, e.g. the build
`specrt bench --compare ortgenai` caches) is one child process over all prompts, timed from its
``GeneratorParams`` to its last token per prompt after one warm-up. Chat prompts reach llama.cpp as the text the bundle's chat template renders. Medians
over rounds, and each engine's ratio to the first GGUF. ``--temperature T`` samples at T everywhere: llama.cpp with
its default top-k, top-p and min-p turned off (``--top-k 0 --top-p 1 --min-p 0``), so both draw from the model's own
distribution at T; GenAI stays greedy (refused with T > 0).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PERF = re.compile(r"(prompt eval|\beval) time =\s*([\d.]+) ms /\s*(\d+) (tokens|runs)")
SPEC_TIME = re.compile(r"(encoded|decoded)\s+(\d+) tokens in\s+([\d.]+) seconds")
SPEC_COUNT = re.compile(r"n_(drafted|accept)\s+=\s+(\d+)")


def specrt_round(bundle: str, methods: str, prompts: str, chat: bool, n: int, threads: int,
                 extra: list[str], shift: int = 0) -> dict[str, float]:
    """One `specrt bench` process over every method; round ``shift`` starts ``shift`` methods later, so that on a
    machine whose speed drifts within a process no method always runs first (or last)."""
    names = methods.split(",")
    methods = ",".join(names[shift % len(names):] + names[:shift % len(names)])
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        cmd = [sys.executable, "-m", "specrt.cli", "bench", "--bundle", bundle, "--methods", methods, "--prompts",
               prompts, "--max-new-tokens", str(n), "--repeats", "1", "--threads", str(threads), "--json", str(out)]
        run = subprocess.run(cmd + (["--chat"] if chat else []) + extra, capture_output=True, text=True)
        if run.returncode:
            raise SystemExit(f"specrt bench --bundle {bundle} failed: {run.stderr.strip() or run.stdout.strip()}")
        return {m: r["tokens_per_second"] for m, r in json.loads(out.read_text())["methods"].items()}


def sampling_args(temperature: float) -> list[str]:
    """llama.cpp's sampling at ``temperature``: greedy at 0, else T alone (its top-k 40, top-p 0.95, min-p 0.05
    defaults off, as specrt's bench samples)."""
    if temperature == 0:
        return ["--temp", "0"]
    return ["--temp", str(temperature), "--top-k", "0", "--top-p", "1", "--min-p", "0"]


def llama_round(binary: Path, gguf: str, texts: list[str], n: int, threads: int,
                temperature: float = 0.0) -> dict[str, float]:
    tokens = ms = 0.0
    for text in texts:
        run = subprocess.run([str(binary), "-m", gguf, "-p", text, "-n", str(n), *sampling_args(temperature),
                              "-t", str(threads), "-no-cnv", "-s", "0"], capture_output=True, text=True, check=True)
        perf = {m[0]: (float(m[1]), int(m[2])) for m in PERF.findall(run.stderr)}
        prompt_ms, decode = perf["prompt eval"][0], perf["eval"]
        tokens += decode[1] + 1  # the first new token comes from the prompt's pass
        ms += prompt_ms + decode[0]
    return {"plain": tokens / ms * 1000}


def llama_spec_round(binary: Path, gguf: str, args: list[str], texts: list[str], n: int,
                     threads: int, temperature: float = 0.0) -> dict[str, float]:
    """llama.cpp's speculative decoding (`llama-speculative-simple`), greedy: tokens/s over its encode + decode
    time, and the share of drafted tokens its target kept."""
    tokens = seconds = drafted = accepted = 0.0
    for text in texts:
        run = subprocess.run([str(binary), "-m", gguf, "-p", text, "-n", str(n), *sampling_args(temperature),
                              "-t", str(threads), "-s", "0", *args], capture_output=True, text=True, check=True)
        times = {m[0]: (int(m[1]), float(m[2])) for m in SPEC_TIME.findall(run.stderr)}
        counts = {m[0]: int(m[1]) for m in SPEC_COUNT.findall(run.stderr)}
        tokens += times["decoded"][0]
        seconds += times["encoded"][1] + times["decoded"][1]
        drafted, accepted = drafted + counts["drafted"], accepted + counts["accept"]
    return {"speculative": tokens / seconds, "acceptance": accepted / max(drafted, 1)}


def genai_round(model_dir: str, texts: list[str], n: int, threads: int) -> dict[str, float]:
    """ONNX Runtime GenAI on its own model folder (e.g. `specrt bench --compare ortgenai`'s cached build), in a
    child process of this script: prefill + decoding over the tokens it produced, after one warm-up."""
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "texts.json"
        spec.write_text(json.dumps(texts))
        run = subprocess.run([sys.executable, __file__, "--genai-worker", model_dir, "--prompts", str(spec),
                              "--max-new-tokens", str(n), "--threads", str(threads)],
                             capture_output=True, text=True, check=True)
        return {"plain": json.loads(run.stdout.strip().splitlines()[-1])["tokens_per_second"]}


def genai_worker(model_dir: str, texts: list[str], n: int, threads: int) -> None:
    from specrt.measure.peers.ortgenai import OrtGenaiPeer
    from specrt.runtime.sampling import SamplingConfig

    peer, greedy = OrtGenaiPeer(Path(model_dir), threads=threads), SamplingConfig(temperature=0.0)
    ids = [peer.encode(t) for t in texts]
    peer.generate(ids[:1], n, greedy, 0)  # warm-up, as specrt's bench and llama.cpp's own
    run = peer.generate(ids, n, greedy, 0)
    print(json.dumps({"tokens_per_second": run.tokens_per_second}))


def short(args: str) -> str:
    """llama.cpp's arguments as a label: files by their names."""
    return " ".join(Path(a).name if Path(a).is_file() else a for a in args.split())


def prompt_texts(bundle: str, prompts: list[str], chat: bool) -> list[str]:
    """What llama.cpp is given: the chat template's text (its own BOS rule applies) or the prompt itself."""
    if not chat:
        return prompts
    import specrt

    gen = specrt.load(bundle, threads=1)
    return [gen.render_chat([{"role": "user", "content": p}]) for p in prompts]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", action="append", default=[], help="BUNDLE or BUNDLE=method,method")
    ap.add_argument("--gguf", action="append", default=[])
    ap.add_argument("--llama-spec", action="append", default=[],
                    help="GGUF=ARGS: llama-speculative-simple on GGUF with ARGS, e.g. '--spec-type draft-eagle3 -md H'")
    ap.add_argument("--genai", action="append", default=[], help="an ONNX Runtime GenAI model folder, or LABEL=FOLDER")
    ap.add_argument("--genai-worker", help=argparse.SUPPRESS)
    ap.add_argument("--llama-bin", type=Path, help="folder holding llama-completion (with --gguf)")
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--chat", action="store_true")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--temperature", type=float, default=0.0, help="sampling temperature for every engine (0: greedy)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--bench-args", default="", help="more `specrt bench` options, e.g. '--gamma 2'")
    a = ap.parse_args()
    prompts = json.loads(Path(a.prompts).read_text())
    if a.genai_worker:
        return genai_worker(a.genai_worker, prompts, a.max_new_tokens, a.threads)
    if (a.gguf or a.llama_spec) and a.llama_bin is None:
        ap.error("--gguf and --llama-spec need --llama-bin")
    if a.temperature < 0 or (a.temperature > 0 and a.genai):
        ap.error("--temperature must be >= 0, and 0 with --genai (its worker decodes greedily)")
    bundles = [b.split("=", 1) if "=" in b else (b, "none") for b in a.bundle]
    texts = prompt_texts(bundles[0][0], prompts, a.chat) if bundles else prompts
    engines = [(f"llama.cpp {Path(g).name}", lambda r, g=g: llama_round(a.llama_bin / "llama-completion", g, texts,
                                                                      a.max_new_tokens, a.threads, a.temperature))
               for g in a.gguf]
    specs = [spec.split("=", 1) for spec in a.llama_spec]
    engines += [(f"llama.cpp {Path(g).name} {short(args)}", lambda r, g=g, args=args: llama_spec_round(
        a.llama_bin / "llama-speculative-simple", g, args.split(), texts, a.max_new_tokens, a.threads,
        a.temperature))
        for g, args in specs]
    genai = [g.split("=", 1) if "=" in g else (Path(g).name, g) for g in a.genai]
    engines += [(f"ONNX Runtime GenAI {label}", lambda r, g=g: genai_round(g, texts, a.max_new_tokens, a.threads))
                for label, g in genai]
    extra = a.bench_args.split() + (["--temperature", str(a.temperature)] if a.temperature else [])
    engines += [(f"specrt {Path(b).name}", lambda r, b=b, m=m: specrt_round(
        b, m, a.prompts, a.chat, a.max_new_tokens, a.threads, extra, shift=r)) for b, m in bundles]
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, _ in engines}
    for r in range(a.rounds):
        for name, run in engines[r % len(engines):] + engines[:r % len(engines)]:
            runs[name].append(run(r))  # r: the round, which rotates the order of specrt's methods
            print(f"round {r + 1}: {name} {runs[name][-1]}", flush=True)
    rows = {f"{name} · {m}": statistics.median(x[m] for x in reps) for name, reps in runs.items() for m in reps[0]
            if m != "acceptance"}
    acceptance = {f"{name} · speculative": statistics.median(x["acceptance"] for x in reps)
                  for name, reps in runs.items() if "acceptance" in reps[0]}
    base = next(iter(rows.values()))
    for name, tps in rows.items():
        print(f"{name:60s} {tps:7.1f} tokens/s  {tps / base:5.2f}x")
    if a.json:
        a.json.write_text(json.dumps({"prompts": a.prompts, "chat": a.chat, "max_new_tokens": a.max_new_tokens,
                                      "rounds": a.rounds, "threads": a.threads, "bench_args": a.bench_args,
                                      "temperature": a.temperature,
                                      "tokens_per_second": rows, "llama_acceptance": acceptance,
                                      "runs": runs}, indent=2) + "\n")


if __name__ == "__main__":
    main()
