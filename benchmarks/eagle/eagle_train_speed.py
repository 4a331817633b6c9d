"""`specrt eagle train`'s two costs in float32 and bfloat16, alternating in one process: the target writing its
data (tokens/s at 128 rows, the run's batch) and one training step (batch of full-length sequences, TTT).

    python benchmarks/eagle/eagle_train_speed.py ./smollm2-135m --head benchmarks/heads/smollm2-135m-instruct \
        --prompts benchmarks/prompts/eagle-seeds-r4.json --json benchmarks/eagle/eagle-train-speed-zen4-cpu.json

The step runs on synthetic data of the real shapes (every row scored, as in a full 192-token sequence):
its cost depends on the shapes alone. Medians over --rounds alternations, after one warm-up step each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from specrt.bundle.machine import cpu_name
from specrt.export.eagle.checkpoint import load_eagle3
from specrt.export.eagle.data import SequenceCache, _encode_prompt
from specrt.export.eagle.generate import continue_prompts
from specrt.export.eagle.train import EagleTrainConfig, optimizer, train_step
from specrt.export.loading import load_causal_lm, load_tokenizer
from specrt.export.precision import generating, native_bf16

COMPUTES = ("float32", "bfloat16")


def synthetic_batch(batch: int, seq_len: int, taps_width: int, vocab: int, draft: int, topk: int) -> SequenceCache:
    g = torch.Generator().manual_seed(0)
    logp = torch.log_softmax(torch.randn(batch, seq_len, topk, generator=g), -1).sort(-1, descending=True).values
    full = torch.full((batch,), seq_len, dtype=torch.int32)
    return SequenceCache(tokens=torch.randint(0, vocab, (batch, seq_len), generator=g, dtype=torch.int32),
                         length=full, start=torch.ones(batch, dtype=torch.int32), stop=full,
                         taps=torch.randn(batch, seq_len, taps_width, generator=g).half(), logp=logp.half(),
                         ids=torch.randint(0, draft, (batch, seq_len, topk), generator=g, dtype=torch.int32),
                         top1=torch.randint(0, draft, (batch, seq_len), generator=g, dtype=torch.int32))


def step_seconds(head, opt, embed, t2d, b: SequenceCache, cfg: EagleTrainConfig, compute: str) -> float:
    t0 = time.perf_counter()
    train_step(head, opt, embed, t2d, b, cfg, compute, cfg.steps // 2)  # the training loop's own step
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("target")
    ap.add_argument("--head", required=True, help="a head for the target (its shapes and draft vocabulary)")
    ap.add_argument("--prompts", required=True, help="JSON list of seed prompts (the first --rows are used)")
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--seq-len", type=int, default=192)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--ttt-steps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    model = load_causal_lm(args.target, "float32")
    model.requires_grad_(False)
    tok = load_tokenizer(args.target)
    prompts = json.loads(Path(args.prompts).read_text())[:args.rows]
    encoded = sorted((_encode_prompt(tok, p, True) for p in prompts), key=len)
    head_cfg, head, d2t, t2d = load_eagle3(args.head, model.config)
    taps = head_cfg.tap_layers_for(model.config.num_hidden_layers)
    head.float().train()
    embed = model.get_input_embeddings().weight.detach().float()
    b = synthetic_batch(args.batch_size, args.seq_len, head.fc.in_features, embed.shape[0], len(d2t), 64)
    gen_rate: dict[str, list[float]] = {c: [] for c in COMPUTES}
    step: dict[str, list[float]] = {c: [] for c in COMPUTES}
    cfg = EagleTrainConfig(ttt_steps=args.ttt_steps, lr=1e-6)  # a tiny lr: the timed steps barely move the head
    opts = {c: optimizer(head, cfg) for c in COMPUTES}  # one each, as a run has one: Adam's state made once
    for compute in COMPUTES:  # warm-up (allocates Adam's state)
        step_seconds(head, opts[compute], embed, t2d, b, cfg, compute)
    for r in range(args.rounds):
        for compute in COMPUTES:
            t0 = time.perf_counter()
            with torch.no_grad():
                seqs = continue_prompts(generating(model, compute), encoded, args.seq_len, 0.7, [tok.eos_token_id],
                                 torch.Generator().manual_seed(r), taps)
            tokens = sum(len(q.tokens) - q.start - 1 for q in seqs)
            rate = tokens / (time.perf_counter() - t0)
            secs = statistics.median(step_seconds(head, opts[compute], embed, t2d, b, cfg, compute)
                                     for _ in range(3))
            print(f"round {r} {compute}: generate {rate:.0f} tokens/s, step {secs:.2f} s", flush=True)
            gen_rate[compute].append(rate)
            step[compute].append(secs)
    result = {"cpu": cpu_name(), "native_bf16": native_bf16(), "threads": torch.get_num_threads(),
              "config": {k: v for k, v in vars(args).items() if k != "json"},
              "generate_tokens_per_s": {c: statistics.median(v) for c, v in gen_rate.items()},
              "step_s": {c: statistics.median(v) for c, v in step.items()},
              "runs": {"generate_tokens_per_s": gen_rate, "step_s": step}}
    print(json.dumps({k: result[k] for k in ("generate_tokens_per_s", "step_s")}))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
