"""The Python API: load a bundle once, then ``generate``/``stream`` text or ``chat`` with any method."""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generator, Iterator, Mapping, Sequence

import numpy as np

from ..bundle import safety
from ..bundle.machine import cpu_name
from ..bundle.manifest import Manifest, load_manifest
from ..bundle.tokenizer_file import tokenizer_text
from ..errors import BundleError, ConfigError, ContextLengthError
from .backends import Decoder, create_decoder, create_heads
from .backends.onnxruntime import share_threads
from .cached import CachedModel
from .costs import (CALIBRATION_CONTEXT, CALIBRATION_ROWS, MEASURED_TREE_ROWS, measure_verify_costs,
                    remembered_verify_costs)
from .dflash import DFlashParts, load_dflash
from .drafters import METHODS, NO_DRAFTER, Drafter, DrafterContext, auto_method
from .eagle import read_vocab_map
from .gate import GatedStepper, MethodGate
from .loop import ChainStepper, DecodeState, DraftGate, PlainStepper, TreeStepper, decode
from .masks import TREES_NEED
from .options import AUTO, DecodeOptions
from .stats import GenerationStats, StatsRecorder
from .tree import DynamicTree

if TYPE_CHECKING:
    from .chat import ChatTemplate

ADVICE_LOGGER = "specrt.advice"  # what load() tells a library user; the CLI says it itself, where it matters


@dataclass(frozen=True)
class GenerationResult:
    text: str
    token_ids: list[int]  # generated ids only (a stop id that ended the generation is not included)
    stats: GenerationStats
    finish_reason: str  # "length" | "eos" | "stop"


class Stream(Iterator[str]):
    """Text pieces as they are decided; once iteration has ended, :attr:`result` holds the generation's
    result (reading it earlier decodes the rest first)."""

    def __init__(self, pieces: Generator[str, None, GenerationResult]) -> None:
        self._pieces = pieces
        self._result: GenerationResult | None = None
        self._done = False

    def __iter__(self) -> "Stream":
        return self

    def __next__(self) -> str:
        # A finished generator raises a bare StopIteration on every later next(): without this guard a second
        # iteration (or `for` after `next`) would overwrite the kept result with None.
        if self._done:
            raise StopIteration
        try:
            return next(self._pieces)
        except StopIteration as end:
            self._result, self._done = end.value, True
            raise

    @property
    def result(self) -> GenerationResult:
        if self._result is None:
            for _ in self:
                pass
        return self._result

    def close(self) -> None:
        """Stop early: the generation's frame is released (no result, unless it had finished already)."""
        self._pieces.close()
        self._done = True


class _TextTracker:
    """Incremental detokenisation with stop strings: emits only text that is final.

    The tokenizers library's own streaming decoder (``DecodeStream``) turns ids into text as they
    come: one call per id, holding back ids that end inside a multi-byte character, with the previous
    piece as context (decoders such as SentencePiece's drop a leading space at the start of what they
    decode), so the work per push does not grow with the generation."""

    def __init__(self, tokenizer, stop: Sequence[str]) -> None:
        from tokenizers.decoders import DecodeStream

        self.tokenizer, self.stop = tokenizer, [s for s in stop if s]
        self.stream = DecodeStream(skip_special_tokens=True)
        self.ids: list[int] = []
        self.emitted = 0
        self.text = ""
        self.stopped = False

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def push(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        new = "".join(piece for piece in (self.stream.step(self.tokenizer, i) for i in ids) if piece)
        if not new:
            return ""  # nothing new yet, or a multi-byte character is still incomplete
        searched_to = max(0, len(self.text) - max((len(s) - 1 for s in self.stop), default=0))
        self.text += new
        cut = min((i for i in (self.text.find(s, searched_to) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            self.text, self.stopped = self.text[:cut], True
            self.ids = self._ids_covering(cut)
        # Hold back a tail that could still become a stop string.
        hold = 0 if self.stopped else max((len(s) - 1 for s in self.stop), default=0)
        upto = max(self.emitted, len(self.text) - hold)
        delta, self.emitted = self.text[self.emitted:upto], upto
        return delta

    def _ids_covering(self, n_chars: int) -> list[int]:
        """The shortest prefix of the ids whose text reaches ``n_chars``: the tokens past a stop string are
        not part of the result (the stop usually falls in the last chunk, so this decodes a few prefixes)."""
        k = len(self.ids)
        while k > 0 and len(self._decode(self.ids[:k - 1])) >= n_chars:
            k -= 1
        return self.ids[:k]

    def flush(self) -> str:
        delta, self.emitted = self.text[self.emitted:], len(self.text)
        return delta


class SpeculativeGenerator:
    """A loaded bundle: tokenizer, target and (if present) draft sessions and caches, created once."""

    def __init__(self, bundle: str | Path, backend: str = "auto", threads: int | None = None,
                 low_memory: bool | None = None, shared_threads: bool = False) -> None:
        """``low_memory``: sessions that keep no second copy of the weights, slower (ONNX Runtime on CPU);
        None: each where the default one would not fit in the memory available. ``shared_threads``: every
        ONNX Runtime session of this process on one pool of ``threads`` workers, so a draft or head runs on
        the target's spinning workers (faster on CPUs; ORT then refuses sessions with pools of their own in
        the whole process: see :func:`~specrt.runtime.backends.onnxruntime.share_threads`)."""
        from tokenizers import Tokenizer

        self.bundle = Path(bundle)
        self.manifest: Manifest = load_manifest(self.bundle)
        if shared_threads and backend in ("auto", "onnxruntime"):
            with contextlib.suppress(ImportError):  # no ONNX Runtime: no pool to share
                share_threads(threads)
        m = self.manifest
        safety.fits_in_memory(safety.kv_cache_bytes(m.max_context, [(e.dims, e.dtype) for e in m.models.values()]),
                              f"the KV cache of bundle {self.bundle} at its max context of {m.max_context}")
        # The text whose cost was bounded, not the file again: a small tokenizer.json can cost gigabytes to build.
        text = tokenizer_text(self.bundle / m.tokenizer.file, m.target.dims.vocab_size)
        try:
            self.tokenizer = Tokenizer.from_str(text)
        except Exception as e:  # tokenizers raises a bare Exception on a corrupt file
            raise BundleError(f"cannot read {self.manifest.tokenizer.file}: {str(e).splitlines()[0]}") from None
        self.decoders: dict[str, Decoder] = {
            role: create_decoder(backend, self.bundle, entry, threads, role, low_memory)
            for role, entry in self.manifest.models.items() if role not in ("eagle", "dflash")}  # those on first use
        vocab = self.manifest.target.dims.vocab_size
        self._models = {role: CachedModel(d, self.manifest.max_context, vocab) for role, d in self.decoders.items()}
        self._backend, self._threads, self._low_memory = backend, threads, low_memory
        self._shared_threads = shared_threads
        self._vocab_map: np.ndarray | None = None
        self._dflash: DFlashParts | None = None  # the DFlash draft: loaded on first use
        self._heads = None  # Medusa heads: loaded on first use, so backends without them still run the rest
        self._chat_template: ChatTemplate | None = None  # compiled on first chat: a bad one breaks chat only
        self._verify_costs: tuple[float, ...] | None = None
        self._verify_rows = 0  # the most rows verify_costs was asked for
        self._gates: dict[tuple, Any] = {}  # MethodGate / DraftGate per method and settings (_keep)
        # Off by default, so every generation costs what the last did (benchmarks). On, a generation whose
        # prompt starts as the last one's context did (the turns of a conversation, one prompt sampled again)
        # feeds only the rest: each cache keeps what it holds of that context.
        self.reuse_prefix = False
        self._held: list[int] = []  # the last generation's context; every cache holds a prefix of it

    @property
    def max_context(self) -> int:
        return self.manifest.max_context

    @property
    def memory_notes(self) -> list[str]:
        """One line per model whose session is the low-memory one, saying why (backends without one: none)."""
        plans = {role: getattr(d, "memory_plan", None) for role, d in self.decoders.items()}
        return [f"{role}: {p.reason}" for role, p in plans.items() if p is not None and p.low_memory]

    def encode(self, prompt: str) -> list[int]:
        ids = self.tokenizer.encode(prompt, add_special_tokens=False).ids
        bos = self.manifest.tokenizer.bos_token_id
        return ([bos] if self.manifest.tokenizer.add_bos_token and bos is not None else []) + ids

    def render_chat(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
        """The prompt text the bundle's chat template makes of ``messages`` ([{"role": ..., "content": ...}]),
        as transformers' ``apply_chat_template(messages, tokenize=False)`` renders it."""
        if self._chat_template is None:
            entry = self.manifest.tokenizer
            if entry.chat_template is None:
                raise ConfigError(f"bundle {self.bundle} has no chat template (its tokenizer had none): export an "
                                  "instruct model whose tokenizer defines chat_template, or pass a plain prompt")
            from .chat import ChatTemplate

            self._chat_template = ChatTemplate.from_file(self.bundle / entry.chat_template, entry.special_tokens)
        return self._chat_template.render(messages, add_generation_prompt=add_generation_prompt)

    def encode_chat(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """Token ids of the rendered conversation, ending with the assistant's header.

        Special-token text the template wrote (``<|eot_id|>``, ``<start_of_turn>``) encodes as those tokens.
        BOS is prepended only when the tokenizer adds one and the template did not write it already: most
        templates write ``bos_token`` themselves (transformers' ``apply_chat_template(tokenize=True)``
        never adds one), and a second BOS degrades the reply."""
        ids = self.tokenizer.encode(self.render_chat(messages), add_special_tokens=False).ids
        bos = self.manifest.tokenizer.bos_token_id
        if self.manifest.tokenizer.add_bos_token and bos is not None and ids[:1] != [bos]:
            ids = [bos] + ids
        return ids

    def verify_costs(self, rows: int = CALIBRATION_ROWS) -> tuple[float, ...]:
        """What a target pass over 1, 2, ... ``rows`` rows costs against one row on this backend (runtime.costs):
        how ``gamma="auto"`` weighs a longer chain and a ``nodes="auto"`` tree its nodes. Measured on the first
        call that asks for that many rows, then kept; on ONNX Runtime's CPU provider, where that takes a fraction
        of a second to a few seconds, also in specrt's cache for the next process (:meth:`verify_cost_key`). A
        GPU measures it in milliseconds, and its engines' shapes are not in the key: measured per load there."""
        if self._verify_costs is None or self._verify_rows < rows:  # rows asked: a short cache measures fewer
            target = self._models["target"]
            self._verify_costs = (
                remembered_verify_costs(target, self.verify_cost_key(), rows, safety.cache_dir())
                if target.decoder.provider == "CPUExecutionProvider" else measure_verify_costs(target, max_rows=rows))
            self._verify_rows = rows
        return self._verify_costs

    def verify_cost_key(self) -> dict:
        """What this target's verify-cost curve depends on: its graph file (a re-export or re-quantization is a
        new curve), the backend and its threads, the CPUs this process may use, and the machine."""
        graph = (self.bundle / self.manifest.target.file).resolve()
        stat, decoder = graph.stat(), self.decoders["target"]
        plan = getattr(decoder, "memory_plan", None)
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        return {"graph": str(graph), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                "provider": decoder.provider, "threads": self._threads, "shared_pool": self._shared_threads,
                "low_memory": bool(plan.low_memory) if plan is not None else None, "cpus": cpus,
                "machine": cpu_name(), "context": CALIBRATION_CONTEXT}

    def tree_verify_costs(self, shape: DynamicTree) -> tuple[float, ...] | None:
        """The verify costs a tree sized by cost (``shape.by_cost``) weighs its nodes with, measured up to its
        rows (at most MEASURED_TREE_ROWS; beyond, extrapolated); None for a fixed tree."""
        return self.verify_costs(min(shape.nodes + 1, MEASURED_TREE_ROWS)) if shape.by_cost else None

    @property
    def default_method(self) -> str:
        """What ``method="auto"`` runs: the best this bundle holds (runtime.drafters.auto_method): the drafter
        ``specrt export`` measured fastest where it holds several, else its EAGLE-3 head's dynamic tree (sized by
        what this backend's rows and head passes cost, it is never much worse than the head's chain and beat it
        greedy and sampled, fp32 and int8, on SmolLM2: docs/performance/smollm2-eagle3-cpu.md; its chain where the
        bundle's graphs are causal only, Manifest.runs_trees), else its DFlash draft, else a draft model's chain,
        else prompt lookup (no model; exact, and never slower than plain decoding by more than its lookup)."""
        return auto_method(self.manifest)

    @property
    def drafter_note(self) -> str | None:
        """One line when the bundle holds no drafter (auto runs prompt lookup, which rarely speeds up a sampled
        reply) and how to get one; None when it has a head or a draft model."""
        return NO_DRAFTER if self.default_method == "ngram" else None

    def resolve_method(self, method: str) -> str:
        return self.default_method if method == AUTO else method

    def _drafter(self, opts: DecodeOptions, method: str) -> Drafter:
        if method not in METHODS:
            raise ConfigError(f"unknown method {method!r}; choose from {AUTO}, {', '.join(METHODS)}")
        cls = METHODS[method]
        if cls.proposes_trees and not self.manifest.runs_trees:  # its graphs take no mask (contract.CAUSAL_ONLY_GRAPHS)
            raise ConfigError(f"method {method!r} verifies token trees and this bundle's "
                              f"{self.manifest.target.graph} graphs are causal only; run a chain method (eagle, "
                              f"draft, ngram), or re-export: {TREES_NEED}")
        if cls.needs_draft_model and "draft" not in self._models:
            raise ConfigError(f"method {method!r} needs a draft model and this bundle has none")
        if cls.needs_medusa and self._heads is None:
            if self.manifest.medusa is None:
                raise ConfigError(f"method {method!r} needs Medusa heads and this bundle has none "
                                  "(specrt export ... --medusa HEADS)")
            self._heads = create_heads(self._backend, self.bundle, self.manifest.medusa.file, self._threads)
        if cls.needs_eagle:
            self._load_eagle(method)
        if cls.needs_dflash and self._dflash is None:
            self._dflash = load_dflash(self.bundle, self.manifest, self.decoders["target"], self._threads)
        medusa = self.manifest.medusa
        tree_costs = self.tree_verify_costs(opts.eagle_tree) if cls.sizes_tree_by_cost else None
        return cls.build(DrafterContext(vocab=self.manifest.target.dims.vocab_size, model=self._models.get("draft"),
                                        tree=opts.tree, heads=self._heads, paths=tuple(medusa.tree) if medusa else (),
                                        acceptance=opts.acceptance, target=self._models["target"],
                                        eagle=self._models.get("eagle"), vocab_map=self._vocab_map,
                                        eagle_tree=opts.eagle_tree, draft_stop=opts.draft_stop,
                                        verify_costs=tree_costs, dflash=self._dflash))

    def _load_eagle(self, method: str) -> None:
        """The EAGLE-3 head's session, cache and vocabulary map, made on first use."""
        entry = self.manifest.eagle
        if entry is None:
            raise ConfigError(f"method {method!r} needs an EAGLE-3 head and this bundle has none "
                              "(specrt export ... --eagle HEAD)")
        if "eagle" in self._models:
            return
        if not getattr(self.decoders["target"], "supports_eagle", False):
            raise ConfigError(f"the {self.decoders['target'].provider} backend does not run EAGLE-3 heads yet; "
                              "use --backend onnxruntime")
        vocab_map = read_vocab_map(self.bundle, entry.vocab_map, entry.dims.vocab_size,
                                   self.manifest.target.dims.vocab_size)
        decoder = create_decoder(self._backend, self.bundle, entry, self._threads, "draft", self._low_memory)
        self.decoders["eagle"] = decoder
        self._models["eagle"] = CachedModel(decoder, self.manifest.max_context, entry.dims.vocab_size)
        self._vocab_map = vocab_map

    def stream(self, prompt: str, options: DecodeOptions | None = None, **changes: Any) -> Stream:
        """Text pieces as they are decided, for ``options`` (:class:`DecodeOptions`; keyword ``changes``
        override its fields, e.g. ``stream(p, method="none", max_new_tokens=32)``); ``.result`` of the
        returned :class:`Stream` holds the result once it is exhausted."""
        return self.stream_ids(self.encode(prompt), options, **changes)

    def stream_chat(self, messages: Sequence[Mapping[str, Any]], options: DecodeOptions | None = None,
                    **changes: Any) -> Stream:
        """The assistant's reply to ``messages`` ([{"role": "system"|"user"|"assistant", "content": str}]) as it
        is decided; options as for :meth:`stream`. The reply ends at any of the bundle's end ids
        (``eos_token_ids``), e.g. the template's end-of-turn token."""
        return self.stream_ids(self.encode_chat(messages), options, **changes)

    def stream_ids(self, tokens: list[int], options: DecodeOptions | None = None, **changes: Any) -> Stream:
        """:meth:`stream` from prompt token ids already encoded (:meth:`encode`, :meth:`encode_chat`), for a
        caller that needs them too (a server counting prompt tokens) without encoding twice. Bad options,
        an empty prompt or one beyond the context raise here, before anything runs."""
        opts = DecodeOptions.of(options, **changes)
        method = self.resolve_method(opts.method)
        drafter = self._drafter(opts, method)
        if not tokens:
            raise ConfigError("the prompt is empty and the tokenizer adds no BOS token")
        if len(tokens) + opts.max_new_tokens > self.max_context:
            raise ContextLengthError(f"prompt ({len(tokens)} tokens) + max_new_tokens ({opts.max_new_tokens}) exceeds "
                                     f"the bundle's max context of {self.max_context}")
        return Stream(self._decode(list(tokens), opts, method, drafter))

    def _decode(self, tokens: list[int], opts: DecodeOptions, method: str,
                drafter: Drafter) -> Generator[str, None, GenerationResult]:
        auto = opts.gamma == "auto" and method != "none" and not drafter.proposes_trees
        gate = drafter.proposes_for_free and method != "none"  # a lookup verified only where it pays
        costs = self.verify_costs() if auto or gate else None
        stepper = (PlainStepper() if method == "none"
                   else TreeStepper(typical=opts.acceptance == "typical") if drafter.proposes_trees
                   else ChainStepper(opts.gamma, costs, one_pass=drafter.drafts_in_one_pass,
                                     gate=self._keep(DraftGate, opts, method, costs) if gate else None))
        switch = self._method_gate(opts, method, drafter)
        if switch is not None:
            stepper = GatedStepper(stepper, switch)
        reused = self._rewind(tokens, drafter)
        state = DecodeState(tokens=tokens, target=self._models["target"], drafter=drafter, sampling=opts.sampling,
                            rng=np.random.default_rng(opts.seed),
                            stats=StatsRecorder(method, opts.gamma, prompt_tokens=len(tokens), reused_tokens=reused,
                                                verify_costs=self._verify_costs, one_pass=drafter.drafts_in_one_pass),
                            min_rows=2 if opts.row_stable else 1)
        tracker = _TextTracker(self.tokenizer, opts.stop)
        stop_ids = frozenset(self.manifest.tokenizer.eos_token_ids)
        finish = "length"
        try:
            for chunk in decode(state, opts.max_new_tokens, stepper, stop_ids):
                piece = tracker.push(chunk)
                if piece:
                    yield piece
                if tracker.stopped:
                    finish = "stop"
                    break
            else:
                if state.stats.new_tokens < opts.max_new_tokens:
                    finish = "eos"
        except GeneratorExit:  # the caller stopped reading: between steps, the caches are consistent
            self._hold(state.tokens)
            raise
        self._hold(state.tokens)
        tail = tracker.flush()
        if tail:
            yield tail
        if switch is not None:
            state.stats.switch_note = switch.describe(method)
        state.stats.engine_s = sum(m.forward_s for m in self._models.values()) + (
            self._dflash.runner.forward_s if drafter.needs_dflash else 0.0)  # its session runs outside _models
        state.stats.target_copied_bytes = state.target.copied_bytes
        return GenerationResult(tracker.text, tracker.ids, state.stats.finish(), finish)

    def _method_gate(self, opts: DecodeOptions, method: str, drafter: Drafter) -> MethodGate | None:
        """``auto``'s switch between the method and plain decoding (runtime.gate), one per method and settings
        for the generator's life; None where the user named the method, or it needs none (plain decoding) or is
        lossy anyway (typical acceptance). Prompt lookup gets one too: its own gate prices a proposal's rows by
        the verify-cost curve, but not the host work of looking up and accepting, which on SmolLM2's Q4_1 blocks
        at T 0.7 left it at 0.92x plain decoding."""
        if opts.method != AUTO or method == "none" or opts.acceptance == "typical":
            return None
        return self._keep(MethodGate, opts, method)

    def _keep(self, kind: type, opts: DecodeOptions, method: str, *args: Any) -> Any:
        """The generator's one ``kind`` (a gate) for this method and these settings, made on first use: what a
        gate learns outlives a generation (a lookup's gate made afresh verified each reply's first proposals
        blind, which on SmolLM2's Q4_1 blocks at T 0.7 cost 3 % of plain decoding's speed)."""
        key = (kind, method, opts.sampling, opts.gamma, opts.eagle_tree, opts.tree, opts.draft_stop, opts.row_stable,
               *args)
        if key not in self._gates:
            self._gates[key] = kind(*args)
        return self._gates[key]

    def _rewind(self, tokens: list[int], drafter: Drafter) -> int:
        """Cut every cache to what this generation can keep of it (nothing unless ``reuse_prefix``); returns
        the prompt tokens the models it runs need not be fed again."""
        common = _common_prefix(self._held, tokens) if self.reuse_prefix else 0
        self._held = []  # until this generation leaves its caches consistent
        # What each cache still holds of this context: an EAGLE-3 head's row j read token j+1 too.
        valid = {role: max(0, min(m.cache.length, common - 1 if role == "eagle" else common))
                 for role, m in self._models.items()}
        used = ["target"] + ["draft"] * drafter.needs_draft_model + ["eagle"] * drafter.needs_eagle
        # The prompt's last two tokens are fed again: quantized kernels compute a one-row pass differently
        # from a multi-row one (MatMulNBits int8: logits up to 0.7 apart; multi-row passes agree row for
        # row), so the first token comes out as a prefill of the whole prompt would give it. The models this
        # generation runs keep the same length: the head's catch-up reads the target's taps from there.
        draft = self._dflash.runner if drafter.needs_dflash and self._dflash is not None else None
        held = [valid[r] for r in used] + ([min(draft.length, common)] if draft is not None else [])
        keep = max(0, min([len(tokens) - 2] + held))
        for role, m in self._models.items():
            m.reset(keep if role in used else valid[role])
        if draft is not None:  # its context: positions whose taps a target pass made; the rest is fed again
            draft.reset(keep)
        return keep

    def _hold(self, tokens: list[int]) -> None:
        """Record the context this generation ended with; no cache keeps entries beyond it (accepted tokens
        after a stop id)."""
        for m in self._models.values():
            m.cache.truncate(min(m.cache.length, len(tokens)))
        self._held = list(tokens)

    def generate(self, prompt: str, options: DecodeOptions | None = None, **changes: Any) -> GenerationResult:
        """Generate in one call; options as for :meth:`stream`."""
        return self.stream(prompt, options, **changes).result

    def chat(self, messages: Sequence[Mapping[str, Any]], options: DecodeOptions | None = None,
             **changes: Any) -> GenerationResult:
        """The assistant's reply to ``messages`` in one call; options as for :meth:`stream`, e.g.
        ``gen.chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]).text``."""
        return self.stream_chat(messages, options, **changes).result


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if len(diff) else n


def load(bundle: str | Path | None = None, backend: str = "auto", threads: int | None = None,
         low_memory: bool | None = None, shared_threads: bool = False) -> SpeculativeGenerator:
    """Load a bundle folder; with no path, the demo bundle that ships inside the package."""
    if bundle is None:
        from .. import demo

        bundle = demo.bundle_path()
    gen = SpeculativeGenerator(bundle, backend=backend, threads=threads, low_memory=low_memory,
                               shared_threads=shared_threads)
    if gen.drafter_note:  # one line on stderr (logging's last resort) unless the app configured logging
        logging.getLogger(ADVICE_LOGGER).warning(gen.drafter_note)
    return gen
