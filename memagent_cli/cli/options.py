"""Options and checks shared by several commands, defined once."""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
import sys
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from memagent_cli import readers
from memagent_cli.backend import Sampling
from memagent_cli.backends.llama_cpp import CacheType, FlashAttn, LlamaOptions
from memagent_cli.backends.openai import (
    ServerOptions,
    in_the_clear,
    openai_api_key,
    without_credentials,
)
from memagent_cli.documents.document import DocumentFormat
from memagent_cli.documents.ocr import OcrMode, OcrOptions
from memagent_cli.errors import Interrupted, UserError
from memagent_cli.run.engine import BackendKind, BackendOptions
from memagent_cli.text import printable
from memagent_cli.views import console

# The defaults of every option below, from the one place that owns each.
LLAMA, SERVER, SAMPLING = LlamaOptions(), ServerOptions(), Sampling()

F = TypeVar("F", bound=Callable[..., Any])

# Every command and group takes -h as well as --help.
CONTEXT = {"help_option_names": ["-h", "--help"]}


_SHOWN = {"int": "N", "int range": "N", "float": "N", "float range": "N", "file": "FILE"}
_SHOWN |= {"path": "PATH", "directory": "FOLDER"}


def shown_type(param: Any, ctx: Any) -> str | None:
    """What `--help` shows beside an option: a metavar only where it says something (FILE,
    N, URL, the choices), never `<bool>`, `<str>` or `<int range>`. An argument's name
    already stands in its own column."""
    from typer import core

    if isinstance(param, core.TyperArgument):
        return None
    if param.metavar is not None:
        return str(param.metavar)
    typed = param.display_type(ctx).strip("<>")  # Typer's label: "bool", "int range", "a|b"
    if "|" in typed and not typed.startswith("list["):
        return typed
    return _SHOWN.get(typed)


def _quiet_help_types() -> None:
    """Typer (0.2x) prints every parameter's Python type in `--help`; shown_type says what
    to print instead. Older Typer prints Click's metavars and has nothing to replace."""
    from typer import core

    for cls in (core.TyperOption, core.TyperArgument):
        if hasattr(cls, "display_type_rich") and hasattr(cls, "display_type"):
            cls.display_type_rich = shown_type
        if hasattr(cls, "_get_number_range_help_str"):  # "[x>=1]": the help says the range
            cls._get_number_range_help_str = lambda self: None


_quiet_help_types()

# Where an option shows in `--help`, grouped as llama.cpp groups its flags.
INPUT, MODEL, READING = "Input", "Model", "Reading"
OUTPUT, SERVER_PANEL, ENGINE = "Output", "Server (--backend openai)", "Engine (llama.cpp)"
# Secrets may come from the environment, so that they need not sit in shell history or in
# what `ps` shows; a resume hint never repeats them (cli/ask.py).
PASSWORD_VARIABLE = "MEMAGENT_PDF_PASSWORD"
# $OPENAI_API_KEY is not one of them: it is the OpenAI SDK's key for $OPENAI_BASE_URL
# (backend_options below sends it there, and to OpenAI, only).
API_KEY_VARIABLE = "MEMAGENT_API_KEY"
SECRET_OPTIONS = {"--password": PASSWORD_VARIABLE, "--api-key": API_KEY_VARIABLE}


def complete_model(incomplete: str) -> list[str]:
    """Shell completion for --model: registry names and the GGUFs in the models folders
    (an empty list lets the shell complete file names instead)."""
    from memagent_cli.gguf_header import split_parts
    from memagent_cli.models import hub, registry

    names = list(registry.registry())
    for folder in registry.model_dirs():
        for path in sorted(folder.rglob("*.gguf")) if folder.is_dir() else []:
            if split_parts(path)[0] == 1:  # a split model by its first part
                name = registry.hub_name(path)  # hf:OWNER/NAME:QUANT when it was pulled
                names.append(name if name.startswith(hub.PREFIX) else str(path))
    return [name for name in dict.fromkeys(names) if name.startswith(incomplete)]


DocumentArg = Annotated[
    str,
    typer.Argument(help="Text, Markdown, PDF or EPUB file, or - for stdin.", metavar="DOCUMENT"),
]
DocumentsArg = Annotated[
    str | None,
    typer.Argument(
        help="Text, Markdown, PDF or EPUB file, a folder of them, or - for stdin; with "
        "--documents FILE, every argument is a question.",
        metavar="DOCUMENT",
        show_default=False,
    ),
]
ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        metavar="MODEL",
        show_default=False,
        autocompletion=complete_model,
        rich_help_panel=MODEL,
        help="GGUF file, registry name, or hf:OWNER/NAME[:QUANT] (pulled on first use) "
        "\\[default: $MEMAGENT_MODEL, else the default model].",
    ),
]
ChunkTokensOpt = Annotated[
    int, typer.Option(min=1, help="Model tokens of document per step.", rich_help_panel=READING)
]
MemoryTokensOpt = Annotated[
    int,
    typer.Option(
        min=1, help="Most tokens the memory (each update) may take.", rich_help_panel=READING
    ),
]
# The readers of readers/, as an Enum so that --help lists them.
ReaderName = StrEnum("ReaderName", {name: name for name in readers.NAMES})
ReaderOpt = Annotated[
    ReaderName | None,
    typer.Option(
        "--reader",
        show_default=False,
        help="How the chunks are read: memagent (every chunk into the memory), rememr1 "
        "(recalls earlier memories), infmem (searches, stops early) \\[default: the model's "
        "own, from the registry, else memagent].",
        rich_help_panel=READING,
    ),
]
FormatOpt = Annotated[
    DocumentFormat | None,
    typer.Option(
        "--format",
        show_default=False,
        help="Read DOCUMENT as text, pdf or epub, whatever its content looks like.",
        rich_help_panel=INPUT,
    ),
]
PasswordOpt = Annotated[
    str | None,
    typer.Option(
        metavar="PASSWORD",
        envvar=PASSWORD_VARIABLE,
        show_default=False,
        help="Password of an encrypted PDF \\[default: asked for on a terminal].",
        rich_help_panel=INPUT,
    ),
]
NoDocumentCacheOpt = Annotated[
    bool,
    typer.Option(
        "--no-document-cache",
        help="Extract the document's text again, and keep no copy of it in the cache.",
        rich_help_panel=INPUT,
    ),
]
OcrOpt = Annotated[
    OcrMode,
    typer.Option(
        "--ocr",
        help="Read PDF pages by OCR: those without a text layer (auto), every page, for a "
        "garbage text layer (always), or none (never).",
        rich_help_panel=INPUT,
    ),
]
OcrLangOpt = Annotated[
    str,
    typer.Option(
        "--ocr-lang",
        metavar="LANGS",
        help="Languages of the pages OCR reads: Tesseract's names joined by + (eng+deu), or "
        "ISO codes (en,de).",
        rich_help_panel=INPUT,
    ),
]
OCR = OcrOptions()  # the defaults of --ocr and --ocr-lang
GpuLayersOpt = Annotated[
    int | None,
    typer.Option(
        "--gpu-layers",
        "-ngl",
        show_default=False,
        help="Layers to offload to the GPU \\[default: all when llama.cpp was built with GPU "
        "support, else 0].",
        rich_help_panel=MODEL,
    ),
]
ThreadsOpt = Annotated[
    int | None,
    typer.Option(
        "--threads",
        "-t",
        min=1,
        show_default=False,
        help="CPU threads \\[default: physical cores].",
        rich_help_panel=MODEL,
    ),
]
EncodingOpt = Annotated[
    str,
    typer.Option(
        metavar="NAME",
        help="tiktoken encoding, where the model's own tokenizer is not at hand.",
        rich_help_panel=READING,
    ),
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print JSON instead of text.", rich_help_panel=OUTPUT)
]
QuietOpt = Annotated[
    bool, typer.Option("--quiet", "-q", help="Show no progress.", rich_help_panel=OUTPUT)
]
VerboseOpt = Annotated[
    bool,
    typer.Option("--verbose", "-v", help="Show llama.cpp's own log.", rich_help_panel=OUTPUT),
]


TemperatureOpt = Annotated[
    float,
    typer.Option(
        min=0.0, help="Sampling temperature; 0 is greedy, reproducible.", rich_help_panel=READING
    ),
]
TopPOpt = Annotated[
    float, typer.Option(min=0.0, max=1.0, help="Nucleus sampling.", rich_help_panel=READING)
]
SeedOpt = Annotated[
    int | None,
    typer.Option(help="Random seed for sampling.", show_default=False, rich_help_panel=READING),
]
BackendOpt = Annotated[
    BackendKind,
    typer.Option(
        help="llama (in-process GGUF) or openai (an OpenAI-compatible server).",
        rich_help_panel=SERVER_PANEL,
    ),
]
BaseUrlOpt = Annotated[
    str | None,
    typer.Option(
        metavar="URL",
        envvar=["MEMAGENT_BASE_URL", "OPENAI_BASE_URL"],
        show_default=False,
        help="Server URL for --backend openai, e.g. http://127.0.0.1:8080/v1.",
        rich_help_panel=SERVER_PANEL,
    ),
]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option(
        metavar="KEY",
        envvar=API_KEY_VARIABLE,
        show_default=False,
        help="Server API key (the variable keeps it out of shell history); $OPENAI_API_KEY "
        "is sent only to $OPENAI_BASE_URL or api.openai.com.",
        rich_help_panel=SERVER_PANEL,
    ),
]
ServedModelOpt = Annotated[
    str | None,
    typer.Option(
        metavar="NAME",
        envvar="MEMAGENT_SERVED_MODEL",
        show_default=False,
        help="Model name on the server \\[default: the first it serves].",
        rich_help_panel=SERVER_PANEL,
    ),
]
ParallelOpt = Annotated[
    int,
    typer.Option(
        min=1,
        help="Cases at once: read together in one context (in-process), or in flight "
        "(--backend openai).",
        rich_help_panel=READING,
    ),
]
TogetherOpt = Annotated[
    int | None,
    typer.Option(
        "--parallel",
        min=1,
        show_default=False,
        help="Questions read at once \\[default: all that fit in memory; 1 with a server].",
        rich_help_panel=READING,
    ),
]
WatchOpt = Annotated[
    int,
    typer.Option(
        min=1,
        help="With several questions read at once: the live view shows this one's memory.",
        rich_help_panel=OUTPUT,
    ),
]
TimeoutOpt = Annotated[
    float,
    typer.Option(
        min=1.0,
        help="Seconds one call to a server may take in all, to the last byte of its reply "
        "(--backend openai).",
        rich_help_panel=SERVER_PANEL,
    ),
]


def html_file(name: str, help: str, panel: str | None = None) -> Any:
    """The option of a command that also writes an HTML report (views/html.py) to FILE:
    `ask --html`, `trace --html`, `eval report --html`. Only the name, the help and the
    help panel differ between them."""
    return typer.Option(
        name, metavar="FILE", dir_okay=False, show_default=False, help=help, rich_help_panel=panel
    )


NoTraceOpt = Annotated[
    bool, typer.Option("--no-trace", help="Write no trace.", rich_help_panel=OUTPUT)
]
NoReuseOpt = Annotated[
    bool,
    typer.Option(
        "--no-reuse",
        help="Read again even where an identical greedy run finished (else its answer is reused).",
        rich_help_panel=OUTPUT,
    ),
]


# Engine settings, named as llama.cpp names them.
SpeculateOpt = Annotated[
    bool,
    typer.Option(
        "--speculate/--no-speculate",
        help="Draft memory tokens from the prompt and verify them in one batch.",
        rich_help_panel=ENGINE,
    ),
]
ExactOpt = Annotated[
    bool,
    typer.Option(
        "--exact",
        help="Output byte-identical with and without drafts and other questions (CPU only).",
        rich_help_panel=ENGINE,
    ),
]
FlashAttnOpt = Annotated[
    FlashAttn,
    typer.Option("--flash-attn", "-fa", help="Flash attention.", rich_help_panel=ENGINE),
]
CacheTypeKOpt = Annotated[
    CacheType,
    typer.Option("--cache-type-k", "-ctk", help="KV cache type for K.", rich_help_panel=ENGINE),
]
CacheTypeVOpt = Annotated[
    CacheType,
    typer.Option(
        "--cache-type-v",
        "-ctv",
        help="KV cache type for V (quantized needs flash attention).",
        rich_help_panel=ENGINE,
    ),
]
BatchSizeOpt = Annotated[
    int,
    typer.Option(
        "--batch-size",
        "-b",
        min=1,
        help="Prompt tokens per llama_decode call.",
        rich_help_panel=ENGINE,
    ),
]
UbatchSizeOpt = Annotated[
    int,
    typer.Option(
        "--ubatch-size", "-ub", min=1, help="Physical batch size.", rich_help_panel=ENGINE
    ),
]

RepackOpt = Annotated[
    bool | None,
    typer.Option(
        "--repack/--no-repack",
        show_default=False,
        help="llama.cpp's own weight layouts, AMX included \\[default: repacked, never AMX].",
        rich_help_panel=ENGINE,
    ),
]


def user_errors(command: F) -> F:
    """Turn errors a user can cause into one sentence on stderr and a non-zero exit."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except UserError as exc:
            console.error(exc.message)
            raise typer.Exit(exc.exit_code) from None

    return wrapper  # type: ignore[return-value]


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Interrupted("SIGTERM")


def stop_on_sigterm() -> None:
    """SIGTERM stops a run as Ctrl-C does: the trace keeps every finished step, and the exit
    code is 143 (130 for Ctrl-C), as a shell reports each."""
    signal.signal(signal.SIGTERM, _on_sigterm)


def ask_password() -> Callable[[str], str] | None:
    """What asks for the password of an encrypted PDF: a hidden prompt on stderr when stdin
    is a terminal, else nothing (the reader then says to pass --password)."""
    if not sys.stdin.isatty():
        return None

    def prompt(where: str) -> str:
        return str(
            typer.prompt(f"Password for {printable(Path(where).name)}", hide_input=True, err=True)
        )

    return prompt


_LLAMA_FIELDS = {f.name for f in dataclasses.fields(LlamaOptions)}
_SERVER_FIELDS = {f.name for f in dataclasses.fields(ServerOptions)}


def warn_if_in_the_clear(url: str | None, api_key: str | None) -> None:
    """One line on stderr when a key, or the user:password@ of `url`, goes unencrypted to
    another machine: the user said where it goes, but may not have meant it to be readable
    on the way."""
    if not url or not in_the_clear(url):
        return
    if api_key:
        secret = "API key"
    elif without_credentials(url) != url:
        secret = "user:password of the server URL"
    else:
        return
    console.warn(
        f"the {secret} goes unencrypted to {without_credentials(url)} (plain http to "
        "another machine), where anyone on the way can read it; use https."
    )


def backend_options(
    backend: BackendKind, parallel: int, runs: str = "question runs", **fields: Any
) -> BackendOptions:
    """The backend options of a command, checked: several runs in flight need a server
    (`parallel` 1 where an in-process model reads them together). `fields` are the
    options of either backend, under their own names, and `model`."""
    if parallel > 1 and backend != BackendKind.openai:
        raise typer.BadParameter(
            f"one in-process model reads one at a time; --parallel (several {runs} at once) "
            "needs --backend openai.",
            param_hint="--parallel",
        )
    llama = {k: v for k, v in fields.items() if k in _LLAMA_FIELDS}
    server = {k: v for k, v in fields.items() if k in _SERVER_FIELDS}
    if backend == BackendKind.openai:
        server["api_key"] = server.get("api_key") or openai_api_key(
            server.get("base_url"), os.environ
        )
        warn_if_in_the_clear(server.get("base_url"), server["api_key"])
    return BackendOptions(
        kind=BackendKind(backend),
        model=fields.get("model"),
        llama=LlamaOptions(**llama),
        server=ServerOptions(**server),
    )
