"""Turn a trained demo pair (``python -m specrt.demo.train``) into what ships: fp16 HF checkpoints in
``demo/hf/`` (repo only; exercised by the export tests) and the exported bundle in ``specrt/demo/bundle``.

    python -m specrt.demo.build --pair DIR   # DIR holds target/, draft/, training.json, MODEL_CARD.md
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from . import BUNDLE

REPO = Path(__file__).resolve().parents[2]
HF_DIR = REPO / "demo" / "hf"
MAX_CONTEXT = 1024  # the models' trained position range


def convert_checkpoints(pair: Path, out: Path) -> None:
    """Re-save target and draft in fp16 (half the bytes; the fp16 export's parity check guards quality)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out.mkdir(parents=True, exist_ok=True)
    for role in ("target", "draft"):
        model = AutoModelForCausalLM.from_pretrained(pair / role, dtype=torch.float16)
        model.save_pretrained(out / role)
        AutoTokenizer.from_pretrained(pair / role).save_pretrained(out / role)
    for name in ("training.json", "MODEL_CARD.md"):
        shutil.copy2(pair / name, out / name)


def build(pair: Path, hf_out: Path = HF_DIR, bundle_out: Path = BUNDLE) -> None:
    from ..export.bundle import ExportOptions, export_bundle
    from ..progress import RichReporter

    convert_checkpoints(pair, hf_out)
    export_bundle(str(hf_out / "target"), str(hf_out / "draft"), bundle_out,
                  ExportOptions(dtype="float16", max_context=MAX_CONTEXT, force=True), RichReporter())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specrt.demo.build", description=__doc__.split("\n\n")[0])
    p.add_argument("--pair", type=Path, required=True, help="output folder of python -m specrt.demo.train")
    args = p.parse_args(argv)
    if not (args.pair / "training.json").is_file():
        p.error(f"{args.pair} holds no trained pair (training.json is missing)")
    build(args.pair)
    return 0


if __name__ == "__main__":
    sys.exit(main())
