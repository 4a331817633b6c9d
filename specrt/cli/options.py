"""What the commands share: the error boundary, option decorators, loading a bundle."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import click

from ..errors import ConfigError, SpecrtError
from ..export.pipeline import missing_extra
from ..runtime.backends.base import check_threads
from ..runtime.drafters import METHODS as REGISTERED
from ..runtime.options import AUTO, check_seed, check_temperature
from ..runtime.tree import DEFAULT_EAGLE_TREE


class Commands(click.Group):
    """The error boundary: a SpecrtError in any command becomes click's one-line 'Error: ...' and exit code 1,
    never a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SpecrtError as e:
            raise click.ClickException(str(e)) from None


@contextlib.contextmanager
def torch_side(what: str) -> Iterator[None]:
    """Imports of the export extra inside this block fail as one line naming the install command."""
    try:
        yield
    except ImportError as e:
        raise missing_extra(what, e) from None


def combine(*decorators: Callable) -> Callable:
    """Several options as one decorator, shown in --help in the order given."""

    def deco(fn: Callable) -> Callable:
        for d in reversed(decorators):
            fn = d(fn)
        return fn

    return deco


# What `eagle train` and `dflash train` both read: the text the target writes from, and its sequences
training_text_options = combine(
    click.option("--data", "data_files", multiple=True, type=click.Path(exists=True),
                 help="Plain text to train on as well (a file or a folder; repeatable) [default: only the target's "
                      "own replies to the shipped chat, code and prose prompts]."),
    click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False),
                 help="Seed prompts the target continues (JSON list or one per line) [default: the shipped ones]."))
training_sequence_options = combine(
    click.option("--sequences", "num_sequences", type=int, default=1000, show_default=True,
                 help="Continuations the target generates from the seed prompts."),
    click.option("--seq-len", type=int, default=256, show_default=True),
    click.option("--batch-size", type=int, default=8, show_default=True))
draft_vocab_option = click.option(
    "--draft-vocab", type=int, default=16384, show_default=True,
    help="Draft vocabulary: the most frequent target ids in the data (0: the whole vocabulary).")


def checked(check: Callable[[Any], Any]) -> Callable:
    """A click callback that applies the library's own check to an option's value before any bundle loads:
    the same rule as the Python API's, its ConfigError one 'Invalid value for --option' line."""

    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        try:
            return value if value is None else check(value)
        except ConfigError as e:
            raise click.BadParameter(str(e)) from None

    return callback


def parse_gamma(ctx: click.Context, param: click.Parameter, value: str) -> int | str:
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is neither an integer nor 'auto'") from None


# --- options shared by several commands ------------------------------------------------------------------------

METHODS = (AUTO, *REGISTERED)  # every registered method (the built-ins in their order), after auto
BITS = {"int4": 4, "int8": 8}


def parse_bits(ctx: click.Context, param: click.Parameter, value: str | None) -> int | str | None:
    return None if value == "none" else BITS.get(value, value)  # "same" stays "same"


bundle_option = click.option(
    "--bundle", type=click.Path(file_okay=False),
    help="Bundle folder from `specrt export` [default: the demo bundle shipped with specrt].")
gamma_option = combine(
    click.option("--gamma", default="4", show_default=True, callback=parse_gamma,
                 help="Draft tokens per target pass (1-64), or 'auto' to pick it from measured alpha and c."),
    click.option("--draft-stop", type=click.FloatRange(0, 1, max_open=True), default=0.0, show_default=True,
                 metavar="P",
                 help="End a chain (eagle, draft) early where the drafter's own probability of its next token is "
                      "below P: fewer drafts where it is unsure, still exact (0: always --gamma tokens)."),
    click.option("--row-stable", is_flag=True,
                 help="No one-row target pass after the prefill (a plain step feeds the token before again): "
                      "int8/int4 kernels compute one row differently from several, so greedy chains then match "
                      "plain decoding token for token on quantized bundles; plain steps cost ~1.25x (SmolLM2 int8)."))
tree_option = combine(
    click.option("--tree", "tree_shape", default="2,2,1,1", show_default=True,
                 help="Tree shape of the tree method: children per node at each depth."),
    click.option("--eagle-tree", default=str(DEFAULT_EAGLE_TREE), show_default=True, metavar="TOPK,DEPTH,NODES",
                 help="The eagle-tree method's dynamic tree (EAGLE-2): the TOPK best nodes of each level get their "
                      "TOPK likeliest children, DEPTH levels deep; the NODES best in all are verified. NODES auto: "
                      "each pass verifies as many as pay for their rows on this backend (its pass cost per row "
                      "count, measured once), and a level is grown only where its head pass pays: few nodes "
                      "and levels on a CPU, all on a GPU."))
sampling_options = combine(
    click.option("--temperature", type=float, default=0.0, show_default=True, callback=checked(check_temperature),
                 help="0 = greedy, as is any T below 1e-30; at most 2, as the server's requests."),
    click.option("--top-k", type=int, default=0, show_default=True, help="0 = off."),
    click.option("--top-p", type=float, default=1.0, show_default=True, help="1 = off."))
backend_option = click.option(
    "--backend", default="auto", show_default=True,
    help="onnxruntime, tensorrt or torch. auto: TensorRT when the bundle has engines from `specrt build` "
         "(and TensorRT is importable), else ONNX Runtime (its CUDA provider if onnxruntime-gpu sees a GPU).")
threads_option = combine(
    click.option("--threads", type=int, callback=checked(check_threads),
                 help="Intra-op threads, at most 256 (4 per core past 64 cores) [default, or 0: all cores]."),
    click.option("--thread-pool", type=click.Choice(["shared", "per-model"]), default="shared", show_default=True,
                 envvar="SPECRT_THREAD_POOL",
                 help="ONNX Runtime on CPU. shared: one pool for all of the bundle's models, so the draft's or EAGLE "
                      "head's passes run on the target's spinning workers (SmolLM2-135M fp32, eagle-tree: 1.33x -> "
                      "1.50x none on 2 cores; int8 unchanged); per-model: a pool per session, the draft or head on "
                      "one thread (what specrt.load gives an app unless it passes shared_threads=True)."))
low_memory_option = click.option(
    "--low-memory", type=click.Choice(["auto", "on", "off"]), default="auto", show_default=True,
    callback=lambda c, p, v: {"auto": None, "on": True, "off": False}[v],
    help="ONNX Runtime on CPU. on: no fp32 copy of an fp16 model's weights (cast at every pass instead) and no "
         "prepacking (Llama-3.2-1B dims fp16: 0.3x the anonymous memory, 0.2x the tokens/s). auto: on for a model "
         "whose default session would not fit in the memory available, said on stderr.")
seed_option = click.option("--seed", type=int, default=0, show_default=True, callback=checked(check_seed),
                           help="Sampling seed, 0 to 2^63 - 1.")
force_option = click.option("--force", is_flag=True, help="Replace a non-empty output folder.")


def method_option(lead: str = "") -> Callable:
    return click.option(
        "--method", type=click.Choice(METHODS), default="auto", show_default=True,
        help=lead + "auto: the best the bundle holds (eagle-tree, else draft, else ngram); eagle: a chain from the "
                    "bundle's EAGLE-3 head; eagle-tree: a dynamic tree from that head (EAGLE-2, --eagle-tree); draft: a chain from the draft model; tree: a token tree from the draft model, verified in one pass (SpecInfer); "
                    "medusa: the bundle's Medusa heads; ngram: prompt lookup, no model; none: plain decoding.")


def quantize_layout_options(note: str = "") -> Callable:
    return combine(
        click.option("--block-size", type=click.Choice(["16", "32", "64", "128"]), default="32", show_default=True,
                     callback=lambda c, p, v: int(v), help=f"Weights per quantization scale{note}."),
        click.option("--head-block-size", type=click.Choice(["16", "32", "64", "128"]), default=None,
                     callback=lambda c, p, v: int(v) if v else None,
                     help="The LM head's and the int8 embedding lookups' blocks [default: --block-size]: "
                          "SmolLM2-135M at int8 passes the gate with --block-size 64 --head-block-size 32 "
                          "--quantize-embeddings, not at 64 throughout (KL 0.011, limit 0.01)."),
        click.option("--draft-quantize", type=click.Choice(["same", "none", "int4", "int8"]), default="same",
                     show_default=True, callback=parse_bits,
                     help="The draft's quantization: same as the target's, none (float), int4 or int8."),
        click.option("--eagle-quantize", type=click.Choice(["same", "none", "int4", "int8"]), default="same",
                     show_default=True, callback=parse_bits,
                     help="The EAGLE-3 head's quantization, as --draft-quantize. An int8 head drafted at a third of "
                          "an fp32 head's cost on SmolLM2-135M; acceptance on the float and the quantized pair is "
                          "recorded."),
        click.option("--dflash-quantize", type=click.Choice(["auto", "same", "none", "int4", "int8"]),
                     default="auto", show_default=True, callback=parse_bits,
                     help="The DFlash draft's quantization: auto, int8 where the target is quantized to int4 or int8, "
                          "else float (a float target, or kept GGUF blocks); "
                          "or as --draft-quantize. A proposer, so no quality gate (the target verifies its blocks). "
                          "A pass runs a block's 8-16 rows, which cost arithmetic more than bytes on a CPU: "
                          "SmolLM2-135M's draft pass took 0.89x its float32 time at int8, 1.07x at int4."),
        click.option("--algorithm", type=click.Choice(["auto", "rtn", "hqq"]), default="auto", show_default=True,
                     help="int4 weights: rtn, symmetric round-to-nearest (fast to make); hqq, ONNX Runtime's "
                          "half-quadratic quantizer (asymmetric, fitted per block; needs torch, ~1 min for 135M "
                          "weights): SmolLM2-135M at int4 passes the gate with hqq (KL 0.096, limit 0.1), not with "
                          "rtn (0.56); auto, hqq where torch is installed, else rtn. int8 weights are always rtn."),
        click.option("--kernel", type=click.Choice(["nbits", "integer", "auto"]), default="nbits", show_default=True,
                     help="int8 matmuls: nbits, ONNX Runtime's MatMulNBits (blocks of --block-size); integer, its "
                          "integer matmul with weights per column and each row's activations in two 7-bit halves "
                          "(CPUs only); auto, the target made both ways and the faster kept, timed on this machine "
                          "at the rows decoding will verify (1, or 4 where a draft or head proposes). Which wins "
                          "depends on the CPU: on a 2-core Xeon integer's 5 verify rows cost 1.4x one against "
                          "nbits' 1.7x (eagle-tree ~1.1x faster, plain ~5% slower on SmolLM2-135M; plain 1.27x "
                          "faster at Llama-3.2-1B dimensions); on a 2-core AMD Zen 4 integer was slower at every "
                          "row count. integer also keeps greedy speculation on plain decoding's tokens (2 of 56 "
                          "runs left them, nbits 44). int4 weights stay nbits."),
        click.option("--quantize-embeddings/--float-embeddings", default=None,
                     help="Store the target's and draft's embedding tables at int8 too (ONNX Runtime's "
                          "GatherBlockQuantized; checked by the same gate), a quarter of their float bytes, or "
                          "keep them float [default: int8 where the gate passes, else float: SmolLM2-135M's int8 "
                          "bundle is ~150 MB with int8 tables, 269 MB with float ones]."))


def load_bundle(bundle: str | None, **kwargs: Any):
    """The bundle's generator; notes on how its sessions were sized go to stderr."""
    from .. import load

    gen = load(bundle, **kwargs)
    for note in gen.memory_notes:
        click.echo(f"note: {note}", err=True)
    return gen


def chat_option(what: str) -> Callable:
    """``--chat/--no-chat`` for a command that measures on prompts: default, the bundle's own chat template."""
    return click.option("--chat/--no-chat", "chat", default=None,
                        help=f"{what} [default: --chat when the bundle has a chat template (an instruct model), "
                             "whose replies are what a head for it drafts; else --no-chat].")


def chat_for(gen, chat: bool | None) -> bool:
    """``chat`` as given, else whether the bundle has a chat template."""
    return gen.manifest.tokenizer.chat_template is not None if chat is None else chat


def measure_prompts(chat: bool) -> list[str]:
    """The shipped prompts bench and plan measure on unless told: 8 chat prompts (the set has 210), or the 8 code
    prompts."""
    from ..data import prompts

    return prompts("chat")[-8:] if chat else prompts("code")
