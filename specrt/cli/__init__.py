"""The ``specrt`` command line: parse, call the library, print. Domain errors become one-line messages.

One module per room: ``export`` (make bundles), ``dflash`` (train DFlash drafts), ``run`` (decode), ``measure``
(measure and check); what they share is in ``options``."""

from __future__ import annotations

import logging

import click

from .. import __version__
from .options import Commands


@click.group(cls=Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="specrt")
def main() -> None:
    """specrt: lossless speculative decoding, exported to ONNX and run on a lean runtime.

    \b
    Typical session:
      specrt export ./target --draft ./draft -o bundle     # HF models -> checked ONNX bundle
      specrt run "def fib(n):" --bundle bundle --stats --baseline     # stream text, show alpha and speedup
    """
    from ..runtime.generator import ADVICE_LOGGER

    logging.getLogger(ADVICE_LOGGER).disabled = True  # the commands say it where it matters (run --stats, serve)


# Importing a command module registers its commands on main.
from . import dflash, export, measure, run  # noqa: E402,F401
