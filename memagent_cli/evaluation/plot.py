"""Pictures of results: accuracy versus length (one line per run, the paper's models for
reference) and the depth x length heatmap of needle runs.

matplotlib is an optional extra (`.venv/bin/pip install matplotlib`); it draws with Agg, so no
display is needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memagent_cli.errors import UserError
from memagent_cli.evaluation.report import GroupRow, length_label

# The paper's RULER-HQA accuracy (%) (arXiv 2507.02259, 128 questions per length); a copy
# made by hand is checked in tests/test_eval_results.py.
REFERENCE_LENGTHS = ("7K", "14K", "28K", "56K", "112K", "224K", "448K", "896K", "1.75M", "3.5M")
REFERENCE = {
    "RL-MemAgent-14B": (83.59, 82.03, 84.38, 80.47, 76.56, 81.25, 75.00, 77.34, 76.56, 78.12),
    "RL-MemAgent-7B": (82.03, 79.69, 78.91, 77.34, 79.69, 72.66, 74.22, 76.56, 75.78, 71.09),
}
# 7K doubling ten times, in the paper's binary units (1.75M = 1792K).
REFERENCE_TOKENS = tuple(7 * 1024 * 2**i for i in range(len(REFERENCE_LENGTHS)))


class PlotError(UserError):
    """A plot that cannot be drawn or saved."""


def accuracy_figure(runs: Sequence[tuple[str, Sequence[GroupRow]]]) -> Any:
    """Accuracy (sub_em) versus document length, log scale: one line per run, with the
    paper's RL-MemAgent rows drawn dashed for reference."""
    figure = _figure()
    axes = figure.add_subplot()
    for name, values in REFERENCE.items():
        axes.plot(REFERENCE_TOKENS, values, "--", marker=".", alpha=0.6, label=f"{name} (paper)")
    for label, rows in runs:
        axes.plot([r.tokens for r in rows], [r.sub_em for r in rows], marker="o", label=label)
    axes.set_xscale("log")
    ticks = sorted(
        {t for _, rows in runs for t in (r.tokens for r in rows)} | set(REFERENCE_TOKENS)
    )
    axes.set_xticks(ticks, [length_label(t) for t in ticks], rotation=45)
    axes.minorticks_off()
    axes.set_ylim(-2, 102)  # points at 0 or 100 stay visible
    axes.set_xlabel("document tokens")
    axes.set_ylabel("accuracy (sub_em, %)")
    axes.set_title("memagent eval: accuracy versus length")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize="small")
    return figure


def heatmap_figure(
    lengths: Sequence[str], depths: Sequence[float], grid: Sequence[Sequence[Any]]
) -> Any:
    """Needle recall (%) by depth (rows) and length (columns), blank where nothing ran."""
    figure = _figure()
    axes = figure.add_subplot()
    values = [[float("nan") if v is None else v for v in row] for row in grid]
    image = axes.imshow(values, vmin=0, vmax=100, cmap="RdYlGn", aspect="auto")
    axes.set_xticks(range(len(lengths)), list(lengths))
    axes.set_yticks(range(len(depths)), [f"{d:g}%" for d in depths])
    for y, row in enumerate(grid):
        for x, value in enumerate(row):
            if value is not None:
                axes.text(x, y, f"{value:.0f}", ha="center", va="center", fontsize="small")
    axes.set_xlabel("document tokens")
    axes.set_ylabel("needle depth")
    axes.set_title("memagent eval niah: recall by depth and length")
    figure.colorbar(image, ax=axes, label="recall (%)")
    return figure


def require() -> None:
    """Fail before hours of runs, not after, when --plot cannot be drawn."""
    _figure()


def _figure() -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotError(
            "--plot needs matplotlib, which is not installed: .venv/bin/pip install matplotlib "
            "in memagent's checkout."
        ) from None
    # A bare Figure draws with Agg when saved: no display, no global pyplot state.
    return Figure(figsize=(8, 5), layout="constrained")


def save(figure: Any, path: Path) -> None:
    """Write a figure to `path`, in the format its extension names (PNG without one)."""
    try:
        # Given no format, matplotlib writes a name without an extension to NAME.png: not
        # the path the user gave and is told.
        figure.savefig(path, dpi=120, format=None if path.suffix else "png")
    except ValueError as exc:  # an extension matplotlib cannot write
        raise PlotError(f"Cannot save the plot as {path}: {exc}") from None
    except OSError as exc:
        raise PlotError(f"Cannot write the plot to {path}: {exc.strerror}.") from None
