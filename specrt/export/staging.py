"""Where export-side commands write: a private folder beside the output, renamed into place only when
every step passed, so a failure never leaves a half-written bundle. Torch-free."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from ..errors import BundleError, OutputPathError


def check_output(out: Path, force: bool) -> None:
    """Refuse an output that is a file, a non-empty folder without ``force``, or an unwritable place."""
    if out.exists() and not out.is_dir():
        raise OutputPathError(f"output {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise OutputPathError(f"output folder {out} is not empty; pass --force to replace it")
    parent = out.resolve().parent
    if not parent.is_dir():
        raise OutputPathError(f"cannot create {out}: parent folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputPathError(f"cannot write to {parent}: permission denied")


def staging_folder(out: Path) -> Path:
    """A private folder beside ``out`` (same file system, so publishing is one rename)."""
    try:
        return Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.resolve().parent))
    except OSError as e:
        raise OutputPathError(f"cannot write to {out.resolve().parent}: {e.strerror}") from None


def ordinary_mode(path: Path, base: int = 0o666) -> None:
    """Give ``path`` the mode the user's umask gives new files (``base`` 0o777 for a folder): safetensors writes its
    files private (0600) and mkdtemp its folders, but a head, a draft or a bundle is ordinary, for others to read."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, base & ~umask)


def write_weights(folder: Path, tensors: dict, weights_name: str, config_text: str, config_name: str) -> None:
    """``tensors`` as ``weights_name`` (safetensors) and ``config_text`` as ``config_name`` in ``folder`` (made):
    each lands by rename, so a failure leaves no half-written file, and with the umask's mode. Raises OSError."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tmp_weights, tmp_config = folder / (weights_name + ".tmp"), folder / (config_name + ".tmp")
    save_file(tensors, str(tmp_weights), metadata={"format": "pt"})
    ordinary_mode(tmp_weights)
    tmp_config.write_text(config_text)
    os.replace(tmp_weights, folder / weights_name)
    os.replace(tmp_config, folder / config_name)


def publish(tmp: Path, out: Path) -> None:
    """Make the filled staging folder ``out``, replacing what was there."""
    ordinary_mode(tmp, 0o777)  # mkdtemp made it private
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)


@contextlib.contextmanager
def staged(out: Path, force: bool) -> Iterator[Path]:
    """Yield a private folder to fill; on success it replaces ``out``, on any error it is removed."""
    check_output(out, force)
    tmp = staging_folder(out)
    try:
        yield tmp
        publish(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_graph(path: Path):
    """An ONNX graph with its external weights, or a one-line BundleError where onnx refuses them: a weights
    file with several hard links (``cp -al`` copies; onnx suspects a hard-link attack), one a symlink leads
    to outside the bundle, or one that is missing."""
    import onnx

    try:
        return onnx.load(str(path))
    except (onnx.checker.ValidationError, OSError) as e:
        raise BundleError(f"cannot read {path.name}'s weights: {str(e).splitlines()[0]} (copy the bundle's files "
                          "instead of linking them)") from None


def save_graph(model, out: Path) -> None:
    """Write an ONNX ``model`` to ``out``, its weights in ``<out>.data`` when the file would pass protobuf's 2 GB
    limit (past which protobuf cannot even size the message: an int8 graph of a 1B model with its float
    embedding table)."""
    import onnx
    from google.protobuf.message import EncodeError

    try:
        large = model.ByteSize() > 1_800_000_000
    except EncodeError:
        large = True
    onnx.save_model(model, str(out), save_as_external_data=large, location=out.name + ".data")
