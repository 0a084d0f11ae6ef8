"""Evaluations as a person reads them: the score table on stdout, the plot, and what an
interrupted run left."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from memagent_cli.evaluation import plot, report, results
from memagent_cli.evaluation.evaluate import EvalStopped
from memagent_cli.evaluation.results import Results
from memagent_cli.progress import Reporter
from memagent_cli.views import console as display


def show(run: Results, *, as_json: bool, plot_path: Path | None, note: Reporter) -> None:
    """A finished run: what scored 0 for want of \\boxed{}, the table (or JSON), the plot."""
    unboxed = sum(r.get("prediction") is None for r in run.records)
    if unboxed:
        note.note(
            f"{unboxed} of {len(run.records)} final replies put no answer in "
            "\\boxed{}; they score 0, as in the authors' script (each record keeps the reply)."
        )
    if as_json:
        display.result_json(report.to_json(run))
    else:
        print_table(display.results_console(), run)
    if plot_path is not None:
        draw([run], plot_path)


def show_reports(
    paths: Sequence[Path], *, as_json: bool, plot_path: Path | None, html_path: Path | None = None
) -> None:
    """Summaries of finished results files, compared in one plot; with `html_path`, also an
    HTML report holding the tables and the plot."""
    runs = [results.read(path) for path in paths]
    if plot_path is not None:
        plot.require()
    if html_path is not None:
        write_html(runs, html_path)
    if as_json:
        display.result_json({"runs": [report.to_json(r) for r in runs]})
    else:
        out = display.results_console()
        for r in runs:
            print_table(out, r, title=len(runs) > 1)
    if plot_path is not None:
        draw(runs, plot_path)


def require_plot() -> None:
    """Fail before hours of runs, not after, when --plot cannot be drawn."""
    plot.require()


def stopped(stop: EvalStopped) -> int:
    """Say why an evaluation stopped and where its finished cases are; the exit code."""
    display.error(stop.message)
    display.note(f"finished cases are in {stop.output}; run the same command again to continue")
    return stop.exit_code


def draw(runs: list[Results], path: Path) -> None:
    """Accuracy by length, or for one needle run the depth x length heatmap."""
    plot.save(_picture(runs), path)
    display.note(f"plot: {path}")


def _picture(runs: list[Results]) -> Any:
    records = [r for run_results in runs for r in run_results.records]
    if len(runs) == 1 and records and all(r.get("depth") is not None for r in records):
        return plot.heatmap_figure(*report.depth_grid(records))
    return plot.accuracy_figure([(r.label, report.summarize(r.records)) for r in runs])


def write_html(runs: list[Results], path: Path) -> None:
    """The HTML report of results files: their tables and cases, and the chart `draw` draws,
    inline as SVG (no matplotlib needed)."""
    from memagent_cli.views import html

    html.write(path, html.eval_report(runs))
    display.note(f"report: {path}")


def print_table(console: Console, run: Results, *, title: bool = False) -> None:
    """The run's groups as a table; `title` names the run (when several are compared)."""
    table = Table(title=Text(str(run.path)) if title else None, title_justify="left")
    for name in report.COLUMNS:
        table.add_column(name, justify="left" if name == "group" else "right")
    rows = report.summarize(run.records)
    pooled = report.overall(run.records)
    for row in rows + ([pooled] if pooled and len(rows) > 1 else []):
        group, *numbers = report.cells(row)
        table.add_row(Text(group), *numbers)
    console.print(table)
