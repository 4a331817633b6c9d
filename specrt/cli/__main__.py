"""``python -m specrt.cli``: the same commands as ``specrt``."""

from . import main

main()
