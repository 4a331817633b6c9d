"""How to decode, as one frozen value: the CLI, ``bench``, ``serve`` and the Python API build a
:class:`DecodeOptions` and the generator reads nothing else."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ConfigError
from .sampling import GREEDY_BELOW, SamplingConfig, is_real
from .tree import DEFAULT_EAGLE_TREE, DynamicTree, TreeShape

MAX_GAMMA = 64
AUTO = "auto"  # the method: the best the bundle holds (SpeculativeGenerator.default_method)
ACCEPTANCE = ("exact", "typical")
MAX_TEMPERATURE = 2.0  # OpenAI's bound, which the server's requests keep too: one rule for every entry point
MAX_SEED = 2**63 - 1  # the server's bound: a seed any client, language or JSON parser can send


def check_temperature(value: Any) -> float:
    """``value`` as a temperature: a number in [0, MAX_TEMPERATURE], below GREEDY_BELOW read as 0 (greedy:
    the softmax there is the argmax's point mass, and 1/T would overflow float32); else a ConfigError."""
    if not is_real(value) or not 0 <= value <= MAX_TEMPERATURE:  # NaN fails the comparison
        raise ConfigError(f"temperature must be a number in [0, {MAX_TEMPERATURE:g}] (0: greedy), got {_shown(value)}")
    return 0.0 if value < GREEDY_BELOW else value


def check_seed(value: Any) -> int:
    """``value`` as a sampling seed: an integer in [0, MAX_SEED]; else a ConfigError."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value <= MAX_SEED:
        raise ConfigError(f"seed must be an integer in [0, 2^63 - 1], got {_shown(value)}")
    return value


def _shown(value: Any) -> str:
    return str(value) if is_real(value) else repr(value)  # inf, -1, '0.5'


@dataclass(frozen=True)
class DecodeOptions:
    """``method``: "auto" (the best the bundle holds), "eagle" (a chain of ``gamma`` tokens from the bundle's
    EAGLE-3 head), "eagle-tree" (EAGLE-2's dynamic tree from that head, shaped by ``eagle_tree``: top-k per
    node, depth, nodes), "draft" (a chain of ``gamma`` draft-model tokens),
    "tree" (a draft-model token tree of shape ``tree``, children per depth), "medusa" (the bundle's Medusa
    heads and static tree), "ngram" (prompt lookup) or "none" (plain decoding). ``gamma``: drafted tokens
    per target pass, or "auto" (adapted from the measured α and c); ``draft_stop``: a chain ends early where
    the drafter's probability of its next token is below it. temperature in [0, 2]: 0 is greedy, as is
    any below 1e-30 (stored as 0); top_k 0 and top_p 1 are off; seed in [0, 2^63 - 1]. ``stop``: strings
    that end the generation. ``acceptance="typical"`` (Medusa only) is LOSSY: faster sampling whose output
    is not distributed as the target's."""

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    method: str = AUTO
    gamma: int | str = 4
    stop: tuple[str, ...] = ()
    tree: TreeShape = field(default_factory=TreeShape)
    acceptance: str = "exact"
    eagle_tree: DynamicTree = DEFAULT_EAGLE_TREE
    # A chain (eagle, draft) stops early once the drafter's own softmax gives its next token less than this
    # (0: never; Hugging Face's assistant_confidence_threshold). The length then depends on q alone: exact.
    draft_stop: float = 0.0
    # Every target pass after the prefill at least two rows (a one-row step feeds the token before again):
    # quantized kernels compute a one-row pass differently from a multi-row one, and any two multi-row
    # passes agree row for row, so greedy speculation then reproduces plain decoding bit for bit on int8 /
    # int4 targets too, for a 2-row pass's cost per plain step (SmolLM2 int8 in the loop: 1.26x a row).
    row_stable: bool = False

    def __post_init__(self) -> None:
        # Accept the spellings callers have (a tree as "2,2,1,1" or widths, one stop string or a list) and
        # store one form, so equal options compare equal.
        tree = self.tree
        if isinstance(tree, str):
            tree = TreeShape.parse(tree)
        elif not isinstance(tree, TreeShape):
            tree = TreeShape(tuple(tree))
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        eagle_tree = self.eagle_tree
        if isinstance(eagle_tree, str):
            eagle_tree = DynamicTree.parse(eagle_tree)
        elif not isinstance(eagle_tree, DynamicTree):
            eagle_tree = DynamicTree(*eagle_tree)
        object.__setattr__(self, "eagle_tree", eagle_tree)
        object.__setattr__(self, "tree", tree)
        object.__setattr__(self, "stop", stop)
        object.__setattr__(self, "temperature", check_temperature(self.temperature))
        SamplingConfig(self.temperature, self.top_k, self.top_p)  # validates them
        check_seed(self.seed)
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, (int, np.integer)) \
                or self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if self.gamma != "auto" and (isinstance(self.gamma, bool) or not isinstance(self.gamma, (int, np.integer))
                                     or not 1 <= self.gamma <= MAX_GAMMA):
            raise ConfigError(f"gamma must be an integer in [1, {MAX_GAMMA}] or 'auto', got {self.gamma!r}")
        if not all(isinstance(s, str) for s in stop):
            raise ConfigError(f"stop must be strings, got {self.stop!r}")
        if isinstance(self.draft_stop, bool) or not isinstance(self.draft_stop, (int, float)) \
                or not 0 <= self.draft_stop < 1:
            raise ConfigError(f"draft_stop must be a probability in [0, 1), got {self.draft_stop!r}")
        if self.acceptance not in ACCEPTANCE:
            raise ConfigError(f"acceptance must be 'exact' or 'typical', got {self.acceptance!r}")
        if self.acceptance == "typical" and self.method != "medusa":
            raise ConfigError("typical acceptance (lossy) applies to --method medusa only")

    @property
    def sampling(self) -> SamplingConfig:
        return SamplingConfig(self.temperature, self.top_k, self.top_p)

    def replace(self, **changes: Any) -> "DecodeOptions":
        """A copy with ``changes``; a misspelt name is a ConfigError naming the known ones, never ignored."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            known = ", ".join(f.name for f in dataclasses.fields(self))
            raise ConfigError(f"unknown decoding option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                              f"known: {known}")
        return dataclasses.replace(self, **changes) if changes else self

    @classmethod
    def of(cls, options: "DecodeOptions | None" = None, **changes: Any) -> "DecodeOptions":
        """``options`` (default: the defaults) with keyword ``changes`` applied: what every API entry point
        takes, so ``gen.generate(p, method="none")`` and ``gen.generate(p, DecodeOptions(method="none"))``
        are the same call."""
        if options is not None and not isinstance(options, DecodeOptions):
            raise ConfigError(f"options must be a DecodeOptions, got {type(options).__name__}")
        return (options or cls()).replace(**changes)

