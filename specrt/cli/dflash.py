"""Commands for DFlash block drafts (the torch side): dflash train."""

from __future__ import annotations

import click

from ..export.dflash.config import MAX_BLOCK
from . import main
from .export import _limits_said
from .options import draft_vocab_option, torch_side, training_sequence_options, training_text_options


def _layer_ids(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        return tuple(int(i) for i in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of layer indices (e.g. 1,4,6)") from None


@main.group()
def dflash() -> None:
    """DFlash block drafts: a few layers that read the target's hidden states and draft a block of tokens in one
    pass."""


@dflash.command("train")
@click.argument("model")
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False), help="Folder for the draft.")
@training_text_options
@click.option("--self-prompts", type=int, default=0, show_default=True, metavar="N",
              help="The target also writes N user messages itself and answers them (as eagle train's).")
@click.option("--layers", type=click.IntRange(1, 16), metavar="N",
              help="Decoder layers of the draft, each as wide as one of the target's [default: 1 on a CPU, 5 on a "
                   "GPU (z-lab's)].")
@click.option("--block-size", type=click.IntRange(2, MAX_BLOCK), default=8, show_default=True, metavar="B",
              help="The last token then B-1 masks: a pass drafts B-1 tokens.")
@click.option("--target-layers", callback=_layer_ids, metavar="I,J,...",
              help="Target layers whose outputs the draft reads (0-based, after the layer) [default: z-lab's rule, "
                   "one per draft layer: the middle one for a single layer].")
@draft_vocab_option
@click.option("--steps", type=int, default=2000, show_default=True, help="Training steps at most.")
@click.option("--anchors", type=int, default=32, show_default=True,
              help="Blocks drawn per sequence per step, at random scored positions.")
@click.option("--gamma", type=click.FloatRange(min=0, min_open=True),
              help="Loss decay over the block: slot k weighs exp(-(k-1)/gamma) [default: 1 + 3B/8, 4 at B=8].")
@training_sequence_options
@click.option("--lr", type=float, default=6e-4, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--resume", is_flag=True, help="Continue from the checkpoint in the output folder, if it matches.")
@click.option("--keep-checkpoint", is_flag=True, help="Keep OUTPUT/.train (the cached data, the last checkpoint).")
@click.option("--compute", type=click.Choice(["auto", "float32", "bfloat16"]), default="auto", show_default=True,
              help="Matmul precision: auto is bfloat16 where the device has it natively, else float32.")
@click.option("--device", default="auto", show_default=True, metavar="auto|cpu|cuda|cuda:N",
              help="Where the target generates and the draft trains (auto: a CUDA GPU when torch sees one).")
@click.option("--heldout", "heldout_fraction", type=click.FloatRange(0, 1, min_open=True, max_open=True),
              default=0.1, show_default=True, metavar="FRACTION",
              help="Share of the prompts held out whole: the draft's acceptance is measured on their greedy replies.")
@click.option("--time-limit", type=click.FloatRange(min=0, min_open=True), metavar="MINUTES",
              help="Fit the whole run in this much wall time, as eagle train's: about half writes the data, timed "
                   "steps set how many fit before the held-out check and the save. A limit below what the run "
                   "needs at the least is refused before anything is generated.")
def dflash_train(model: str, output: str, data_files: tuple[str, ...], prompts_file: str | None, self_prompts: int,
                 layers: int | None, block_size: int, target_layers: tuple[int, ...] | None, draft_vocab: int,
                 steps: int, anchors: int, gamma: float | None, num_sequences: int, seq_len: int, batch_size: int,
                 lr: float, seed: int, resume: bool, keep_checkpoint: bool, compute: str, device: str,
                 heldout_fraction: float, time_limit: float | None) -> None:
    """Train a DFlash draft for the frozen local MODEL (a Hugging Face folder or a llama.cpp GGUF), on text the
    target writes itself (never a download).

    DFlash (arXiv 2602.06036) drafts B-1 tokens in one non-causal pass over [last token, MASK x (B-1)], reading
    the target's hidden states as context; the target then verifies the block in one pass. What it costs here:
    on 2 CPU cores, --time-limit 8 on the 25 M demo target wrote 400 replies in 4 minutes and trained a 1-layer
    draft for 259 steps in 3, for 2.38 tokens per target pass on held-out replies (block 8); more steps and layers
    carry acceptance deeper into the block. The draft is written in z-lab's layout (config.json,
    model.safetensors), with training.json holding the held-out acceptance per block slot.

    \b
    Example:
      specrt dflash train ./target -o draft --time-limit 8
      specrt dflash train ./target -o draft --layers 2 --block-size 16 --steps 3000
      specrt export ./target --dflash draft -o bundle
    """
    from ..measure.bench import read_prompts

    with torch_side("dflash train"):
        from ..export.dflash.train import DFlashTrainConfig, train_dflash
        from ..export.progress import rich_progress
    cfg = DFlashTrainConfig(steps=steps, lr=lr, batch_size=batch_size, anchors=anchors, block_size=block_size,
                            layers=layers, target_layer_ids=target_layers, gamma=gamma, seq_len=seq_len,
                            draft_vocab=draft_vocab or None, num_sequences=num_sequences, self_prompts=self_prompts,
                            heldout_fraction=heldout_fraction, seed=seed, keep_checkpoint=keep_checkpoint,
                            compute=compute, device=device, time_limit=time_limit)
    prompts = read_prompts(prompts_file) if prompts_file else None
    with rich_progress() as progress:
        record = train_dflash(model, output, cfg, prompts=prompts, data_files=data_files, progress=progress,
                              resume=resume, say=lambda line: click.echo(line, err=True))
    held = record["heldout"]
    slots = " ".join(f"{a:.2f}" for a in held["accept_by_slot"])
    click.echo(f"wrote {output}: held-out greedy acceptance by block slot {slots}; {held['tokens_per_pass']:.2f} "
               f"tokens per target pass at block {held['block_size']} (over {held['anchors']} held-out anchors; "
               f"trained in {record['compute']} on {record['device']}, {record['time_s']['total_this_run'] / 60:.1f} "
               "min)")
    for line in _limits_said(record):
        click.echo(line)
    click.echo(f"next: specrt export {model} --dflash {output} -o BUNDLE")
