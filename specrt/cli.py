"""The ``specrt`` command line: parse, call the library, print. Domain errors become one-line messages."""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable

import click

from . import __version__
from .errors import SpecrtError


def _domain_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a SpecrtError into click's one-line 'Error: ...' and exit code 1, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SpecrtError as e:
            raise click.ClickException(str(e)) from None
        except KeyboardInterrupt:
            raise click.Abort() from None

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="specrt")
def main() -> None:
    """specrt: lossless speculative decoding, exported to ONNX and run on a lean runtime.

    \b
    Typical session:
      specrt export ./target --draft ./draft -o bundle     # HF models -> checked ONNX bundle
      specrt run "def fib(n):" --bundle bundle --stats     # stream text, show alpha and speedup
    """


@main.command()
@click.argument("model")
@click.option("--draft", "draft", metavar="DRAFT", help="Draft model (folder or hub id) with the same tokenizer.")
@click.option("-o", "--output", "output", required=True, type=click.Path(file_okay=False),
              help="Bundle folder to create.")
@click.option("--dtype", type=click.Choice(["fp32", "fp16"]), default="fp32", show_default=True,
              help="Weight and KV-cache precision of the exported graphs.")
@click.option("--opset", type=int, default=18, show_default=True, help="ONNX opset version.")
@click.option("--max-context", type=int, default=None,
              help="Positions the runtime's KV cache holds [default: the models' limit, at most 4096].")
@click.option("--exporter", type=click.Choice(["dynamo", "torchscript"]), default="dynamo", show_default=True,
              help="torch.onnx exporter: dynamo gives leaner graphs; torchscript traces faster.")
@click.option("--force", is_flag=True, help="Replace a non-empty output folder.")
@_domain_errors
def export(model: str, draft: str | None, output: str, dtype: str, opset: int, max_context: int | None,
           exporter: str, force: bool) -> None:
    """Export MODEL (and --draft) to an ONNX bundle with explicit KV-cache I/O.

    MODEL and DRAFT are local Hugging Face folders or hub ids. Supported architectures:
    llama, mistral, qwen2, gpt2. Every graph is checked against PyTorch (prefill, 1-token decode,
    a 5-token chain and a tree) before the bundle appears; the figures go into specrt.json.

    \b
    Example:
      specrt export ./llama-1b --draft ./llama-68m -o bundle --dtype fp16
    """
    try:
        from .export.bundle import ExportOptions, export_bundle
    except ImportError as e:
        raise click.ClickException(f"export needs the export extra ({e.name} is missing): "
                                   "pip install torch==2.13.0 && pip install 'specrt[export]'") from None
    from .progress import RichReporter

    options = ExportOptions(dtype={"fp32": "float32", "fp16": "float16"}[dtype], opset=opset,
                            max_context=max_context, exporter=exporter, force=force)
    manifest = export_bundle(model, draft, output, options, RichReporter())
    for role, entry in manifest.models.items():
        worst = max(entry.parity.values())
        click.echo(f"{role}: {entry.architecture}, {entry.dims.num_layers} layers, max |ORT - PyTorch| = "
                   f"{worst:.2e} (tolerance {entry.parity_tolerance:g})")
    click.echo(f"done: {output} (max context {manifest.max_context})")


if __name__ == "__main__":
    sys.exit(main())
