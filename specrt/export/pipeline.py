"""``specrt export`` end to end: Hugging Face models → a checked bundle, quantized on the way when asked.

Importing this module needs no torch (the torch side is imported when the pipeline runs), so callers
can read :data:`INSTALL` on an install without the export extra.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from ..errors import INSTALL_TORCH, ConfigError, SpecrtError

if TYPE_CHECKING:
    from ..bundle.manifest import Manifest
    from .exporter import ExportOptions
    from .progress import Reporter
    from .quant.quantize import QuantizeOptions

# The one install line for everything torch-side (export, medusa train, the Hugging Face peers). torch
# first, from the CPU index unless the machine has an NVIDIA GPU (errors.INSTALL_TORCH).
INSTALL = f"{INSTALL_TORCH} && pip install 'specrt[export]'"


def missing_extra(what: str, error: ImportError) -> SpecrtError:
    """The one-line error for ``what`` (a command) when an import of the export extra failed."""
    return SpecrtError(f"{what} needs the export extra ({error.name} is missing): {INSTALL}")


# Where a bundle will run (``specrt export --for``), and what export chooses for it where a setting is left unset.
#
# Every choice here is one a user could make with a flag, and every flag given wins. The choices and why are
# recorded in the manifest (``chosen``) and printed, so a bundle says what it was made for.
#
# - **cpu**: a CPU decodes at the speed it reads weights. int4 (HQQ) weights where they pass the quality gate,
#   else int8, else float (the gate decides, on this model); on gqa graphs (one in-place KV buffer per layer:
#   nothing re-bound per step). int4's matmuls read half int8's bytes (at 45 % of the probed bandwidth against
#   int8's 59 % on SmolLM2-135M, docs/performance/verify-cost-cpu.md). A GGUF keeps its Q4/Q8 blocks for plain
#   decoding and is re-quantized to int4 when a drafter is given (requantize_gguf). fp32
#   activations: ONNX Runtime's CPU kernels have no fast fp16 path.
# - **cuda** and **jetson**: ONNX Runtime CUDA: fp16 gqa-static graphs, whose verify steps replay as CUDA graphs
#   (docs/gpu.md; causal only, so ``auto`` runs chains); no weight quantization.
# - **tensorrt**: fp16 portable graphs, what ``specrt build`` takes (fused and quantized graphs cannot be built).

PLATFORMS = ("auto", "cpu", "cuda", "tensorrt", "jetson")
_NVIDIA = {"cuda": ("fp16", "gqa-static", "ONNX Runtime CUDA replays gqa-static verify steps as CUDA graphs"),
           "jetson": ("fp16", "gqa-static", "ONNX Runtime CUDA (NVIDIA's JetPack wheel) replays gqa-static verify "
                      "steps as CUDA graphs"),
           "tensorrt": ("fp16", "portable", "specrt build makes TensorRT engines from portable graphs only")}


@dataclass(frozen=True)
class ExportChoice:
    """What ``specrt export`` makes for ``platform``. ``bits``: the target's weights (None: float, or a GGUF's own
    blocks kept); ``fallback``: the bits tried next, in order, when the quality gate refuses (None: float)."""

    platform: str
    dtype: str  # "fp32" | "fp16"
    graph: str  # an ExportOptions.graph
    auto_graph: str  # what graph "auto" gives a fused architecture
    bits: int | None
    fallback: tuple[int | None, ...]
    why: tuple[str, ...]  # one line per setting chosen, for the screen and the manifest

    def record(self, bits: int | None) -> dict:
        """The manifest's ``chosen``: the platform, what the target ended as, and why."""
        return {"for": self.platform, "dtype": self.dtype, "quantize": f"int{bits}" if bits else "float",
                "why": list(self.why)}


def this_machine() -> tuple[str, str]:
    """(platform, why) for the machine export runs on: cuda where torch sees a CUDA GPU, else cpu."""
    try:
        import torch

        if torch.cuda.is_available():
            return "cuda", f"this machine: {torch.cuda.get_device_name(0)}"
    except ImportError:
        pass
    return "cpu", "this machine: no CUDA GPU that torch can see"


def choose(platform: str, *, dtype: str | None, graph: str, bits: int | None, decided: bool, gguf: bool,
           requantize_gguf: bool) -> ExportChoice:
    """The settings for ``platform`` ("auto": :func:`this_machine`) where the user left them unset (``dtype``
    None, ``graph`` "auto"; ``decided``: the user set the quantization, ``bits`` None meaning float or a proposer's
    alone). ``gguf``: the target is a GGUF file; ``requantize_gguf``: its blocks give way to int4
    (export.pipeline.requantize_gguf, from --gguf-blocks and the drafter)."""
    if platform not in PLATFORMS:
        raise ConfigError(f"--for must be one of {', '.join(PLATFORMS)}, got {platform!r}")
    why: list[str] = []
    if platform == "auto":
        platform, reason = this_machine()
        why.append(f"for {platform}: {reason}")
    if platform in _NVIDIA:
        want_dtype, want_graph, reason = _NVIDIA[platform]
        if dtype is None:
            why.append(f"fp16: {platform} runs fp16 kernels")
        if graph == "auto":
            why.append(f"{want_graph} graphs: {reason}")
        return ExportChoice(platform, dtype or want_dtype, graph if graph != "auto" else want_graph, "fused", bits,
                            (), tuple(why))
    if dtype is None:
        why.append("fp32: ONNX Runtime's CPU kernels have no fast fp16 path")
    fallback: tuple[int | None, ...] = ()
    if not decided and gguf and not requantize_gguf:
        why.append("the GGUF's Q4/Q8 blocks kept: the fastest plain decoding (--gguf-blocks)")
    elif not decided:
        bits, fallback = 4, ((8,) if gguf else (8, None))
        why.append("int4 weights (HQQ) where they pass the quality gate, else int8" + ("" if gguf else ", else float")
                   + (": a drafter verifies several rows a step, which Q4 blocks make dear on a CPU" if gguf else
                      ": a CPU decodes at the speed it reads weights, and int4 reads half int8's bytes"))
    auto_graph = "gqa" if bits else "fused"
    if graph == "auto" and bits:
        why.append("gqa graphs where the architecture has them: one in-place KV buffer per layer, nothing re-bound "
                   "per step")
    return ExportChoice(platform, dtype or "fp32", graph, auto_graph, bits, fallback, tuple(why))


def export_pipeline(model: str, draft: str | None, output: str | Path, options: ExportOptions,
                    quantize: QuantizeOptions | None = None, reporter: Reporter | None = None,
                    progress: Callable[[str], None] | None = None,
                    fallback: Sequence[int | None] = ()) -> Manifest:
    """Export ``model`` (+ ``draft``) to the bundle ``output``. With ``quantize``, the float bundle is
    written to a hidden folder beside ``output``, quantized into ``output`` and removed: only the
    quantized bundle appears, and a refused output is refused before minutes of export.

    ``model`` / ``draft`` may be llama.cpp GGUF files (or folders holding one): they are read through
    transformers into Hugging Face folders in that hidden folder, exported, and each role not given bits of
    its own keeps the file's Q4_0 / Q4_1 / Q8_0 blocks as they are (:mod:`specrt.export.quant.gguf`).

    ``fallback``: the target's bits to try, in order, when the quality gate refuses ``quantize``'s (None: the
    float bundle as exported), as ``specrt export`` chooses for a CPU (export.pipeline.choose)."""
    from .exporter import export_bundle
    from .quant.gguf import find_gguf, has_blocks
    from .progress import SilentReporter

    reporter = reporter or SilentReporter()
    ggufs = {role: find_gguf(src) for role, src in (("target", model), ("draft", draft))}
    ggufs = {role: path for role, path in ggufs.items() if path is not None}
    if quantize is None and not ggufs:
        return export_bundle(model, draft, output, options, reporter)
    from .quant.quantize import QuantizeOptions
    from .staging import check_output

    out = Path(output)
    check_output(out, options.force or (quantize is not None and quantize.force))
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.float-", dir=out.resolve().parent))
    try:
        sources = {"target": model, "draft": draft}
        for role, path in ggufs.items():
            sources[role] = _staged_gguf(path, work / f"{role}-hf", reporter)
        keep = tuple((role, str(path)) for role, path in ggufs.items() if _keeps_blocks(quantize, role) and has_blocks(path))
        names = {role: p.name for role, p in ggufs.items()}  # progress names the GGUFs, not their staged folders
        if quantize is None and not keep:  # float GGUFs (F32 / F16 / BF16), no --quantize: a float bundle
            manifest = export_bundle(sources["target"], sources["draft"], out, options, reporter, shown=names)
        else:
            quantize = (replace(quantize, gguf=keep) if quantize is not None else
                        QuantizeOptions(bits=None, draft_bits=None, eagle_bits=None, dflash_bits=None, force=options.force, gguf=keep))
            shown = {"bundle": "the float bundle, quantized next", **names}  # not the hidden work folder's path
            export_bundle(sources["target"], sources["draft"], work / "bundle", options, reporter, shown=shown)
            manifest = _quantize_or_fall_back(work / "bundle", out, quantize, fallback, progress)
        if ggufs:  # the bundle names the GGUF it came from, not the hidden folder it was read into
            models = {role: replace(e, source=str(ggufs[role].resolve())) if role in ggufs else e
                      for role, e in manifest.models.items()}
            manifest = replace(manifest, models=models)
            manifest.write(out)
        return manifest
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _quantize_or_fall_back(src: Path, out: Path, quantize: QuantizeOptions, fallback: Sequence[int | None],
                           progress: Callable[[str], None] | None) -> Manifest:
    """``src`` quantized into ``out`` at ``quantize``'s bits, or at the first of ``fallback`` the gate passes (None:
    ``src`` as it is, also where a block size does not divide a model's widths)."""
    from ..bundle.manifest import load_manifest
    from ..errors import QualityGateError
    from .quant.quantize import check_quantizable, quantize_bundle

    say = progress or (lambda message: None)
    tries = [quantize.bits, *fallback]
    for i, bits in enumerate(tries):
        if bits is not None and None in tries[i:]:
            try:
                check_quantizable(src, load_manifest(src), replace(quantize, bits=bits))
            except ConfigError as e:
                say(f"target: kept float: {e}")
                return _copy_bundle(src, out, quantize.force)
        if bits is None and i:  # (the first may be None: a GGUF's blocks kept, or a proposer's bits alone)
            say("target: kept float: no quantization passed the gate")
            return _copy_bundle(src, out, quantize.force)
        try:
            return quantize_bundle(src, out, replace(quantize, bits=bits), progress=progress)
        except QualityGateError as e:
            if i == len(fallback):
                raise
            say(f"{str(e).split(';')[0]}; trying {f'int{fallback[i]}' if fallback[i] else 'float'}")
    raise AssertionError("unreachable")


def _copy_bundle(src: Path, out: Path, force: bool) -> Manifest:
    from ..bundle.manifest import load_manifest
    from .staging import staged

    with staged(out, force) as tmp:
        for item in src.iterdir():
            (shutil.copytree if item.is_dir() else shutil.copy2)(item, tmp / item.name)
    return load_manifest(out)


def _keeps_blocks(quantize: QuantizeOptions | None, role: str) -> bool:
    """A GGUF role keeps its blocks unless given bits: --quantize for the target (and a draft that follows
    it), --draft-quantize for the draft (none: float, dequantized)."""
    if quantize is None:
        return True
    if role == "draft" and quantize.draft_bits != "same":
        return False
    return quantize.bits is None


def _staged_gguf(path: Path, folder: Path, reporter: Reporter) -> str:
    from .quant.gguf import stage

    with reporter.step(f"Reading {path.name} (GGUF: config, tokenizer, weights dequantized by transformers)"):
        return str(stage(path, folder))


def next_steps(manifest: Manifest, folder: str | Path) -> str:
    """What ``specrt export`` says last: what ``--method auto`` will run on the bundle and why, and what to run
    next; a bundle without a drafter is told plainly that prompt lookup rarely speeds up a sampled reply."""
    from ..runtime.drafters import auto_method

    method = auto_method(manifest)
    bench = f"next: specrt bench --bundle {folder} --methods none,{method}"
    if method == "ngram":
        return ("auto will run ngram (prompt lookup): the bundle has no drafter. It pays where a reply repeats its "
                "prompt; sampled, it would be slower than plain decoding, and auto then runs plain steps. For a "
                "speedup on this model, add one:\n"
                "  an EAGLE-3 head published for it: specrt export MODEL --eagle HUB_ID (EAGLE-3 or speculators "
                "format; docs/eagle.md)\n"
                "  or your own: specrt eagle train MODEL -o HEAD --time-limit MINUTES (the run fits in that time "
                "and says the acceptance to expect before its steps), then specrt export MODEL --eagle HEAD\n"
                "  or a smaller model with the same tokenizer: specrt export MODEL --draft DRAFT\n" + bench)
    what = {"eagle-tree": "the EAGLE-3 head's tree", "eagle": "the EAGLE-3 head's chain: gqa-static graphs verify no "
            "trees", "dflash": "the DFlash draft's block, one pass per step"}.get(method, "the draft model's chain")
    return f"auto will run {method} ({what}).\n{bench}"


# SmolLM2-135M-Instruct's Q4_1 GGUF with its EAGLE-3 head on a 2-core AVX2 EPYC (2026-12-06, separate processes,
# 14 held-out chat prompts x 64 tokens, greedy, medians of 3 rounds: docs/performance/smollm2-gguf-cpu.md): the Q4_1
# blocks kept, auto (eagle-tree) 0.98x llama.cpp's best mode on the same file; re-quantized to int4 HQQ with gqa
# graphs, 1.38x by the medians, 1.11x by each round's ratio (plain decoding 1.22x). Q4 blocks cost 1.1-2.1x one
# row to verify 2-8 rows on a CPU.
GGUF_BLOCKS = ("auto", "keep", "requantize")


def requantize_gguf(choice: str, has_drafter: bool) -> bool:
    """Whether a GGUF target given without --quantize is re-quantized (int4, gqa graphs) rather than its blocks
    kept: ``choice`` "keep" / "requantize", or "auto": re-quantized where a drafter will verify many rows a step."""
    if choice not in GGUF_BLOCKS:
        raise SpecrtError(f"--gguf-blocks must be one of {', '.join(GGUF_BLOCKS)}, got {choice!r}")
    return choice == "requantize" or (choice == "auto" and has_drafter)


def gguf_verify_note(manifest: Manifest, folder: str | Path, model: str) -> str | None:
    """For a GGUF whose blocks the target kept, exported with a drafter: what verifying several rows of those
    blocks costs here against one (measured now, a second or two), and the re-quantized target to compare
    it with. None for any other bundle. On a CPU a tree step verifies ~4-8 rows, and Q4 blocks cost 1.1-2.1x
    one row for 2-8 (docs/performance/smollm2-gguf-cpu.md), which can eat what the drafter saves."""
    q = manifest.target.quantization or {}
    if not q.get("gguf") or (manifest.eagle is None and manifest.draft is None and manifest.dflash is None):
        return None
    from ..runtime.generator import SpeculativeGenerator

    costs = SpeculativeGenerator(folder).verify_costs(5)
    drafter = (f"--eagle {manifest.eagle.source}" if manifest.eagle is not None
               else f"--dflash {manifest.dflash.source}" if manifest.dflash is not None else "--draft DRAFT")
    return (f"verifying 4 rows of {'+'.join(sorted(q['gguf']['types']))} blocks costs {costs[3]:.2f}x one row here "
            f"(5 rows: {costs[4]:.2f}x); where `specrt bench` shows the drafter barely above none, compare a target "
            f"re-quantized for many-row passes (what --gguf-blocks auto does with a drafter): specrt export {model} "
            f"{drafter} --gguf-blocks requantize -o OUT")


def describe(manifest: Manifest) -> str:
    """What ``specrt export`` prints of a bundle: per model its graph and parity against PyTorch (for a
    quantized bundle, its bits and parity against the float one) and the Medusa tree."""
    if any(e.quantization for e in manifest.models.values()):
        from .quant.quantize import describe as describe_quantized

        return describe_quantized(manifest)
    from ..bundle.parity import describe as describe_parity

    lines = []
    for role, e in manifest.models.items():
        if e.kind == "eagle3":
            what = (f"EAGLE-3 head ({e.graph} graph{''.join(', ' + v for v in e.variants)}) reading target layers "
                    f"{', '.join(map(str, e.eagle_taps))}, {e.dims.vocab_size} draft ids")
        elif e.kind == "dflash":
            layers = f"{e.dims.num_layers} layer{'s' * (e.dims.num_layers != 1)}"
            what = (f"DFlash draft, {layers}, blocks of {e.block_size}, reading target layers "
                    f"{', '.join(map(str, e.eagle_taps))}, {e.dims.vocab_size} draft ids")
        else:
            what = f"{e.architecture} ({e.graph} graph), {e.dims.num_layers} layers"
            if e.eagle_taps:
                what += f", eagle_taps from layers {', '.join(map(str, e.eagle_taps))}"
        lines.append(f"{role}: {what}, {describe_parity(e.parity, e.parity_tolerance)}")
    if manifest.medusa:
        md = manifest.medusa
        lines.append(f"medusa: {md.num_heads} heads, tree of {len(md.tree)} nodes, expected "
                     f"{md.expected_accepted:.2f} accepted tokens per pass (+1 from the target)")
    return "\n".join(lines)
