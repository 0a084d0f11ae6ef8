"""`memagent trace`: which view of a saved run; the views live in views/traces/ and
views/html/."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from memagent_cli.cli.options import html_file, user_errors
from memagent_cli.errors import UserError
from memagent_cli.trace import default_dir, listing, locate
from memagent_cli.views import console as display


@user_errors
def trace(
    names: Annotated[
        list[Path] | None,
        typer.Argument(
            # The backslash keeps Typer's Rich help from reading "[default: ...]" as markup.
            help="Trace file, or the name of one in the data folder; several go with --html "
            "\\[default: the most recent trace].",
            metavar="TRACE",
            show_default=False,
        ),
    ] = None,
    list_traces: Annotated[
        bool, typer.Option("--list", help="List the saved traces, newest first.")
    ] = False,
    step: Annotated[
        int | None,
        typer.Option(
            "--step",
            metavar="N",
            help="Show the memory after step N in full (step 1 reads the first chunk).",
            show_default=False,
        ),
    ] = None,
    diff: Annotated[
        int | None,
        typer.Option(
            "--diff",
            metavar="N",
            help="Show what step N changed in the memory (step 1: against the initial memory).",
            show_default=False,
        ),
    ] = None,
    grep: Annotated[
        str | None,
        typer.Option(
            "--grep",
            metavar="TEXT",
            show_default=False,
            help="Show the steps whose memory contains TEXT (any case).",
        ),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print the trace (or --list) as JSON: its records, steps numbered from 1 as "
            "in every view (an evidence entry's step too).",
        ),
    ] = False,
    markdown: Annotated[
        bool, typer.Option("--markdown", help="Print a Markdown report of the run.")
    ] = False,
    follow_run: Annotated[
        bool, typer.Option("--follow", "-f", help="Show steps as a running `ask` writes them.")
    ] = False,
    html: Annotated[
        Path | None,
        html_file(
            "--html", "Write an HTML report of the run(s) to FILE: one page, a tab per trace."
        ),
    ] = None,
) -> None:
    """Show what the model kept, dropped and concluded at every step of a run."""
    from memagent_cli.views import traces as traceview

    views = {
        "--list": list_traces,
        "--step": step is not None,
        "--diff": diff is not None,
        "--grep": grep is not None,
        "--markdown": markdown,
        "--follow": follow_run,
        "--html": html is not None,
    }
    chosen = [name for name, on in views.items() if on]
    if len(chosen) > 1:
        raise typer.BadParameter(f"{' and '.join(chosen)} are different views; pick one.")
    if as_json and chosen and chosen != ["--list"]:
        raise typer.BadParameter(f"--json goes with the whole trace or --list, not {chosen[0]}.")
    if len(names or []) > 1 and html is None:
        raise typer.BadParameter("several traces go together only in an --html report.")
    name = names[0] if names else None
    out = display.results_console()
    if list_traces:
        if names:
            raise typer.BadParameter("--list lists the data folder; leave out TRACE.")
        rows = listing()
        traceview.warn_unreadable(rows)
        if as_json:
            display.result_json(rows, indent=2)
        elif not rows:
            raise UserError(f"There are no traces in {default_dir()} yet.")
        else:
            traceview.print_listing(out, rows)
        return
    if html is not None:
        from memagent_cli.views import html as report

        runs = [traceview.load(locate(n)) for n in names or [None]]
        report.write(html, report.trace_report(runs))
        display.note(f"report: {html}")
        return
    path = locate(name)
    if follow_run:
        try:
            traceview.follow(out, path)
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        return
    loaded = traceview.load(path)
    if as_json:
        display.result_json(loaded.to_json(), indent=2)
    elif markdown:
        display.result(traceview.markdown(loaded), end="")
    elif step is not None:
        traceview.step(out, loaded, step)
    elif diff is not None:
        traceview.diff(out, loaded, diff)
    elif grep is not None:
        if not traceview.grep(out, loaded, grep):
            raise typer.Exit(1)
    else:
        traceview.summary(out, loaded)
