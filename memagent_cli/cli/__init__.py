"""The `memagent` command line: options in, calls out. One module per command; the work
itself happens in the modules they call."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from memagent_cli import crash
from memagent_cli.cli import ask, cache, evaluation, inspect, models, paths, trace
from memagent_cli.cli.options import CONTEXT, Command, Group
from memagent_cli.errors import STOPS, stop_code
from memagent_cli.views import console

app = typer.Typer(
    cls=Group,
    help="Answer questions about book-scale documents with a MemAgent model run locally "
    "through llama.cpp.\n\n"
    'Example: memagent ask book.pdf "Who sends the letter, and why?"\n\n'
    "Every command: docs/cli.md; the manual: docs/ in memagent's source tree.",
    no_args_is_help=True,
    context_settings=CONTEXT,  # inherited by every command and group below
    pretty_exceptions_show_locals=False,
)
app.command("ask", cls=Command, epilog=ask.EXAMPLES)(ask.ask)
app.command("inspect", cls=Command)(inspect.inspect)
app.command("trace", cls=Command)(trace.trace)
app.add_typer(models.app, name="models")
app.add_typer(evaluation.app, name="eval")
app.add_typer(cache.app, name="cache")
app.command("paths", cls=Command)(paths.paths)


@app.callback(invoke_without_command=True)
def _root(
    context: typer.Context,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Show memagent's version and its llama.cpp build: CPU features, GPU offload "
            "and devices.",
        ),
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="With --version: one JSON object, for bug reports.")
    ] = False,
) -> None:
    console.show_notes()
    if version:
        from memagent_cli.backends import build
        from memagent_cli.views import build as views

        views.show(build.describe(), as_json=as_json)
        raise typer.Exit()
    if context.invoked_subcommand is None:
        typer.echo(context.get_help(), err=True)
        raise typer.Exit(2)


def main() -> None:
    """Console entry point."""
    crash.install()
    try:
        app()
    except STOPS as exc:  # SIGTERM too, before a run began (loading a document or model)
        sys.exit(stop_code(exc))
