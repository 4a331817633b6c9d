"""The bundle manifest (``specrt.json``): everything the runtime needs to know, nothing inferred from names.

Written by ``specrt export``; read by the runtime with no torch or transformers installed.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BundleError
from . import safety
from .contract import (CAUSAL_ONLY_GRAPHS, DTYPES, FORMAT_VERSION, KINDS, MAX_BLOCK, ModelDims, TensorSpec,
                       decoder_io)
from .external_data import check_external_data
from .graph_io import check_graph_dims, check_heads_dims
from .validate import GRAPHS, MAX_MEDUSA_HEADS, ROLE_KINDS, ROLES, Fields, check_ids, check_medusa_tree, finite


def id_set(value) -> set[int]:
    """A Hugging Face eos_token_id field (config, generation config, tokenizer): an int, a list of ints,
    or None."""
    return set(value if isinstance(value, (list, tuple)) else [value] if value is not None else [])

MANIFEST_NAME = "specrt.json"


@dataclass(frozen=True)
class ModelEntry:
    """One exported decoder: its file, source, dims and the parity figures measured at export."""

    file: str
    source: str
    architecture: str
    dtype: str
    dims: ModelDims
    # Per parity case ("prefill", "decode", "chain", "tree", "far"): abs/rel/kl/top1 against PyTorch fp32
    # (see bundle.parity); the tolerance they passed: {"rel", "kl"}. Bundles from before the relative
    # criterion load with {"abs": max |diff|} per case and {"abs": tolerance}.
    parity: dict[str, dict[str, float]] = field(default_factory=dict)
    parity_tolerance: dict[str, float] = field(default_factory=dict)
    # PyTorch's logits on a fixed prompt (top ids per position), for `specrt verify` on any backend.
    golden: dict[str, Any] | None = None
    # Weight-only quantization (`specrt quantize`): bits, block size, quantized matmuls, bytes before and
    # after, distributional parity against the float graph. None: the graph's weights are as exported.
    quantization: dict[str, Any] | None = None
    # "fused": rotary/attention/RMS norm as single opset-23 nodes for ONNX Runtime; "gqa": fused, with ONNX
    # Runtime's GroupQueryAttention over one in-place cache buffer per layer (contract.GQA_GRAPH); "gqa-static":
    # gqa with static shapes, for CUDA graphs (contract.GQA_STATIC_GRAPH); "portable": plain ops.
    graph: str = "portable"
    # What one pass reads and computes (bundle.files.graph_cost), recorded where onnx is installed (export,
    # quantize) so the runtime needs no graph parser. None: a bundle from before they were recorded.
    weight_bytes: int | None = None
    matmul_flops_per_token: int | None = None
    # "decoder", or "eagle3" for an EAGLE-3 head (contract.py: its extra inputs, draft-vocabulary logits).
    kind: str = "decoder"
    # A target: the layers whose entering hidden states its graph outputs as eagle_taps (empty: none).
    # An EAGLE-3 head: the target layers it was trained on, which the target must output in this order.
    eagle_taps: tuple[int, ...] = ()
    tap_width: int = 0  # eagle_taps' width: len(eagle_taps) x the target's hidden size
    # An EAGLE-3 head: the .npy file (int64 [D_v], strictly ascending) of the target id of each draft id.
    vocab_map: str | None = None
    # The graph takes contract.LOGITS_INDEX: the rows whose logits a pass computes. False: every row's.
    logits_index: bool = False
    # An EAGLE-3 head: how it departs from the standard head (Eagle3Config.variants: speculators' and vLLM's tap
    # norms, fed-back norm, window, q/k norms, stacked layers), for people reading the bundle; the graph has them.
    variants: tuple[str, ...] = ()
    # A DFlash draft (kind "dflash"): its block's slots and the target's embedding row that fills the masked ones
    block_size: int = 0
    mask_token_id: int = -1

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise BundleError(f"model dtype {self.dtype!r} is not one of {DTYPES}")
        if self.kind not in KINDS:
            raise BundleError(f"model kind {self.kind!r} is not one of {KINDS}")
        if self.kind == "eagle3" and (not self.eagle_taps or not self.tap_width or not self.vocab_map):
            raise BundleError("an EAGLE-3 head's entry needs its eagle_taps, tap_width and vocab_map")
        if self.kind == "dflash" and (not self.eagle_taps or not self.tap_width or not self.vocab_map
                                      or not 2 <= self.block_size <= MAX_BLOCK or self.mask_token_id < 0):
            raise BundleError(f"a DFlash draft's entry needs its eagle_taps, tap_width, vocab_map, a block_size of "
                              f"2 to {MAX_BLOCK} and a mask_token_id")
        for name in ("weight_bytes", "matmul_flops_per_token"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise BundleError(f"model {name} must be a non-negative integer, got {value!r}")

    @property
    def takes_mask(self) -> bool:
        """Whether the graph takes an attention mask, and so can verify token trees; a causal-only graph
        (contract.CAUSAL_ONLY_GRAPHS: gqa-static) runs prefills, plain steps and chains only."""
        return self.graph not in CAUSAL_ONLY_GRAPHS

    def io(self) -> tuple[list[TensorSpec], list[TensorSpec]]:
        return decoder_io(self.dims, self.dtype, self.kind, self.tap_width, self.graph, self.logits_index)

    def to_json(self) -> dict[str, Any]:
        ins, outs = self.io()
        d = asdict(self)
        d["inputs"] = [s.to_json() for s in ins]
        d["outputs"] = [s.to_json() for s in outs]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any], where: str = "model") -> "ModelEntry":
        """``where``: the entry's path in the manifest (``models.target``), which a refusal names."""
        f = Fields(d, where)
        parity = f.nested("parity", {})
        return cls(file=f.string("file"), source=f.string("source"), architecture=f.string("architecture"),
                   dtype=f.string("dtype", choices=DTYPES), dims=_dims(f.nested("dims")),
                   parity={case: parity.figures(case) for case in parity.raw},
                   parity_tolerance=f.figures("parity_tolerance"), golden=f.optional_mapping("golden"),
                   quantization=_quantization(f), graph=f.string("graph", "portable", GRAPHS),
                   weight_bytes=f.optional_integer("weight_bytes"),
                   matmul_flops_per_token=f.optional_integer("matmul_flops_per_token"),
                   kind=f.string("kind", "decoder", KINDS),
                   eagle_taps=f.integers("eagle_taps", 0, safety.MAX_DIM["num_layers"], ()),
                   tap_width=f.integer("tap_width", 0, safety.MAX_DIM["num_layers"] * safety.MAX_DIM["hidden_size"], 0),
                   vocab_map=f.optional_string("vocab_map"), logits_index=f.boolean("logits_index", False),
                   variants=f.strings("variants", ()), block_size=f.integer("block_size", 0, MAX_BLOCK, 0),
                   mask_token_id=f.integer("mask_token_id", -1, safety.MAX_DIM["vocab_size"], -1))


def _dims(f: Fields) -> ModelDims:
    """The six sizes, each a positive integer within :data:`safety.MAX_DIM` before any cache is sized from it."""
    values = {name: f.integer(name, 1, limit) for name, limit in safety.MAX_DIM.items()}
    try:
        return ModelDims(**values)
    except ValueError as e:  # heads not a multiple of the KV heads
        raise BundleError(f"the manifest's {f.where}: {e}") from None


def _quantization(f: Fields) -> dict[str, Any] | None:
    """The quantization record: free-form, but what the runtime reads of it typed (bits for the cost estimate, the
    CPU its kernel was timed on for `specrt bench`'s note)."""
    record = f.optional_mapping("quantization")
    if record is not None:
        q = f.nested("quantization")
        q.optional_integer("bits", 1, 16)
        choice = q.nested("kernel_choice", {})
        if choice.raw.get("cpu") is not None:  # a choice made by timing: bench compares its CPU with this one
            choice.string("cpu")
            choice.string("chosen")
    return record


@dataclass(frozen=True)
class MedusaEntry:
    """Medusa heads: hidden [B, Q, H] → per-head top-k ids and log-probs, and the static tree to use."""

    file: str
    source: str
    num_heads: int
    topk: int
    tree: list[list[int]]  # paths of candidate ranks, level order (see runtime/medusa.py)
    expected_accepted: float  # predicted accepted tokens per pass from the calibration accuracies
    accuracies: list[list[float]]  # [head][rank]: P(candidate == target's argmax) on calibration text
    parity: float = 0.0

    def __post_init__(self) -> None:
        check_medusa_tree(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "MedusaEntry":
        f = Fields(d, "medusa")
        num_heads = f.integer("num_heads", 1, MAX_MEDUSA_HEADS)
        topk = f.integer("topk", 1, safety.MAX_DIM["vocab_size"])
        accuracies = f.raw.get("accuracies")
        if not (isinstance(accuracies, list)
                and all(isinstance(row, list) and all(finite(a) and 0 <= a <= 1 for a in row) for row in accuracies)):
            f.refuse("accuracies", "a list per head of numbers in [0, 1]", accuracies)
        return cls(file=f.string("file"), source=f.string("source"), num_heads=num_heads, topk=topk,
                   tree=f.raw.get("tree"), expected_accepted=f.number("expected_accepted", 0),
                   accuracies=accuracies, parity=f.number("parity", 0, 0.0))


@dataclass(frozen=True)
class TokenizerEntry:
    """The target's tokenizer: its file, the ids that start and end a text, and (instruct models) its chat
    template. Bundles written before chat support have neither ``chat_template`` nor ``special_tokens``."""

    file: str
    bos_token_id: int | None
    # Every id that ends a generation: the model config's, the generation config's (Llama 3: <|eot_id|>
    # and <|end_of_text|>) and the tokenizer's eos.
    eos_token_ids: tuple[int, ...]
    add_bos_token: bool
    vocab_size: int
    chat_template: str | None = None  # the template's file in the bundle (Jinja2 text), None: no template
    # Named special tokens as text (bos_token, eos_token, ...): variables a chat template reads.
    special_tokens: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "TokenizerEntry":
        f = Fields(d, "tokenizer")  # the ids' range is the target's vocabulary: validate.check_ids
        return cls(file=f.string("file"), bos_token_id=f.optional_integer("bos_token_id"),
                   eos_token_ids=f.integers("eos_token_ids"), add_bos_token=f.boolean("add_bos_token"),
                   vocab_size=f.integer("vocab_size", 1, safety.MAX_DIM["vocab_size"]),
                   chat_template=f.optional_string("chat_template"),
                   special_tokens=f.text_map("special_tokens") if d.get("special_tokens") is not None else {})


@dataclass(frozen=True)
class Manifest:
    """The whole ``specrt.json``. ``models`` maps a role ("target", "draft", "eagle") to its entry."""

    max_context: int
    tokenizer: TokenizerEntry
    models: dict[str, ModelEntry]
    vocab_check: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    medusa: MedusaEntry | None = None
    engines: dict[str, Any] = field(default_factory=dict)  # role -> TensorRT engine file, cache key, options
    # What `specrt export` chose where the user left a setting unset (export.pipeline.choose): the platform the bundle
    # was made for ("for"), its dtype, the target's quantization, and a line of why per choice
    chosen: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        if "target" not in self.models:
            raise BundleError("manifest has no 'target' model")
        unknown = sorted(set(self.models) - set(ROLES))
        if unknown:  # the generator makes a session for every model it is given
            raise BundleError(f"the manifest's models hold {unknown[0]!r}; a bundle's roles are {', '.join(ROLES)}")
        if self.max_context < 1:
            raise BundleError(f"max_context must be positive, got {self.max_context}")
        for role, entry in self.models.items():
            kind = ROLE_KINDS.get(role, "decoder")
            if entry.kind != kind:
                raise BundleError(f"the {role} must be of kind {kind!r}, got {entry.kind!r}")
        taps = self.target.eagle_taps
        if self.target.tap_width != len(taps) * self.target.dims.hidden_size:
            raise BundleError(f"the target's tap_width is {self.target.tap_width}; {len(taps)} eagle_taps of hidden "
                              f"size {self.target.dims.hidden_size} are {len(taps) * self.target.dims.hidden_size}")
        head = self.eagle
        # The head reads the first of the target's taps; a DFlash draft any of them, each named by its layer
        if head is not None and head.eagle_taps != taps[:len(head.eagle_taps)]:
            raise BundleError(f"the EAGLE-3 head reads target layers {list(head.eagle_taps)} but the target graph "
                              f"outputs {list(taps)}")
        dflash = self.dflash
        if dflash is not None and not set(dflash.eagle_taps) <= set(taps):
            raise BundleError(f"the DFlash draft reads target layers {list(dflash.eagle_taps)} but the target graph "
                              f"outputs {list(taps)}")
        for entry in (e for e in (head, dflash) if e is not None):
            if entry.tap_width != len(entry.eagle_taps) * self.target.dims.hidden_size:
                raise BundleError(f"the {entry.kind} entry's tap_width is {entry.tap_width}, not "
                                  f"{len(entry.eagle_taps)} layers x {self.target.dims.hidden_size}")

    @property
    def target(self) -> ModelEntry:
        return self.models["target"]

    @property
    def draft(self) -> ModelEntry | None:
        return self.models.get("draft")

    @property
    def eagle(self) -> ModelEntry | None:
        """The EAGLE-3 head, where the bundle has one."""
        return self.models.get("eagle")

    @property
    def dflash(self) -> ModelEntry | None:
        """The DFlash block draft, where the bundle has one."""
        return self.models.get("dflash")

    @property
    def runs_trees(self) -> bool:
        """Whether methods that verify token trees can run on this bundle: every graph takes a mask (a
        gqa-static bundle's are causal only: its tree methods are refused, and ``auto`` runs a chain)."""
        return all(e.takes_mask for e in self.models.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "max_context": self.max_context,
            "tokenizer": asdict(self.tokenizer),
            "models": {role: m.to_json() for role, m in self.models.items()},
            "vocab_check": self.vocab_check,
            "versions": self.versions,
            **({"medusa": asdict(self.medusa)} if self.medusa else {}),
            **({"engines": self.engines} if self.engines else {}),
            **({"chosen": self.chosen} if self.chosen else {}),
        }

    def write(self, folder: Path) -> Path:
        path = Path(folder) / MANIFEST_NAME
        safety.write_atomic(path, json.dumps(self.to_json(), indent=2) + "\n")  # a reader never sees half a manifest
        return path


def load_manifest(folder: str | Path) -> Manifest:
    """Read and validate ``folder/specrt.json``; every failure is a :class:`BundleError` naming the problem."""
    folder = Path(folder)
    if not folder.is_dir():
        raise BundleError(f"bundle folder not found: {folder}")
    path = folder / MANIFEST_NAME
    if not path.is_file():
        raise BundleError(f"{folder} is not a specrt bundle: {MANIFEST_NAME} is missing")
    safety.no_links_out(folder)
    safety.checked_size(path, safety.MAX_MANIFEST_BYTES, "manifest")
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise BundleError(f"{path} is not valid JSON: {str(e).splitlines()[0]}") from None
    version = raw.get("format_version") if isinstance(raw, dict) else None
    if version != FORMAT_VERSION:
        raise BundleError(f"{path} has format version {version!r}; this specrt reads version {FORMAT_VERSION}: "
                          "re-export the bundle with this specrt version")
    try:
        manifest = _parse(raw)
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:  # what no check names: one line still
        raise BundleError(f"{path} is corrupt: {type(e).__name__}: {e}") from None
    for what, rel in named_files(manifest):
        # an engine may be gone (a bundle copied without engines/): the TensorRT backend says to rebuild
        if not safety.inside(folder, rel, what).is_file() and not what.endswith("engine"):
            raise BundleError(f"bundle {folder} is incomplete: {rel} is missing")
        if what.endswith("graph") or what == "Medusa heads":  # before any session or parser opens it
            check_external_data(folder / rel, folder)
    for role, entry in manifest.models.items():
        check_graph_dims(folder / entry.file, entry.io(), f"models.{role}")
    if manifest.medusa:
        check_heads_dims(folder / manifest.medusa.file, manifest.target.dims.hidden_size, manifest.medusa)
    check_ids(manifest)  # once the vocabularies are known to be the graphs'
    safety.checked_size(folder / manifest.tokenizer.file, safety.MAX_TOKENIZER_BYTES, "tokenizer")
    if manifest.tokenizer.chat_template:
        safety.checked_size(folder / manifest.tokenizer.chat_template, safety.MAX_TEMPLATE_BYTES, "chat template")
    return manifest


def _parse(raw: dict[str, Any]) -> Manifest:
    """The manifest's objects, every field read typed and in range (:class:`~.validate.Fields`)."""
    top = Fields(raw, "")
    engines = top.mapping("engines", {})
    for role in engines:
        top.nested("engines").nested(role).string("file")  # the rest of a record is the TensorRT backend's
    medusa = raw.get("medusa")
    return Manifest(max_context=top.integer("max_context", 1, safety.MAX_CONTEXT),
                    tokenizer=TokenizerEntry.from_json(top.mapping("tokenizer")),
                    models={r: ModelEntry.from_json(m, f"models.{r}") for r, m in top.mapping("models").items()},
                    vocab_check=top.mapping("vocab_check", {}), versions=top.text_map("versions", {}),
                    medusa=MedusaEntry.from_json(medusa) if medusa is not None else None, engines=engines,
                    chosen=top.mapping("chosen", {}))


def named_files(manifest: Manifest) -> list[tuple[str, str]]:
    """(what, relative path) of every file the manifest names: graphs, tokenizer, chat template, heads, the
    EAGLE-3 vocabulary map and TensorRT engines."""
    files = [("tokenizer", manifest.tokenizer.file)]
    if manifest.tokenizer.chat_template:
        files.append(("chat template", manifest.tokenizer.chat_template))
    for role, m in manifest.models.items():
        files.append((f"{role} graph", m.file))
        if m.vocab_map:
            files.append((f"{role} vocabulary map", m.vocab_map))
    if manifest.medusa:
        files.append(("Medusa heads", manifest.medusa.file))
    for role, record in manifest.engines.items():
        files.append((f"{role} engine", record["file"]))
    return files
