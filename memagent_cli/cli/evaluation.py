"""`memagent eval`: the paper's evaluation files, needle cases and reports."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from memagent_cli.cli import options
from memagent_cli.cli.options import (
    FROM_FLAGS,
    OCR,
    Command,
    Group,
    JsonOpt,
    NoReuseOpt,
    NoTraceOpt,
    OcrLangOpt,
    OcrOpt,
    QuietOpt,
    ReadFlagsOpt,
    ReadOptions,
    choices,
    reads,
    user_errors,
)
from memagent_cli.evaluation.niah import VARIANTS
from memagent_cli.views.progress import reporter


class _EvalGroup(Group):
    """`memagent eval DATA...` runs the authors' files (the `run` command); `eval niah` and
    `eval report` are named."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


app = typer.Typer(
    cls=_EvalGroup,
    help="Reproduce the paper's long-context results: `memagent eval DATA...` runs the "
    "authors' evaluation files, `eval niah` builds needle cases from a document, "
    "`eval report` compares runs.",
    no_args_is_help=True,
)

# The needle variants evaluation/niah.py defines, as an Enum so that --help lists them.
Needles = StrEnum("Needles", {name: name for name in VARIANTS})
EvalOutputOpt = Annotated[
    Path | None,
    typer.Option(
        "--output",
        "-o",
        metavar="FILE",
        dir_okay=False,
        show_default=False,
        help="Results file (JSON Lines, one line per case); run again to continue it "
        "\\[default: a new file in the data folder].",
    ),
]
PlotOpt = Annotated[
    Path | None,
    typer.Option(
        "--plot",
        dir_okay=False,
        show_default=False,
        metavar="FILE.png",
        help="Draw accuracy versus length (needle runs: depth x length) with matplotlib.",
    ),
]


def _run_keywords(
    read: ReadOptions,
    *,
    output: Path | None,
    no_trace: bool,
    no_reuse: bool,
    quiet: bool,
    plot: Path | None,
) -> dict[str, Any]:
    """The keywords of api.eval_files and api.eval_niah that every eval run shares, from
    the engine flags (one ReadOptions, read as `ask` reads it) and the eval options, checked
    before any model loads."""
    from memagent_cli.views import evaluation as views

    if plot is not None:
        views.require_plot()  # fails in seconds, before any model loads
    options.stop_on_sigterm()
    report = reporter(quiet)
    keywords: dict[str, Any] = {
        "read": read,
        "output": output,
        "reuse": not no_reuse,
        "traces": not no_trace,
        "report": report,
    }
    if read.parallel is not None:  # else eval's own: one case at a time (api.eval_files)
        keywords["parallel"] = read.parallel
    return keywords


@app.command("run", cls=Command)
@user_errors
@reads
def eval_run(
    data: Annotated[
        list[str],
        typer.Argument(
            help="The authors' eval_*.json files, RULER needle files, or folders of them.",
            metavar="DATA...",
        ),
    ],
    limit: Annotated[
        int | None,
        typer.Option(
            metavar="N",
            callback=options.at_least(1),
            show_default=False,
            help="Run the first N cases of each file.",
        ),
    ] = None,
    output: EvalOutputOpt = None,
    as_json: JsonOpt = False,
    plot: PlotOpt = None,
    read: ReadFlagsOpt = FROM_FLAGS,
    no_trace: NoTraceOpt = False,
    no_reuse: NoReuseOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Run every case of the authors' files as an ordinary ask, scored as their ruler_hqa.py."""
    from memagent_cli import api
    from memagent_cli.views import evaluation as views

    how = _run_keywords(
        read, output=output, no_trace=no_trace, no_reuse=no_reuse, quiet=quiet, plot=plot,
    )  # fmt: skip
    try:
        finished = api.eval_files(data, limit=limit, **how)
    except api.EvalStopped as stop:
        raise typer.Exit(views.stopped(stop)) from None
    views.show(finished, as_json=as_json, plot_path=plot, note=how["report"])


@app.command("niah", cls=Command)
@user_errors
@reads
def eval_niah(
    haystack: Annotated[
        str,
        typer.Option(
            "--haystack",
            metavar="DOCUMENT",
            help="Text, Markdown, PDF or EPUB file whose sentences hide the needles.",
        ),
    ],
    lengths: Annotated[
        str, typer.Option(metavar="LIST", help="Document lengths in model tokens (K = 1024).")
    ] = "8K,32K",
    depths: Annotated[
        str,
        typer.Option(
            metavar="LIST", help="How many depths from 0% to 100% (5), or percents (0,50,100)."
        ),
    ] = "5",
    needles: Annotated[
        Needles,
        typer.Option(metavar=choices(Needles), help="RULER variant (docs/eval.md)."),
    ] = Needles.single,
    ocr: OcrOpt = OCR.mode,
    ocr_lang: OcrLangOpt = OCR.languages,
    output: EvalOutputOpt = None,
    as_json: JsonOpt = False,
    plot: PlotOpt = None,
    read: ReadFlagsOpt = FROM_FLAGS,
    no_trace: NoTraceOpt = False,
    no_reuse: NoReuseOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Hide RULER key-value needles in a document at each depth and length, and ask for them.

    --seed seeds the cases (keys, values, other needles) and the sampling; 0 unless given."""
    from memagent_cli import api
    from memagent_cli.views import evaluation as views

    how = _run_keywords(
        read, output=output, no_trace=no_trace, no_reuse=no_reuse, quiet=quiet, plot=plot,
    )  # fmt: skip
    try:
        finished = api.eval_niah(
            haystack,
            lengths=lengths,
            depths=depths,
            needles=needles,
            ocr=api.OcrOptions(ocr, ocr_lang),
            **how,
        )
    except api.EvalStopped as stop:
        raise typer.Exit(views.stopped(stop)) from None
    views.show(finished, as_json=as_json, plot_path=plot, note=how["report"])


@app.command("report", cls=Command)
@user_errors
def eval_report(
    runs: Annotated[
        list[Path],
        typer.Argument(help="Results files of `memagent eval`.", metavar="RESULTS.jsonl..."),
    ],
    as_json: JsonOpt = False,
    plot: PlotOpt = None,
    html: Annotated[
        Path | None,
        options.html_file(
            "--html", "Also write an HTML report to FILE: the tables, every case and the plot."
        ),
    ] = None,
) -> None:
    """Summarize results files; --plot compares them with the paper's RL-MemAgent rows."""
    from memagent_cli.views import evaluation as views

    views.show_reports(runs, as_json=as_json, plot_path=plot, html_path=html)
