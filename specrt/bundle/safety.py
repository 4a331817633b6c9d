"""Bundles are downloaded and shared, so loading one must not read outside it or exhaust the machine.

Every file a manifest names resolves inside the bundle folder (no absolute paths, no ``..``, no symlink
leading out); no symlink in the folder leads out either, at any depth; ONNX external data named inside the
graphs is checked the same way before any session opens them (:mod:`.external_data`: ONNX Runtime confines it
only from ~1.24 on); files are size-checked before they are read;
declared sizes (dims, context) are bounded before anything is allocated from them (:mod:`.validate` reads every
manifest field typed and in range, :mod:`.graph_io` holds the dims to the graphs'). Every refusal is a
one-line :class:`~specrt.errors.BundleError`. TensorRT engines can carry plugin code: the backend loads
only those ``specrt build`` made on this machine (:mod:`specrt.runtime.backends.tensorrt`).
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath, PureWindowsPath

from ..errors import BundleError

MAX_MANIFEST_BYTES = 16 << 20  # golden logits and parity figures: ~100 KB for a 152k vocabulary
MAX_TOKENIZER_BYTES = 256 << 20  # tokenizer.json of a 256k vocabulary: ~35 MB
MAX_TEMPLATE_BYTES = 1 << 20
# Far beyond any model specrt exports, and small enough that no product of them overflows an int64.
MAX_DIM = {"num_layers": 1024, "num_heads": 1024, "num_kv_heads": 1024, "head_dim": 4096, "hidden_size": 1 << 17,
           "vocab_size": 1 << 22}
MAX_CONTEXT = 1 << 21
MAX_BUNDLE_ENTRIES = 10_000  # files and folders scanned for links leading out


def climbs_out(name: str) -> bool:
    """Whether ``name`` leaves the folder it is read in before links are resolved: absolute (POSIX or Windows, a
    drive), or through ``..``. The one test for every path a bundle names: manifest files, graphs' external data."""
    posix, windows = PurePosixPath(name), PureWindowsPath(name)
    return (posix.is_absolute() or windows.is_absolute() or bool(windows.drive)
            or ".." in posix.parts or ".." in windows.parts)


def inside(folder: Path, name: object, what: str) -> Path:
    """``folder / name`` for a file the manifest names; refused unless ``name`` is a relative path that
    stays inside ``folder`` once symlinks are resolved."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise BundleError(f"the manifest's {what} must be a file name inside the bundle, got {name!r}")
    if climbs_out(name):
        raise BundleError(f"the manifest's {what} {name!r} points outside the bundle: bundle files are named by "
                          "relative paths inside its folder")
    path = folder / name
    root = folder.resolve()
    if not path.resolve().is_relative_to(root):
        raise BundleError(f"the manifest's {what} {name!r} is a symlink leading outside the bundle "
                          f"(to {path.resolve()})")
    return path


def no_links_out(folder: Path, max_entries: int = MAX_BUNDLE_ENTRIES) -> None:
    """Refuse a symlink anywhere in ``folder``, at any depth, that leads out; and a folder of more than
    ``max_entries`` files and folders (a bundle holds a dozen), so the scan itself stays bounded."""
    root = folder.resolve()
    stack, seen = [folder], 0
    while stack:
        current = stack.pop()
        try:
            entries = list(os.scandir(current))
        except OSError as e:
            raise BundleError(f"cannot list {current}: {e.strerror}") from None
        seen += len(entries)
        if seen > max_entries:
            raise BundleError(f"bundle {folder} holds more than {max_entries} files and folders; a bundle is a "
                              "manifest, its graphs, tokenizer and engines")
        for entry in entries:
            path = Path(entry.path)
            if entry.is_symlink() and not path.resolve().is_relative_to(root):
                raise BundleError(f"{path.relative_to(folder)} in bundle {folder} is a symlink leading outside it "
                                  f"(to {path.resolve()})")
            if entry.is_dir(follow_symlinks=False):
                stack.append(path)


def checked_size(path: Path, limit: int, what: str) -> int:
    """The size of ``path`` (a regular file), refused above ``limit`` bytes before anything is read."""
    try:
        size = path.stat().st_size
    except OSError as e:
        raise BundleError(f"cannot read the bundle's {what} {path.name}: {e.strerror}") from None
    if not path.is_file():
        raise BundleError(f"the bundle's {what} {path.name} is not a regular file")
    if size > limit:
        raise BundleError(f"the bundle's {what} {path.name} is {size / 2**20:.0f} MiB; a {what} larger than "
                          f"{limit / 2**20:.0f} MiB is refused as corrupt or hostile")
    return size


def kv_cache_bytes(max_context: int, models: list[tuple[object, str]]) -> int:
    """Host bytes of the KV caches of ``models`` ((ModelDims, dtype) each) at ``max_context`` positions."""
    import numpy as np

    return sum(2 * d.num_layers * max_context * d.num_kv_heads * d.head_dim * np.dtype(dt).itemsize
               for d, dt in models)


def fits_in_memory(need: int, what: str) -> None:
    """Refuse to allocate ``need`` bytes on a machine with less physical memory than that."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: nothing to compare with
        return
    if need > total:
        raise BundleError(f"{what} needs {need / 2**30:.1f} GiB and this machine has {total / 2**30:.1f} GiB: "
                          "re-export with a smaller --max-context")


# TensorRT engines can carry plugin code that runs when they are deserialized, so a downloaded bundle's
# engines are not loaded: only those `specrt build` wrote on this machine (their SHA-256 in this registry),
# or any with SPECRT_TRUST_ENGINES=1 set by someone who knows where they came from.
TRUST_ENV = "SPECRT_TRUST_ENGINES"
TRUSTED_ENGINES = "trusted-engines.json"


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all: a reader never sees half a file, and processes writing the
    same file at once (replicas starting together) each leave a complete one."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def cache_dir() -> Path:
    """specrt's per-user cache: $SPECRT_CACHE_DIR, else $XDG_CACHE_HOME/specrt, else ~/.cache/specrt."""
    if os.environ.get("SPECRT_CACHE_DIR"):
        return Path(os.environ["SPECRT_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specrt"


def _sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def _trusted() -> set[str]:
    import json

    path = cache_dir() / TRUSTED_ENGINES
    try:
        return set(json.loads(path.read_text()))
    except FileNotFoundError:
        return set()
    except (OSError, ValueError, TypeError) as e:
        raise BundleError(f"cannot read the trusted-engine registry {path}: {e}") from None


def trust_engine(path: Path) -> None:
    """Record an engine ``specrt build`` just wrote (or found in its cache) as safe to load on this machine."""
    import json

    registry = cache_dir() / TRUSTED_ENGINES
    registry.parent.mkdir(parents=True, exist_ok=True)
    known = _trusted() | {_sha256(Path(path).read_bytes())}
    write_atomic(registry, json.dumps(sorted(known)) + "\n")


def is_trusted(path: Path) -> bool:
    """Whether ``specrt build`` on this machine made the engine at ``path`` (an engine that came with a
    downloaded bundle is rebuilt, not reused, even under the cache key it claims)."""
    return Path(path).is_file() and _sha256(Path(path).read_bytes()) in _trusted()


def trusted_engine_bytes(path: Path) -> bytes:
    """The engine's bytes, refused unless this machine's ``specrt build`` made it or ``SPECRT_TRUST_ENGINES=1``."""
    data = path.read_bytes()
    if os.environ.get(TRUST_ENV) == "1" or _sha256(data) in _trusted():
        return data
    raise BundleError(f"{path.name} was not built on this machine by `specrt build` (TensorRT engines can carry "
                      f"plugin code, so a downloaded one is not loaded): rebuild it with `specrt build --bundle "
                      f"{path.parent.parent}`, or set {TRUST_ENV}=1 if you trust where it came from")
