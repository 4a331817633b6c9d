"""Turn a trained demo pair (``python -m specrt.demo.train``) into what ships: fp16 HF checkpoints in
``demo/hf/`` (repo only; exercised by the export tests) and the exported bundle in ``specrt/demo/bundle``.

    python -m specrt.demo.build --pair DIR   # DIR holds target/, draft/, training.json, MODEL_CARD.md
"""

from __future__ import annotations

import argparse
import os
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


MEDUSA_HEADS = 3  # deeper heads of a model this small are rarely right: they would cost bytes, not time
MEDUSA_STEPS = 400


def train_heads(hf_out: Path, corpus_file: Path, steps: int = MEDUSA_STEPS, seq_len: int = 256) -> Path:
    """Medusa heads for the demo target on the training split, stored in fp16 next to the checkpoints."""
    from safetensors.torch import load_file, save_file

    from ..export.medusa import WEIGHTS_NAME, MedusaTrainConfig, train_medusa

    out = hf_out / "medusa"
    train_medusa(str(hf_out / "target"), corpus_file, out,
                 MedusaTrainConfig(num_heads=MEDUSA_HEADS, steps=steps, seq_len=seq_len))
    weights = load_file(str(out / WEIGHTS_NAME))
    save_file({k: v.half().contiguous() for k, v in weights.items()}, str(out / WEIGHTS_NAME))
    return out


def write_train_split(path: Path, max_bytes: int | None = None) -> Path:
    from . import corpus

    path.write_text("\n".join(corpus.iter_texts("train", max_bytes)))
    return path


def build(pair: Path, hf_out: Path = HF_DIR, bundle_out: Path = BUNDLE, medusa: bool = True,
          medusa_steps: int = MEDUSA_STEPS, corpus_bytes: int | None = None, seq_len: int = 256) -> None:
    from ..export.bundle import ExportOptions, export_bundle
    from ..progress import RichReporter

    convert_checkpoints(pair, hf_out)
    heads = (train_heads(hf_out, write_train_split(pair / "train_split.txt", corpus_bytes), medusa_steps, seq_len)
             if medusa else None)
    # Sources are recorded relative to the repo root (where `--backend torch` and `bench --compare hf`
    # find the checkpoints in a clone), not as this machine's absolute paths.
    rel = lambda p: os.path.relpath(p, REPO)  # noqa: E731
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        export_bundle(rel(hf_out / "target"), rel(hf_out / "draft"), bundle_out,
                      ExportOptions(dtype="float16", max_context=MAX_CONTEXT, force=True,
                                    medusa=rel(heads) if heads else None), RichReporter())
    finally:
        os.chdir(cwd)


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
