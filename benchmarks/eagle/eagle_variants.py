"""EAGLE-3 head variants trained on the same data: the standard head against the changes speculators' trainer
now defaults to (EAGLE 3.1: the taps normalised before fc, the residual after hidden_norm, the normalised
output fed to the next step), each from scratch with the same init, batches, seed and learning rate, then
held-out greedy acceptance as `specrt eagle train` measures it.

    specrt eagle train ./smollm2-135m -o head7 ... --keep-checkpoint      # any run: its cache is the data
    python benchmarks/eagle/eagle_variants.py ./smollm2-135m head7/.train/cache.pt --steps 600 \
        --variants standard,eagle31 --json benchmarks/eagle/eagle-variants-smollm2-cpu.json
    python benchmarks/eagle/eagle_variants.py ./smollm2-135m head7/.train/cache.pt --steps 600 \
        --variants fed-back-norm --json benchmarks/eagle/eagle-variants-smollm2-cpu.json --append

The cache holds the target's taps and top-k log-probabilities for every training and held-out sequence, so
no variant generates anything: what differs between rows is the head alone. One process, variants in turn.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from specrt.bundle.machine import cpu_name
from specrt.export.eagle.data import BatchSampler, SequenceCache
from specrt.export.eagle.init import head_config, new_head
from specrt.export.eagle.train import EagleTrainConfig, optimizer, train_step
from specrt.export.eagle.ttt import evaluate
from specrt.export.loading import load_causal_lm, load_config
from specrt.export.precision import resolve_compute

# Eagle3Config fields per variant (docs/design/eagle3.md, "The speculators format")
VARIANTS = {
    "standard": {},
    "eagle31": {"tap_norm": "joint", "norm_before_residual": True, "feed_normed": True},
    "joint-norm": {"tap_norm": "joint", "norm_before_residual": True},
    "fed-back-norm": {"feed_normed": True},
}


def train_variant(name: str, model, target_config, cache: dict, cfg: EagleTrainConfig, compute: str) -> dict:
    d2t, t2d = cache["d2t"], cache["t2d"]
    train, held = SequenceCache(**cache["train"]), SequenceCache(**cache["heldout"])
    head_cfg = dataclasses.replace(head_config(target_config, len(d2t)), **VARIANTS[name])
    head = new_head(head_cfg, model, torch.arange(len(d2t)) + d2t, cfg.seed, from_target=True)
    embed = model.get_input_embeddings().weight.detach().float().clone()
    opt, sampler = optimizer(head, cfg), BatchSampler(train.length, cfg.batch_size, cfg.seed)
    history, t0 = [], time.perf_counter()
    for step in range(cfg.steps):
        losses = train_step(head, opt, embed, t2d, train.batch(sampler.batch(step), "cpu"), cfg, compute, step)
        history.append(sum(cfg.loss_decay ** s * v for s, v in enumerate(losses)))
        if (step + 1) % 50 == 0:
            print(f"{name}: step {step + 1}/{cfg.steps}, loss {sum(history[-50:]) / 50:.3f} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
    train_s = time.perf_counter() - t0
    return {"variant": name, "fields": VARIANTS[name], "train_s": train_s, "loss_history": history,
            "heldout": evaluate(head, embed, d2t, t2d, held, cfg)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("target")
    ap.add_argument("cache", type=Path, help="a training run's .train/cache.pt (specrt eagle train --keep-checkpoint)")
    ap.add_argument("--variants", default="standard,eagle31", help=f"comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--ttt-steps", type=int, default=3)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--append", action="store_true",
                    help="add these runs to --json's (same settings and cache size; each variant is deterministic)")
    args = ap.parse_args()
    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant {unknown[0]!r}; known: {', '.join(VARIANTS)}")
    cfg = EagleTrainConfig(steps=args.steps, lr=args.lr, batch_size=args.batch_size, ttt_steps=args.ttt_steps)
    compute = resolve_compute("auto")
    cache = torch.load(args.cache, map_location="cpu", weights_only=False)  # specrt's own file
    model = load_causal_lm(args.target, "float32")
    target_config = load_config(args.target)
    runs = [train_variant(n, model, target_config, cache, cfg, compute) for n in names]
    for r in runs:
        h = r["heldout"]
        print(f"{r['variant']}: held-out alpha1 {h['alpha1']:.3f}, by depth "
              f"{' / '.join(f'{a:.3f}' for a in h['alpha_by_depth'])}, {h['tokens_per_pass']:.3f} tokens per pass "
              f"at depth {h['depth']}, KL {h['kl']:.3f} ({r['train_s'] / 60:.1f} min)")
    if args.json:
        record = {"machine": cpu_name(), "compute": compute, "steps": args.steps, "batch_size": args.batch_size,
                  "lr": args.lr, "ttt_steps": args.ttt_steps, "sequences_train": len(cache["train"]["length"]),
                  "sequences_heldout": len(cache["heldout"]["length"]), "runs": runs}
        if args.append and args.json.exists():
            old = json.loads(args.json.read_text())
            differ = [k for k in record if k not in ("machine", "runs") and old.get(k) != record[k]]
            if differ:
                raise SystemExit(f"{args.json} was measured with other {', '.join(differ)}; not appended")
            record["runs"] = [o for o in old["runs"] if o["variant"] not in names] + runs  # a rerun replaces
        args.json.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
