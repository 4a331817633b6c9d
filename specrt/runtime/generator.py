"""The Python API: load a bundle once, then ``generate``/``stream`` text or ``chat`` with any method."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

import numpy as np

from ..bundle.manifest import Manifest, load_manifest
from ..errors import BundleError, ConfigError, ContextLengthError
from .backends import Decoder, create_decoder, create_heads
from .cached import CachedModel
from .drafters import METHODS, Drafter
from .loop import MAX_GAMMA, ChainStepper, DecodeState, TreeStepper, decode
from .sampling import SamplingConfig
from .stats import GenerationStats, StatsRecorder
from .tree import TreeShape

if TYPE_CHECKING:
    from .chat import ChatTemplate


@dataclass(frozen=True)
class GenerationResult:
    text: str
    token_ids: list[int]  # generated ids only (a stop id that ended the generation is not included)
    stats: GenerationStats
    finish_reason: str  # "length" | "eos" | "stop"


def _check_gamma(gamma: int | str) -> int | str:
    if gamma == "auto":
        return gamma
    if isinstance(gamma, bool) or not isinstance(gamma, (int, np.integer)) or not 1 <= gamma <= MAX_GAMMA:
        raise ConfigError(f"gamma must be an integer in [1, {MAX_GAMMA}] or 'auto', got {gamma!r}")
    return int(gamma)


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
                 low_memory: bool | None = None) -> None:
        """``low_memory``: sessions that keep no second copy of the weights, slower (ONNX Runtime on CPU);
        None: each where the default one would not fit in the memory available."""
        from tokenizers import Tokenizer

        self.bundle = Path(bundle)
        self.manifest: Manifest = load_manifest(self.bundle)
        try:
            self.tokenizer = Tokenizer.from_file(str(self.bundle / self.manifest.tokenizer.file))
        except Exception as e:  # tokenizers raises a bare Exception on a corrupt file
            raise BundleError(f"cannot read {self.manifest.tokenizer.file}: {str(e).splitlines()[0]}") from None
        self.decoders: dict[str, Decoder] = {
            role: create_decoder(backend, self.bundle, entry, threads, role, low_memory)
            for role, entry in self.manifest.models.items()}
        vocab = self.manifest.target.dims.vocab_size
        self._models = {role: CachedModel(d, self.manifest.max_context, vocab) for role, d in self.decoders.items()}
        self._backend, self._threads = backend, threads
        self._heads = None  # Medusa heads: loaded on first use, so backends without them still run the rest
        self._chat_template: ChatTemplate | None = None  # compiled on first chat: a bad one breaks chat only
        self.last_result: GenerationResult | None = None

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

    def _drafter(self, method: str, shape: TreeShape, acceptance: str) -> Drafter:
        if method not in METHODS:
            raise ConfigError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
        cls = METHODS[method]
        if cls.needs_draft_model and "draft" not in self._models:
            raise ConfigError(f"method {method!r} needs a draft model and this bundle has none")
        if getattr(cls, "needs_medusa", False) and self._heads is None:
            if self.manifest.medusa is None:
                raise ConfigError(f"method {method!r} needs Medusa heads and this bundle has none "
                                  "(specrt export ... --medusa HEADS)")
            self._heads = create_heads(self._backend, self.bundle, self.manifest.medusa.file, self._threads)
        medusa = self.manifest.medusa
        return cls(model=self._models.get("draft"), vocab=self.manifest.target.dims.vocab_size, tree=shape,
                   heads=self._heads, paths=medusa.tree if medusa else [], acceptance=acceptance)

    def stream(self, prompt: str, max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0,
               top_p: float = 1.0, seed: int = 0, method: str = "draft", gamma: int | str = 4,
               stop: Sequence[str] = (), tree: TreeShape | tuple[int, ...] | str = TreeShape(),
               acceptance: str = "exact") -> Iterator[str]:
        """Yield text as it is decided. When the iterator ends, ``self.last_result`` holds the result.

        ``method``: "draft" (chain of ``gamma`` draft-model tokens), "tree" (a draft-model token tree of
        shape ``tree``, children per depth), "medusa" (the bundle's Medusa heads and static tree),
        "ngram" (prompt lookup) or "none" (plain decoding). ``acceptance="typical"`` (Medusa only) is
        LOSSY: faster sampling whose output is not distributed as the target's."""
        return self.stream_ids(self.encode(prompt), max_new_tokens=max_new_tokens, temperature=temperature,
                            top_k=top_k, top_p=top_p, seed=seed, method=method, gamma=gamma, stop=stop, tree=tree,
                            acceptance=acceptance)

    def stream_chat(self, messages: Sequence[Mapping[str, Any]], **kwargs: Any) -> Iterator[str]:
        """Yield the assistant's reply to ``messages`` ([{"role": "system"|"user"|"assistant", "content": str}])
        as it is decided; same keyword arguments as :meth:`stream`. The reply ends at any of the bundle's
        end ids (``eos_token_ids``), e.g. the template's end-of-turn token."""
        return self.stream_ids(self.encode_chat(messages), **kwargs)

    def stream_ids(self, tokens: list[int], max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0,
                   top_p: float = 1.0, seed: int = 0, method: str = "draft", gamma: int | str = 4,
                   stop: Sequence[str] = (), tree: TreeShape | tuple[int, ...] | str = TreeShape(),
                   acceptance: str = "exact") -> Iterator[str]:
        """:meth:`stream` from prompt token ids already encoded (:meth:`encode`, :meth:`encode_chat`), for a
        caller that needs them too (a server counting prompt tokens) without encoding twice."""
        sampling = SamplingConfig(temperature, top_k, top_p)
        gamma = _check_gamma(gamma)
        if max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        shape = (tree if isinstance(tree, TreeShape) else TreeShape.parse(tree) if isinstance(tree, str)
                 else TreeShape(tuple(tree)))
        drafter = self._drafter(method, shape, acceptance)
        if acceptance == "typical" and method != "medusa":
            raise ConfigError("typical acceptance (lossy) applies to --method medusa only")
        stepper = (TreeStepper(typical=acceptance == "typical") if drafter.proposes_trees
                   else ChainStepper(gamma if method != "none" else 0))
        if not tokens:
            raise ConfigError("the prompt is empty and the tokenizer adds no BOS token")
        if len(tokens) + max_new_tokens > self.max_context:
            raise ContextLengthError(f"prompt ({len(tokens)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
                                     f"bundle's max context of {self.max_context}")
        for m in self._models.values():
            m.reset()
        state = DecodeState(tokens=list(tokens), target=self._models["target"], drafter=drafter, sampling=sampling,
                            rng=np.random.default_rng(seed), stats=StatsRecorder(method, gamma, prompt_tokens=len(tokens)))
        tracker = _TextTracker(self.tokenizer, stop)
        stop_ids = frozenset(self.manifest.tokenizer.eos_token_ids)
        finish = "length"
        for chunk in decode(state, max_new_tokens, stepper, stop_ids):
            piece = tracker.push(chunk)
            if piece:
                yield piece
            if tracker.stopped:
                finish = "stop"
                break
        else:
            if state.stats.new_tokens < max_new_tokens:
                finish = "eos"
        tail = tracker.flush()
        if tail:
            yield tail
        state.stats.engine_s = sum(m.forward_s for m in self._models.values())
        state.stats.target_copied_bytes = state.target.copied_bytes
        self.last_result = GenerationResult(tracker.text, tracker.ids, state.stats.finish(), finish)

    def generate(self, prompt: str, **kwargs: Any) -> GenerationResult:
        """Generate in one call; same arguments as :meth:`stream`."""
        return self._drain(self.stream(prompt, **kwargs))

    def chat(self, messages: Sequence[Mapping[str, Any]], **kwargs: Any) -> GenerationResult:
        """The assistant's reply to ``messages`` in one call; same arguments as :meth:`stream_chat`, e.g.
        ``gen.chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]).text``."""
        return self._drain(self.stream_chat(messages, **kwargs))

    def _drain(self, pieces: Iterator[str]) -> GenerationResult:
        for _ in pieces:
            pass
        assert self.last_result is not None
        return self.last_result


def load(bundle: str | Path | None = None, backend: str = "auto", threads: int | None = None,
         low_memory: bool | None = None) -> SpeculativeGenerator:
    """Load a bundle folder; with no path, the demo bundle that ships inside the package."""
    if bundle is None:
        from .. import demo

        bundle = demo.bundle_path()
    return SpeculativeGenerator(bundle, backend=backend, threads=threads, low_memory=low_memory)
