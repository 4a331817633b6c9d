"""Diagnostics: ``specrt doctor`` (what this machine can run) and ``specrt verify`` (equivalence checks of a
bundle on this backend)."""
