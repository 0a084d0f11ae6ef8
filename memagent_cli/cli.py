"""The `memagent` command line: options in, calls out."""

from __future__ import annotations

import functools
import json
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from memagent_cli import __version__, display
from memagent_cli.errors import Interrupted, UserError

app = typer.Typer(
    help="Answer questions about book-scale documents with a MemAgent model run locally "
    "through llama.cpp.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)

F = TypeVar("F", bound=Callable[..., Any])


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Interrupted("SIGTERM")


def user_errors(command: F) -> F:
    """Turn errors a user can cause into one sentence on stderr and a non-zero exit."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except UserError as exc:
            display.error(exc.message)
            raise typer.Exit(exc.exit_code) from None

    return wrapper  # type: ignore[return-value]


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


@app.command()
@user_errors
def ask(
    document: Annotated[str, typer.Argument(help="Text file to read, or - for stdin.", metavar="DOCUMENT")],
    questions: Annotated[
        list[str] | None, typer.Argument(help="One or more questions.", show_default=False, metavar="QUESTION")
    ] = None,
    questions_file: Annotated[
        Path | None,
        typer.Option("--questions", help="File of questions, one per line.", show_default=False),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model", "-m", help="GGUF file or registry name [default: $MEMAGENT_MODEL, "
            "else the default model].", show_default=False,
        ),
    ] = None,
    chunk_tokens: Annotated[
        int, typer.Option(min=1, help="Model tokens of document per step.")
    ] = 5000,
    memory_tokens: Annotated[
        int, typer.Option(min=1, help="Most tokens the memory (each update) may take.")
    ] = 1024,
    temperature: Annotated[
        float, typer.Option(min=0.0, help="Sampling temperature; 0 is greedy, reproducible.")
    ] = 0.7,
    top_p: Annotated[float, typer.Option(min=0.0, max=1.0, help="Nucleus sampling.")] = 0.95,
    seed: Annotated[
        int | None, typer.Option(help="Random seed for sampling.", show_default=False)
    ] = None,
    gpu_layers: Annotated[
        int | None,
        typer.Option(
            "--gpu-layers", "-ngl", help="Layers to offload to the GPU [default: all when "
            "llama.cpp was built with GPU support, else 0].", show_default=False,
        ),
    ] = None,
    threads: Annotated[
        int | None,
        typer.Option(
            "--threads", "-t", min=1, help="CPU threads [default: physical cores].",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object per question.")
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Show no progress.")] = False,
    trace: Annotated[
        Path | None,
        typer.Option(help="Write the trace here [default: a new file in the data folder].",
                     show_default=False, dir_okay=False),
    ] = None,
    no_trace: Annotated[bool, typer.Option("--no-trace", help="Write no trace.")] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show llama.cpp's own log.")
    ] = False,
) -> None:
    """Read DOCUMENT chunk by chunk into a memory and answer each QUESTION from it."""
    from memagent_cli import session

    asked = [q.strip() for q in questions or [] if q.strip()]
    if questions_file is not None:
        asked += session.questions_from_file(questions_file)
    if not asked:
        raise typer.BadParameter(
            "give at least one question, as an argument or with --questions FILE.",
            param_hint="QUESTIONS",
        )
    if trace is not None and len(asked) > 1:
        raise typer.BadParameter(
            "--trace names one file, but there are several questions; leave it out to get "
            "one trace per question in the data folder.",
            param_hint="--trace",
        )
    signal.signal(signal.SIGTERM, _on_sigterm)
    run = session.open_session(
        document,
        model=model,
        chunk_tokens=chunk_tokens,
        memory_tokens=memory_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        gpu_layers=gpu_layers,
        threads=threads,
        verbose=verbose,
        questions=asked,
    )
    warned = False
    for index, question in enumerate(asked):
        trace_path = None if no_trace else (trace or session.default_trace_path(run, index))
        try:
            result = run.ask(question, trace_path=trace_path, quiet=quiet)
        except (KeyboardInterrupt, Interrupted) as exc:
            reason = str(exc) or "SIGINT"
            display.error(run.interrupted_message(reason))
            raise typer.Exit(130) from None
        if as_json:
            print(json.dumps(result.to_json(), ensure_ascii=False), flush=True)
        else:
            print(result.stdout_line(), flush=True)
        if result.answer.answer is None and not warned:
            display.warn(
                "the model put no answer in \\boxed{}; printed its raw final reply instead."
            )
            warned = True


def main() -> None:
    """Console entry point."""
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
