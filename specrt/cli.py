"""The ``specrt`` command line: parse, call the library, print. Domain errors become one-line messages."""

from __future__ import annotations

import contextlib
import functools
import json
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import click

from . import __version__
from .errors import SpecrtError
from .export.pipeline import missing_extra


class _Commands(click.Group):
    """The error boundary: a SpecrtError in any command becomes click's one-line 'Error: ...' and exit code 1,
    never a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SpecrtError as e:
            raise click.ClickException(str(e)) from None


@contextlib.contextmanager
def _torch_side(what: str) -> Iterator[None]:
    """Imports of the export extra inside this block fail as one line naming the install command."""
    try:
        yield
    except ImportError as e:
        raise missing_extra(what, e) from None


def _options(*decorators: Callable) -> Callable:
    """Several options as one decorator, shown in --help in the order given."""

    def deco(fn: Callable) -> Callable:
        for d in reversed(decorators):
            fn = d(fn)
        return fn

    return deco


def _gamma(ctx: click.Context, param: click.Parameter, value: str) -> int | str:
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is neither an integer nor 'auto'") from None


# --- options shared by several commands ------------------------------------------------------------------------

METHODS = ("auto", "eagle", "draft", "tree", "medusa", "ngram", "none")
BITS = {"int4": 4, "int8": 8}


def _bits(ctx: click.Context, param: click.Parameter, value: str | None) -> int | str | None:
    return None if value == "none" else BITS.get(value, value)  # "same" stays "same"


bundle_option = click.option(
    "--bundle", type=click.Path(file_okay=False),
    help="Bundle folder from `specrt export` [default: the demo bundle shipped with specrt].")
gamma_option = click.option(
    "--gamma", default="4", show_default=True, callback=_gamma,
    help="Draft tokens per target pass (1-64), or 'auto' to pick it from measured alpha and c.")
tree_option = click.option("--tree", "tree_shape", default="2,2,1,1", show_default=True,
                           help="Tree shape of the tree method: children per node at each depth.")
sampling_options = _options(
    click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy."),
    click.option("--top-k", type=int, default=0, show_default=True, help="0 = off."),
    click.option("--top-p", type=float, default=1.0, show_default=True, help="1 = off."))
backend_option = click.option(
    "--backend", default="auto", show_default=True,
    help="onnxruntime, tensorrt or torch. auto: TensorRT when the bundle has engines from `specrt build` "
         "(and TensorRT is importable), else ONNX Runtime (its CUDA provider if onnxruntime-gpu sees a GPU).")
threads_option = click.option("--threads", type=int, help="Intra-op threads per session [default: all cores].")
low_memory_option = click.option(
    "--low-memory", type=click.Choice(["auto", "on", "off"]), default="auto", show_default=True,
    callback=lambda c, p, v: {"auto": None, "on": True, "off": False}[v],
    help="ONNX Runtime on CPU. on: no fp32 copy of an fp16 model's weights (cast at every pass instead) and no "
         "prepacking (Llama-3.2-1B dims fp16: 0.3x the anonymous memory, 0.2x the tokens/s). auto: on for a model "
         "whose default session would not fit in the memory available, said on stderr.")
force_option = click.option("--force", is_flag=True, help="Replace a non-empty output folder.")


def method_option(lead: str = "") -> Callable:
    return click.option(
        "--method", type=click.Choice(METHODS), default="auto", show_default=True,
        help=lead + "auto: the best the bundle holds (eagle, else draft, else ngram); eagle: a chain from the "
                    "bundle's EAGLE-3 head; draft: a chain from the draft model; tree: a token tree from the draft model, verified in one pass (SpecInfer); "
                    "medusa: the bundle's Medusa heads; ngram: prompt lookup, no model; none: plain decoding.")


def quantize_layout_options(note: str = "") -> Callable:
    return _options(
        click.option("--block-size", type=click.Choice(["16", "32", "64", "128"]), default="32", show_default=True,
                     callback=lambda c, p, v: int(v), help=f"Weights per quantization scale{note}."),
        click.option("--draft-quantize", type=click.Choice(["same", "none", "int4", "int8"]), default="same",
                     show_default=True, callback=_bits, help=f"The draft's quantization{note}."))


def _load(bundle: str | None, **kwargs: Any):
    """The bundle's generator; notes on how its sessions were sized go to stderr."""
    from . import load

    gen = load(bundle, **kwargs)
    for note in gen.memory_notes:
        click.echo(f"note: {note}", err=True)
    return gen


# --- commands -------------------------------------------------------------------------------------------------

@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="specrt")
def main() -> None:
    """specrt: lossless speculative decoding, exported to ONNX and run on a lean runtime.

    \b
    Typical session:
      specrt export ./target --draft ./draft -o bundle     # HF models -> checked ONNX bundle
      specrt run "def fib(n):" --bundle bundle --stats --baseline     # stream text, show alpha and speedup
    """


@main.command()
@click.argument("model")
@click.option("--draft", metavar="DRAFT", help="Draft model (folder or hub id) with the same tokenizer.")
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False), help="Bundle folder to create.")
@click.option("--dtype", type=click.Choice(["fp32", "fp16"]), default="fp32", show_default=True,
              help="Weight and KV-cache precision of the exported graphs.")
@click.option("--opset", type=int, default=18, show_default=True,
              help="ONNX opset of portable graphs (fused graphs are opset 23).")
@click.option("--max-context", type=int,
              help="Positions the runtime's KV cache holds [default: the models' limit, at most 4096].")
@click.option("--exporter", type=click.Choice(["dynamo", "torchscript"]), default="dynamo", show_default=True,
              help="torch.onnx exporter: dynamo gives leaner graphs; torchscript traces faster.")
@click.option("--graph", type=click.Choice(["auto", "fused", "portable"]), default="auto", show_default=True,
              help="fused: rotary, attention, RMS norm and packed projections as single opset-23 nodes (a ~2.5x "
                   "smaller graph, faster on ONNX Runtime); portable: plain ops, for TensorRT (`specrt build`). "
                   "auto: fused where the architecture has it (llama, mistral, qwen2, qwen3, phi3, gemma2, "
                   "gemma3_text: all but gpt2) with the dynamo exporter.")
@click.option("--medusa", type=click.Path(file_okay=False),
              help="Medusa heads for the target (from `specrt medusa train`): adds medusa.onnx and a static tree.")
@click.option("--medusa-dtype", type=click.Choice(["fp32", "fp16"]),
              help="Precision of the Medusa heads [default: --dtype]; fp16 heads halve their bytes on an fp32 target.")
@click.option("--medusa-nodes", type=int, default=24, show_default=True,
              help="Node budget of the Medusa tree, chosen from the heads' measured top-k accuracies.")
@click.option("--eagle", metavar="HEAD", type=click.Path(file_okay=False),
              help="EAGLE-3 head for MODEL (a folder in the published layout: config.json + model.safetensors with "
                   "fc, midlayer.*, lm_head, d2t, t2d): adds eagle.onnx and its vocabulary map, and the target graph "
                   "outputs the hidden states the head reads (llama, mistral, qwen2, qwen3, phi3 targets).")
@click.option("--quantize", type=click.Choice(["int4", "int8"]), callback=_bits,
              help="Weight-only quantization of every matmul (LM head included) with ONNX Runtime's MatMulNBits.")
@quantize_layout_options(" (with --quantize)")
@force_option
def export(model: str, draft: str | None, output: str, dtype: str, opset: int, max_context: int | None,
           exporter: str, graph: str, medusa: str | None, medusa_dtype: str | None, medusa_nodes: int,
           eagle: str | None, quantize: int | None, block_size: int, draft_quantize: int | str | None, force: bool) -> None:
    """Export MODEL (and --draft) to an ONNX bundle with explicit KV-cache I/O.

    MODEL and DRAFT are local Hugging Face folders or hub ids. Supported architectures: llama, mistral, qwen2,
    qwen3, gemma2, gemma3_text, phi3, gpt2. Every graph is checked against PyTorch computed in fp32 (prefill,
    1-token decode, a 5-token chain, a tree and a prefill at the last position) before the bundle appears: logit
    error relative to each row's spread, and KL; the figures go into specrt.json.

    \b
    Examples:
      specrt export ./llama-1b --draft ./llama-68m -o bundle --dtype fp16
      specrt export ./llama-1b --draft ./llama-68m -o bundle-int4 --quantize int4
    """
    with _torch_side("export"):
        from transformers.utils import logging as hf_logging

        from .export.bundle import ExportOptions
    from .export.pipeline import describe, export_pipeline
    from .export.progress import RichReporter
    from .export.quantize import QuantizeOptions

    hf_logging.disable_progress_bar()  # our own step display replaces transformers' per-file bars
    dtypes = {"fp32": "float32", "fp16": "float16"}
    options = ExportOptions(dtype=dtypes[dtype], opset=opset, max_context=max_context, exporter=exporter, force=force,
                            medusa=medusa, medusa_nodes=medusa_nodes, graph=graph, eagle=eagle,
                            medusa_dtype=dtypes[medusa_dtype] if medusa_dtype else None)
    qopts = QuantizeOptions(quantize, block_size, draft_quantize, force=force) if quantize else None
    manifest = export_pipeline(model, draft, output, options, qopts, RichReporter(), progress=click.echo)
    click.echo(describe(manifest))
    click.echo(f"done: {output} (max context {manifest.max_context})")


@main.command()
@click.argument("bundle", type=click.Path(file_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False), help="Quantized bundle to create.")
@click.option("--bits", type=click.Choice(["int4", "int8"]), default="int4", show_default=True, callback=_bits)
@quantize_layout_options()
@force_option
def quantize(bundle: str, output: str, bits: int, block_size: int, draft_quantize: int | str | None,
             force: bool) -> None:
    """Weight-only int4/int8 copy of an exported BUNDLE (ONNX Runtime's MatMulNBits; needs onnx, not torch).

    Every matmul with constant weights is quantized, the LM head included (tied embeddings keep a float copy for the
    lookup). Each graph must stay close to the float one in distribution (mean KL and top-1 agreement on the shipped
    prompts) before OUT appears. Speculation stays exact with respect to the quantized target.

    \b
    Example:
      specrt quantize bundle -o bundle-int4 --bits int4 --block-size 32
    """
    from .export.quantize import QuantizeOptions, describe, quantize_bundle

    manifest = quantize_bundle(bundle, output, QuantizeOptions(bits, block_size, draft_quantize, force=force),
                               progress=click.echo)
    click.echo(describe(manifest))
    click.echo(f"done: {output}")


@main.command()
@click.argument("prompt", required=False)
@click.option("--chat", "chat_message", metavar="MESSAGE",
              help="Chat with an instruct model instead of continuing PROMPT: MESSAGE is the user's turn, rendered "
                   "with the bundle's chat template (exported from the tokenizer); the reply streams until the "
                   "model's end-of-turn token.")
@click.option("--system", "system_message", metavar="TEXT",
              help="With --chat: a system message before the user's (not every template accepts one).")
@bundle_option
@method_option()
@click.option("--acceptance", type=click.Choice(["exact", "typical"]), default="exact", show_default=True,
              help="typical: Medusa's typical acceptance for sampling. LOSSY: the output is NOT distributed as "
                   "the target's. Exact is the default and the only lossless choice.")
@tree_option
@gamma_option
@click.option("--max-new-tokens", type=int, default=128, show_default=True)
@sampling_options
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--stop", multiple=True, help="Stop string (repeatable); the text ends before it.")
@click.option("--stats", is_flag=True, help="Print acceptance, tokens per target pass, c and speedups to stderr.")
@click.option("--baseline", is_flag=True,
              help="With --stats: also decode the prompt with --method none and print the measured speedup.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object (text, token_ids, stats) instead of streaming.")
@backend_option
@threads_option
@low_memory_option
def run(prompt: str | None, chat_message: str | None, system_message: str | None, bundle: str | None, method: str,
        acceptance: str, tree_shape: str, gamma: int | str, max_new_tokens: int, temperature: float, top_k: int,
        top_p: float, seed: int, stop: tuple[str, ...], stats: bool, baseline: bool, as_json: bool, backend: str,
        threads: int | None, low_memory: bool | None) -> None:
    """Generate a continuation of PROMPT with exact speculative decoding, streaming it to stdout. With --chat
    MESSAGE (instead of PROMPT), reply to MESSAGE as the instruct model's assistant.

    The output is distributed exactly as the target model's own (greedy: identical tokens); the draft only changes
    how many tokens each target pass yields.

    \b
    Examples:
      specrt run "def fib(n):" --bundle bundle --stats --baseline
      specrt run "import os" --bundle bundle --method ngram --temperature 0.8 --top-p 0.95 --seed 1
      specrt run "class Stack:" --bundle bundle --gamma auto --json
      specrt run "def main():" --bundle bundle --method tree --tree 3,2,1,1 --stats
      specrt run --chat "Write a haiku about caches." --system "You are terse." --bundle instruct-bundle
    """
    from .runtime.options import DecodeOptions

    if (prompt is None) == (chat_message is None):
        raise click.UsageError("give either PROMPT or --chat MESSAGE")
    if system_message is not None and chat_message is None:
        raise click.UsageError("--system needs --chat")
    gen = _load(bundle, backend=backend, threads=threads, low_memory=low_memory)
    if chat_message is not None:
        messages = ([{"role": "system", "content": system_message}] if system_message is not None else []) + [
            {"role": "user", "content": chat_message}]
        stream = functools.partial(gen.stream_chat, messages)
    else:
        stream = functools.partial(gen.stream, prompt)
    options = DecodeOptions(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                            seed=seed, method=method, gamma=gamma, stop=stop, tree=tree_shape, acceptance=acceptance)
    pieces = stream(options)
    if as_json:
        result = pieces.result
        click.echo(json.dumps({"text": result.text, "token_ids": result.token_ids,
                               "finish_reason": result.finish_reason, "stats": result.stats.to_dict()}, indent=2))
    else:
        for piece in pieces:
            click.echo(piece, nl=False)
        click.echo()
        result = pieces.result
    if stats:
        from .measure.report import print_stats

        measured = None
        if baseline and method != "none":
            plain = stream(options.replace(method="none", acceptance="exact")).result  # typical is Medusa's only
            measured = result.stats.tokens_per_second / plain.stats.tokens_per_second
        print_stats(result.stats, gen.decoders["target"].provider, lossy=acceptance == "typical",
                    measured_speedup=measured)


@main.command()
@bundle_option
@click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False),
              help="JSON list or one-prompt-per-line file [default: the shipped code prompts].")
@click.option("--prompt-set", type=click.Choice(["code", "prose", "all"]), default="code", show_default=True,
              help="Which shipped prompt set to use when --prompts is not given.")
@click.option("--methods", default="none,draft,tree,ngram", show_default=True,
              help="Comma-separated; must include none.")
@tree_option
@click.option("--max-new-tokens", type=int, default=128, show_default=True)
@click.option("--repeats", type=int, default=3, show_default=True, help="Figures are medians over repeats.")
@gamma_option
@sampling_options
@click.option("--greedy-baseline/--no-greedy-baseline", default=True, show_default=True,
              help="With sampling: also run greedy plain decoding in every repeat, beside the sampled none run, "
                   "and report each method's tokens/s over it (what sampling costs, measured in one run).")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), help="Also write the results here.")
@threads_option
@click.option("--compare", "compare", multiple=True, metavar="PEERS",
              help="Also time peers on the same checkpoints, prompts and sampling settings, interleaved with "
                   "specrt's methods: hf (Hugging Face generate and assisted generation; needs torch), ortgenai "
                   "(ONNX Runtime GenAI plain decoding; needs the [peers] extra). Comma-separated or repeated.")
@click.option("--hf-target", type=click.Path(file_okay=False),
              help="HF checkpoint of the target for --compare [default: the manifest's source].")
@click.option("--hf-draft", type=click.Path(file_okay=False),
              help="HF checkpoint of the draft for --compare hf [default: the manifest's source].")
@click.option("--peer-precision", type=click.Choice(["fp32", "int8", "int4"]),
              help="Precision ONNX Runtime GenAI's builder makes [default: the bundle's; fp16 bundles get fp32, "
                   "the builder has no fp16 for CPU].")
@click.option("--peer-cache", type=click.Path(file_okay=False),
              help="Where built ONNX Runtime GenAI models are kept [default: ~/.cache/specrt/peers].")
@click.option("--roofline", is_flag=True,
              help="Probe the memory bandwidth first (about a second: the GPU's with torch+CUDA for GPU backends, "
                   "else host memory) and report per method the GB/s achieved, its share of that roofline, and "
                   "the tokens/s the roofline allows.")
@click.option("--bandwidth", "bandwidth_gbps", type=float, metavar="GBPS",
              help="Use this bandwidth (GB/s) as the roofline instead of probing: a datasheet figure, or "
                   "`specrt doctor --bandwidth`'s.")
@click.option("--energy", is_flag=True,
              help="Joules per token and tokens per joule per method, from Jetson power monitors, RAPL or NVML "
                   "(whichever this machine reports; which are missing is said, not an error).")
@low_memory_option
def bench(bundle: str | None, prompts_file: str | None, prompt_set: str, methods: str, tree_shape: str,
          max_new_tokens: int, repeats: int, gamma: int | str, temperature: float, top_k: int, top_p: float,
          greedy_baseline: bool, json_out: str | None, threads: int | None, compare: tuple[str, ...],
          hf_target: str | None, hf_draft: str | None, peer_precision: str | None, peer_cache: str | None,
          roofline: bool, bandwidth_gbps: float | None, energy: bool, low_memory: bool | None) -> None:
    """Measure tokens/s per method in one run; speedups are ratios to --method none.

    Also reports tokens per target pass, alpha, c, the speedup the theory predicts for them, the time split (draft /
    verify / prefill / host), the host work per generated token (everything outside the engines' forward calls) and,
    for greedy runs, whether every method produced the same tokens as plain decoding; for sampled runs, every
    method's tokens/s over greedy plain decoding's, run beside it in each repeat. Sampling settings apply to every
    method alike, and to the peers of --compare, which decode from specrt's prompt ids; each method's tokens/s is
    reported over each peer's. ONNX Runtime GenAI's model is built once per checkpoint, precision and version, then
    cached.

    Every method also gets its bytes read per generated token (weights of each graph at its precision, plus the KV
    cache at the measured mean context, times the measured target and draft passes per token) and its arithmetic per
    token against plain decoding (ops factor). Decoding at batch 1 is memory-bound: --roofline divides the measured
    bandwidth by those bytes to say how far each method is from the limit.

    \b
    Examples:
      specrt bench --bundle bundle --methods none,draft,ngram --repeats 3 --json bench.json
      specrt bench --bundle bundle --methods none,draft --temperature 0.8 --top-p 0.9
      specrt bench --bundle bundle --methods none,draft --roofline --energy
      specrt bench --bundle bundle --bandwidth 204.8          # Jetson AGX Orin's LPDDR5, from the datasheet
      specrt bench --bundle bundle-int4 --compare ortgenai,hf
    """
    from rich.console import Console

    from . import load
    from .data import prompts as builtin_prompts
    from .measure.bandwidth import Bandwidth
    from .measure.bench import BenchConfig, make_peers, read_prompts, run_bench
    from .measure.peers import parse_kinds
    from .measure.probes import energy_meter, roofline_bandwidth
    from .measure.report import print_bench
    from .runtime.tree import TreeShape

    kinds = parse_kinds(compare)
    cfg = BenchConfig(methods=tuple(m.strip() for m in methods.split(",") if m.strip()),
                      max_new_tokens=max_new_tokens, repeats=repeats, gamma=gamma, temperature=temperature,
                      top_k=top_k, top_p=top_p, tree=TreeShape.parse(tree_shape), greedy_baseline=greedy_baseline)
    prompts = read_prompts(prompts_file) if prompts_file else builtin_prompts(prompt_set)
    given = Bandwidth("given", bandwidth_gbps) if bandwidth_gbps is not None else None  # checks it before loading
    gen = load(bundle, threads=threads, low_memory=low_memory)
    notes: list[str] = [f"memory: {n}" for n in gen.memory_notes]
    with Console(stderr=True).status("loading peers…" if kinds else "benchmarking…") as status:
        peers = make_peers(gen, kinds, hf_target, hf_draft, threads, peer_precision, peer_cache,
                           on_progress=lambda msg: status.update(f"building ONNX Runtime GenAI model: {msg}"))
        provider = gen.decoders["target"].provider
        bw = given or (roofline_bandwidth(provider, notes, status.update) if roofline else None)
        meter = energy_meter(notes) if energy else None
        result = run_bench(gen, prompts, cfg, on_progress=lambda msg: status.update(f"benchmarking: {msg}"),
                           peers=peers, bandwidth=bw, energy=meter)
    result["notes"] = notes
    print_bench(result)
    if json_out:
        with open(json_out, "w") as f:
            json.dump(result, f, indent=2)
        click.echo(f"wrote {json_out}")


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

    with _torch_side("medusa train"):
        from .export.medusa import MedusaTrainConfig, train_medusa
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
@click.option("--alpha", type=float, help="Acceptance rate α in [0, 1].")
@click.option("--c", "c", type=float, help="Cost of a draft pass / cost of a target pass.")
@click.option("--mu", type=float,
              help="Draft / target arithmetic operations per token, for the ops-factor column [default: from the "
                   "bundle's graphs with --bundle; else c, a time ratio standing in for it].")
@click.option("--bundle", type=click.Path(file_okay=False),
              help="Measure α and c on this bundle first (instead of --alpha/--c), and μ from its graphs.")
@click.option("--demo", is_flag=True, help="Measure on the demo bundle shipped with specrt.")
@click.option("--temperature", type=float, default=1.0, show_default=True,
              help="Sampling temperature to measure α at.")
@click.option("--context", type=int, default=256, show_default=True,
              help="With --bundle: μ adds attention's FLOPs at this many positions (0: matmuls only).")
@click.option("--max-gamma", type=int, default=16, show_default=True)
@click.option("--plot", "plot_file", type=click.Path(dir_okay=False),
              help="Write a PNG of speedup vs γ (needs matplotlib).")
def plan(alpha: float | None, c: float | None, mu: float | None, bundle: str | None, demo: bool, temperature: float,
         context: int, max_gamma: int, plot_file: str | None) -> None:
    """Table of γ, E[tokens per target pass], relative cost γc+1, speedup and arithmetic-ops factor; marks the
    optimal γ and says how close it gets to the unlimited-γ ceiling.

    \b
    E[tokens/pass] = (1 - α^(γ+1)) / (1 - α)     speedup = E / (γc + 1)
    ops factor     = (γμ + γ + 1) / E             (Leviathan et al. 2023, Eq. 11)
    oracle ceiling = 1 / (1 - α)                  (E as γ → ∞)

    The ops factor is how many times plain decoding's arithmetic speculation spends: it is paid in compute (and
    energy) even where the memory-bound wall time improves.

    \b
    Examples:
      specrt plan --alpha 0.8 --c 0.02 --mu 0.01
      specrt plan --bundle bundle --temperature 0 --context 1024 --plot speedup.png
    """
    from .measure.plan import bundle_mu, measure, plot
    from .measure.report import print_plan

    mu_note = None
    if bundle is not None or demo:
        if alpha is not None or c is not None:
            raise click.UsageError("give either --alpha/--c or --bundle, not both")
        from . import load
        from .data import prompts as builtin_prompts

        gen = load(bundle)
        m = measure(gen, builtin_prompts("code"), temperature=temperature)
        alpha, c = m.alpha, m.c
        click.echo(m.describe())
        if mu is None:
            mu, mu_note = bundle_mu(gen.bundle, gen.manifest, context)
    elif alpha is None or c is None:
        raise click.UsageError("give --alpha and --c, or --bundle to measure them")
    print_plan(alpha, c, max_gamma, mu, mu_note)
    if plot_file:
        click.echo(f"wrote {plot(alpha, c, max_gamma, plot_file)}")


@main.command()
@bundle_option
@click.option("--samples", type=int, default=2000, show_default=True,
              help="Samples per side for the sampled-distribution check.")
@click.option("--max-new-tokens", type=int, default=32, show_default=True)
@click.option("--prompt-set", type=click.Choice(["code", "prose", "all"]), default="all", show_default=True)
@backend_option
def verify(bundle: str | None, samples: int, max_new_tokens: int, prompt_set: str, backend: str) -> None:
    """Check a bundle on this backend: PASS/FAIL with figures, exit code 1 on any FAIL.

    \b
    - logits vs the PyTorch reference stored at export (precision problems, broken engines);
    - greedy speculation == plain greedy decoding, token for token (draft and n-gram);
    - sampled speculation vs plain sampling, total-variation distance under a stated threshold;
    - the draft pays for itself: best predicted speedup at the measured α and c above 1
      (a draft with a shifted vocabulary cannot change the output, only this figure).
    """
    from rich.console import Console

    from . import load
    from .check.verify import verify_bundle
    from .data import prompts as builtin_prompts

    if samples < 10:
        raise click.BadParameter("use at least 10 samples", param_hint="--samples")
    gen = load(bundle, backend=backend)
    with Console(stderr=True).status("verifying…"):
        checks = verify_bundle(gen, builtin_prompts(prompt_set), samples=samples, max_new_tokens=max_new_tokens)
    for ch in checks:
        click.echo(f"{'PASS' if ch.passed else 'FAIL'}  {ch.name}: {ch.detail}")
    failed = [ch for ch in checks if not ch.passed]
    if failed:
        raise click.ClickException(f"{len(failed)} of {len(checks)} checks failed")
    click.echo(f"all {len(checks)} checks passed")


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

    from .bundle.manifest import load_manifest
    from .demo import bundle_path
    from .export import tensorrt as trt

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


@main.command()
@bundle_option
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind. The default answers this machine only; 0.0.0.0 opens it to the network "
                   "(then set an API key).")
@click.option("--port", type=int, default=8000, show_default=True)
@method_option("Speculation method for every request. ")
@gamma_option
@tree_option
@click.option("--max-queue", type=int, default=16, show_default=True,
              help="Requests that may wait for the generator besides the one it runs; past that: 429 with "
                   "Retry-After.")
@click.option("--api-key", envvar="SPECRT_API_KEY", show_envvar=True,
              help="Require 'Authorization: Bearer KEY' on /v1/* (401 otherwise). Prefer the environment "
                   "variable: a command line is visible to every user of the machine.")
@click.option("--model-name",
              help="The model id clients send [default: specrt-demo, or the bundle folder's name].")
@click.option("--max-body", type=int, default=1 << 20, show_default=True,
              help="Largest request body in bytes; larger ones get 413.")
@click.option("--drain-timeout", type=float, default=30.0, show_default=True,
              help="On SIGTERM: seconds in-flight requests get to finish before they are cancelled.")
@backend_option
@threads_option
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="info",
              show_default=True)
@low_memory_option
def serve(bundle: str | None, host: str, port: int, method: str, gamma: int | str, tree_shape: str, max_queue: int,
          api_key: str | None, model_name: str | None, max_body: int, drain_timeout: float, backend: str,
          threads: int | None, log_level: str, low_memory: bool | None) -> None:
    """Serve the bundle with OpenAI's HTTP API (needs `pip install 'specrt[serve]'`).

    \b
    POST /v1/completions, POST /v1/chat/completions  JSON, or server-sent events with "stream": true;
                                                     each answer carries usage and a "specrt" object
                                                     (accepted/drafted, tokens per target pass, alpha)
    GET /v1/models, GET /health
    GET /metrics                                     Prometheus: requests, tokens, tokens/s, alpha,
                                                     queue depth, latency histograms
    Chat needs a bundle with a chat template (the demo has none).

    One generator serves requests in arrival order (batch size 1); temperature, top_p, top_k, seed, max_tokens and
    stop are per request. SIGTERM lets in-flight requests finish (--drain-timeout), then exits 0.

    \b
    Examples:
      specrt serve                                    # the demo bundle on http://127.0.0.1:8000/v1
      SPECRT_API_KEY=secret specrt serve --bundle bundle --host 0.0.0.0 --port 8080 --gamma auto
      curl -N localhost:8000/v1/completions -H 'Content-Type: application/json' \\
        -d '{"model": "specrt-demo", "prompt": "def fib(n):", "max_tokens": 64, "stream": true}'
    """
    try:
        from .serve import ServeConfig
        from .serve import run as serve_forever
    except ImportError as e:
        missing = (e.name or "a dependency").split(".")[0]  # the package to install, not its submodule
        raise click.ClickException(f"serve needs the serve extra ({missing} is missing): "
                                   "pip install 'specrt[serve]'") from None
    config = ServeConfig(host=host, port=port, method=method, gamma=gamma, tree=tree_shape, max_queue=max_queue,
                         api_key=api_key, max_body_bytes=max_body, model_name=model_name,
                         drain_timeout_s=drain_timeout, log_level=log_level)
    gen = _load(bundle, backend=backend, threads=threads, low_memory=low_memory)
    serve_forever(gen, config, announce=lambda line: click.echo(line, err=True))


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--bandwidth", is_flag=True,
              help="Also measure sustainable memory bandwidth the way STREAM does (about a second): host memory "
                   "(read-sum and copy, one thread per core), and the GPU's with torch+CUDA.")
@click.option("--bandwidth-mb", type=int,
              help="Array size of the probe in MiB [default: max(512, 4x the last-level cache), at most a quarter "
                   "of free memory].")
def doctor(as_json: bool, bandwidth: bool, bandwidth_mb: int | None) -> None:
    """What specrt sees: Python and library versions, ONNX Runtime providers, GPUs, Jetson model / L4T / JetPack /
    power mode, and the backend `specrt run` would pick.

    \b
    Examples:
      specrt doctor
      specrt doctor --bandwidth                 # then: specrt bench --bandwidth <its GB/s>
      specrt doctor --bandwidth --bandwidth-mb 2048 --json
    """
    from .check.doctor import as_dict, diagnose, render
    from .measure.probes import bandwidth_probes

    if bandwidth_mb is not None and not bandwidth:
        raise click.UsageError("--bandwidth-mb needs --bandwidth")
    report = diagnose()
    probes = bandwidth_probes(None if bandwidth_mb is None else bandwidth_mb * 2**20) if bandwidth else None
    click.echo(json.dumps(as_dict(report, probes), indent=2) if as_json else render(report, probes))


if __name__ == "__main__":
    sys.exit(main())
