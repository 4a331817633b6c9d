"""Running one step of an export in a child Python process, so its memory goes back to the OS when it ends.

Why: after a dynamo export PyTorch and the exporter keep weights-sized blocks allocated from C++ that no
``gc``/``malloc_trim`` in the same process returns (measured: a Llama-3.2-1B fp16 export left 1.3 GB
behind, on which ONNX Runtime then loaded the graph). A child that loads the model, computes the
reference logits and writes the graph, then exits, leaves the parent as small as it was.

The protocol is pickles over pipes: the parent writes ``(function, args)`` on the child's stdin; the
child answers with ``("step", text)`` / ``("done", text)`` messages (mirrored on the parent's reporter)
and ends with ``("result", value)`` or ``("error", exception)``. The child's own stdout is redirected
to stderr so nothing a library prints can corrupt the stream. A plain subprocess rather than
multiprocessing: ``spawn`` re-imports the caller's ``__main__``, which breaks scripts without a main guard.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import signal
import subprocess
import sys
import traceback
from typing import Any, BinaryIO, Callable, Iterator

from ..errors import ExportProcessError, SpecrtError
from .progress import Reporter


class _PipeReporter:
    """The child's reporter: tells the parent when each step starts and ends."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out

    def send(self, message: tuple) -> None:
        pickle.dump(message, self.out)
        self.out.flush()

    @contextlib.contextmanager
    def step(self, description: str) -> Iterator[None]:
        self.send(("step", description))
        yield
        self.send(("done", description))


def _portable(error: BaseException) -> BaseException:
    """The error itself when the parent can unpickle it (specrt's typed errors), else a one-line summary."""
    if isinstance(error, SpecrtError):
        try:
            pickle.loads(pickle.dumps(error))
            return error
        except Exception:  # an error holding something unpicklable: fall through to the summary
            pass
    last = traceback.format_exception_only(type(error), error)[-1].strip()
    return ExportProcessError(f"export process failed: {last}")


def run_isolated(fn: Callable[..., Any], args: tuple, reporter: Reporter) -> Any:
    """``fn(*args, reporter=...)`` in a child process; its steps show on ``reporter``, its errors re-raise here.

    ``fn`` must be a module-level function and ``args`` picklable; ``fn``'s return value comes back by pickle.
    """
    proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    steps: list[contextlib.AbstractContextManager] = []
    try:
        pickle.dump((fn, args), proc.stdin)
        proc.stdin.close()
        while True:
            try:
                kind, value = pickle.load(proc.stdout)
            except EOFError:
                code = proc.wait()
                why = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
                hint = " (out of memory?)" if code == -signal.SIGKILL else ""
                raise ExportProcessError(f"the export process ended without an answer: {why}{hint}") from None
            if kind == "step":
                cm = reporter.step(value)
                cm.__enter__()
                steps.append(cm)
            elif kind == "done":
                steps.pop().__exit__(None, None, None)
            elif kind == "error":
                raise value
            else:
                proc.wait()
                return value
    except BaseException as e:
        while steps:  # close open steps as failed (no tick for them)
            steps.pop().__exit__(type(e), e, e.__traceback__)
        raise
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def _die_with_parent() -> None:
    """Linux: have the kernel end this process when its parent dies, so a killed export leaves no orphan
    holding gigabytes (elsewhere the child ends at its next message, on the broken pipe)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _child() -> None:
    _die_with_parent()
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # prints from any library go to stderr, not into the message stream
    sys.stdout = sys.stderr
    fn, args = pickle.load(sys.stdin.buffer)
    reporter = _PipeReporter(out)
    try:
        reporter.send(("result", fn(*args, reporter=reporter)))
    except BaseException as e:  # the parent decides what to do with every error, Ctrl-C included
        reporter.send(("error", _portable(e)))


if __name__ == "__main__":
    _child()
