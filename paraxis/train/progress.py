"""Progress display for rank 0: a rich progress bar with step, loss and throughput.

While it is on screen it also shows the heartbeat's stall reports (`dist/heartbeat.py`):
the ranks that stopped making progress, printed above the bar and named in its status.
"""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress

from paraxis.dist import heartbeat
from paraxis.files.terminal import PIPED_WIDTH


class Progress:
    def __init__(self, total: int, enabled: bool = True, title: str = "train") -> None:
        self.enabled = enabled
        self.console = Console(stderr=True)
        if not self.console.is_terminal:
            # A log file or pipe: rich would wrap every line at 80 columns ("peak mem" on one
            # line, "366 MiB" on the next); a log has room for the whole line.
            self.console = Console(stderr=True, width=PIPED_WIDTH)
        self.total = total
        self._bar = RichProgress(TextColumn("[bold]{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("{task.fields[status]}"),
                                 TimeElapsedColumn(), console=self.console,
                                 disable=not enabled, transient=False)
        self._task = self._bar.add_task(title, total=total, status="")

    def __enter__(self) -> Progress:
        self._bar.__enter__()
        if self.enabled:
            self._previous_sink, heartbeat.stall_sink = heartbeat.stall_sink, self.stall
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            heartbeat.stall_sink = self._previous_sink
        self._bar.__exit__(*exc)

    def stall(self, text: str | None) -> None:
        """Called from the heartbeat thread: a stall line, or None once progress resumes."""
        if text:
            self._bar.console.print(text, markup=False, highlight=False, soft_wrap=True)
        self._bar.update(self._task, status="[red]stalled (see above)" if text else "")

    def update(self, step: int, record: dict, log: bool = False) -> None:
        if not self.enabled:
            return
        status = (f"loss {record['loss']:.4f}  {record['tokens_per_s']:,.0f} tok/s  "
                  f"lr {record['lr']:.2e}")
        self._bar.update(self._task, completed=step + 1, status=status)
        if log:
            extra = f"  grad-norm {record['grad_norm']:.3f}"
            if record.get("mfu") is not None:
                extra += f"  MFU {100 * record['mfu']:.1f}%"
            if "peak_mem_bytes_max_rank" in record:
                extra += f"  peak mem {record['peak_mem_bytes_max_rank'] / 2**20:,.0f} MiB"
            if "aux_loss" in record:  # a mixture of experts' load-balancing loss
                extra += f"  aux loss {record['aux_loss']:.4f}"
            if "val_loss" in record:
                extra += f"  val loss {record['val_loss']:.4f}"
            self._bar.console.print(f"step {step:>5}  {status}{extra}", soft_wrap=True)
