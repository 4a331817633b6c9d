"""A manifest's fields read with their types and ranges checked, and the checks that relate one field to another.

A bundle is shared, so its ``specrt.json`` is input like any request: a field of the wrong type or out of range is
refused in one line naming it (a :class:`~specrt.errors.BundleError`), never left to become a traceback later
(``int(Infinity)``, ``"x".items()``) or, worse, something else that runs: ``eos_token_ids: "1"`` iterated as
characters stops nothing, ``bos_token_id: -7`` reads the embedding from its end.
"""

from __future__ import annotations

import math
from typing import Any, NoReturn

from ..errors import BundleError

# Bundles from older exports leave optional fields out; _REQUIRED marks those that every version wrote.
_REQUIRED = object()
ROLES = ("target", "draft", "eagle", "dflash")  # the generator makes a session per role: no role it does not know
ROLE_KINDS = {"eagle": "eagle3", "dflash": "dflash"}  # each role's graph kind (contract.KINDS); the rest: decoders
GRAPHS = ("portable", "fused", "gqa", "gqa-static")  # contract.GQA_GRAPH, GQA_STATIC_GRAPH
MAX_MEDUSA_NODES = 64  # runtime.tree.MAX_TREE_NODES: export's choose_tree never makes more
MAX_MEDUSA_HEADS = 64
MAX_INT64 = 2**63 - 1
_TYPES = {bool: "true/false", int: "an integer", float: "a number", str: "a string", list: "a list", tuple: "a list",
          dict: "an object", type(None): "null"}


def shown(value: Any) -> str:
    """``value`` as the message quotes it: short, whatever a hostile manifest holds."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _kind(value: Any) -> str:
    return _TYPES.get(type(value), type(value).__name__)


def _span(lo: int, hi: int) -> str:
    return f">= {lo}" if hi == MAX_INT64 else f"in [{lo}, {hi}]"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def finite(value: Any) -> bool:
    """A JSON number that is one: not true/false, not NaN or infinite (Python's json reads NaN and Infinity)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class Fields:
    """One JSON object of the manifest (``where``: its path, e.g. ``models.target.dims``); each reader returns a
    field of the declared type and range, or raises a one-line BundleError naming ``where.key``."""

    def __init__(self, raw: Any, where: str) -> None:
        if not isinstance(raw, dict):
            raise BundleError(f"the manifest's {where} must be an object, got {shown(raw)} ({_kind(raw)})")
        self.raw, self.where = raw, where

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def refuse(self, key: str, want: str, value: Any) -> NoReturn:
        raise BundleError(f"the manifest's {self.path(key)} must be {want}, got {shown(value)} ({_kind(value)})")

    def _get(self, key: str, default: Any) -> Any:
        if key in self.raw:
            return self.raw[key]
        if default is _REQUIRED:
            owner = f"the manifest's {self.where}" if self.where else "the manifest"
            raise BundleError(f"{owner} has no {key!r}")
        return default

    def integer(self, key: str, lo: int = 0, hi: int = MAX_INT64, default: Any = _REQUIRED) -> int:
        value = self._get(key, default)
        if not _is_int(value):
            self.refuse(key, f"an integer {_span(lo, hi)}", value)
        if not lo <= value <= hi:
            raise BundleError(f"the manifest's {self.path(key)} = {value} is not {_span(lo, hi)}: refused as "
                              "corrupt or hostile")
        return value

    def optional_integer(self, key: str, lo: int = 0, hi: int = MAX_INT64) -> int | None:
        return None if self.raw.get(key) is None else self.integer(key, lo, hi)

    def number(self, key: str, lo: float = -math.inf, default: Any = _REQUIRED) -> float:
        value = self._get(key, default)
        if not (finite(value) and value >= lo):
            self.refuse(key, "a finite number" + (f" >= {lo:g}" if lo > -math.inf else ""), value)
        return float(value)

    def boolean(self, key: str, default: Any = _REQUIRED) -> bool:
        value = self._get(key, default)
        if not isinstance(value, bool):
            self.refuse(key, "true or false", value)
        return value

    def string(self, key: str, default: Any = _REQUIRED, choices: tuple[str, ...] | None = None) -> str:
        value = self._get(key, default)
        if not isinstance(value, str) or (choices is not None and value not in choices):
            self.refuse(key, "one of " + ", ".join(map(repr, choices)) if choices else "a string", value)
        return value

    def optional_string(self, key: str) -> str | None:
        return None if self.raw.get(key) is None else self.string(key)

    def integers(self, key: str, lo: int = 0, hi: int = MAX_INT64, default: Any = _REQUIRED) -> tuple[int, ...]:
        value = self._get(key, default)
        if not isinstance(value, (list, tuple)) or not all(_is_int(v) and lo <= v <= hi for v in value):
            self.refuse(key, f"a list of integers {_span(lo, hi)}", value)
        return tuple(value)

    def strings(self, key: str, default: Any = _REQUIRED) -> tuple[str, ...]:
        value = self._get(key, default)
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            self.refuse(key, "a list of strings", value)
        return tuple(value)

    def mapping(self, key: str, default: Any = _REQUIRED) -> dict[str, Any]:
        value = self._get(key, default)
        if not isinstance(value, dict):
            self.refuse(key, "an object", value)
        return value

    def optional_mapping(self, key: str) -> dict[str, Any] | None:
        return None if self.raw.get(key) is None else self.mapping(key)

    def text_map(self, key: str, default: Any = _REQUIRED) -> dict[str, str]:
        value = self.mapping(key, default)
        if not all(isinstance(v, str) for v in value.values()):
            self.refuse(key, "an object of strings", value)
        return dict(value)

    def nested(self, key: str, default: Any = _REQUIRED) -> "Fields":
        return Fields(self._get(key, default), self.path(key))

    def figures(self, key: str) -> dict[str, float]:
        """Named parity figures ({"rel": .., "kl": ..}); a bare number (bundles before the relative criterion) is
        the max |diff|."""
        value = self._get(key, {})
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return {"abs": self.number(key)}
        inner = self.nested(key, {})
        return {name: inner.number(name) for name in inner.raw}


def check_ids(manifest: Any) -> None:
    """Every token id the manifest names (BOS, end ids, the golden prompt and its top ids) addresses the target's
    logits: [0, vocab). A negative id would index the embedding from its end, a larger one fail inside a graph."""
    vocab = manifest.target.dims.vocab_size
    tok = manifest.tokenizer
    named = [("tokenizer.bos_token_id", tok.bos_token_id)] if tok.bos_token_id is not None else []
    named += [("tokenizer.eos_token_ids", i) for i in tok.eos_token_ids]
    for where, token in named:
        if not 0 <= token < vocab:
            raise BundleError(f"the manifest's {where} names id {token}, outside the target's vocabulary [0, {vocab})")
    for role, entry in manifest.models.items():
        if entry.golden is not None:
            _check_golden(entry.golden, f"models.{role}.golden", entry.dims.vocab_size)


def _check_golden(golden: dict[str, Any], where: str, vocab: int) -> None:
    """The reference logits `specrt verify` compares against: a prompt of ids, and per position top ids and
    logits of one shape (and a scale per position, in bundles since the relative criterion)."""
    g = Fields(golden, where)
    rows = len(g.integers("input_ids", 0, vocab - 1))
    top_ids, top_logits = golden.get("top_ids"), golden.get("top_logits")
    for key, value, ok, what in (("top_ids", top_ids, lambda v: _is_int(v) and 0 <= v < vocab, f"ids in [0, {vocab})"),
                                 ("top_logits", top_logits, finite, "finite numbers")):
        if not (_table(value, rows) and all(ok(v) for row in value for v in row)):
            g.refuse(key, f"{rows} rows of {what}, all of one length", value)
    if rows and len(top_ids[0]) != len(top_logits[0]):
        g.refuse("top_logits", "as many values per row as top_ids has ids", top_logits)
    scale = golden.get("scale")
    if scale is not None and not (isinstance(scale, list) and len(scale) == rows and all(map(finite, scale))):
        g.refuse("scale", f"{rows} finite numbers", scale)


def _table(value: Any, rows: int) -> bool:
    """Whether ``value`` is ``rows`` lists of one length."""
    return (isinstance(value, list) and len(value) == rows and all(isinstance(r, list) for r in value)
            and len({len(r) for r in value}) <= 1)


def check_medusa_tree(medusa: Any) -> None:
    """The static tree is paths of candidate ranks in level order: each rank below ``topk``, each path no deeper
    than the heads, its parent listed before it, no path twice, at most :data:`MAX_MEDUSA_NODES` nodes."""
    tree = medusa.tree
    if not isinstance(tree, list) or not 1 <= len(tree) <= MAX_MEDUSA_NODES:
        raise BundleError(f"the manifest's medusa.tree must list 1 to {MAX_MEDUSA_NODES} paths, got {shown(tree)}")
    seen: set[tuple[int, ...]] = set()
    for path in tree:
        if (not isinstance(path, list) or not 1 <= len(path) <= medusa.num_heads
                or not all(_is_int(r) and 0 <= r < medusa.topk for r in path)):
            raise BundleError(f"the manifest's medusa.tree holds {shown(path)}: a path is 1 to {medusa.num_heads} "
                              f"candidate ranks in [0, {medusa.topk})")
        key = tuple(path)
        if key in seen or (len(key) > 1 and key[:-1] not in seen):
            raise BundleError(f"the manifest's medusa.tree lists {list(key)} "
                              f"{'twice' if key in seen else 'before its parent'}: paths come in level order, once")
        seen.add(key)
