"""Real model families at real dimensions (random weights built from configs): export, parity, memory, speed.

    python scripts/scale_check.py [--families llama-3.2-1b,qwen3-0.6b,gemma-2-2b,phi-3-mini]
                                  [--dtypes float16,float32] [--work /tmp/specrt-scale]
                                  [--json WORK/scale-check.json] [--tokens 16] [--layers N]

For each family: a target at the real checkpoint's dimensions (vocabulary, widths, depth, rope
scaling, windows, soft-caps) and a 2-layer draft of the same family and vocabulary, saved in bf16 like
the real checkpoints; the final norm is scaled so the logits spread like a trained model's (std ~3),
not a random model's (~1). Each dtype's export runs in its own process, so its wall time and peak
RSS are its own; the bundle then decodes greedily with --method none and --method draft, which must
agree token for token, in another (ONNX Runtime's low-memory session where the default would not fit;
its peak memory recorded too). A process the kernel kills still leaves its row: its figures up to then
and the signal. Not in CI (minutes and gigabytes per family); nothing is downloaded. The figures go to the
work folder unless --json names benchmarks/scale/scale-check.json: that file's rows stand under
docs/performance/scale-check.md's date and machine, so only a run meant to replace them should write it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

# Dimensions from the public config.json of each checkpoint (the draft: 2 layers of the same family).
FAMILIES = {
    "llama-3.2-1b": ("llama", dict(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, max_position_embeddings=131072, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        tie_word_embeddings=True, bos_token_id=128000, eos_token_id=[128001, 128008, 128009])),
    "qwen3-0.6b": ("qwen3", dict(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=True,
        bos_token_id=151643, eos_token_id=151645)),
    "gemma-2-2b": ("gemma2", dict(
        vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
        num_key_value_heads=4, head_dim=256, query_pre_attn_scalar=256, max_position_embeddings=8192,
        sliding_window=4096, final_logit_softcapping=30.0, attn_logit_softcapping=50.0,
        hidden_activation="gelu_pytorch_tanh", bos_token_id=2, eos_token_id=[1, 107], pad_token_id=0)),
    "phi-3-mini": ("phi3", dict(
        vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, max_position_embeddings=4096, original_max_position_embeddings=4096,
        sliding_window=2047, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=[32000, 32007],
        pad_token_id=32000)),
}
DRAFT = dict(num_hidden_layers=2)
PROMPTS = ["def fibonacci(n):\n    ", "import numpy as np\n\nclass Matrix:\n"]

EXPORT = """
import json, sys, time
from specrt.export.exporter import ExportOptions, export_bundle
t = time.perf_counter()
m = export_bundle(sys.argv[1], sys.argv[2], sys.argv[3], ExportOptions(dtype=sys.argv[4], force=True))
print(json.dumps({"export_s": time.perf_counter() - t,
                  "graphs": {r: e.graph for r, e in m.models.items()},
                  "parity": {r: e.parity for r, e in m.models.items()},
                  "parity_tolerance": m.target.parity_tolerance, "max_context": m.max_context}))
"""
# The decode runs in its own process too, so its memory is the run time's alone; ONNX Runtime's
# low-memory session is chosen as `specrt run` would choose it (the notes say where and why).
DECODE = """
import json, sys, time
import specrt
gen = specrt.load(sys.argv[1])
tokens, prompts, out = int(sys.argv[2]), json.loads(sys.argv[3]), {}
for method in ("none", "draft"):
    ids, t = [], time.perf_counter()
    for p in prompts:
        ids.append(gen.generate(p, max_new_tokens=tokens, method=method, gamma=3).token_ids)
    out[method] = {"token_ids": ids, "tokens_per_second": sum(map(len, ids)) / (time.perf_counter() - t)}
print(json.dumps({"greedy_draft_equals_none": out["none"]["token_ids"] == out["draft"]["token_ids"],
                  **{f"{m}_tokens_per_second": round(v["tokens_per_second"], 2) for m, v in out.items()},
                  "memory_notes": gen.memory_notes}))
"""


def _tree(pid: int) -> list[int]:
    try:
        kids = open(f"/proc/{pid}/task/{pid}/children").read().split()
    except OSError:
        return [pid]
    return [pid] + [p for k in kids for p in _tree(int(k))]


def _memory(pid: int) -> tuple[int, int]:
    rss = anon = 0
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("RssAnon:"):
                anon = int(line.split()[1]) * 1024
    except OSError:
        pass
    return rss, anon


def measured(code: str, *args: str) -> tuple[dict, dict]:
    """Run ``code`` in a child process: (its last stdout line as JSON, or {"error": ...}; its wall time and
    the peak memory of its whole process tree (the export runs each model's PyTorch side in a child of
    its own), sampled every 20 ms from here, so a child the kernel kills still has its figures: RSS
    (file-backed pages of memory-mapped checkpoints and external data included) and anonymous memory
    alone (mapped pages are page cache the kernel can drop))."""
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    peak = [0, 0]

    def sample() -> None:
        while proc.poll() is None:
            now = [_memory(p) for p in _tree(proc.pid)]
            peak[:] = [max(peak[i], sum(m[i] for m in now)) for i in (0, 1)]
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    sampler.join()
    figures = {"wall_s": round(time.perf_counter() - t, 1), "peak_rss_bytes": peak[0], "peak_anon_bytes": peak[1]}
    if proc.returncode < 0:  # SIGKILL here is the kernel's out-of-memory killer
        return {"error": f"killed by signal {-proc.returncode}"}, figures
    if proc.returncode:
        last = err.strip().splitlines()[-1:] or ["no message"]
        return {"error": f"exit {proc.returncode}: {last[0]}"}, figures
    return json.loads(out.strip().splitlines()[-1]), figures


def tokenizer():
    """A byte-level BPE (8,000 ids) trained on the standard library's sources: the models' vocabularies
    are larger, as padded vocabularies are (ids past the tokenizer are never fed, only scored)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = [p.read_text(errors="ignore") for p in sorted(Path(json.__file__).parent.parent.glob("*.py"))[:60]]
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=8000, special_tokens=["<s>", "</s>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                      show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


def build(work: Path, family: str, layers: int | None = None) -> tuple[Path, Path, int]:
    """Target and draft folders (bf16 safetensors), reused when present; returns the target's parameters."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, dims = FAMILIES[family]
    if layers:
        dims = {**dims, "num_hidden_layers": layers}
        family = f"{family}-{layers}-layers"
    folders = work / family / "target", work / family / "draft"
    if all((f / "config.json").exists() for f in folders):
        return (*folders, json.loads((folders[0] / "params.json").read_text())["params"])
    tok = tokenizer()
    for folder, extra in zip(folders, ({}, DRAFT)):
        torch.manual_seed(0)
        cfg = AutoConfig.for_model(model_type, **{**dims, **extra})
        with torch.device("cpu"):
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
        with torch.no_grad():  # spread the logits like a trained model's (std ~3)
            ids = torch.tensor([tok.encode(PROMPTS[0] * 4)[:48]])
            std = float(model(ids).logits.float().std())
            model.model.norm.weight.mul_(3.0 / std) if model_type != "gemma2" else model.model.norm.weight.add_(
                (3.0 / std - 1.0) * (1.0 + model.model.norm.weight))
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
        params = sum(p.numel() for p in model.parameters())
        (folder / "params.json").write_text(json.dumps({"params": params}))
        del model
    return (*folders, json.loads((folders[0] / "params.json").read_text())["params"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--dtypes", default="float16,float32")
    ap.add_argument("--work", type=Path, default=Path("/tmp/specrt-scale"))
    ap.add_argument("--json", type=Path, default=None,
                    help="where the rows go (merged by family and dtype) [default: WORK/scale-check.json]")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--layers", type=int, default=None,
                    help="target depth instead of the checkpoint's (real widths and vocabulary, less time)")
    args = ap.parse_args()
    args.json = args.json or args.work / "scale-check.json"
    args.json.parent.mkdir(parents=True, exist_ok=True)
    results = json.loads(args.json.read_text()) if args.json.exists() else {}
    for family in args.families.split(","):
        target, draft, params = build(args.work, family, args.layers)
        family = f"{family} ({args.layers} layers)" if args.layers else family
        for dtype in args.dtypes.split(","):
            bundle = target.parent / f"bundle-{dtype}"
            got, figures = measured(EXPORT, str(target), str(draft), str(bundle), dtype)
            row = {"params": params, "weight_bytes": params * (2 if dtype == "float16" else 4),
                   **{k: v for k, v in figures.items() if k != "wall_s"}, **got}
            if "error" not in row:
                row["peak_rss_over_weights"] = round(row["peak_rss_bytes"] / row["weight_bytes"], 2)
                # the budget: 1.5x the weights + 2 GB
                row["within_budget"] = row["peak_rss_bytes"] <= 1.5 * row["weight_bytes"] + 2 * 2**30
                got, figures = measured(DECODE, str(bundle), str(args.tokens), json.dumps(PROMPTS))
                row.update({f"decode_{k}": v for k, v in figures.items()}, **got)
                if "error" in got:
                    row["decode_error"] = row.pop("error")
            else:
                row["export_s"] = figures["wall_s"]  # until it failed
            results[f"{family} {dtype}"] = row
            print(family, dtype, json.dumps({k: v for k, v in row.items() if k != "parity"}), flush=True)
            args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
