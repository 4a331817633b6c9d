"""The one shape every hostile-bundle test checks: refused by the API as one BundleError line, and by `specrt run`
as exit 1 with that line and no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import specrt
from specrt.cli import main
from specrt.errors import BundleError


def assert_refused_in_one_line(bundle: Path, message: str) -> None:
    with pytest.raises(BundleError) as e:
        specrt.load(bundle, threads=1)
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
    res = CliRunner().invoke(main, ["run", "x", "--bundle", str(bundle), "--max-new-tokens", "2"])
    assert res.exit_code == 1 and "Traceback" not in res.output and message in res.output, res.output


def assert_rewrite_refused_unchanged(rewrite, model, dims, match: str) -> None:
    """A graph rewrite (export/graph/gqa*.py) that refuses ``model`` raises a ConfigError matching ``match`` and
    leaves the model byte for byte as it was: nothing half rewritten."""
    from specrt.errors import ConfigError

    before = model.SerializeToString()
    with pytest.raises(ConfigError, match=match):
        rewrite(model, dims)
    assert model.SerializeToString() == before
