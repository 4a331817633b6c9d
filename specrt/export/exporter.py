"""``specrt export``: target (+ draft) Hugging Face models → a checked, self-describing bundle folder."""

from __future__ import annotations

import ctypes
import gc
import platform
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .. import __version__
from ..bundle import contract as C
from ..bundle.contract import DTYPES
from ..bundle.files import graph_cost
from ..bundle.manifest import Manifest, MedusaEntry, ModelEntry, TokenizerEntry, id_set
from ..bundle.parity import PARITY_TOLERANCE
from ..errors import ChatTemplateError, ConfigError
from .graph.architectures import adapter_for
from .isolation import run_isolated
from .loading import (
    load_causal_lm,
    load_config,
    load_generation_config,
    load_tokenizer,
    resolve_source,
)
from .graph.trace import EXPORTERS, export_decoder
from .graph.parity import ParityCases, check_parity, golden_logits, reference_outputs
from .progress import Reporter, SilentReporter
from .staging import check_output as _check_output
from .staging import publish, staging_folder
from .vocab import compare_vocab

DEFAULT_MAX_CONTEXT = 4096  # caps the runtime's preallocated KV cache for long-context models
GRAPHS = ("auto", "fused", "gqa", "gqa-static", "portable")
ISOLATE_BYTES = 512 * 2**20
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


@dataclass(frozen=True)
class ExportOptions:
    dtype: str = "float32"
    opset: int = 18
    max_context: int | None = None
    exporter: str = "dynamo"
    force: bool = False
    medusa: str | None = None  # folder of `specrt medusa train` heads for the target
    medusa_nodes: int = 24  # node budget of the static Medusa tree
    # The heads' own dtype (None: the models'). fp16 heads on an fp32 target are fine: the runtime casts
    # the hidden state to the heads' dtype, and they only rank candidates the target then verifies.
    medusa_dtype: str | None = None
    # "auto": ``auto_graph`` where the architecture has a fused graph (see fused_ops), else portable.
    graph: str = "auto"
    # What "auto" gives a fused architecture: "fused", or the gqa / gqa-static rewrite of it that the platform the
    # bundle is made for runs best (export.pipeline.choose: a CPU's quantized bundle gqa, ONNX Runtime CUDA gqa-static).
    auto_graph: str = "fused"
    # Run each model's PyTorch side (load, reference logits, graph) in a child process whose memory goes
    # back to the OS before ONNX Runtime checks the graph. None: only for checkpoints of ISOLATE_BYTES or
    # more (the child's start, ~3 s of imports, is not worth it for small models).
    isolate: bool | None = None
    # An EAGLE-3 head folder for the target (specrt's or a published one): adds eagle.onnx, its vocabulary
    # map, and the eagle_taps output of the target graph at the head's tap layers.
    eagle: str | None = None
    # A DFlash draft folder for the target (z-lab's or speculators' format, or specrt dflash train's): adds
    # dflash.onnx, its vocabulary map, and the target layers it reads to the target graph's eagle_taps.
    dflash: str | None = None

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if not 14 <= self.opset <= 23:
            raise ConfigError(f"opset must be between 14 and 23, got {self.opset}")
        if self.max_context is not None and self.max_context < 16:
            raise ConfigError(f"max context must be at least 16, got {self.max_context}")
        if self.exporter not in EXPORTERS:
            raise ConfigError(f"exporter must be one of {', '.join(EXPORTERS)}, got {self.exporter!r}")
        if self.medusa_dtype is not None and self.medusa_dtype not in DTYPES:
            raise ConfigError(f"medusa dtype must be one of {', '.join(DTYPES)}, got {self.medusa_dtype!r}")
        if self.graph not in GRAPHS or self.auto_graph not in ("fused", *C.SHARED_KV_GRAPHS):
            raise ConfigError(f"graph must be one of {', '.join(GRAPHS)}, got {self.graph!r} "
                              f"(auto: {self.auto_graph!r})")
        if self.graph in ("fused", *C.SHARED_KV_GRAPHS) and self.exporter != "dynamo":
            raise ConfigError(f"--graph {self.graph} needs the dynamo exporter")

    def fused_for(self, adapter_cls, config) -> bool:
        """Whether this model's graph is the fused one (or, under "gqa" / "gqa-static", the fused one rewritten)."""
        if self.graph == "auto":
            return adapter_cls.fused_supported(config) and self.exporter == "dynamo"
        return self.graph in ("fused", *C.SHARED_KV_GRAPHS)

    def graph_for(self, fused: bool) -> str:
        """The manifest's ``graph`` of a model exported fused or not."""
        if not fused:
            return "portable"
        graph = self.auto_graph if self.graph == "auto" else self.graph
        return graph if graph in C.SHARED_KV_GRAPHS else "fused"

    def isolate_for(self, source: str) -> bool:
        """Whether ``source``'s PyTorch side runs in a child process (hub ids: always, under ``None``)."""
        if self.isolate is not None:
            return self.isolate
        folder = Path(source)
        if not folder.is_dir():
            return True
        return sum(f.stat().st_size for f in folder.iterdir() if f.suffix in WEIGHT_SUFFIXES) >= ISOLATE_BYTES


def release_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS: glibc keeps blocks freed by large torch
    tensors in its heap (its mmap threshold rises after the first large free), which would otherwise add
    to every later step's peak."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
        pass


def _versions() -> dict[str, str]:
    import onnx
    import onnxruntime
    import torch
    import transformers

    return {"specrt": __version__, "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__}


CHAT_TEMPLATE_FILE = "chat_template.jinja"


def chat_template_of(tok) -> str | None:
    """The tokenizer's chat template text: the string, or the "default" of a dict of named templates
    (what apply_chat_template uses without tools); None when there is none."""
    template = getattr(tok, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default")
    return template if isinstance(template, str) and template.strip() else None


def check_chat_template(tok, special_tokens: dict[str, str]) -> None:
    """Refuse a template the runtime would render differently from transformers' apply_chat_template on a
    probe conversation with and without a system message (both refusing the messages counts as equal)."""
    import jinja2

    from ..runtime.chat import ChatTemplate

    def outcome(render, messages) -> str:
        try:
            return render(messages)
        except (jinja2.TemplateError, TypeError, ValueError, LookupError, ArithmeticError) as e:
            return f"error: {type(e).__name__}: {e}"  # ChatTemplateError is a ValueError

    template = chat_template_of(tok)
    for messages in ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}],
                     [{"role": "user", "content": "Hello!"}]):
        ref = outcome(lambda m: tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True), messages)
        ours = outcome(lambda m: ChatTemplate(template, special_tokens).render(m), messages)
        if ref != ours and not (ref.startswith("error") and ours.startswith("error")):
            raise ChatTemplateError(f"specrt renders the tokenizer's chat template differently from transformers "
                                    f"({ours[:60]!r} vs {ref[:60]!r}); delete chat_template from the tokenizer "
                                    "to export without chat")


def _tokenizer_entry(tok, model_config, generation_config, vocab_size: int) -> TokenizerEntry:
    # Every end id stops a generation: instruct models end a turn with a token (Llama 3's <|eot_id|>)
    # that often only the generation config lists.
    eos_ids = id_set(model_config.eos_token_id) | id_set(tok.eos_token_id)
    if generation_config is not None:
        eos_ids |= id_set(generation_config.eos_token_id)
    bos = tok.bos_token_id
    probe = tok("a").input_ids
    return TokenizerEntry(file="tokenizer.json", bos_token_id=bos, eos_token_ids=tuple(sorted(eos_ids)),
                          add_bos_token=bool(bos is not None and probe and probe[0] == bos), vocab_size=vocab_size,
                          chat_template=CHAT_TEMPLATE_FILE if chat_template_of(tok) else None,
                          # transformers 4.x also maps additional_special_tokens to a list: not a named token
                          special_tokens={k: str(v) for k, v in tok.special_tokens_map.items()
                                          if not isinstance(v, (list, tuple))})


@dataclass(frozen=True)
class RoleJob:
    """What the PyTorch side of one model's export needs (picklable: it may run in a child process)."""

    role: str
    source: str
    options: ExportOptions
    fused: bool
    max_context: int
    cases: ParityCases
    token_limit: int
    path: Path
    eagle: Any = None  # the target's EAGLE-3 head (eagle_export.HeadInfo), None: no head, no taps
    shown: str = ""  # how progress names the source ("": its path)
    dflash: Any = None  # the target's DFlash draft (dflash.graph.DraftInfo), None: none

    @property
    def taps(self) -> tuple[int, ...]:
        """The target graph's tap layers: the head's first (it reads a prefix), then the draft's others."""
        head = self.eagle.taps if self.eagle is not None else ()
        return head + tuple(t for t in (self.dflash.taps if self.dflash is not None else ()) if t not in head)


def torch_side(job: RoleJob, reporter: Reporter = SilentReporter()) -> tuple:
    """Load one model, compute its fp32 reference and golden logits, write its graph to ``job.path``;
    returns (dims, reference, golden, taps reference, head, draft). With an EAGLE-3 head (``job.eagle``) the
    graph outputs the head's taps, checked against Hugging Face's hidden states, and the head's graph is
    written beside it (``head``: eagle_export.HeadExport, else None; the taps reference None without a
    head); with a DFlash draft (``job.dflash``) its graph too (``draft``: dflash.graph.DraftExport, else None).
    Everything PyTorch holds is garbage once this returns."""
    with reporter.step(f"Loading {job.role} {job.shown or job.source}"):
        model = load_causal_lm(job.source, job.options.dtype)
        adapter = adapter_for(model.config.model_type)(model, fused=job.fused, positions=job.max_context)
        dims = adapter.dims()
    with reporter.step(f"Reference logits of {job.role} (PyTorch, fp32)"):
        reference, taps_reference = reference_outputs(model, job.cases, job.taps)
        golden = golden_logits(model, job.token_limit)
        release_memory()  # the fp32 upcasts' freed blocks, before the exporter's own peak
    graph = "fused" if job.fused else "portable"
    with reporter.step(f"Exporting {job.role} to ONNX ({job.options.exporter}, {graph} graph)"):
        export_decoder(adapter, job.path, job.options.dtype, job.options.opset, job.options.exporter, job.taps)
    head = None
    if job.eagle is not None:
        from .eagle.graph import GRAPH_FILE, head_torch_side

        with reporter.step(f"Exporting the EAGLE-3 head {job.eagle.source} ({graph} graph, reference in fp32)"):
            head = head_torch_side(job.eagle, model, model.config, job.cases, taps_reference,
                                   job.path.with_name(GRAPH_FILE), job.options.dtype, fused=job.fused,
                                   positions=job.max_context, opset=job.options.opset,
                                   exporter=job.options.exporter)
    draft = _dflash_torch_side(job, model, taps_reference, reporter) if job.dflash is not None else None
    return dims, reference, golden, taps_reference, head, draft


def _dflash_torch_side(job: RoleJob, model: Any, taps_reference: dict, reporter: Reporter) -> Any:
    """The DFlash draft's graph written beside the target's, its reference computed on the target's own taps."""
    from .dflash.graph import GRAPH_FILE, draft_torch_side

    columns = C.tap_columns(job.taps, job.dflash.taps, model.config.hidden_size)
    with reporter.step(f"Exporting the DFlash draft {job.dflash.source} (reference in fp32)"):
        return draft_torch_side(job.dflash, model, taps_reference["prefill"][:, columns],
                                job.path.with_name(GRAPH_FILE), job.options.dtype, opset=job.options.opset,
                                exporter=job.options.exporter, fused=job.fused, positions=job.max_context)


@dataclass
class _Sources:
    """What the export reads before any graph is made: each role's source, config and tokenizer."""

    paths: dict[str, str]  # role -> local folder (a hub id resolved)
    configs: dict[str, Any]
    tokenizers: dict[str, Any]
    tokenizer: TokenizerEntry  # the target's, as the manifest records it
    vocab_check: dict
    max_context: int


def export_bundle(target: str, draft: str | None, out: str | Path, options: ExportOptions = ExportOptions(),
                  reporter: Reporter = SilentReporter(), eagle: str | None = None,
                  shown: dict[str, str] | None = None) -> Manifest:
    """Export ``target`` and ``draft`` to ``out``; the folder appears only once every check has passed.
    ``shown``: how progress names a role's source and the bundle ("target", "draft", "bundle"; default: their
    paths), for a caller that works in folders of its own (the pipeline's GGUF staging).

    ``eagle`` (or ``options.eagle``): an EAGLE-3 head folder for the target, checked against it before
    anything is written."""
    if eagle is not None:
        options = replace(options, eagle=str(eagle))
    out = Path(out)
    _check_output(out, options.force)
    paths = {"target": resolve_source(target)}
    if draft is not None:
        paths["draft"] = resolve_source(draft)
    with reporter.step("Reading configs and tokenizers"):
        sources = _read_sources(paths, options)
    head_info = None
    if options.eagle is not None:
        from .eagle.graph import read_head

        with reporter.step(f"Reading the EAGLE-3 head {options.eagle}"):
            head_info = read_head(options.eagle, sources.configs["target"])
            release_memory()  # its weights are read again where the head is exported
    draft_info = None
    if options.dflash is not None:
        from .dflash.graph import read_dflash

        with reporter.step(f"Reading the DFlash draft {options.dflash}"):
            draft_info = read_dflash(options.dflash, sources.configs["target"])

    tmp = staging_folder(out)
    try:
        entries: dict[str, ModelEntry] = {}
        medusa = None
        cases = ParityCases.draw(len(sources.tokenizers["target"]), sources.max_context)
        for role in sources.paths:
            entries.update(_export_role(role, sources, options, cases, head_info, tmp, reporter,
                                        (shown or {}).get(role, ""), draft_info))
            if role == "target" and options.medusa:
                with reporter.step(f"Exporting Medusa heads {options.medusa}"):
                    medusa = _export_medusa(Path(options.medusa), tmp, entries["target"].dims, options)
        with reporter.step(f"Writing {(shown or {}).get('bundle', f'bundle {out}')}"):
            tokenizer = sources.tokenizer
            sources.tokenizers["target"].backend_tokenizer.save(str(tmp / "tokenizer.json"))
            if tokenizer.chat_template:
                (tmp / tokenizer.chat_template).write_text(chat_template_of(sources.tokenizers["target"]),
                                                           encoding="utf-8")
            manifest = Manifest(max_context=sources.max_context, tokenizer=tokenizer, models=entries,
                                vocab_check=sources.vocab_check, versions=_versions(), medusa=medusa)
            manifest.write(tmp)
            publish(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def _read_sources(paths: dict[str, str], options: ExportOptions) -> _Sources:
    """Configs and tokenizers of every role, the target's chat template checked, the draft's vocabulary compared
    with the target's, and the context the bundle allows."""
    configs = {role: load_config(src) for role, src in paths.items()}
    tokenizers = {role: load_tokenizer(src) for role, src in paths.items()}
    tokenizer = _tokenizer_entry(tokenizers["target"], configs["target"], load_generation_config(paths["target"]),
                                 len(tokenizers["target"]))
    if tokenizer.chat_template:
        check_chat_template(tokenizers["target"], tokenizer.special_tokens)
    vocab_check = {}
    if "draft" in paths:
        vocab_check = compare_vocab(tokenizers["target"], tokenizers["draft"],
                                    configs["target"].vocab_size, configs["draft"].vocab_size)
    max_context = _max_context(options.max_context, min(
        adapter_for(c.model_type).max_positions(c) for c in configs.values()))
    return _Sources(paths, configs, tokenizers, tokenizer, vocab_check, max_context)


def _export_role(role: str, sources: _Sources, options: ExportOptions, cases: ParityCases, head_info: Any,
                 tmp: Path, reporter: Reporter, shown: str = "", draft_info: Any = None) -> dict[str, ModelEntry]:
    """One model traced (in a child process where ``options`` isolate it), rewritten for its graph kind and
    checked against PyTorch: its manifest entry, and the EAGLE-3 head's when the target carries one."""
    src, config = sources.paths[role], sources.configs[role]
    job = RoleJob(role, src, options, fused=options.fused_for(adapter_for(config.model_type), config),
                  max_context=sources.max_context, cases=cases, token_limit=len(sources.tokenizers["target"]),
                  path=tmp / f"{role}.onnx", eagle=head_info if role == "target" else None, shown=shown,
                  dflash=draft_info if role == "target" else None)
    if options.isolate_for(src):
        dims, reference, golden, taps_reference, head, draft = run_isolated(torch_side, (job,), reporter)
    else:
        dims, reference, golden, taps_reference, head, draft = torch_side(job, reporter=reporter)
        release_memory()
    graph = options.graph_for(job.fused)
    if graph in C.SHARED_KV_GRAPHS:
        from .graph.gqa import rewrite_file
        from .graph.gqa_static import rewrite_static_file

        what = role + (" and its EAGLE-3 head" if head is not None else "")
        with reporter.step(f"Rewriting {what} for ONNX Runtime's GroupQueryAttention"):
            files = [(tmp / f"{role}.onnx", dims)]
            if head is not None:  # its one layer's cache too: written in place, bound once
                from .eagle.graph import GRAPH_FILE

                files.append((tmp / GRAPH_FILE, head.dims))
            for path, model_dims in files:
                rewrite_file(path, path, model_dims)
                if graph == C.GQA_STATIC_GRAPH:  # lengths from seqlens_k, a mask as wide as the buffer
                    rewrite_static_file(path, path, model_dims)
    with reporter.step(f"Checking {role}: ONNX Runtime vs PyTorch"):
        parity = check_parity(reference, cases, tmp / f"{role}.onnx", dims, options.dtype,
                              taps_reference=taps_reference)
    entries = {role: ModelEntry(file=f"{role}.onnx", source=src, architecture=config.model_type,
                                dtype=options.dtype, dims=dims, parity=parity,
                                parity_tolerance=PARITY_TOLERANCE[options.dtype].to_json(),
                                golden=golden, graph=graph, eagle_taps=job.taps,
                                tap_width=len(job.taps) * dims.hidden_size, logits_index=True,
                                **graph_cost(tmp / f"{role}.onnx").manifest_fields())}
    if head is not None:
        with reporter.step("Checking the EAGLE-3 head: ONNX Runtime vs PyTorch"):
            entries["eagle"] = _head_entry(head_info, head, tmp, options.dtype, graph)
    if draft is not None:
        from .dflash.graph import draft_entry

        with reporter.step("Checking the DFlash draft: ONNX Runtime vs PyTorch"):
            entries["dflash"] = draft_entry(draft_info, draft, tmp, options.dtype)
    return entries


def _head_entry(info, head, tmp: Path, dtype: str, graph: str) -> ModelEntry:
    """Check the head's graph (exported as the target's ``graph``) against its PyTorch reference, write its
    vocabulary map; its manifest entry."""
    import numpy as np

    from .eagle.graph import ARCHITECTURE, GRAPH_FILE, VOCAB_FILE, check_head_parity

    parity = check_head_parity(head.reference, head.cases, tmp / GRAPH_FILE, head.dims, dtype, info.tap_width,
                               head.order)
    np.save(tmp / VOCAB_FILE, head.vocab_map.astype(np.int64))
    return ModelEntry(file=GRAPH_FILE, source=info.source, architecture=ARCHITECTURE, dtype=dtype, dims=head.dims,
                      parity=parity, parity_tolerance=PARITY_TOLERANCE[dtype].to_json(),
                      graph=graph, kind="eagle3", eagle_taps=info.taps,
                      tap_width=info.tap_width, vocab_map=VOCAB_FILE, logits_index=True,
                      variants=info.config.variants, **graph_cost(tmp / GRAPH_FILE).manifest_fields())


def _max_context(requested: int | None, model_limit: int) -> int:
    if requested is None:
        return min(model_limit, DEFAULT_MAX_CONTEXT)
    if requested > model_limit:
        raise ConfigError(f"--max-context {requested} exceeds what the models support ({model_limit} positions)")
    return requested


def _export_medusa(folder: Path, tmp: Path, dims, options: ExportOptions) -> MedusaEntry:
    import torch

    from ..runtime.medusa import choose_tree
    from .medusa import export_heads, load_heads

    heads, record = load_heads(folder)
    if (record["hidden_size"], record["vocab_size"]) != (dims.hidden_size, dims.vocab_size):
        raise ConfigError(f"Medusa heads in {folder} were trained for hidden {record['hidden_size']} / vocab "
                          f"{record['vocab_size']}, the target has {dims.hidden_size} / {dims.vocab_size}")
    topk = len(record["accuracies"][0])
    diff = export_heads(heads, tmp / "medusa.onnx", getattr(torch, options.medusa_dtype or options.dtype), topk,
                        options.opset)
    paths, expected = choose_tree(record["accuracies"], options.medusa_nodes)
    return MedusaEntry(file="medusa.onnx", source=str(folder), num_heads=record["num_heads"], topk=topk,
                       tree=[list(p) for p in paths], expected_accepted=expected, accuracies=record["accuracies"],
                       parity=diff)
