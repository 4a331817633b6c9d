"""Fuzzing bundles (hypothesis): any mutation of a valid bundle's manifest or layout either loads and decodes the
same tokens as the original, or is refused with one SpecrtError line. Never another exception (hypothesis then
shows the traceback), never a refusal only the catch-all in load_manifest names ("is corrupt: KeyError ..."), and
never a file opened outside the bundle's copy: Python's opens are recorded with an audit hook, ONNX Runtime's
(C++, not audited) by wrapping its InferenceSession.

Bounded for the suite: a few dozen examples per property, each a hard-linked copy of a tiny bundle loaded in
~0.02 s (the llama pair) or ~0.3 s (the shipped demo bundle, whose manifest has Medusa heads and older fields).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

import onnxruntime
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specrt
from specrt import demo
from specrt.bundle import safety
from specrt.errors import SpecrtError

PROMPT, NEW_TOKENS = "hello x", 6
RUNS = {"llama": {"method": "draft", "gamma": 3}, "demo": {"method": "medusa"}}  # greedy: any drafter, same tokens
# Fields whose valid changes change the prompt or where it stops: there a load must still decode, in range.
SEMANTIC = {("tokenizer", "bos_token_id"), ("tokenizer", "add_bos_token"), ("tokenizer", "eos_token_ids")}
SETTINGS = settings(max_examples=40, deadline=timedelta(seconds=20), database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

OPENED: list[str] = []  # real paths opened from Python while WATCHING holds an entry
WATCHING: list[bool] = []


def _audit(event: str, args: tuple) -> None:
    if WATCHING and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        OPENED.append(os.path.realpath(args[0]))


sys.addaudithook(_audit)  # for good (hooks cannot be removed): it records only while a test watches


class _RecordedSession(onnxruntime.InferenceSession):
    def __init__(self, path_or_bytes, *args, **kwargs):
        if isinstance(path_or_bytes, (str, os.PathLike)):
            OPENED.append(os.path.realpath(path_or_bytes))
        super().__init__(path_or_bytes, *args, **kwargs)


# Python's own files (a module imported lazily on an error path), and what the machine tells about itself
_ALLOWED = tuple({sys.prefix, sys.base_prefix, str(Path(specrt.__file__).parent), "/proc/", "/sys/"})


def _outside(bundle: Path) -> list[str]:
    """What was opened outside the bundle, Python's files, /proc and specrt's cache (verify costs it measured)."""
    allowed = (str(bundle.resolve()) + os.sep, str(safety.cache_dir().resolve()) + os.sep) + _ALLOWED
    return sorted({p for p in OPENED if not p.startswith(allowed)})


def _link_copy(src: Path, dst: Path) -> Path:
    """``src`` copied with its files hard-linked (the demo's graphs are 67 MB): a mutation replaces a file, never
    writes through a link into the fixture."""
    def link(a, b):
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    shutil.copytree(src, dst, copy_function=link, symlinks=True)
    return dst


def _replace(path: Path, data: str | bytes) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    path.write_bytes(data.encode() if isinstance(data, str) else data)


def _decode(bundle: Path, run: dict) -> list[int] | SpecrtError:
    """The greedy tokens the bundle decodes, or the SpecrtError it is refused with; any other exception escapes.
    Every file opened on the way is recorded."""
    OPENED.clear()
    WATCHING.append(True)
    try:
        with pytest.MonkeyPatch.context() as m:
            m.setattr(onnxruntime, "InferenceSession", _RecordedSession)
            gen = specrt.load(bundle, threads=1)
            return gen.generate(PROMPT, max_new_tokens=NEW_TOKENS, temperature=0, **run).token_ids
    except SpecrtError as e:
        return e
    finally:
        WATCHING.clear()


@pytest.fixture(scope="module")
def originals(llama_bundle) -> dict[str, tuple[Path, dict, list[int]]]:
    """Each source bundle, its manifest and the tokens it decodes (the first load also imports what loading
    imports lazily, before any file is watched)."""
    found = {}
    for name, path in (("llama", llama_bundle), ("demo", demo.bundle_path())):
        tokens = _decode(path, RUNS[name])
        assert isinstance(tokens, list) and len(tokens) == NEW_TOKENS, tokens
        found[name] = (path, json.loads((path / "specrt.json").read_text()), tokens)
    return found


def _paths(node, prefix: tuple = ()) -> list[tuple]:
    """Every key path of the manifest: all object keys, and of a list its first, second and last items (golden
    logits and accuracies would otherwise be most of what gets drawn)."""
    found = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for i in sorted({0, 1, len(node) - 1} & set(range(len(node)))):
            found += _paths(node[i], prefix + (i,))
    return found


NAMES = ["", ".", "..", "/", "../specrt.json", "../../outside/secret.json", "/etc/passwd", "target.onnx",
         "draft.onnx", "medusa.onnx", "tokenizer.json", "specrt.json", "engines/../../x.engine", "a\x00b", "C:\\x",
         "~/x", "nested/../tokenizer.json", "missing.onnx"]
VALUES = st.one_of(
    st.sampled_from([None, True, False, 0, 1, -1, -7, 2, 3, 8, 10, 64, 255, 256, 335, 336, 352, 4096, 2**31, 2**63,
                     -(2**63), 10**30, 0.5, 100.5, 1e308, float("nan"), float("inf"), float("-inf"), "1", "x",
                     "float16", "float32", "gqa", "fused", "portable", "eagle3", "decoder", [], [1], [0, 1], ["x"],
                     [[0]], [[0, 0]], {}, {"file": "x"}, {"file": "../x"}, {"x": 1}]),
    st.sampled_from(NAMES), st.integers(), st.floats(), st.text(max_size=6),
    st.lists(st.integers(-3, 400), max_size=4))
MUTATION = st.one_of(st.tuples(st.just("drop")), st.tuples(st.just("set"), VALUES),
                     st.tuples(st.just("add"), st.sampled_from(["x", "file", "dims", "eagle", "helper"]), VALUES))


def _at(manifest: dict, path: tuple):
    node = manifest
    for key in path:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            return None
    return node


def _apply(manifest: dict, path: tuple, mutation: tuple) -> None:
    """One mutation at ``path``; skipped where an earlier one removed or retyped what the path walks through."""
    node = manifest
    for key in path[:-1]:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            return
    key = path[-1]
    if not isinstance(node, (dict, list)):
        return
    if isinstance(node, list) and (not isinstance(key, int) or key >= len(node)):
        return
    if isinstance(node, dict) and key not in node and mutation[0] != "set":
        return
    if mutation[0] == "drop":
        del node[key]
    elif mutation[0] == "set":
        node[key] = mutation[1]
    elif mutation[0] == "copy":  # another part of the same manifest: a valid value in the wrong place
        node[key] = json.loads(json.dumps(_at(manifest, mutation[1])))
    elif isinstance(node[key], dict):
        node[key][mutation[1]] = mutation[2]


def _check(bundle: Path, run: dict, expected: list[int], touched_semantic: bool, vocab: int) -> None:
    outcome = _decode(bundle, run)
    assert not _outside(bundle), f"opened outside the bundle: {_outside(bundle)}"
    if isinstance(outcome, SpecrtError):
        message = str(outcome)
        assert message and "\n" not in message, repr(message)
        assert "is corrupt:" not in message, f"a field no check names: {message}"
    elif touched_semantic:
        assert all(0 <= t < vocab for t in outcome), outcome
    else:
        assert outcome == expected


@pytest.mark.parametrize("name", list(RUNS))
@SETTINGS
@given(data=st.data())
def test_a_mutated_manifest_decodes_the_same_or_is_refused_in_one_line(originals, name, data):
    source, manifest, expected = originals[name]
    paths = _paths(manifest)
    copy = st.tuples(st.just("copy"), st.sampled_from(paths))
    mutations = data.draw(st.lists(st.tuples(st.sampled_from(paths), MUTATION | copy), min_size=1, max_size=3))
    changed = json.loads(json.dumps(manifest))
    for path, mutation in mutations:
        _apply(changed, path, mutation)
    with tempfile.TemporaryDirectory() as tmp:
        bundle = _link_copy(source, Path(tmp) / "bundle")
        _replace(bundle / "specrt.json", json.dumps(changed))  # NaN and Infinity as JSON's extension writes them
        touched = any(path[:2] in SEMANTIC for path, _ in mutations)
        _check(bundle, RUNS[name], expected, touched, manifest["models"]["target"]["dims"]["vocab_size"])


def _secret_copy(bundle: Path, name: str) -> Path:
    """A working copy of the bundle's ``name`` outside it: a loader that followed a link out would run on it."""
    secret = bundle.parent / "outside" / name
    secret.parent.mkdir(exist_ok=True)
    if not secret.exists():
        shutil.copy2(bundle / name, secret)
    return secret


def _relink(bundle: Path, name: str, how: str, depth: int) -> None:
    path = bundle / name
    if how == "remove":
        path.unlink()
    elif how == "folder":
        path.unlink()
        path.mkdir()
    elif how in ("empty", "garbage", "half"):
        data = path.read_bytes()
        _replace(path, b"" if how == "empty" else os.urandom(64) if how == "garbage" else data[: len(data) // 2])
    elif how == "link out":
        secret = _secret_copy(bundle, name)
        path.unlink()
        path.symlink_to(secret)
    elif how == "link inside":
        path.rename(bundle / f"moved-{name}")
        path.symlink_to(f"moved-{name}")
    elif how == "link out deep":
        folder = bundle.joinpath(*[f"d{i}" for i in range(depth)])
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"escape-{name}").symlink_to(_secret_copy(bundle, name).parent)


LAYOUT = st.tuples(st.sampled_from(["specrt.json", "tokenizer.json", "target.onnx", "draft.onnx", "medusa.onnx"]),
                   st.sampled_from(["remove", "folder", "empty", "garbage", "half", "link out", "link inside",
                                    "link out deep"]),
                   st.integers(0, 4))


@pytest.mark.parametrize("name", list(RUNS))
@SETTINGS
@given(changes=st.lists(LAYOUT, min_size=1, max_size=2, unique_by=lambda c: c[0]))
def test_a_mutated_layout_decodes_the_same_or_is_refused_in_one_line(originals, name, changes):
    source, manifest, expected = originals[name]
    with tempfile.TemporaryDirectory() as tmp:
        bundle = _link_copy(source, Path(tmp) / "bundle")
        for file, how, depth in changes:
            if (bundle / file).is_file():
                _relink(bundle, file, how, depth)
        _check(bundle, RUNS[name], expected, False, 0)
