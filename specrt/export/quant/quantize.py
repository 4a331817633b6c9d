"""Weight-only int4 / int8 bundles with ONNX Runtime's own quantizer (``MatMulNBits``), checked by
distribution against the bundle they came from. Torch-free: it rewrites ONNX graphs.

Every MatMul with a constant weight is quantized, the LM head included: with tied embeddings the head
reads the embedding matrix through a Transpose, which the quantizer cannot see as a constant, so the
head gets its own (transposed) copy first and the embedding lookup keeps the float matrix.
Speculation over a quantized target is exact with respect to that quantized target. Each role has its
own bits: the target may stay float while the draft or the EAGLE-3 head is quantized (a proposer's bits
change how often it is right, never what the target emits). A quantized head has no distribution gate:
what it keeps is measured as its first-draft acceptance on the float pair and on the quantized pair.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable


from ...bundle import contract as C
from ...bundle.files import graph_cost
from ...bundle.manifest import Manifest, load_manifest
from ...errors import INSTALL_TORCH, ConfigError, QualityGateError, SpecrtError
from .lookups import head_matmuls, quantize_lookups, tied_heads, untie_lm_head
from .quality import distribution_parity, head_acceptance
from ..graph.edit import gemms_to_matmuls
from ..staging import load_graph, save_graph, staged

BITS = (4, 8)
BLOCK_SIZES = (16, 32, 64, 128)
# Distributional parity of a quantized graph against its float source, on the shipped prompts
# (measured on the demo pair: int4 KL 0.005-0.012 nats, int8 0.0001; thresholds leave ~10x room).
# Top-1 agreement counts only positions where the float model is decisive (bundle.parity.decisive).
MAX_MEAN_KL = {4: 0.1, 8: 0.01}
ALGORITHMS = ("auto", "rtn", "hqq")
KERNELS = ("nbits", "integer", "auto")
MIN_TOP1 = {4: 0.85, 8: 0.95}
# Graph kinds that only propose (the target verifies what they draft): no distribution gate, and their input
# tables (copies of the target's) are always int8.
PROPOSER_KINDS = ("eagle3", "dflash")


@dataclass(frozen=True)
class QuantizeOptions:
    """Bits per role: ``bits`` for the target (None: it stays float), ``draft_bits``, ``eagle_bits`` and
    ``dflash_bits`` each "same" (as the target), None (float) or 4 / 8."""

    bits: int | None = 4
    block_size: int = 32
    draft_bits: int | None | str = "same"
    accuracy_level: int = 4  # MatMulNBits: int8 activations, so the CPU kernel uses int8 dot products
    force: bool = False
    eagle_bits: int | None | str = "same"
    # The target's and draft's embedding lookups at int8 too (GatherBlockQuantized; gated like the rest); None:
    # int8 where the gate passes, else float (a float table is most of a small model's int8 bytes: SmolLM2-135M's
    # int8 bundle 269 MB with it, ~150 MB without). A quantized EAGLE-3 head's lookup (a copy of the target's
    # table) always is: it only proposes.
    embeddings: bool | None = None
    # Roles whose float graph came from a GGUF file: (role, path) pairs. Those keep the file's Q4_0 / Q4_1 /
    # Q8_0 blocks as they are (specrt.export.quant.gguf) instead of being quantized at ``bits``.
    gguf: tuple[tuple[str, str], ...] = ()
    # int4 weights: "rtn" (symmetric round-to-nearest) or "hqq" (ORT's half-quadratic quantizer: asymmetric,
    # scales and zero points fitted per block; needs torch), or "auto": hqq where torch is installed (SmolLM2-135M
    # passes the gate with it, KL 0.096, and not with rtn, 0.56), else rtn. int8 weights are always RTN.
    algorithm: str = "auto"
    # The LM head's blocks (and the int8 lookups', which share a tied head's bytes) when not ``block_size``:
    # a small head block with larger ones elsewhere keeps the logits close for fewer scale bytes.
    head_block_size: int | None = None
    # int8 matmuls on "nbits" (MatMulNBits, blocks of ``block_size``) or "integer" (specrt.export.quant.integer_matmul:
    # cheap extra rows, row-independent numerics), or "auto": the target's int8 graph made both ways and timed
    # here (specrt.export.quant.kernel_choice), the other roles following it. Lookups and int4 weights stay as they are.
    kernel: str = "nbits"
    # A DFlash draft's bits, as eagle_bits, or "auto": int8 where `bits` quantizes the target, else float (a float
    # target, or a GGUF's blocks kept). A proposer, so no distribution gate (the target verifies its blocks). A pass
    # runs a block's 8-16 rows, which on a CPU cost arithmetic more than bytes: SmolLM2-135M's draft pass took
    # 0.89x the float32 time at int8 and 1.07x at int4
    # (2-core AVX2 EPYC, benchmarks/dflash/smollm2-draft-pass-int{8,4}-cpu.json).
    dflash_bits: int | None | str = "auto"

    def __post_init__(self) -> None:
        if self.kernel not in KERNELS:
            raise ConfigError(f"--kernel must be one of {', '.join(KERNELS)}, got {self.kernel!r}")
        if self.kernel == "integer" and 4 in (self.bits, self.draft_bits, self.eagle_bits, self.dflash_bits):
            raise ConfigError("--kernel integer is for int8 weights only: give int4 roles --kernel nbits")
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(f"--algorithm must be one of {', '.join(ALGORITHMS)}, got {self.algorithm!r}")
        if self.bits not in (None, *BITS):
            raise ConfigError(f"--quantize must be int4 or int8, got {self.bits} bits")
        for size in (self.block_size, self.head_block_size or self.block_size):
            if size not in BLOCK_SIZES:
                raise ConfigError(f"block size must be one of {', '.join(map(str, BLOCK_SIZES))}, got {size}")
        for name, value in (("draft", self.draft_bits), ("eagle", self.eagle_bits), ("dflash", self.dflash_bits)):
            words = ("auto", "same") if name == "dflash" else ("same",)  # auto: the DFlash draft's default only
            if value not in (*words, None, *BITS):
                raise ConfigError(f"{name} quantization must be {', '.join(words)}, none, int4 or int8, got {value!r}")
        proposers = (self.draft_bits, self.eagle_bits, self.dflash_bits)
        if self.bits is None and not any(b in BITS for b in proposers) and not self.gguf:
            raise ConfigError("nothing to quantize: the target stays float and so do the proposers "
                              "(give --draft-quantize, --eagle-quantize or --dflash-quantize int4/int8)")

    def bits_for(self, role: str) -> int | None:
        if self.gguf_for(role) is not None:
            return None
        own = {"draft": self.draft_bits, "eagle": self.eagle_bits, "dflash": self.dflash_bits}.get(role, "same")
        if own == "auto":
            return 8 if self.bits else None
        return self.bits if own == "same" else own  # type: ignore[return-value]

    def gguf_for(self, role: str) -> Path | None:
        return next((Path(path) for r, path in self.gguf if r == role), None)


def quantize_graph(path: Path, out: Path, bits: int, block_size: int, accuracy_level: int,
                   lookups: bool = False, algorithm: str = "rtn", head_block_size: int | None = None,
                   kernel: str = "nbits") -> dict:
    """Quantize every constant-weight MatMul of ``path`` into ``out`` (``lookups``: the embedding lookups too,
    at int8; ``algorithm``: "rtn" or, for int4, "hqq"; ``head_block_size``: the LM head's and the lookups'
    blocks, when not ``block_size``; ``kernel``: "integer", int8 on MatMulIntegerToFloat); what was done, as a record."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        HQQWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    hqq = algorithm == "hqq" and bits == 4
    if hqq:
        try:
            import torch  # noqa: F401  (ORT's HQQ fits blocks with torch)
        except ImportError:
            raise SpecrtError("--algorithm hqq needs torch (ONNX Runtime's HQQ quantizer runs on it): "
                              f"{INSTALL_TORCH}") from None

    model = load_graph(path)
    if any(n.op_type in ("MatMulNBits", "MatMulIntegerToFloat") for n in model.graph.node):
        raise ConfigError(f"{path.name} is already quantized")
    gemms_to_matmuls(model)  # torch's linear on 2-D rows (a DFlash draft's graph) exports Gemm; quantizers read MatMul
    untied = untie_lm_head(model)
    before = {n.name for n in model.graph.node if n.op_type == "MatMul"}
    if kernel == "integer":  # its lookups share no bytes with the head: no need to find the tied tables
        from .integer_matmul import integer_graph

        return integer_graph(model, path, out, lookups, head_block_size or block_size, untied is not None, before)
    tied = tied_heads(model) if lookups else {}
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    heads = head_matmuls(model) if head_block_size not in (None, block_size) else []
    others = [n.name for n in model.graph.node if n.op_type == "MatMul" and n.name not in heads]
    # The LM head at its own block size first (it and the lookup sharing its bytes decide the logits most
    # directly), then every other MatMul (the quantizer's nodes_to_include adds to its op types, it does not
    # restrict them: exclusion does).
    for size, exclude in ([(head_block_size, others)] if heads else []) + [(block_size, heads)]:
        quantizer = MatMulNBitsQuantizer(model, bits=bits, block_size=size, is_symmetric=not hqq,
                                         accuracy_level=accuracy_level, nodes_to_exclude=exclude or None,
                                         algo_config=HQQWeightOnlyQuantConfig(block_size=size, bits=4) if hqq else None)
        quantizer.process()
        model = quantizer.model.model
    qmodel = model
    if hqq:
        # ORT's HQQ path writes float zero points (a CPU kernel 20-40x slower than the integer one) and no
        # accuracy level (fp32 arithmetic): the integer kernel plus a per-block float term, at the level asked.
        from .block_term import split_float_zero_points

        split_float_zero_points(qmodel, block_size)
        for node in qmodel.graph.node:
            if node.op_type == "MatMulNBits" and not any(a.name == "accuracy_level" for a in node.attribute):
                node.attribute.append(onnx.helper.make_attribute("accuracy_level", accuracy_level))
    head_size = head_block_size if heads else block_size
    tables = quantize_lookups(qmodel, head_size, tied) if lookups else []
    after = {n.name for n in qmodel.graph.node if n.op_type == "MatMul"}
    save_graph(qmodel, out)
    return {"bits": bits, "block_size": block_size, **({"head_block_size": head_size} if heads else {}),
            "accuracy_level": accuracy_level, "symmetric": not hqq,
            "algorithm": "hqq" if hqq else "rtn", "format": "MatMulNBits", "quantized_matmuls": sorted(before - after), "lm_head_untied": untied is not None,
            **({"quantized_lookups": tables, "lookup_bits": 8, "lookup_shares_lm_head": sorted(set(tables) & set(tied))}
               if tables else {}),
            "bytes_before": C.graph_bytes(path), "bytes_after": C.graph_bytes(out)}


def quantize_bundle(src: str | Path, out: str | Path, options: QuantizeOptions = QuantizeOptions(),
                    prompts: list[str] | None = None, progress: Callable[[str], None] | None = None) -> Manifest:
    """Write a quantized copy of bundle ``src`` to ``out``; it appears only once every model passed its
    distributional parity check against ``src``."""
    from ...data import prompts as builtin_prompts

    try:
        import onnx  # noqa: F401  (the runtime-only install has onnxruntime but not onnx)
    except ImportError:
        raise SpecrtError("quantizing needs the onnx package: pip install onnx (torch is not needed)") from None
    src, out = Path(src), Path(out)
    manifest = load_manifest(src)
    check_quantizable(src, manifest, options)
    prompts = prompts if prompts is not None else builtin_prompts("all")
    say = progress or (lambda message: None)
    models = dict(manifest.models)
    with staged(out, options.force) as tmp:
        for item in src.iterdir():
            if item.name != "engines":  # engines belong to the float graphs
                (shutil.copytree if item.is_dir() else shutil.copy2)(item, tmp / item.name)
        kernel = "nbits" if options.kernel == "auto" else options.kernel  # auto: until the target's is timed
        for role, entry in sorted(manifest.models.items(), key=lambda item: item[0] != "target"):
            if options.bits_for(role) is None and options.gguf_for(role) is None:
                continue
            record, kernel = _quantize_gated(src, tmp, manifest, role, options, kernel, prompts, progress)
            models[role] = replace(entry, quantization=record)
        _record_head_acceptance(src, tmp, manifest, models, prompts, say)
        for role, entry in models.items():  # quantized graphs read fewer bytes; older float ones get figures too
            models[role] = replace(entry, **graph_cost(tmp / entry.file).manifest_fields())
        quantized = replace(manifest, models=models, engines={})
        quantized.write(tmp)
    return quantized


def _has_torch() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def candidates(options: QuantizeOptions, role: str, kind: str = "decoder") -> list[QuantizeOptions]:
    """The settings a role is tried at, best first, until one passes the gate: what ``auto`` and an unset
    ``embeddings`` resolve to (int8 lookups before float ones; hqq where torch is installed, else rtn)."""
    bits = options.bits_for(role)
    algorithm = ("hqq" if _has_torch() else "rtn") if options.algorithm == "auto" else options.algorithm
    if bits != 4:
        algorithm = "rtn"  # int8 weights are always round-to-nearest
    lookups = ([True, False] if options.embeddings is None and kind not in PROPOSER_KINDS and options.gguf_for(role) is None
               else [bool(options.embeddings)])
    return [replace(options, algorithm=algorithm, embeddings=e) for e in lookups]


def _quantize_gated(src: Path, tmp: Path, manifest: Manifest, role: str, options: QuantizeOptions, kernel: str,
                    prompts: list[str], progress: Callable[[str], None] | None) -> tuple[dict, str]:
    """One role quantized at the first of its :func:`candidates` that passes the gate (a proposer has none: the
    target verifies what it drafts): its record, which says what was tried, and the kernel now chosen."""
    say = progress or (lambda message: None)
    entry, refused = manifest.models[role], []
    tries = candidates(options, role, entry.kind)
    for i, cand in enumerate(tries):
        record, chosen, bits = _quantize_model(src, tmp, manifest, role, cand, kernel, progress)
        if entry.kind in PROPOSER_KINDS:
            return record, chosen
        say(f"{role}: checking int{bits}{' with int8 lookups' if cand.embeddings else ''} against the float graph")
        try:
            record["parity"] = _gate(src, tmp, manifest, role, cand, bits, prompts)
        except QualityGateError as e:
            if i + 1 == len(tries):
                raise QualityGateError(str(e) + "".join(f" (also refused: {r})" for r in refused), e.mean_kl) from None
            refused.append(f"int8 lookups, mean KL {e.mean_kl:.3f}")
            say(f"{role}: refused with int8 lookups; trying float lookups")
            continue
        if refused:
            record["refused"] = refused
        return record, chosen
    raise AssertionError("candidates() is never empty")


def check_quantizable(src: Path, manifest: Manifest, options: QuantizeOptions) -> None:
    for role, entry in manifest.models.items():
        if entry.quantization:
            raise ConfigError(f"{src} is already quantized ({role}: int{entry.quantization['bits']}); "
                              "quantize the float bundle it came from")
        for size in {options.block_size, options.head_block_size or options.block_size}:
            if options.bits_for(role) is not None and entry.dims.hidden_size % size:
                raise ConfigError(f"block size {size} does not divide the {role}'s hidden size "
                                  f"{entry.dims.hidden_size}")


def _quantize_model(src: Path, tmp: Path, manifest: Manifest, role: str, options: QuantizeOptions, kernel: str,
                    progress: Callable[[str], None] | None) -> tuple[dict, str, int]:
    """One model's graph quantized into ``tmp`` (a GGUF's blocks kept, or int4/int8 on ``kernel``; an int8 target
    under ``--kernel auto`` on whichever kernel times faster): its quantization record, the kernel now chosen and
    its bits (a GGUF's own)."""
    entry = manifest.models[role]
    bits, gguf = options.bits_for(role), options.gguf_for(role)
    timed = options.kernel == "auto" and role == "target" and bits == 8 and gguf is None
    if progress and not timed:
        progress(f"{role}: keeping the blocks of {gguf.name}" if gguf else
                 f"{role}: int8 on the integer kernel" if kernel == "integer" and bits == 8 else
                 f"{role}: int{bits}, blocks of {options.block_size}"
                 + (f" (LM head and lookups: {options.head_block_size})"
                    if options.head_block_size not in (None, options.block_size) else ""))
    (tmp / (entry.file + ".data")).unlink(missing_ok=True)  # rewritten (or no longer needed) by the quantized graph
    if gguf is not None:
        from .gguf import keep_blocks

        record = keep_blocks(src / entry.file, tmp / entry.file, gguf, options.accuracy_level)
        return record, kernel, record["bits"]

    def write(out: Path, how: str) -> dict:
        return quantize_graph(src / entry.file, out, bits, options.block_size, options.accuracy_level,
                              lookups=options.embeddings or entry.kind in PROPOSER_KINDS, algorithm=options.algorithm,
                              head_block_size=options.head_block_size, kernel=how if bits == 8 else "nbits")

    if not timed:
        return write(tmp / entry.file, kernel), kernel, bits
    from .kernel_choice import decisive_rows, quantize_by_timing

    record = quantize_by_timing(entry, tmp, decisive_rows(manifest), write, progress)
    return record, record["kernel"], bits


def _gate(src: Path, tmp: Path, manifest: Manifest, role: str, options: QuantizeOptions, bits: int,
          prompts: list[str]) -> dict:
    """The quantized model's distribution against the float one's on ``prompts``: its parity record, or a one-line
    refusal naming what to try when it drifts past the gate for ``bits``."""
    parity = distribution_parity(src, tmp, manifest, role, prompts)
    record = {**parity, "max_mean_kl": MAX_MEAN_KL[bits], "min_top1_agreement": MIN_TOP1[bits]}
    if parity["mean_kl"] <= MAX_MEAN_KL[bits] and parity["top1_agreement"] >= MIN_TOP1[bits]:
        return record
    gguf = options.gguf_for(role)
    if gguf is not None:
        raise ConfigError(f"{role}: the blocks of {gguf.name} drift from its dequantized weights (mean KL "
                          f"{parity['mean_kl']:.3f}, top-1 agreement {parity['top1_agreement']:.3f}): a "
                          "conversion fault; export with --quantize int8 meanwhile")
    hqq = "--algorithm hqq, " if _has_torch() else f"--algorithm hqq ({INSTALL_TORCH}), "
    raise QualityGateError(f"{role} at int{bits} drifts too far from the float model: mean KL "
                          f"{parity['mean_kl']:.3f} (max {MAX_MEAN_KL[bits]}), top-1 agreement "
                          f"{parity['top1_agreement']:.3f} (min {MIN_TOP1[bits]}); try "
                          + (hqq if bits == 4 and options.algorithm == "rtn" else "")
                          + ("int8 or " if bits == 4 else "") + "a smaller block size"
                          + (" or --float-embeddings" if options.embeddings else ""), parity["mean_kl"])


def _record_head_acceptance(src: Path, tmp: Path, manifest: Manifest, models: dict, prompts: list[str],
                            say: Callable[[str], None]) -> None:
    """An EAGLE-3 head's acceptance on the float pair and the quantized one, recorded with the head when it was
    quantized, else with the target. Only a quantized target or head changes what the head drafts."""
    head_role = next((r for r, e in manifest.models.items() if e.kind == "eagle3"), None)
    if head_role is None or not (models["target"].quantization or models[head_role].quantization):
        return
    say("eagle: the head's acceptance on the float pair and on this one")
    holder = head_role if models[head_role].quantization else "target"
    before, after = head_acceptance([src, tmp], manifest, prompts)
    record = {**models[holder].quantization, "eagle_acceptance": {
        "float": before, "quantized": after,
        "measure": "greedy first-draft acceptance, teacher-forced on the parity prompts"}}
    models[holder] = replace(models[holder], quantization=record)


def describe(manifest: Manifest) -> str:
    """One line per model: bits, bytes before → after, parity (a head: its acceptance before and after)."""
    lines = []
    for role, e in manifest.models.items():
        q = e.quantization
        if not q:
            lines.append(f"{role}: {e.dtype} (not quantized)")
            continue
        kind = (f"{'+'.join(sorted(q['gguf']['types']))} blocks of {q['gguf']['file']} kept" if q.get("gguf")
                else f"int{q['bits']}")
        if q.get("algorithm") == "hqq":
            kind += " HQQ"
        if q.get("refused"):
            kind += f" (float lookups: refused with {'; '.join(q['refused'])})"
        layout = "integer kernel, weights per column" if q.get("kernel") == "integer" else f"blocks of {q['block_size']}"
        line = (f"{role}: {kind} ({layout}, {len(q['quantized_matmuls'])} matmuls"
                f"{' incl. the LM head' if q['lm_head_untied'] else ''}"
                f"{', int8 lookup' if q.get('quantized_lookups') else ''}), {q['bytes_before'] / 2**20:.1f} → "
                f"{q['bytes_after'] / 2**20:.1f} MiB")
        if "parity" in q:
            p = q["parity"]
            line += (f"; vs float: mean KL {p['mean_kl']:.4f}, top-1 {p['top1_agreement']:.3f} over "
                     f"{p['decisive_positions']} decisive positions")
        if "kernel_choice" in q:
            from .kernel_choice import describe_choice

            line += f"; {describe_choice(q['kernel_choice'])}"
        if "eagle_acceptance" in q:
            a = q["eagle_acceptance"]
            line += (f"; EAGLE-3 head's first-draft acceptance {a['float']:.3f} on the float pair, "
                     f"{a['quantized']:.3f} on this one")
        lines.append(line)
    return "\n".join(lines)
