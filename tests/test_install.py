"""The installed package, as a user's script imports it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import specrt


def test_a_folder_named_specrt_beside_a_script_does_not_shadow_the_package(tmp_path):
    """`specrt export MODEL -o specrt`, or a clone named specrt, beside a script once made `import specrt` find
    that folder (a namespace package without `load`) under an editable install."""
    (tmp_path / "specrt").mkdir()
    (tmp_path / "specrt" / "specrt.json").write_text("{}")  # a bundle, say
    (tmp_path / "use.py").write_text("import specrt\nprint(specrt.__file__)\n")
    out = subprocess.run([sys.executable, "use.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()) == Path(specrt.__file__)
