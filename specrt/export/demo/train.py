"""Reproducible CPU training of specrt's demo target/draft pair on the Python standard library's sources.

Pipeline: corpus (:mod:`specrt.export.demo.corpus`) → byte-level BPE tokenizer (:mod:`.tokens`) → target
LlamaForCausalLM trained by next-token cross entropy → draft LlamaForCausalLM distilled from the frozen target
(the losses and metrics: :mod:`.losses`) → ``training.json`` and a model card (:mod:`.card`); what a run is made
of, :mod:`.config`. Both models are ordinary Hugging Face
checkpoints that ``specrt export`` takes as they are.

    python -m specrt.export.demo.train --out runs/demo                # the shipped configuration
    python -m specrt.export.demo.train --out /tmp/tiny --tiny         # a smoke run in well under a minute
    python -m specrt.export.demo.train --out runs/again --config runs/demo/training.json   # rerun a recorded run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import platform
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from ...errors import ConfigError, OutputPathError, SpecrtError
from ..precision import apply_update
from . import corpus
from .card import model_card
from .config import ModelShape, TrainConfig
from .losses import acceptance, distill_loss, eval_draft, eval_target, logits_of, next_token_ce, split_batch
from .tokens import (
    BOS_ID,
    EOS_ID,
    check_stream,
    fixed_windows,
    random_windows,
    token_stream,
    train_tokenizer,
    wrap_tokenizer,
)

FORMAT_VERSION = 1


# ----------------------------------------------------------------------------------------- tokenizer and data


# ---------------------------------------------------------------------------------------------------- models


def llama_config(shape: ModelShape, vocab_size: int, cfg: TrainConfig):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab_size, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                       num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                       num_key_value_heads=shape.kv_heads, max_position_embeddings=cfg.max_position_embeddings,
                       tie_word_embeddings=True, bos_token_id=BOS_ID, eos_token_id=EOS_ID)


def build_model(shape: ModelShape, vocab_size: int, cfg: TrainConfig, seed: int):
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)  # the initial weights depend on this seed only, not on what ran before
    return LlamaForCausalLM(llama_config(shape, vocab_size, cfg)).float().to(cfg.device)


def count_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() yields the tied embedding once


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    # No weight decay on norms' gains: decaying them towards 0 only fights the normalisation.
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # fused: one kernel per step; the per-tensor loop spends as long as the backward pass on a 2-core CPU.
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), fused=True)


def lr_factor(step: int, steps: int, warmup_fraction: float, min_lr_ratio: float) -> float:
    """Linear warmup, then cosine decay from 1 to ``min_lr_ratio`` at the last step."""
    warmup = max(1, round(steps * warmup_fraction))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - 1 - warmup)
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


# ------------------------------------------------------------------------------------------------ evaluation


# ------------------------------------------------------------------------------------------------- progress


class _Progress:
    """A rich progress bar per phase (loss, elapsed, ETA) on stderr, or nothing."""

    def __init__(self, enabled: bool) -> None:
        self.console = None
        self._bar = None  # the live progress bar, while a phase runs
        if enabled:
            from rich.console import Console

            self.console = Console(stderr=True)

    def log(self, message: str) -> None:
        if self.console is not None:
            self.console.print(message)

    @contextlib.contextmanager
    def step(self, description: str) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        self.log(f"[green]✓[/green] {description} [dim]({time.perf_counter() - t0:.1f} s)[/dim]")

    @contextlib.contextmanager
    def phase(self, name: str, total: int) -> Iterator[Callable[[float], None]]:
        if self.console is None:
            yield lambda loss: None
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), TextColumn("eta"),
                   TimeRemainingColumn())
        with Progress(*columns, console=self.console) as bar:
            task = bar.add_task(name, total=total, loss="  -   ")
            self._bar = bar
            yield lambda loss: bar.update(task, advance=1, loss=f"{loss:6.3f}")
            self._bar = None

    def eval_line(self, name: str, step: int, metrics: dict[str, float]) -> None:
        text = f"{name} step {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())
        (self._bar.console.print if self._bar is not None else self.log)(text)


# --------------------------------------------------------------------------------------------------- phases


@dataclass
class PhaseResult:
    history: list[dict[str, float]]
    final_train_loss: float
    train_time_s: float
    eval_time_s: float
    tokens_per_s: float


def run_phase(name: str, model: torch.nn.Module, steps: int, loss_fn: Callable[[torch.Tensor], torch.Tensor],
              batches: Iterator[torch.Tensor], evaluate: Callable[[], dict[str, float]], cfg: TrainConfig,
              progress: _Progress) -> PhaseResult:
    """AdamW + warmup/cosine for ``steps`` steps, evaluating every ``cfg.eval_every`` steps and at the end."""
    optimizer = make_optimizer(model, cfg)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, steps, cfg.warmup_fraction, cfg.min_lr_ratio))
    history: list[dict[str, float]] = []
    window: list[float] = []  # train losses since the last evaluation
    train_time = eval_time = 0.0
    with progress.phase(name, steps) as advance:
        for step in range(1, steps + 1):
            t0 = time.perf_counter()
            model.train()
            loss = loss_fn(next(batches))
            diverged = f"{name} training diverged at step {step}"
            window.append(apply_update(model, optimizer, loss, cfg.grad_clip, diverged, "lower --lr"))
            schedule.step()
            train_time += time.perf_counter() - t0
            advance(window[-1])
            if step % cfg.eval_every == 0 or step == steps:
                t0 = time.perf_counter()
                metrics = {"step": step, "train_loss": sum(window) / len(window), **evaluate()}
                eval_time += time.perf_counter() - t0
                history.append(metrics)
                progress.eval_line(name, step, {k: v for k, v in metrics.items() if k != "step"})
                window = []
    tokens = steps * cfg.batch_size * cfg.seq_len
    return PhaseResult(history, history[-1]["train_loss"], train_time, eval_time, tokens / train_time)


def train_target(target: torch.nn.Module, train: torch.Tensor, val: list[torch.Tensor], cfg: TrainConfig,
                 progress: _Progress) -> PhaseResult:
    gen = torch.Generator().manual_seed(cfg.seed + 1000)

    def loss_fn(batch: torch.Tensor) -> torch.Tensor:
        inputs, labels = split_batch(batch, cfg.device)
        return next_token_ce(logits_of(target, inputs), labels)

    return run_phase("target", target, cfg.target_steps, loss_fn,
                     random_windows(train, cfg.seq_len, cfg.batch_size, gen),
                     lambda: eval_target(target, val, cfg.device), cfg, progress)


def train_draft(draft: torch.nn.Module, target: torch.nn.Module, train: torch.Tensor, val: list[torch.Tensor],
                cfg: TrainConfig, progress: _Progress) -> PhaseResult:
    target.eval().requires_grad_(False)
    gen = torch.Generator().manual_seed(cfg.seed + 2000)

    def loss_fn(batch: torch.Tensor) -> torch.Tensor:
        inputs, labels = split_batch(batch, cfg.device)
        with torch.no_grad():
            p_logits = logits_of(target, inputs)
        return distill_loss(logits_of(draft, inputs), p_logits, labels, cfg.ce_weight)[0]

    return run_phase("draft", draft, cfg.draft_steps, loss_fn,
                     random_windows(train, cfg.seq_len, cfg.batch_size, gen),
                     lambda: eval_draft(draft, target, val, cfg.device), cfg, progress)


# ------------------------------------------------------------------------------------------------ entry point


@contextlib.contextmanager
def _torch_settings(cfg: TrainConfig) -> Iterator[None]:
    """Thread count and seeded RNG for the run, restoring the caller's afterwards."""
    old_threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    device = torch.device(cfg.device)
    devices = [device.index or 0] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(cfg.seed)
            yield
    finally:
        torch.set_num_threads(old_threads)


def _prepare_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise OutputPathError(f"{out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise OutputPathError(f"{out} is not empty; pass --overwrite (overwrite=True) to train into it anyway")
    out.mkdir(parents=True, exist_ok=True)


def save_checkpoint(model: torch.nn.Module, tokenizer, folder: Path) -> None:
    """``save_pretrained`` of model (safetensors) and tokenizer, without transformers' own progress bars."""
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    # transformers 5 writes its own class name, TokenizersBackend, which transformers 4 cannot load;
    # PreTrainedTokenizerFast names the same tokenizer.json-backed class in both.
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2) + "\n")


def _versions() -> dict[str, str]:
    import tokenizers
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__}


def train_demo(cfg: TrainConfig, out: Path, progress: bool = True, overwrite: bool = False) -> dict:
    """Train the demo pair into ``out`` (``target/``, ``draft/``, ``training.json``, ``MODEL_CARD.md``);
    returns the training.json record."""
    out = Path(out)
    _prepare_out(out, overwrite)
    bar = _Progress(progress)
    t_start = time.perf_counter()
    with _torch_settings(cfg):
        with bar.step("corpus"):
            record = corpus.corpus_record(cfg.max_corpus_bytes, cfg.val_fraction)
            train_texts = list(corpus.iter_texts("train", cfg.max_corpus_bytes, cfg.val_fraction))
            val_texts = list(corpus.iter_texts("val", cfg.max_corpus_bytes, cfg.val_fraction))
        with bar.step(f"tokenizer (byte-level BPE, {cfg.vocab_size} tokens)"):
            t0 = time.perf_counter()
            raw_tok = train_tokenizer(train_texts, cfg.vocab_size)  # fitted on train only: val stays unseen
            train_stream, val_stream = token_stream(raw_tok, train_texts), token_stream(raw_tok, val_texts)
            check_stream("train", train_stream, cfg.seq_len)
            check_stream("val", val_stream, cfg.seq_len)
            val = fixed_windows(val_stream, cfg.seq_len, cfg.batch_size, cfg.eval_batches)
            tokenizer_time = time.perf_counter() - t0
        vocab = raw_tok.get_vocab_size()
        tokenizer = wrap_tokenizer(raw_tok, cfg.max_position_embeddings)
        bar.log(f"corpus: {record.files} files, {record.bytes / 1e6:.2f} MB; tokens: {len(train_stream):,} train, "
                f"{len(val_stream):,} val ({sum(b.numel() for b in val):,} used for evaluation)")

        target = build_model(cfg.target, vocab, cfg, cfg.seed)
        target_init = eval_target(target, val, cfg.device)
        target_run = train_target(target, train_stream, val, cfg, bar)

        draft = build_model(cfg.draft, vocab, cfg, cfg.seed + 1)
        draft_init = eval_draft(draft, target, val, cfg.device)
        draft_run = train_draft(draft, target, train_stream, val, cfg, bar)

        with bar.step("acceptance on held-out windows"):
            alpha = acceptance(target, draft, val, cfg.device)
        with bar.step(f"save to {out}"):
            for name, model in (("target", target), ("draft", draft)):
                save_checkpoint(model, tokenizer, out / name)

    result = {
        "format": FORMAT_VERSION,
        "config": asdict(cfg),
        "corpus": asdict(record),
        "tokens": {"vocab_size": vocab, "train": len(train_stream), "val": len(val_stream),
                   "val_used": sum(b.numel() for b in val)},
        "params": {"target": count_params(target), "draft": count_params(draft)},
        "time_s": {"tokenizer": tokenizer_time, "target": target_run.train_time_s + target_run.eval_time_s,
                   "draft": draft_run.train_time_s + draft_run.eval_time_s,
                   "total": time.perf_counter() - t_start},
        "target": _phase_record(target_init, target_run),
        "draft": _phase_record(draft_init, draft_run),
        "alpha": alpha,
        "versions": _versions(),
    }
    (out / "training.json").write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")
    (out / "MODEL_CARD.md").write_text(model_card(result))
    return result


def _phase_record(init: dict[str, float], run: PhaseResult) -> dict[str, Any]:
    final = run.history[-1]
    return {"init_" + k: v for k, v in init.items()} | {
        "final_train_loss": run.final_train_loss,
        **{"final_" + k: v for k, v in final.items() if k.startswith("val_")},
        "train_time_s": run.train_time_s, "eval_time_s": run.eval_time_s, "tokens_per_s": run.tokens_per_s,
        "history": run.history,
    }


# ------------------------------------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m specrt.export.demo.train", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="output folder (target/, draft/, training.json)")
    base = p.add_mutually_exclusive_group()
    base.add_argument("--tiny", action="store_true", help="smoke-test preset (seconds; useless models)")
    base.add_argument("--config", type=Path, help="start from the config of a training.json (or a config JSON)")
    p.add_argument("--target-steps", type=int)
    p.add_argument("--draft-steps", type=int)
    p.add_argument("--vocab-size", type=int)
    p.add_argument("--target-shape", type=str, metavar="H,L,HEADS,KV,FF", help="e.g. 384,6,6,2,1024")
    p.add_argument("--draft-shape", type=str, metavar="H,L,HEADS,KV,FF", help="e.g. 128,2,4,1,384")
    p.add_argument("--seq-len", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--ce-weight", type=float, help="weight of the CE term in the draft loss (rest is KL)")
    p.add_argument("--eval-every", type=int)
    p.add_argument("--eval-batches", type=int)
    p.add_argument("--max-corpus-bytes", type=int, help="cap each split at this many bytes (tiny runs)")
    p.add_argument("--seed", type=int)
    p.add_argument("--threads", type=int)
    p.add_argument("--device", type=str, help="torch device [default: cpu]")
    p.add_argument("--overwrite", action="store_true", help="train into a non-empty --out")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    return p


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    if args.tiny:
        cfg = TrainConfig.tiny()
    elif args.config:
        try:
            data = json.loads(args.config.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"cannot read config {args.config}: {e}") from None
        cfg = TrainConfig.from_dict(data.get("config", data))
    else:
        cfg = TrainConfig()
    overrides = {name: getattr(args, name) for name in (
        "target_steps", "draft_steps", "vocab_size", "seq_len", "batch_size", "lr", "ce_weight", "eval_every",
        "eval_batches", "max_corpus_bytes", "seed", "threads", "device") if getattr(args, name) is not None}
    for name in ("target_shape", "draft_shape"):
        if getattr(args, name) is not None:
            overrides[name.removesuffix("_shape")] = ModelShape.parse(getattr(args, name))
    return replace(cfg, **overrides)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        cfg = config_from_args(args)
    except (ConfigError, TypeError) as e:
        parser.error(str(e))
    try:
        result = train_demo(cfg, args.out, progress=not args.quiet, overwrite=args.overwrite)
    except SpecrtError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    alpha = result["alpha"]
    print(f"target val loss {result['target']['final_val_loss']:.3f}, draft val loss "
          f"{result['draft']['final_val_loss']:.3f}, alpha greedy {alpha['alpha_greedy']:.3f}, "
          f"alpha T=1 {alpha['alpha_t1']:.3f} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
