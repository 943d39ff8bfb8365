"""A progress bar for long loops, with the standard library only.

On a terminal it redraws one line (`\\r`); in a log file it writes a line every 5% of the
work, so a training log stays readable. Numbers such as the loss are shown as given.
"""

import sys
import time
from typing import TextIO


class Progress:
    """`Progress(total)`; `update(done, loss=...)` after each item; `note(text)`; `close()`.

    `unit_scale` items of throughput per step (e.g. tokens per optimizer step) turn the
    rate into tokens/s. `start` is where a resumed loop begins, so its rate and ETA count
    only the work done in this process.
    """

    def __init__(
        self,
        total: int,
        *,
        start: int = 0,
        unit_scale: int = 1,
        unit: str = "tok",
        stream: TextIO | None = None,
        enabled: bool = True,
    ) -> None:
        self.total, self.start, self.unit_scale, self.unit = total, start, unit_scale, unit
        self.stream = sys.stderr if stream is None else stream
        self.enabled = enabled
        self.interactive = enabled and getattr(self.stream, "isatty", lambda: False)()
        self.started = time.perf_counter()
        self.every = max(1, (total - start) // 20)
        self.line = ""

    def update(self, done: int, **values: float) -> None:
        """Record that `done` of `total` items are finished; `values` are shown beside."""
        if not self.enabled:
            return
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        rate = (done - self.start) / elapsed
        eta = (self.total - done) / rate if rate > 0 else 0.0
        width = 24
        filled = int(width * done / max(self.total, 1))
        shown = " ".join(f"{k} {_fmt(v)}" for k, v in values.items())
        self.line = (
            f"{done:>{len(str(self.total))}}/{self.total} [{'#' * filled}{'.' * (width - filled)}]"
            f" {shown} | {rate * self.unit_scale:,.0f} {self.unit}/s | eta {_clock(eta)}"
        )
        if self.interactive:
            self.stream.write("\r" + self.line)
            self.stream.flush()
        elif done % self.every == 0 or done == self.total:
            self.stream.write(self.line + "\n")
            self.stream.flush()

    def note(self, text: str) -> None:
        """Print `text` on its own line, keeping the bar below it on a terminal."""
        if not self.enabled:
            return
        if self.interactive:
            self.stream.write("\r" + " " * len(self.line) + "\r" + text + "\n" + self.line)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End the bar's line."""
        if self.enabled and self.interactive:
            self.stream.write("\n")
            self.stream.flush()


def _fmt(value: float) -> str:
    return f"{value:.2e}" if 0 < abs(value) < 1e-2 else f"{value:.3f}"


def _clock(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes}:{seconds:02d}"
