"""The `memagent` command line: options in, calls out. One module per command; the work
itself happens in the modules they call."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from memagent_cli import __version__
from memagent_cli.cli import ask, cache, evaluation, inspect, models, paths, trace
from memagent_cli.cli.options import CONTEXT
from memagent_cli.errors import Interrupted

app = typer.Typer(
    help="Answer questions about book-scale documents with a MemAgent model run locally "
    "through llama.cpp.",
    no_args_is_help=True,
    context_settings=CONTEXT,  # inherited by every command and group below
    pretty_exceptions_show_locals=False,
)
app.command("ask")(ask.ask)
app.command("inspect")(inspect.inspect)
app.command("trace")(trace.trace)
app.add_typer(models.app, name="models")
app.add_typer(evaluation.app, name="eval")
app.add_typer(cache.app, name="cache")
app.command("paths")(paths.paths)


def _version(value: bool) -> None:
    if value:
        print(f"memagent {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Show the version."),
    ] = False,
) -> None:
    """Answer questions about book-scale documents with a MemAgent model run locally."""


def main() -> None:
    """Console entry point."""
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
    except Interrupted as exc:  # SIGTERM before a run began (loading a document or model)
        sys.exit(exc.exit_code)
