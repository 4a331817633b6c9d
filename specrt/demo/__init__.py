"""The demo target/draft bundle shipped with specrt (see docs/demo.md once it is built)."""

from __future__ import annotations

from pathlib import Path

from ..errors import BundleError

BUNDLE = Path(__file__).parent / "bundle"


def bundle_path() -> Path:
    if not (BUNDLE / "specrt.json").is_file():
        raise BundleError("this specrt install has no demo bundle; pass a bundle folder made by `specrt export`")
    return BUNDLE
