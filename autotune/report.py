"""The tuning report: every config of one sweep with its time or why it was pruned, as rows, a table and an
optional bar chart."""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .config import Config


@dataclass(frozen=True)
class Row:
    index: int              # position in the kernel's config list
    config: Config
    ms: float | None        # median time; None when pruned
    pruned: str | None      # why it was not timed; None when timed
    winner: bool
    stored: bool            # the result came from the on-disk store rather than this sweep


@dataclass(frozen=True)
class TuningReport:
    kernel: str
    key: Mapping[str, Any]  # tuning key: argument name -> value (shapes for tensors, plus dtypes)
    device: str
    rows: tuple[Row, ...]
    # Wall time of this process's sweep for the key, by phase: compiling the candidates (in parallel) and
    # timing the survivors. Both 0 when every result came from the store (or another rank swept them).
    compile_seconds: float = 0.0
    timing_seconds: float = 0.0

    @property
    def winner(self) -> Row:
        return next(row for row in self.rows if row.winner)

    def table(self) -> str:
        key = ", ".join(f"{name}={value}" for name, value in self.key.items()) or "(none)"
        header = f"mgjit.autotune {self.kernel}  key: {key}  device: {self.device}"
        configs = [row.config.short() for row in self.rows]
        width = max([len("config")] + [len(c) for c in configs])
        lines = [header, f"{'#':>3}  {'config':<{width}}  {'time (ms)':>10}  note"]
        for row, text in zip(self.rows, configs, strict=True):
            if row.ms is not None:
                note = ("<- winner" if row.winner else "") + (" (stored)" if row.stored else "")
                lines.append(f"{row.index:>3}  {text:<{width}}  {row.ms:>10.4f}  {note.strip()}".rstrip())
            else:
                note = f"pruned: {row.pruned}" + (" (stored)" if row.stored else "")
                lines.append(f"{row.index:>3}  {text:<{width}}  {'-':>10}  {note}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    __repr__ = __str__

    def plot(self, path: str | os.PathLike[str]) -> None:
        """Draw a horizontal bar chart of the timed configs (winner highlighted) into `path`."""
        try:
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure
        except ImportError:
            raise ImportError("tuning_report(plot=...) draws with matplotlib, which is not installed; "
                              "pip install matplotlib, or call tuning_report() for the table") from None
        timed = [row for row in self.rows if row.ms is not None]
        if not timed:
            raise ValueError(f"nothing to plot: all {len(self.rows)} configs of {self.kernel} were pruned")
        # Figure + Agg canvas rather than pyplot: no global figure state, no change to the user's backend.
        figure = Figure(figsize=(8, 1.5 + 0.3 * len(timed)))
        FigureCanvasAgg(figure)
        axes = figure.add_subplot()
        labels = [f"#{row.index} {row.config.short()}" for row in timed]
        colors = ["tab:green" if row.winner else "tab:blue" for row in timed]
        axes.barh(range(len(timed)), [row.ms for row in timed], color=colors)
        axes.set_yticks(range(len(timed)), labels, fontsize=7)
        axes.invert_yaxis()
        axes.set_xlabel("median time (ms)")
        pruned = len(self.rows) - len(timed)
        axes.set_title(f"{self.kernel} on {self.device}: {len(timed)} timed, {pruned} pruned", fontsize=9)
        figure.tight_layout()
        figure.savefig(path)
