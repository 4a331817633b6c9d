"""Step-by-step progress reporting that library code can call without knowing about terminals."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Iterator, Protocol


class Reporter(Protocol):
    def step(self, description: str) -> contextlib.AbstractContextManager[None]: ...


class SilentReporter:
    """The library default: report nothing."""

    @contextlib.contextmanager
    def step(self, description: str) -> Iterator[None]:
        yield


class RichReporter:
    """A spinner per step on stderr, then a tick with the step's duration."""

    def __init__(self) -> None:
        from rich.console import Console

        self.console = Console(stderr=True)

    @contextlib.contextmanager
    def step(self, description: str) -> Iterator[None]:
        t0 = time.perf_counter()
        with self.console.status(f"{description}…"):
            yield
        self.console.print(f"[green]✓[/green] {description} [dim]({time.perf_counter() - t0:.1f} s)[/dim]")


# (phase, done, total, loss or None): how long work in phases (eagle train) reports, without a terminal in sight.
PhaseProgress = Callable[[str, int, int, float | None], None]


@contextlib.contextmanager
def rich_progress() -> Iterator[PhaseProgress]:
    """A ``progress`` callback drawing one rich bar per phase on stderr (for the CLI); where stderr is not a
    terminal (a log file, CI), one line per phase at every tenth of it instead, with the time so far."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TextColumn,
        TimeRemainingColumn,
    )
    from rich.progress import Progress as Bar

    console = Console(stderr=True)
    if not console.is_terminal:
        yield _log_lines(console)
        return
    with Bar(TextColumn("{task.description:9}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[loss]}"),
             TimeRemainingColumn(), console=console) as bar:
        tasks: dict[str, Any] = {}

        def update(phase: str, done: int, total: int, loss: float | None) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total, loss="")
            bar.update(tasks[phase], completed=done, total=total,
                       **({"loss": f"loss {loss:.4f}"} if loss is not None else {}))

        yield update


def _log_lines(console: Any) -> PhaseProgress:
    start, shown = time.perf_counter(), {}

    def update(phase: str, done: int, total: int, loss: float | None) -> None:
        tenth = 10 * done // max(total, 1)
        if shown.get(phase) == tenth:
            return
        shown[phase] = tenth
        note = f", loss {loss:.4f}" if loss is not None else ""
        console.print(f"{phase}: {done}/{total}{note} ({time.perf_counter() - start:.0f} s)", highlight=False)

    return update
