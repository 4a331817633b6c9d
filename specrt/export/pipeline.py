"""``specrt export`` end to end: Hugging Face models → a checked bundle, quantized on the way when asked.

Importing this module needs no torch (the torch side is imported when the pipeline runs), so callers
can read :data:`INSTALL` on an install without the export extra.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..errors import SpecrtError

if TYPE_CHECKING:
    from ..bundle.manifest import Manifest
    from .bundle import ExportOptions
    from .progress import Reporter
    from .quantize import QuantizeOptions

# The one install line for everything torch-side (export, medusa train, the Hugging Face peers). torch
# first: an unpinned torch resolves to a multi-GB CUDA build.
INSTALL = "pip install torch==2.13.0 && pip install 'specrt[export]'"


def missing_extra(what: str, error: ImportError) -> SpecrtError:
    """The one-line error for ``what`` (a command) when an import of the export extra failed."""
    return SpecrtError(f"{what} needs the export extra ({error.name} is missing): {INSTALL}")


def export_pipeline(model: str, draft: str | None, output: str | Path, options: ExportOptions,
                    quantize: QuantizeOptions | None = None, reporter: Reporter | None = None,
                    progress: Callable[[str], None] | None = None) -> Manifest:
    """Export ``model`` (+ ``draft``) to the bundle ``output``. With ``quantize``, the float bundle is
    written to a hidden folder beside ``output``, quantized into ``output`` and removed: only the
    quantized bundle appears, and a refused output is refused before minutes of export."""
    from .bundle import export_bundle
    from .progress import SilentReporter

    reporter = reporter or SilentReporter()
    if quantize is None:
        return export_bundle(model, draft, output, options, reporter)
    from .quantize import quantize_bundle
    from .staging import check_output

    out = Path(output)
    check_output(out, quantize.force)
    float_dir = Path(tempfile.mkdtemp(prefix=f".{out.name}.float-", dir=out.resolve().parent))
    try:
        export_bundle(model, draft, float_dir / "bundle", options, reporter)
        return quantize_bundle(float_dir / "bundle", out, quantize, progress=progress)
    finally:
        shutil.rmtree(float_dir, ignore_errors=True)


def describe(manifest: Manifest) -> str:
    """What ``specrt export`` prints of a bundle: per model its graph and parity against PyTorch (for a
    quantized bundle, its bits and parity against the float one) and the Medusa tree."""
    if any(e.quantization for e in manifest.models.values()):
        from .quantize import describe as describe_quantized

        return describe_quantized(manifest)
    from ..bundle.parity import describe as describe_parity

    lines = []
    for role, e in manifest.models.items():
        if e.kind == "eagle3":
            what = (f"EAGLE-3 head ({e.graph} graph) reading target layers {', '.join(map(str, e.eagle_taps))}, "
                    f"{e.dims.vocab_size} draft ids")
        else:
            what = f"{e.architecture} ({e.graph} graph), {e.dims.num_layers} layers"
            if e.eagle_taps:
                what += f", eagle_taps from layers {', '.join(map(str, e.eagle_taps))}"
        lines.append(f"{role}: {what}, {describe_parity(e.parity, e.parity_tolerance)}")
    if manifest.medusa:
        md = manifest.medusa
        lines.append(f"medusa: {md.num_heads} heads, tree of {len(md.tree)} nodes, expected "
                     f"{md.expected_accepted:.2f} accepted tokens per pass (+1 from the target)")
    return "\n".join(lines)
