"""Write the API names a TensorRT Python bindings wheel exports, for the CPU tests' TensorRT stand-ins.

    python scripts/trt_api_names.py "tensorrt-cu12-bindings==10.13.*" "tensorrt-cu13-bindings==11.4.*"

TensorRT cannot be installed on machines without NVIDIA's index, but its bindings wheels (~1.3 MB) can
be downloaded from PyPI. Their ``tensorrt.so`` is a pybind11 module whose class, method and enum
member names, and the docstrings it registers with them, are plain strings in the binary. For each
wheel this writes ``tests/data/tensorrt-api/<version>.txt``: every identifier-shaped string (the
linker may merge a name into the tail of a longer one, so tests also accept a suffix) and the
one-line member docstrings (e.g. "Enable FP16 layer selection.", which says BuilderFlag.FP16 exists).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "tensorrt-api"
IDENTIFIER = re.compile(rb"^[A-Za-z_][A-Za-z0-9_]{1,63}$")
MEMBER_DOC = re.compile(rb"^Enable [A-Za-z0-9 ]{2,40}\.$")


def strings(blob: bytes, min_len: int = 2) -> list[bytes]:
    """Runs of printable ASCII, as binutils' ``strings`` finds them."""
    return re.findall(rb"[\x20-\x7e]{%d,}" % min_len, blob)


def names(wheel: Path) -> tuple[str, list[str]]:
    with zipfile.ZipFile(wheel) as z:
        so = next(n for n in z.namelist() if n.endswith("tensorrt.so"))
        blob = z.read(so)
        meta = next(n for n in z.namelist() if n.endswith("METADATA"))
        version = re.search(rb"^Version: (\S+)$", z.read(meta), re.M).group(1).decode()
    found = {s for s in strings(blob) if IDENTIFIER.match(s) or MEMBER_DOC.match(s)}
    return version, sorted(s.decode() for s in found)


def main(specs: list[str]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for spec in specs:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, spec], check=True)
        for wheel in sorted(Path(tmp).glob("*.whl")):
            version, found = names(wheel)
            path = OUT / f"{version}.txt"
            path.write_text(f"# from {wheel.name} (scripts/trt_api_names.py)\n" + "\n".join(found) + "\n")
            print(f"{path}: {len(found)} names")


if __name__ == "__main__":
    main(sys.argv[1:] or ["tensorrt-cu12-bindings==10.13.*", "tensorrt-cu13-bindings==11.4.*"])
