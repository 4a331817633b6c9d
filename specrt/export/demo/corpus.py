"""The demo models' training corpus: this Python's own standard-library ``.py`` sources (PSF licence).

Everything here is deterministic: files are listed in sorted relative-path order, the train/validation split
is a hash of the relative path (so adding or removing a file never moves another one), and
:func:`corpus_record` hashes every byte used so a model card can say exactly what a model was trained on.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal

Split = Literal["train", "val"]

MAX_FILE_BYTES = 200_000  # a few huge generated files (pydoc_data/topics.py) would dominate a 10 MB corpus
VAL_FRACTION = 0.03
# Test suites are mostly fixtures and odd edge cases, idlelib is a GUI app, site-packages is not the stdlib.
EXCLUDED_DIRS = frozenset({"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__"})
LICENCE = "PSF-2.0"
_HASH_BUCKETS = 10_000


@dataclass(frozen=True)
class CorpusFile:
    rel: str  # POSIX path relative to the stdlib root: the file's identity for sorting, splitting and hashing
    path: Path
    size: int


@dataclass(frozen=True)
class CorpusRecord:
    """What a training run used, for training.json and the model card."""

    python_version: str
    files: int
    bytes: int
    sha256: str  # over (relative path, length, contents) of every file used, in sorted order
    train_files: int
    train_bytes: int
    val_files: int
    val_bytes: int
    val_fraction: float
    max_bytes: int | None
    source: str = "CPython standard library .py sources (test suites, idlelib and build files excluded)"
    licence: str = LICENCE


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_excluded(rel: str) -> bool:
    """True for files outside the corpus; ``rel`` is a POSIX path relative to the stdlib root."""
    parts = rel.split("/")
    if any(part in EXCLUDED_DIRS for part in parts[:-1]):
        return True
    # config-3.x-<platform>/ and _sysconfigdata_*.py describe how this interpreter was built, not Python code
    # anyone wrote, and differ between builds of the same version.
    if parts[0].startswith("config-") or parts[-1].startswith("_sysconfigdata_"):
        return True
    return not parts[-1].endswith(".py")


def list_files(root: Path | None = None) -> list[CorpusFile]:
    """Every corpus file under ``root`` (default: this interpreter's stdlib), sorted by relative path."""
    root = root or stdlib_root()
    found = []
    for folder, dirs, names in os.walk(root):  # followlinks=False: a symlinked tree is not part of the stdlib
        dirs[:] = [d for d in dirs if d not in EXCLUDED_DIRS]
        for name in names:
            path = Path(folder) / name
            rel = path.relative_to(root).as_posix()
            if is_excluded(rel) or path.is_symlink() or not path.is_file():
                continue
            size = path.stat().st_size
            if size <= MAX_FILE_BYTES:
                found.append(CorpusFile(rel, path, size))
    return sorted(found, key=lambda f: f.rel)


def is_val(rel: str, val_fraction: float = VAL_FRACTION) -> bool:
    """Hash-based split: the same path lands in the same split on every machine and every Python version."""
    bucket = int.from_bytes(hashlib.sha1(rel.encode("utf-8")).digest()[:8], "big") % _HASH_BUCKETS
    return bucket < round(val_fraction * _HASH_BUCKETS)


def split_files(files: list[CorpusFile],
                val_fraction: float = VAL_FRACTION) -> tuple[list[CorpusFile], list[CorpusFile]]:
    """(train, val), each keeping the input order."""
    train = [f for f in files if not is_val(f.rel, val_fraction)]
    val = [f for f in files if is_val(f.rel, val_fraction)]
    return train, val


def _take_bytes(files: list[CorpusFile], max_bytes: int | None) -> list[CorpusFile]:
    """A prefix of ``files`` holding at most ``max_bytes`` (and at least one file), for tiny runs."""
    if max_bytes is None:
        return files
    taken, total = [], 0
    for f in files:
        if taken and total + f.size > max_bytes:
            break
        taken.append(f)
        total += f.size
    return taken


def select(split: Split, max_bytes: int | None = None, val_fraction: float = VAL_FRACTION,
           root: Path | None = None) -> list[CorpusFile]:
    """The files of one split, optionally cut to a byte budget (the same budget applies to each split)."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    train, val = split_files(list_files(root), val_fraction)
    return _take_bytes(train if split == "train" else val, max_bytes)


def read_text(f: CorpusFile) -> str:
    # PEP 3120: stdlib sources are UTF-8; "replace" only guards against a broken install, and the record
    # hashes the raw bytes either way.
    return f.path.read_bytes().decode("utf-8", errors="replace")


def iter_texts(split: Split, max_bytes: int | None = None, val_fraction: float = VAL_FRACTION,
               root: Path | None = None) -> Iterator[str]:
    """The texts of one split's files, in sorted path order."""
    for f in select(split, max_bytes, val_fraction, root):
        yield read_text(f)


def corpus_record(max_bytes: int | None = None, val_fraction: float = VAL_FRACTION,
                  root: Path | None = None) -> CorpusRecord:
    """Counts and a sha256 of exactly the files that :func:`iter_texts` yields for both splits."""
    train = select("train", max_bytes, val_fraction, root)
    val = select("val", max_bytes, val_fraction, root)
    digest = hashlib.sha256()
    for f in sorted(train + val, key=lambda f: f.rel):
        data = f.path.read_bytes()
        # Length-prefixed so that no two different corpora can produce the same byte stream.
        digest.update(f"{f.rel}\0{len(data)}\0".encode("utf-8"))
        digest.update(data)
    train_bytes, val_bytes = sum(f.size for f in train), sum(f.size for f in val)
    return CorpusRecord(python_version=platform.python_version(), files=len(train) + len(val),
                        bytes=train_bytes + val_bytes, sha256=digest.hexdigest(), train_files=len(train),
                        train_bytes=train_bytes, val_files=len(val), val_bytes=val_bytes,
                        val_fraction=val_fraction, max_bytes=max_bytes)
