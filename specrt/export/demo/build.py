"""Turn a trained demo pair (``python -m specrt.export.demo.train``) into what ships: fp16 HF checkpoints in
``demo/hf/`` (repo only; exercised by the export tests) with Medusa heads, and the exported bundle in
``specrt/demo/bundle``. ``--eagle-head OUT`` trains the shipped target's EAGLE-3 head alone.

    python -m specrt.export.demo.build --pair DIR   # DIR holds target/, draft/, training.json, MODEL_CARD.md
    python -m specrt.export.demo.build --eagle-head benchmarks/heads/demo-target
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from ...demo import BUNDLE

REPO = Path(__file__).resolve().parents[3]
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

    from ..medusa import WEIGHTS_NAME, MedusaTrainConfig, train_medusa

    out = hf_out / "medusa"
    train_medusa(str(hf_out / "target"), corpus_file, out,
                 MedusaTrainConfig(num_heads=MEDUSA_HEADS, steps=steps, seq_len=seq_len))
    weights = load_file(str(out / WEIGHTS_NAME))
    save_file({k: v.half().contiguous() for k, v in weights.items()}, str(out / WEIGHTS_NAME))
    return out


# The demo's EAGLE-3 head (issue #28): whole training-split files, teacher-forced, plus the target's own
# continuations of short snippets from other training files. The validation split stays unseen.
EAGLE_DOC_BYTES = 1_400_000
EAGLE_PROMPTS = 100
EAGLE_CONFIG = {"steps": 1500, "draft_vocab": None, "num_sequences": 300, "seq_len": 256, "ttt_steps": 4}


def eagle_data(out: Path, doc_bytes: int = EAGLE_DOC_BYTES, num_prompts: int = EAGLE_PROMPTS,
               seed: int = 0) -> list[str]:
    """Write the head's text documents into ``out`` (one file each); return its seed prompts (2-6 lines
    from a random place in another training file). Deterministic for a given corpus and seed."""
    import random

    from . import corpus

    rng = random.Random(seed)
    texts = list(corpus.iter_texts("train"))
    rng.shuffle(texts)
    out.mkdir(parents=True, exist_ok=True)
    used = n = 0
    for text in texts:
        if used > doc_bytes:
            break
        (out / f"{n:04d}.py").write_text(text)
        used, n = used + len(text), n + 1
    prompts = []
    for text in texts[n:n + 4 * num_prompts]:
        lines = text.splitlines(keepends=True)
        if len(lines) < 20:
            continue
        start, k = rng.randrange(0, len(lines) - 10), rng.randint(2, 6)
        snippet = "".join(lines[start:start + k])
        if 20 < len(snippet) < 300:
            prompts.append(snippet)
    return prompts[:num_prompts]


def train_eagle_head(target: Path, out: Path, work: Path, overrides: dict | None = None,
                     doc_bytes: int = EAGLE_DOC_BYTES, num_prompts: int = EAGLE_PROMPTS) -> Path:
    """An EAGLE-3 head for the demo ``target`` checkpoint into ``out`` (fp16, the published layout); its text
    documents are written under ``work``."""
    from ..eagle.train import EagleTrainConfig, train_eagle
    from ..progress import rich_progress

    prompts = eagle_data(work / "eagle_docs", doc_bytes, num_prompts)
    with rich_progress() as progress:
        train_eagle(target, out, EagleTrainConfig(**{**EAGLE_CONFIG, **(overrides or {})}),
                    prompts=prompts, data_files=[work / "eagle_docs"], progress=progress)
    return out


def write_train_split(path: Path, max_bytes: int | None = None) -> Path:
    from . import corpus

    path.write_text("\n".join(corpus.iter_texts("train", max_bytes)))
    return path


# What ships: fp16 graphs. Measured for issue #11 (benchmarks/demo/quantized-demo-cpu.json and this
# session's check): int8 weights (MatMulNBits, accuracy level 4) decode 1.6-2x faster on the CI CPU
# with the same acceptance, but that kernel computes a row differently alone than among several, so
# greedy speculation left plain decoding's tokens at near-ties in 6 of 27 method x prompt cases; the
# row-stable accuracy levels 0/1 were 16-30x slower than level 4. The demo shows exactness first, and
# the float bundle is also what `specrt build` (TensorRT) and GPU backends take.
SHIPPED_DTYPE = "float16"


def export_shipped(hf_out: Path = HF_DIR, bundle_out: Path = BUNDLE, heads: Path | None = None,
                   reporter=None, eagle: Path | None = None) -> None:
    """Export the checkpoints in ``hf_out`` (+ Medusa ``heads``, an EAGLE-3 head ``eagle``) into ``bundle_out``,
    checked against PyTorch."""
    from ..exporter import ExportOptions, export_bundle
    from ..progress import SilentReporter

    # Sources are recorded relative to the repo root (where `--backend torch` and `bench --compare hf`
    # find the checkpoints in a clone), not as this machine's absolute paths.
    rel = lambda p: os.path.relpath(p, REPO)  # noqa: E731
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        export_bundle(rel(hf_out / "target"), rel(hf_out / "draft"), bundle_out,
                      ExportOptions(dtype=SHIPPED_DTYPE, max_context=MAX_CONTEXT, force=True,
                                    medusa=rel(heads) if heads else None, eagle=rel(eagle) if eagle else None),
                      reporter or SilentReporter())
    finally:
        os.chdir(cwd)


def build(pair: Path, hf_out: Path = HF_DIR, bundle_out: Path = BUNDLE, medusa: bool = True,
          medusa_steps: int = MEDUSA_STEPS, corpus_bytes: int | None = None, seq_len: int = 256,
          eagle: bool = False, eagle_overrides: dict | None = None, eagle_doc_bytes: int = EAGLE_DOC_BYTES,
          eagle_prompts: int = EAGLE_PROMPTS) -> None:
    """``eagle``: train an EAGLE-3 head too and ship it in the bundle. Off by default: measured on this CPU
    (docs/performance/demo-eagle3-cpu.md) the head drafts less well and costs more than the distilled
    draft, and a bundle's ``auto`` method would pick the head."""
    from ..progress import RichReporter

    convert_checkpoints(pair, hf_out)
    heads = (train_heads(hf_out, write_train_split(pair / "train_split.txt", corpus_bytes), medusa_steps, seq_len)
             if medusa else None)
    head = (train_eagle_head(hf_out / "target", hf_out / "eagle", pair, eagle_overrides, eagle_doc_bytes,
                             eagle_prompts) if eagle else None)
    export_shipped(hf_out, bundle_out, heads, RichReporter(), eagle=head)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specrt.export.demo.build", description=__doc__.split("\n\n")[0])
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--pair", type=Path, help="output folder of python -m specrt.export.demo.train")
    what.add_argument("--eagle-head", type=Path, metavar="OUT",
                      help="only train an EAGLE-3 head for the shipped target into OUT (what "
                           "benchmarks/heads/demo-target holds; about 75 min on 2 cores)")
    args = p.parse_args(argv)
    if args.eagle_head is not None:
        import tempfile

        with tempfile.TemporaryDirectory() as work:
            train_eagle_head(HF_DIR / "target", args.eagle_head, Path(work))
        return 0
    if not (args.pair / "training.json").is_file():
        p.error(f"{args.pair} holds no trained pair (training.json is missing)")
    build(args.pair)
    return 0


if __name__ == "__main__":
    sys.exit(main())
