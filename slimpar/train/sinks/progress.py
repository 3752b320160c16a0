"""The training progress shown on rank 0: a rich bar on a terminal, one plain line per logged step elsewhere."""

from __future__ import annotations

import time


class TrainProgress:
    """A rich progress bar on rank 0 (no-op elsewhere); logs and pipes get one plain line per logged step
    with the elapsed time, the estimated time left and the throughput (tokens/s, images/s for image models)."""

    def __init__(self, enabled: bool, start: int, total: int, items_per_step: int = 0, unit: str = "tok/s"):
        import sys

        self.bar = None
        self.start, self.total, self.items, self.unit = start, total, items_per_step, unit
        self.t0 = time.perf_counter()
        self.lines = enabled and not sys.stdout.isatty()
        if enabled and not self.lines:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("loss {task.fields[loss]}"), TimeRemainingColumn())
            self.bar.start()
            self.task = self.bar.add_task("train", total=total, completed=start, loss="-")

    def line(self, done: int, loss: float, now: float | None = None) -> str:
        """``step 40/100  loss 3.1234  elapsed 0:12  eta 0:18  1,234 tok/s``: rates over this invocation's steps."""
        elapsed = (time.perf_counter() if now is None else now) - self.t0
        steps = done - self.start
        rate = steps / elapsed if elapsed > 0 and steps > 0 else 0.0
        eta = clock((self.total - done) / rate) if rate else "?"
        return (f"step {done}/{self.total}  loss {loss:.4f}  elapsed {clock(elapsed)}  eta {eta}  "
                f"{rate * self.items:,.0f} {self.unit}")

    def update(self, done: int, loss: float | None) -> None:
        if self.lines and loss is not None:
            print(self.line(done, loss), flush=True)
        if self.bar is not None:
            fields = {"loss": f"{loss:.3f}"} if loss is not None else {}
            self.bar.update(self.task, completed=done, **fields)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def clock(seconds: float) -> str:
    """``0:07``, ``12:30``, ``1:02:03``."""
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"
