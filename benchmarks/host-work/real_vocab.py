"""Host work at a real vocabulary: a 151,936-id (Qwen2) pair with small layers, built from configs.

    python benchmarks/host-work/real_vocab.py [--work DIR] [--json benchmarks/host-work/real-vocab-cpu.json]
                                              [--ortgenai]

1. The numpy work of one γ = 4 step (4 draft rows + 5 target rows + verification) with the dense
   float64 reference path (``probs_from_logits`` + ``verify_chain``, what the runtime ran before) and
   with the runtime's path (``warp`` + ``accept_chain`` on lazily warped rows), at V = 4,096 /
   128,256 / 151,936, on logits shaped like a trained model's (mean entropy ~2.5 nats).
2. ``specrt bench`` figures of the exported pair (none and draft) for greedy, T 1.0, T 0.8 top-p 0.9 and
   T 0.8 top-k 50, one run: sampled tokens/s over greedy tokens/s, and host time per generated token.
3. ``--ortgenai``: ONNX Runtime GenAI plain decoding of the same Hugging Face target (its own model
   builder, fp32, CPU; ``specrt.measure.peers.ortgenai``), same prompt ids and settings, inside specrt's runs.
4. ``--device-logits``: what a GPU backend brings up per target pass when its logits stay in device
   memory and are read through the logits summary graph, against copying every row (as before). The
   ONNX Runtime backend's own device-logits path runs here on a host stand-in of device memory
   (tests/fake_device.py), so the bytes are the code's, not an estimate; no time is measured.
   ``--device-logits-only`` runs this section alone and merges it into the JSON.

Every setting, method and peer runs once per repeat, interleaved; figures are medians over repeats.

Random weights give a near-uniform next-token distribution, where every top-p keeps ~90 % of the
vocabulary; the final norm is scaled so that the mean next-token entropy is ~2.5 nats, like a trained
model's, before anything is measured. Nothing here downloads anything.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

VOCAB = 151_936
SETTINGS = {"greedy": dict(temperature=0.0), "T1.0": dict(temperature=1.0),
            "T0.8 top-p 0.9": dict(temperature=0.8, top_p=0.9), "T0.8 top-k 50": dict(temperature=0.8, top_k=50)}


# ---------------------------------------------------------------- 1. the numpy work of one step
def trained_like_logits(rng: np.random.Generator, v: int, rows: int) -> np.ndarray:
    z = rng.standard_normal((rows, v)).astype(np.float32)
    for r in range(rows):
        z[r, rng.choice(v, 24, replace=False)] += rng.uniform(9, 15, 24)
    return z


def step_work_ms(v: int, settings: dict, repeats: int = 15) -> dict[str, float]:
    from specrt.runtime.rows import LogitRows
    from specrt.runtime.sampling import SamplingConfig, probs_from_logits, sample
    from specrt.runtime.acceptance import accept_chain, verify_chain

    rng = np.random.default_rng(v)
    target = trained_like_logits(rng, v, 5)
    draft = target[:4] + rng.standard_normal((4, v)).astype(np.float32)
    out: dict[str, float] = {}
    for name, kw in settings.items():
        cfg = SamplingConfig(**kw)
        dense, fast = [], []
        for r in range(repeats):
            t0 = time.perf_counter()
            q = [probs_from_logits(draft[i:i + 1], cfg)[0] for i in range(4)]
            toks = [sample(row, rng) for row in q]
            verify_chain(probs_from_logits(target, cfg), np.stack(q), toks, np.random.default_rng(r))
            t1 = time.perf_counter()
            qd = [LogitRows(draft[i:i + 1], cfg, v)[0] for i in range(4)]
            toks = [d.sample(rng) for d in qd]
            accept_chain(LogitRows(target, cfg, v), qd, toks, np.random.default_rng(r))
            t2 = time.perf_counter()
            dense.append(t1 - t0)
            fast.append(t2 - t1)
        out[name] = {"dense_reference_ms": 1000 * statistics.median(dense), "runtime_ms": 1000 * statistics.median(fast)}
    return out


# ---------------------------------------------------------------- 2. the exported pair
def build_pair(work: Path, hidden: int, layers: int, entropy: float) -> tuple[Path, Path]:
    """A Qwen2 target with a 151,936-id head and small layers, and a draft made of its embedding, first
    layer and head (a layer-skip draft: correlated with the target, so some drafts are accepted)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    target_dir, draft_dir = work / "target", work / "draft"
    if (target_dir / "config.json").exists() and (draft_dir / "config.json").exists():
        return target_dir, draft_dir
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = [p.read_text(errors="ignore") for p in sorted(Path(json.__file__).parent.parent.glob("*.py"))[:60]]
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=8000, special_tokens=["<|endoftext|>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                      show_progress=False))
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")

    def config(n_layers: int) -> Qwen2Config:
        return Qwen2Config(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=n_layers,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                           tie_word_embeddings=True, bos_token_id=0, eos_token_id=0)

    torch.manual_seed(0)
    target = Qwen2ForCausalLM(config(layers)).eval()
    ids = torch.tensor(hf_tok.encode("".join(text[:8]))[:1024]).reshape(4, 256)

    def mean_entropy(scale: float) -> float:
        with torch.no_grad():
            target.model.norm.weight.fill_(scale)
            logp = torch.log_softmax(target(ids).logits.float(), -1)
            return float(-(logp.exp() * logp).sum(-1).mean())

    lo, hi = 1.0, 400.0  # bisection on the final norm's scale: the logits scale with it
    for _ in range(30):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if mean_entropy(mid) > entropy else (lo, mid)
    print(f"final norm scale {hi:.1f}: mean next-token entropy {mean_entropy(hi):.2f} nats", file=sys.stderr)
    draft = Qwen2ForCausalLM(config(1)).eval()
    with torch.no_grad():
        draft.model.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
        draft.model.layers[0].load_state_dict(target.model.layers[0].state_dict())
        draft.model.norm.weight.copy_(target.model.norm.weight)
    for folder, model in ((target_dir, target), (draft_dir, draft)):
        model.save_pretrained(folder)
        hf_tok.save_pretrained(folder)
    return target_dir, draft_dir


def prompts() -> list[str]:
    from specrt.data import prompts as builtin_prompts

    return builtin_prompts("code")


def bench_pair(bundle: Path, max_new_tokens: int, repeats: int, threads: int | None,
               ortgenai_model: Path | None) -> dict:
    """Every setting and method (and ONNX Runtime GenAI) once per repeat, interleaved, so drift of the
    machine hits all alike; medians over repeats."""
    import specrt
    from specrt.measure.bench import BenchConfig, run_bench
    from specrt.measure.peers.ortgenai import OrtGenaiPeer

    gen = specrt.load(bundle, threads=threads)
    peers = [OrtGenaiPeer(ortgenai_model, threads=threads)] if ortgenai_model else []
    runs: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    for r in range(repeats):
        for name, kw in SETTINGS.items():
            cfg = BenchConfig(methods=("none", "draft"), max_new_tokens=max_new_tokens, repeats=1, seed=r,
                              greedy_baseline=False, **kw)  # greedy is a setting of its own here
            result = run_bench(gen, prompts(), cfg, peers=peers)
            if peers:
                result["ortgenai_tokens_per_second"] = result["peers"]["ortgenai"]["tokens_per_second"]
            runs[name].append(result)
            print(f"repeat {r + 1} {name}: " + ", ".join(
                f"{m} {x['tokens_per_second']:.0f} tok/s (host {x['host_ms_per_token']:.3f} ms/token)"
                for m, x in result["methods"].items())
                + (f", ortgenai {result['ortgenai_tokens_per_second']:.0f} tok/s" if peers else ""), file=sys.stderr)
    out = {}
    for name, results in runs.items():
        methods = {m: {k: statistics.median(x["methods"][m][k] for x in results)
                       for k in ("tokens_per_second", "host_ms_per_token", "target_pass_ms", "tokens_per_target_pass",
                                 "share_engine", "d2h_bytes_per_target_pass")}
                   for m in results[0]["methods"]}
        for m in methods:
            alphas = [x["methods"][m]["alpha"] for x in results if x["methods"][m]["alpha"] is not None]
            methods[m]["alpha"] = statistics.median(alphas) if alphas else None
        out[name] = {"methods": methods, "config": results[0]["config"]}
        if peers:
            out[name]["ortgenai_tokens_per_second"] = statistics.median(x["ortgenai_tokens_per_second"] for x in results)
    return out


# ---------------------------------------------------------------- 4. logits left on a device
def device_logits_bytes(bundle: Path, max_new_tokens: int) -> dict:
    """Per setting and method: bytes per target pass through the summary, bytes if every row of logits
    were copied (Q rows of 4 V bytes a pass), and the share of the rows read that needed a whole row."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    from support.fake_device import HostMemory

    import specrt
    from specrt.runtime.backends import base
    from specrt.runtime.backends.onnxruntime import OrtDecoder, OrtHeads

    whole_rows = {"target": 0, "draft": 0}

    def factory(bundle_dir, entry, threads=None, role="target", low_memory=None):
        decoder = OrtDecoder(bundle_dir, entry, threads=threads, role=role, memory=HostMemory(), device_logits=True)
        rows = decoder.summary.rows

        def counted(q_len):  # the same rows, each whole-row copy counted for its model
            device = rows(q_len)
            fetch = device._fetch_row
            device._fetch_row = lambda i: whole_rows.__setitem__(role, whole_rows[role] + 1) or fetch(i)
            return device

        decoder.summary.rows = counted
        return decoder

    base._BACKENDS["device-logits"] = base.BackendInfo("device-logits", lambda: True, factory, OrtHeads)
    gen = specrt.load(bundle, backend="device-logits")
    row = 4 * gen.manifest.target.dims.vocab_size
    out: dict = {}
    for name, kw in SETTINGS.items():
        out[name] = {}
        for method in ("none", "draft"):
            summary = whole = passes = drafted = 0
            whole_rows.update(target=0, draft=0)
            for i, prompt in enumerate(prompts()):
                st = gen.generate(prompt, max_new_tokens=max_new_tokens, method=method, seed=i, **kw).stats
                summary += st.d2h_bytes_per_target_pass * st.target_passes
                whole += row * (st.prompt_tokens + st.drafted + st.target_passes - 1)
                passes += st.target_passes
                drafted += st.drafted
            out[name][method] = {"d2h_bytes_per_target_pass": summary / passes,
                                 "whole_rows_bytes_per_target_pass": whole / passes,
                                 "target_whole_rows_per_pass": whole_rows["target"] / passes,
                                 "draft_whole_rows_per_drafted_token": whole_rows["draft"] / drafted if drafted else None}
            print(f"device logits {name} {method}: {summary / passes / 1e3:.1f} KB per target pass (every row "
                  f"copied: {whole / passes / 1e3:.0f} KB); whole rows: target {whole_rows['target'] / passes:.2f} "
                  f"per pass, draft {whole_rows['draft']} for {drafted} drafted tokens", file=sys.stderr)
    return out


# ---------------------------------------------------------------- 3. ONNX Runtime GenAI
def build_ortgenai(target: Path, work: Path, precision: str = "fp32") -> Path:
    """ONNX Runtime GenAI's own model builder on the same checkpoint (CPU, at ``precision`` with the
    builder's default options); cached under ``work/peers``."""
    from specrt.measure.peers.ortgenai import BuildSpec, build_model

    return build_model(target, BuildSpec(precision), work / "peers", on_progress=None).path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("/tmp/specrt-real-vocab"))
    ap.add_argument("--json", type=Path, default=Path("benchmarks/host-work/real-vocab-cpu.json"))
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--entropy", type=float, default=2.5)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--ortgenai", action="store_true", help="Also time ONNX Runtime GenAI plain decoding.")
    ap.add_argument("--device-logits", action="store_true", help="Also count the bytes of logits left on a device.")
    ap.add_argument("--device-logits-only", action="store_true", help="Only that, merged into --json.")
    args = ap.parse_args()
    if args.device_logits_only:
        result = json.loads(args.json.read_text()) if args.json.exists() else {}
        result["device_logits"] = device_logits_bytes(args.work / "bundle", args.max_new_tokens)
        args.json.write_text(json.dumps(result, indent=2))
        print(f"wrote {args.json}", file=sys.stderr)
        return

    result: dict = {"step_work": {}}
    for v in (4096, 128_256, VOCAB):
        result["step_work"][str(v)] = step_work_ms(v, SETTINGS)
        print(f"step work V={v}: " + ", ".join(f"{k} {x['dense_reference_ms']:.2f} -> {x['runtime_ms']:.2f} ms"
                                                for k, x in result["step_work"][str(v)].items()), file=sys.stderr)
    args.work.mkdir(parents=True, exist_ok=True)
    target, draft = build_pair(args.work, args.hidden, args.layers, args.entropy)
    bundle = args.work / "bundle"
    if not (bundle / "specrt.json").exists():
        from specrt.export.exporter import export_bundle

        export_bundle(str(target), str(draft), bundle)
    peer = build_ortgenai(target, args.work) if args.ortgenai else None
    result["bench"] = bench_pair(bundle, args.max_new_tokens, args.repeats, args.threads, peer)
    greedy = {m: r["tokens_per_second"] for m, r in result["bench"]["greedy"]["methods"].items()}
    result["sampled_over_greedy"] = {name: {m: r["tokens_per_second"] / greedy[m] for m, r in b["methods"].items()}
                                     for name, b in result["bench"].items()}
    if peer:
        result["specrt_none_over_ortgenai"] = {
            name: b["methods"]["none"]["tokens_per_second"] / b["ortgenai_tokens_per_second"]
            for name, b in result["bench"].items()}
    if args.device_logits:
        result["device_logits"] = device_logits_bytes(bundle, args.max_new_tokens)
    result["config"] = {"vocab": VOCAB, "hidden": args.hidden, "layers": args.layers, "entropy": args.entropy,
                        "max_new_tokens": args.max_new_tokens, "repeats": args.repeats}
    args.json.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
