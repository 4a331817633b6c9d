"""Step-by-step progress reporting that library code can call without knowing about terminals."""

from __future__ import annotations

import contextlib
import time
from typing import Iterator, Protocol


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
