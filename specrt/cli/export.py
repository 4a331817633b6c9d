"""Commands that make bundles (the torch side): export, quantize, build, medusa train."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click

from . import main
from .options import (
    BITS,
    bundle_option,
    draft_vocab_option,
    force_option,
    parse_bits,
    quantize_layout_options,
    torch_side,
    training_sequence_options,
    training_text_options,
)


@main.command()
@click.argument("model")
@click.option("--draft", metavar="DRAFT",
              help="Draft model (folder or hub id) with the same tokenizer, or 'self': a quantized copy of MODEL "
                   "(with --draft-quantize int4|int8), which agrees with the target far more often than a "
                   "smaller model.")
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False), help="Bundle folder to create.")
@click.option("--for", "platform", type=click.Choice(["auto", "cpu", "cuda", "tensorrt", "jetson"]), default="auto",
              show_default=True,
              help="Where the bundle will run; settings left unset are chosen for it, and said: cpu, int4 weights "
                   "(HQQ) where they pass the quality gate, else int8, else float, on gqa graphs (a GGUF keeps its "
                   "blocks unless a drafter is given); cuda and jetson, fp16 gqa-static graphs whose verify steps "
                   "ONNX Runtime replays as CUDA graphs; tensorrt, fp16 portable graphs for `specrt build`. auto: "
                   "this machine (cuda where torch sees a GPU, else cpu).")
@click.option("--dtype", type=click.Choice(["fp32", "fp16"]),
              help="Weight and KV-cache precision of the exported graphs [default: --for's: fp32 on a CPU, else fp16].")
@click.option("--opset", type=int, default=18, show_default=True,
              help="ONNX opset of portable graphs (fused graphs are opset 23).")
@click.option("--max-context", type=int,
              help="Positions the runtime's KV cache holds [default: the models' limit, at most 4096].")
@click.option("--exporter", type=click.Choice(["dynamo", "torchscript"]), default="dynamo", show_default=True,
              help="torch.onnx exporter: dynamo gives leaner graphs; torchscript traces faster.")
@click.option("--graph", type=click.Choice(["auto", "fused", "gqa", "gqa-static", "portable"]), default="auto",
              show_default=True,
              help="fused: rotary, attention, RMS norm and packed projections as single opset-23 nodes (a ~2.5x "
                   "smaller graph, faster on ONNX Runtime); gqa: fused, with ONNX Runtime's GroupQueryAttention "
                   "writing one KV buffer per layer in place (nothing re-bound per step; ONNX Runtime only); "
                   "gqa-static: gqa with fixed shapes per row count and no mask, so ONNX Runtime CUDA replays verify "
                   "steps as CUDA graphs; causal only: chains and plain decoding, no tree methods (docs/gpu.md); "
                   "portable: plain ops, for TensorRT (`specrt build`). "
                   "auto: fused where the architecture has it (llama, mistral, qwen2, qwen3, phi3, gemma2, "
                   "gemma3_text: all but gpt2) with the dynamo exporter.")
@click.option("--medusa", type=click.Path(file_okay=False),
              help="Medusa heads for the target (from `specrt medusa train`): adds medusa.onnx and a static tree.")
@click.option("--medusa-dtype", type=click.Choice(["fp32", "fp16"]),
              help="Precision of the Medusa heads [default: --dtype]; fp16 heads halve their bytes on an fp32 target.")
@click.option("--medusa-nodes", type=int, default=24, show_default=True,
              help="Node budget of the Medusa tree, chosen from the heads' measured top-k accuracies.")
@click.option("--eagle", metavar="HEAD", type=click.Path(file_okay=False),
              help="EAGLE-3 head for MODEL, a folder or a hub id (in the published layout: config.json + "
                   "model.safetensors with fc, midlayer.*, lm_head, d2t, t2d; or in the speculators format vLLM "
                   "serves, e.g. RedHatAI's *-speculator.eagle3): adds eagle.onnx and its vocabulary map, and the "
                   "target graph outputs the hidden states the head reads (llama, mistral, qwen2, qwen3, phi3 "
                   "targets).")
@click.option("--dflash", metavar="DRAFT", type=click.Path(file_okay=False),
              help="DFlash block draft for MODEL, a folder (z-lab's layout: config.json with dflash_config + "
                   "model.safetensors; the speculators dflash format; or `specrt dflash train`'s): adds dflash.onnx "
                   "which proposes a whole block in one pass, and the target graph outputs the layers it "
                   "reads (llama, mistral, qwen2, qwen3, phi3 targets). With another drafter too, auto runs "
                   "whichever --measure finds faster (without it: an EAGLE-3 head, then this draft, then "
                   "--draft). int8 where the target is quantized to int4 or int8 (float beside kept GGUF "
                   "blocks), unless --dflash-quantize says otherwise.")
@click.option("--quantize", type=click.Choice(["int4", "int8", "none"]),
              help="Weight-only quantization of every matmul (LM head included) with ONNX Runtime's MatMulNBits; "
                   "none: float [default: --for's: on a CPU int4, else int8, else float, the first the quality gate "
                   "passes; float on a GPU]. With --draft-quantize / --eagle-quantize alone, only the proposer is "
                   "quantized.")
@click.option("--gguf-blocks", type=click.Choice(["auto", "keep", "requantize"]), default="auto", show_default=True,
              help="A GGUF target without --quantize: keep, its Q4_0 / Q4_1 / Q8_0 blocks as they are (the fastest "
                   "plain decoding); requantize, int4 (--algorithm) with gqa graphs from its dequantized weights, "
                   "cheaper to verify many rows with; auto, keep without a drafter and requantize with --eagle or "
                   "--draft (SmolLM2-135M's Q4_1 with its head on a 2-core CPU: 0.98x llama.cpp kept, 1.11-1.38x "
                   "requantized).")
@click.option("--measure/--no-measure", default=True, show_default=True,
              help="After writing, time auto against plain decoding on 4 prompts, greedy and at T 0.7, and say "
                   "what it gained here (a few seconds on a small model). A bundle with several drafters (--eagle, "
                   "--dflash, --draft) has each timed first, and auto runs the fastest (recorded in specrt.json).")
@quantize_layout_options(" (when anything is quantized)")
@force_option
def export(model: str, draft: str | None, output: str, platform: str, dtype: str | None, opset: int,
           max_context: int | None, exporter: str, graph: str, medusa: str | None, medusa_dtype: str | None,
           medusa_nodes: int, eagle: str | None, dflash: str | None, quantize: str | None, block_size: int,
           head_block_size: int | None, draft_quantize: int | str | None, eagle_quantize: int | str | None,
           dflash_quantize: int | str | None, algorithm: str, kernel: str, quantize_embeddings: bool | None,
           gguf_blocks: str, measure: bool, force: bool) -> None:
    """Export MODEL (and --draft) to an ONNX bundle with explicit KV-cache I/O.

    MODEL and DRAFT are local Hugging Face folders, hub ids, or llama.cpp GGUF files (or folders holding one):
    a GGUF's Q4_0 / Q4_1 / Q8_0 weights stay as they are (MatMulNBits, no re-quantization), the rest arrive
    dequantized; --quantize re-quantizes from the dequantized weights instead. Supported architectures: llama,
    mistral, qwen2, qwen3, gemma2, gemma3_text, phi3, gpt2. Every graph is checked against PyTorch computed in fp32 (prefill,
    1-token decode, a 5-token chain, a tree and a prefill at the last position) before the bundle appears: logit
    error relative to each row's spread, and KL; the figures go into specrt.json.

    \b
    Examples:
      specrt export ./llama-1b --draft ./llama-68m -o bundle --dtype fp16
      specrt export ./llama-1b --draft ./llama-68m -o bundle-int4 --quantize int4
      specrt export ./smollm2 --eagle head -o bundle --eagle-quantize int8   # fp32 target, int8 head
      specrt export ./smollm2 --draft self --draft-quantize int8 -o bundle   # fp32 target, int8 copy drafts
      specrt export SmolLM2-135M-Instruct.Q4_1.gguf -o bundle                 # llama.cpp's blocks, kept
      specrt export ./qwen3-4b --dflash ./Qwen3-4B-DFlash-b16 -o bundle       # a published block drafter
    """
    if draft == "self":
        if draft_quantize not in (4, 8):
            raise click.UsageError("--draft self needs --draft-quantize int4 or int8: a float copy of the target "
                                   "costs as much as the target and drafts nothing it would not")
        draft = model
    with torch_side("export"):
        from transformers.utils import logging as hf_logging

        from ..export.exporter import ExportOptions
    from ..export.pipeline import choose, describe, export_pipeline, gguf_verify_note, next_steps, requantize_gguf
    from ..export.progress import RichReporter
    from ..export.quant.gguf import find_gguf
    from ..export.quant.quantize import QuantizeOptions

    hf_logging.disable_progress_bar()  # our own step display replaces transformers' per-file bars
    gguf = find_gguf(model)
    # a proposer given its own int4/int8 ("same", "auto" and none follow the target or stay float)
    proposer_only = any(bits in BITS.values() for bits in (draft_quantize, eagle_quantize, dflash_quantize))
    bits = {"int4": 4, "int8": 8}.get(quantize or "")
    requantize = bool(gguf and requantize_gguf(gguf_blocks, bool(eagle or draft or dflash)))
    choice = choose(platform, dtype=dtype, graph=graph, bits=bits, decided=quantize is not None or proposer_only,
                    gguf=gguf is not None, requantize_gguf=requantize)
    for line in choice.why:
        click.echo(line)
    dtypes = {"fp32": "float32", "fp16": "float16"}
    options = ExportOptions(dtype=dtypes[choice.dtype], opset=opset, max_context=max_context, exporter=exporter,
                            force=force, medusa=medusa, medusa_nodes=medusa_nodes, graph=choice.graph,
                            auto_graph=choice.auto_graph, eagle=eagle, dflash=dflash,
                            medusa_dtype=dtypes[medusa_dtype] if medusa_dtype else None)
    # A GGUF target keeps its blocks without bits; --draft-quantize none then still means a float draft.
    gguf_target = gguf if draft_quantize is None and not choice.bits else None
    qopts = (QuantizeOptions(choice.bits, block_size, draft_quantize, force=force, eagle_bits=eagle_quantize,
                             dflash_bits=dflash_quantize, embeddings=quantize_embeddings, algorithm=algorithm, head_block_size=head_block_size,
                             kernel=kernel, gguf=(("target", str(gguf_target)),) if gguf_target else ())
             if choice.bits or proposer_only or gguf_target else None)
    manifest = export_pipeline(model, draft, output, options, qopts, RichReporter(), progress=click.echo,
                               fallback=choice.fallback)
    manifest = replace(manifest, chosen=choice.record((manifest.target.quantization or {}).get("bits")))
    manifest.write(Path(output))
    click.echo(describe(manifest))
    click.echo(f"done: {output} (max context {manifest.max_context})")
    if measure:
        manifest = _choose_drafter(manifest, output)
    click.echo(next_steps(manifest, output))
    note = gguf_verify_note(manifest, output, model)
    if note:
        click.echo(note)
    if measure:
        click.echo(_measured_here(manifest, output))


QUICK_PROMPTS, QUICK_TOKENS = 4, 48


def _quick_prompts(manifest) -> tuple[list[str], bool]:
    from ..data import prompts

    chat = manifest.tokenizer.chat_template is not None
    return (prompts("chat")[-QUICK_PROMPTS:] if chat else prompts("code")[:QUICK_PROMPTS]), chat


def _choose_drafter(manifest, folder: str):
    """With several drafters in the bundle, the one auto runs, timed here (measure.quick.choose_drafter)."""
    from ..measure.quick import choose_drafter, describe_choice

    texts, chat = _quick_prompts(manifest)
    chosen = choose_drafter(folder, manifest, texts, chat, QUICK_TOKENS,
                            on_progress=lambda msg: click.echo(msg + " ...", err=True))
    if "auto" in chosen.chosen:
        click.echo(describe_choice(chosen.chosen["auto"]))
    return chosen


def _measured_here(manifest, folder: str) -> str:
    """export's last line: what auto gained over plain decoding on this machine (measure.quick)."""
    from ..measure.quick import describe_readings, quick_speedup
    from ..runtime.generator import SpeculativeGenerator

    texts, chat = _quick_prompts(manifest)
    readings = quick_speedup(SpeculativeGenerator(folder), texts, chat, QUICK_TOKENS,
                             on_progress=lambda msg: click.echo(msg + " ...", err=True))
    return describe_readings(readings, len(texts), QUICK_TOKENS, folder)


@main.command()
@click.argument("bundle", type=click.Path(file_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False), help="Quantized bundle to create.")
@click.option("--bits", type=click.Choice(["int4", "int8", "none"]), default="int4", show_default=True,
              callback=parse_bits, help="The target's bits; none keeps it float (then quantize a proposer).")
@quantize_layout_options()
@force_option
def quantize(bundle: str, output: str, bits: int | None, block_size: int, head_block_size: int | None,
             draft_quantize: int | str | None, eagle_quantize: int | str | None,
             dflash_quantize: int | str | None, algorithm: str, kernel: str, quantize_embeddings: bool | None,
             force: bool) -> None:
    """Weight-only int4/int8 copy of an exported BUNDLE (ONNX Runtime's MatMulNBits, or its integer matmul with
    --kernel integer, or whichever of the two runs faster here with --kernel auto; needs onnx, not torch).

    Every matmul with constant weights is quantized, the LM head included (the embedding tables at int8 too where the
    gate passes; else, or with --float-embeddings, a float copy for the lookup). The target and a draft must stay close to their float graphs in distribution (mean KL and top-1
    agreement on the shipped prompts) before OUT appears; an EAGLE-3 head, a proposer only, has its first-draft
    acceptance measured and recorded instead. Speculation stays exact with respect to the (quantized) target.

    \b
    Examples:
      specrt quantize bundle -o bundle-int4 --bits int4 --block-size 32
      specrt quantize bundle -o bundle-qhead --bits none --eagle-quantize int8   # float target, int8 head
      specrt quantize bundle -o bundle-hqq --bits int4 --algorithm hqq          # int4 a small model survives
      specrt quantize bundle -o bundle-i8 --bits int8 --kernel integer          # cheap verify rows on a CPU
      specrt quantize bundle -o bundle-q8 --bits int8 --kernel auto             # the faster int8 on this CPU
    """
    from ..export.quant.quantize import QuantizeOptions, describe, quantize_bundle

    options = QuantizeOptions(bits, block_size, draft_quantize, force=force, eagle_bits=eagle_quantize,
                              dflash_bits=dflash_quantize, embeddings=quantize_embeddings, algorithm=algorithm, head_block_size=head_block_size,
                              kernel=kernel)
    manifest = quantize_bundle(bundle, output, options, progress=click.echo)
    click.echo(describe(manifest))
    click.echo(f"done: {output}")


@main.group()
def medusa() -> None:
    """Medusa heads: extra next-next-token heads on the target, no draft model."""


@medusa.command("train")
@click.argument("model")
@click.option("--data", required=True, type=click.Path(exists=True),
              help="A text file, or a folder whose .py/.txt/.md files are read.")
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False), help="Folder for the heads.")
@click.option("--heads", "num_heads", type=int, default=4, show_default=True)
@click.option("--steps", type=int, default=300, show_default=True)
@click.option("--seq-len", type=int, default=256, show_default=True)
@click.option("--batch-size", type=int, default=8, show_default=True)
@click.option("--lr", type=float, default=1e-3, show_default=True)
@click.option("--topk", type=int, default=10, show_default=True, help="Candidates per head measured and exported.")
@click.option("--seed", type=int, default=0, show_default=True)
def medusa_train(model: str, data: str, output: str, num_heads: int, steps: int, seq_len: int, batch_size: int,
                 lr: float, topk: int, seed: int) -> None:
    """Train Medusa heads on a frozen MODEL by self-distillation (its own predictions are the targets).

    Head k learns the target's distribution k+1 tokens past the next one; its top-k accuracy on held-out calibration
    windows decides the static tree `specrt export --medusa` ships.

    \b
    Example:
      specrt medusa train ./target --data ./corpus -o heads --heads 4 --steps 500
      specrt export ./target --draft ./draft --medusa heads -o bundle
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    with torch_side("medusa train"):
        from ..export.medusa import MedusaTrainConfig, train_medusa
    cfg = MedusaTrainConfig(num_heads=num_heads, steps=steps, seq_len=seq_len, batch_size=batch_size, lr=lr,
                            topk=topk, seed=seed)
    with Progress(TextColumn("training heads"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TextColumn("loss {task.fields[loss]:.3f}"), TimeRemainingColumn()) as bar:
        task = bar.add_task("train", total=steps, loss=float("nan"))
        record = train_medusa(model, Path(data), Path(output), cfg,
                              on_step=lambda step, loss: bar.update(task, advance=1, loss=loss))
    click.echo(f"calibration KL per head: {record['calibration_loss_init']:.3f} -> {record['calibration_loss']:.3f}")
    for k, acc in enumerate(record["accuracies"]):
        click.echo(f"head {k}: top-1 {acc[0]:.3f}, top-{topk} {sum(acc):.3f}")
    click.echo(f"wrote {output}")


@main.command()
@bundle_option
@click.option("--precision", type=click.Choice(["fp32", "fp16", "bf16", "int8", "fp8"]),
              help="Must match the bundle's graphs, which set it (strongly typed engines) [default: the bundle's].")
@click.option("--max-context", type=int, help="Longest context the engines serve [default: the bundle's].")
@click.option("--max-prompt", type=int, default=1024, show_default=True,
              help="Longest prompt (prefill profile).")
@click.option("--max-verify", type=int, default=64, show_default=True,
              help="Most tokens in one verify pass: gamma + 1, or the largest tree / Medusa tree.")
@click.option("--max-batch", type=int, default=1, show_default=True)
@click.option("--workspace", "workspace_mb", type=int, default=4096, show_default=True, help="MB.")
@click.option("--jetson", is_flag=True, help="Jetson Orin/Thor defaults: workspace from free unified memory.")
def build(bundle: str | None, precision: str | None, max_context: int | None, max_prompt: int, max_verify: int,
          max_batch: int, workspace_mb: int, jetson: bool) -> None:
    """Build TensorRT engines for the bundle's models (cached by ONNX hash, TensorRT version, GPU, precision and
    profiles). Needs an NVIDIA GPU and TensorRT (`pip install 'specrt[trt]'`, or JetPack's TensorRT on Jetson).

    Afterwards `specrt run --bundle DIR` uses the engines (backend auto, or --backend tensorrt), with the KV cache
    on the GPU, verify passes replayed as CUDA graphs, and the Medusa heads on their own engine.

    \b
    Example:
      specrt export ./target --draft ./draft --dtype fp16 -o bundle
      specrt build --bundle bundle --max-context 4096 --max-verify 32
    """
    from rich.console import Console

    from ..bundle.manifest import load_manifest
    from ..demo import bundle_path
    from ..export import tensorrt as trt

    bundle_dir = Path(bundle) if bundle else bundle_path()
    max_context = max_context or load_manifest(bundle_dir).max_context
    opts = trt.BuildOptions(precision=precision, max_context=max_context, max_prompt=min(max_prompt, max_context),
                            max_verify=max_verify, max_batch=max_batch, workspace_mb=workspace_mb)
    trt.require_tensorrt()  # before any work: the one-line error names what to install
    if jetson:
        opts = trt.jetson_defaults(trt.free_memory_mb(), opts)
    with Console(stderr=True).status("building TensorRT engines…") as status:
        def progress(role: str, cached: bool) -> None:
            doing = "reusing the cached engine" if cached else "building (minutes on large models)"
            status.update(f"{role}: {doing}…")

        engines = trt.build_bundle_engines(bundle_dir, opts, progress)
    for role, e in engines.items():
        click.echo(f"{role}: {e['file']} (TensorRT {e['tensorrt']}, sm {e['sm']}, {e['options']['precision']})")


@main.group()
def eagle() -> None:
    """EAGLE-3 heads: one decoder layer (or a stack) that drafts from the target's own hidden states."""


@eagle.command("train")
@click.argument("model")
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False), help="Folder for the head.")
@training_text_options
@click.option("--self-prompts", type=int, default=0, show_default=True, metavar="N",
              help="The target also writes N user messages itself (its chat template cut where a user's message "
                   "begins, sampled on: Magpie) and answers them: data for a model without seed prompts. Listed "
                   "in OUTPUT/prompts-written.json. Raise --sequences with it (continuations are spread over all "
                   "the prompts).")
@click.option("--steps", type=int, default=1000, show_default=True)
@draft_vocab_option
@training_sequence_options
@click.option("--ttt-steps", type=int, default=3, show_default=True,
              help="Training-time test: head steps unrolled on its own outputs, as at inference.")
@click.option("--layers", type=click.IntRange(1, 8), default=1, show_default=True,
              help="Decoder layers of the head: the EAGLE-3 layer, then standard ones on its output (a stacked head, "
                   "saved in the speculators format vLLM reads; llama.cpp reads one-layer heads only). Each layer "
                   "adds to a draft's cost: a second one took c 0.041 to 0.059 on SmolLM2-135M at fp32.")
@click.option("--lr", type=float, default=5e-4, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--resume", is_flag=True, help="Continue from the checkpoint in the output folder, if it matches.")
@click.option("--keep-checkpoint", is_flag=True,
              help="Keep OUTPUT/.train (the target's cached data and the last checkpoint) after the run. To train "
                   "again on that data with other --steps or --lr, delete OUTPUT/.train/checkpoint.pt and pass "
                   "--resume: nothing is generated again.")
@click.option("--init", "init", metavar="HEAD", type=click.Path(file_okay=False),
              help="Start from this head (specrt's or EAGLE's published layout; its draft vocabulary is kept), "
                   "to train it further on new data.")
@click.option("--compute", type=click.Choice(["auto", "float32", "bfloat16"]), default="auto", show_default=True,
              help="Matmul precision while the target generates and the head trains. auto: bfloat16 where the "
                   "device has it natively (a CPU with AVX-512 BF16 or AMX: generating ran 1.9x faster on a Zen 4; "
                   "CUDA GPUs from Ampere on), else float32. Held-out acceptance is measured in float32 either way.")
@click.option("--device", default="auto", show_default=True, metavar="auto|cpu|cuda|cuda:N",
              help="Where the target generates and the head trains. auto: the first CUDA GPU when this torch sees "
                   "one, else the CPU. The data cache stays in host memory (about 1 MB per sequence of 256 "
                   "tokens on a 576-wide target); a run resumes on another device.")
@click.option("--heldout", "heldout_fraction", type=click.FloatRange(0, 1, min_open=True, max_open=True),
              default=0.1, show_default=True, metavar="FRACTION",
              help="Share of the prompts held out whole: the target answers each once, greedily, and the head's "
                   "acceptance before and after is measured on those replies. They are written first, within a "
                   "quarter of the time a --time-limit leaves for replies.")
@click.option("--time-limit", type=click.FloatRange(min=0, min_open=True), metavar="MINUTES",
              help="Fit the whole run, reading the target included, in this much wall time: the target writes "
                   "prompts and replies for about half of it (held-out replies first, within their own share; a "
                   "batch running at its deadline stops there), then timed steps set how many training steps fit "
                   "before the held-out check and the save; --sequences and --steps become upper bounds. A limit "
                   "below what the run needs at the least is refused before anything is generated. It says what it "
                   "expects before training, and warns after it when the head is too weak to pay.")
def eagle_train(model: str, output: str, data_files: tuple[str, ...], prompts_file: str | None, steps: int,
                draft_vocab: int, num_sequences: int, seq_len: int, batch_size: int, ttt_steps: int, lr: float,
                seed: int, resume: bool, keep_checkpoint: bool, init: str | None, compute: str,
                self_prompts: int, device: str, layers: int, heldout_fraction: float, time_limit: float | None) -> None:
    """Train an EAGLE-3 head for the frozen local MODEL (a Hugging Face folder or a llama.cpp GGUF), on text the
    target writes itself (never a download).

    The head learns the target's distribution over a reduced draft vocabulary (forward KL), unrolled on its own
    outputs as the runtime feeds them; it is written in the published layout (config.json, model.safetensors; a
    stacked head in the speculators format), with training.json holding the held-out acceptance before and
    after. A checkpoint is kept while it trains.

    \b
    Example:
      specrt eagle train ./smollm2 -o head --steps 300 --draft-vocab 8192
      specrt eagle train ./smollm2 -o head2 --init head --prompts more.json --steps 300   # train it further
      specrt eagle train ./smollm2 -o head3 --self-prompts 3000 --sequences 3000   # prompts it writes itself
      specrt export ./smollm2 --eagle head -o bundle && specrt bench --bundle bundle --methods none,eagle --chat
    """
    from ..measure.bench import read_prompts

    with torch_side("eagle train"):
        from ..export.eagle.train import WRITTEN_NAME, EagleTrainConfig, train_eagle
        from ..export.precision import resolve_compute, resolve_device
        from ..export.progress import rich_progress
    cfg = EagleTrainConfig(steps=steps, lr=lr, batch_size=batch_size, seq_len=seq_len,
                           draft_vocab=draft_vocab or None, ttt_steps=ttt_steps, seed=seed,
                           num_sequences=num_sequences, init=init, keep_checkpoint=keep_checkpoint, compute=compute,
                           self_prompts=self_prompts, device=device, layers=layers, time_limit=time_limit,
                           heldout_fraction=heldout_fraction)
    prompts = read_prompts(prompts_file) if prompts_file else None
    where = resolve_device(device)  # said before the long work starts (train_eagle resolves it the same way)
    click.echo(f"eagle train: on {where}, {resolve_compute(compute, where)} matmuls", err=True)
    with rich_progress() as progress:
        record = train_eagle(model, output, cfg, prompts=prompts, data_files=data_files, progress=progress,
                             resume=resume, say=lambda line: click.echo(line, err=True))
    held, before = record["heldout"], record["heldout_init"]
    replies = record["data"].get("sequences_heldout")
    click.echo(f"wrote {output}: held-out greedy acceptance of the first draft {held['alpha1']:.3f} (from "
               f"{before['alpha1']:.3f}), {held['tokens_per_pass']:.2f} tokens per target pass at depth {ttt_steps} "
               f"(from {before['tokens_per_pass']:.2f}{f' over {replies} held-out sequences' if replies else ''}; "
               f"trained in {record['compute']} on {record['device']}, "
               f"{record['time_s']['total_this_run'] / 60:.0f} min)")
    if init and held["tokens_per_pass"] < before["tokens_per_pass"]:
        click.echo(f"note: {init} drafted better on these held-out replies than the new head: train on more data "
                   "(or fewer steps over it), or keep the old one", err=True)
    for line in _limits_said(record):
        click.echo(line)
    if record.get("verdict"):
        from ..export.eagle.forecast import verdict_line

        weak = verdict_line(record["verdict"], held)
        if weak:
            click.echo(weak, err=True)
    if self_prompts:
        click.echo(f"the target wrote {record['data']['prompts_written']} of the {self_prompts} prompts asked for: "
                   f"{Path(output) / WRITTEN_NAME}")


@eagle.command("prune")
@click.argument("model")
@click.argument("head", type=click.Path(file_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False), help="Folder for the smaller head.")
@click.option("--draft-vocab", "keep", type=click.IntRange(min=1), required=True, metavar="N",
              help="Draft ids to keep: the N the target writes most often, and its end ids.")
@click.option("--text", "text_files", multiple=True, type=click.Path(exists=True),
              help="Text like the target's replies to count ids in (a file or a folder of .txt/.md/.py; "
                   "repeatable) [default: the counts HEAD records, which `specrt eagle train` writes].")
def eagle_prune(model: str, head: str, output: str, keep: int, text_files: tuple[str, ...]) -> None:
    """Copy HEAD, an EAGLE-3 head made for MODEL (a Hugging Face folder or hub id), with a smaller draft
    vocabulary: its N most frequent draft ids kept and the rest of its LM head dropped (FR-Spec).

    The draft LM head is most of a small head's weights: on SmolLM2-135M, keeping 4,096 of its 16,384 ids made
    each drafting pass a third cheaper for 1 % fewer tokens per pass (a chain of 3), and eagle-tree 1.03-1.06x
    faster (int8, 2 CPU cores, one process). Still exact: the head's distribution over the kept ids is its own,
    renormalised. Keep N where the printed coverage is still that of all the ids. The new head keeps HEAD's
    precision, is written as `eagle train` writes heads, with its counts; export it as any head.

    \b
    Example:
      specrt eagle prune ./smollm2 head -o head-4k --draft-vocab 4096
      specrt eagle prune ./smollm2 published-head -o head-8k --draft-vocab 8192 --text replies.txt
      specrt export ./smollm2 --eagle head-4k -o bundle
    """
    with torch_side("eagle prune"):
        from ..export.eagle.prune import prune_eagle
    r = prune_eagle(model, head, output, keep, text_files)
    click.echo(f"wrote {output}: {r.kept:,} of {r.draft_vocab:,} draft ids, covering {100 * r.coverage_after:.1f} % "
               f"of the {r.counted:,} tokens counted (all {r.draft_vocab:,}: {100 * r.coverage_before:.1f} %; counted "
               f"in {r.counts_from})")
    click.echo(f"next: specrt export {model} --eagle {output} -o BUNDLE")


def _limits_said(record: dict) -> list[str]:
    """What a time limit or the host's memory or disk changed in a run, in its own words."""
    data, plan, said = record["data"], record.get("time_limit"), []
    why = {"time": "the time limit", "memory": "this host's free memory", "disk": "the cache's free disk"}
    if data.get("generation_cut"):
        said.append(f"replies: {data['continuations_made']} of the {data['continuations_asked']} asked for (as many as "
                    f"{why[data['generation_cut']]} allowed)")
    if plan:
        ran = len(record["loss"]["history"])  # a resumed run's history holds the earlier steps too
        said.append(f"steps: {ran} of the {record['config']['steps']} allowed, planned {plan['steps']} at "
                    f"{plan['step_s']:.2f} s a step to end within {plan['minutes']:g} min"
                    + (", stopped at the limit" if plan["stopped_at_step"] is not None else ""))
        cut = [f"{part} ({why.get(by, by)})" for part, by in plan.get("data_stopped", {}).items() if by]
        if plan.get("replies_cut_short"):
            cut.append(f"{plan['replies_cut_short']} replies cut part-written")
        if cut:
            said.append("data stopped early: " + ", ".join(cut))
    return said
