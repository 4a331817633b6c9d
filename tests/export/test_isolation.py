"""The export's PyTorch side in a child process: same bundle, steps shown, errors re-raised as themselves."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from specrt.errors import ExportProcessError, ModelLoadError
from specrt.export.exporter import ExportOptions, export_bundle
from specrt.export.isolation import run_isolated


class Recorder:
    def __init__(self) -> None:
        self.events: list[str] = []

    def step(self, description: str):
        import contextlib

        @contextlib.contextmanager
        def cm():
            self.events.append(f"start {description}")
            try:
                yield
            except BaseException:
                self.events.append(f"failed {description}")
                raise
            self.events.append(f"done {description}")
        return cm()


def test_isolated_export_equals_in_process(pairs, tmp_path):
    target, draft = pairs["llama"]
    steps = Recorder()
    iso = export_bundle(str(target), str(draft), tmp_path / "iso", ExportOptions(isolate=True), reporter=steps)
    same = export_bundle(str(target), str(draft), tmp_path / "same", ExportOptions(isolate=False))
    for role in ("target", "draft"):
        a, b = iso.models[role], same.models[role]
        assert a.dims == b.dims and a.golden == b.golden and a.parity == b.parity
        assert (tmp_path / "iso" / f"{role}.onnx").read_bytes() == (tmp_path / "same" / f"{role}.onnx").read_bytes()
    # The child's steps appear on the parent's reporter, each closed, in order, before the parent's check.
    t = [e for e in steps.events if "target" in e]
    assert t[0] == f"start Loading target {target}" and t[1] == f"done Loading target {target}"
    assert [e.split()[0] for e in t] == ["start", "done"] * 4 and "Checking target" in t[-1]


def test_auto_isolates_large_checkpoints_and_hub_ids(pairs, tmp_path):
    opts = ExportOptions()
    assert not opts.isolate_for(str(pairs["llama"][0]))  # a tiny folder: in process
    big = tmp_path / "big"
    big.mkdir()
    with open(big / "model.safetensors", "wb") as f:
        f.truncate(600 * 2**20)  # sparse: the size is what counts
    assert opts.isolate_for(str(big)) and opts.isolate_for("Qwen/Qwen3-0.6B")
    assert not ExportOptions(isolate=False).isolate_for(str(big))


@pytest.mark.parametrize("isolate", [True, False])
def test_child_error_is_reraised_as_itself(pairs, tmp_path, isolate):
    """A corrupt checkpoint (a SafetensorError, not an OSError) is a one-line ModelLoadError, raised as
    itself from the child too; the step closes as failed and nothing is left behind."""
    src = tmp_path / "corrupt"
    src.mkdir()
    for f in pairs["llama"][0].iterdir():
        (src / f.name).write_bytes(f.read_bytes())
    (src / "model.safetensors").write_bytes(b"not a safetensors file" * 10)
    steps = Recorder()
    with pytest.raises(ModelLoadError, match="could not load the weights"):
        export_bundle(str(src), None, tmp_path / "out", ExportOptions(isolate=isolate), reporter=steps)
    assert steps.events[-1] == f"failed Loading target {src}"
    assert list(tmp_path.iterdir()) == [src]


@pytest.fixture
def helpers(tmp_path, monkeypatch):
    """A module the child can import (by PYTHONPATH) with functions that fail in ways a model cannot."""
    (tmp_path / "iso_helpers.py").write_text(textwrap.dedent("""
        import os, signal

        class Unpicklable(Exception):
            def __init__(self, f):
                super().__init__("cannot travel")
                self.f = f

        def die(reporter):
            with reporter.step("about to die"):
                os.kill(os.getpid(), signal.SIGKILL)

        def raise_unpicklable(reporter):
            raise Unpicklable(lambda: 0)

        def sleepy(pid_file, reporter):
            open(pid_file, "w").write(str(os.getpid()))
            import time
            time.sleep(60)

        def chatty(n, reporter):
            print("library chatter on stdout")
            return {"n": n, "sq": n * n}
    """))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{':'.join(sys.path)}")
    monkeypatch.syspath_prepend(str(tmp_path))
    import iso_helpers

    return iso_helpers


def test_child_killed_is_one_line(helpers):
    steps = Recorder()
    with pytest.raises(ExportProcessError, match=r"killed by signal 9 \(out of memory\?\)"):
        run_isolated(helpers.die, (), steps)
    assert steps.events == ["start about to die", "failed about to die"]


def test_unpicklable_error_and_stdout_chatter(helpers):
    with pytest.raises(ExportProcessError, match="Unpicklable: cannot travel"):
        run_isolated(helpers.raise_unpicklable, (), Recorder())
    # prints in the child do not corrupt the answer
    assert run_isolated(helpers.chatty, (7,), Recorder()) == {"n": 7, "sq": 49}
    assert json.dumps(run_isolated(helpers.chatty, (2,), Recorder())) == '{"n": 2, "sq": 4}'


def test_child_dies_with_its_parent(helpers, tmp_path):
    """A parent killed outright (SIGKILL: no cleanup runs) takes its export child with it, rather than
    leaving an orphan that holds the model's memory."""
    import os
    import signal
    import subprocess
    import time

    pid_file = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", f"""
import iso_helpers
from specrt.export.isolation import run_isolated
from specrt.export.progress import SilentReporter
run_isolated(iso_helpers.sleepy, ({str(pid_file)!r},), SilentReporter())
"""])
    deadline = time.time() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.time() < deadline and parent.poll() is None
        time.sleep(0.1)
    child = int(pid_file.read_text())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    while time.time() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(child, signal.SIGKILL)
    raise AssertionError("the export child outlived its killed parent")
