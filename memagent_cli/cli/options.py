"""Options and checks shared by several commands, defined once: each option with its flag,
help and panel; the engine's flags given to every command that reads by one decorator
(`reads`), arriving as one checked ReadOptions; and the command class whose `--help` shows
them."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import os
import signal
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from typer import core

from memagent_cli import protocol, readers
from memagent_cli.backend import Sampling
from memagent_cli.backends.llama_cpp import MOST_THREADS, CacheType, FlashAttn, LlamaOptions
from memagent_cli.backends.openai import (
    MOST_TIMEOUT,
    ServerOptions,
    in_the_clear,
    openai_api_key,
    without_credentials,
)
from memagent_cli.documents.document import DocumentFormat
from memagent_cli.documents.ocr import OcrMode, OcrOptions
from memagent_cli.errors import Interrupted, UserError
from memagent_cli.reader import Settings
from memagent_cli.run.engine import READER_DEFAULTS, BackendKind, BackendOptions, ReadOptions
from memagent_cli.text import printable
from memagent_cli.views import console

F = TypeVar("F", bound=Callable[..., Any])

# Every command and group takes -h as well as --help.
CONTEXT = {"help_option_names": ["-h", "--help"]}


class _QuietOption(core.TyperOption):
    def display_type_rich(self, ctx: Any) -> str | None:
        return self.metavar  # N, FILE, URL, the choices: what the option declares, else nothing


class _QuietArgument(core.TyperArgument):
    def display_type_rich(self, ctx: Any) -> str | None:
        return None  # an argument's name already stands in its own column


# Why a class swap, and not an option of Typer's: Typer (0.29) builds every parameter itself,
# as a TyperOption or TyperArgument, and neither typer.Option nor typer.Argument takes a class
# (click.option's `cls=`). `metavar=` is honoured for an option that has one, but a flag has
# none to give (`--help` itself shows `<bool>`), and an argument's type is printed whatever
# its metavar says. `rich_help_panel`
# and `show_default` say nothing of the type. What Typer does let a program choose is the
# command's class (`cls=`, as every command of memagent names Command), and a command's
# `get_params` (Click's public hook) hands over each parameter before help is drawn: the
# quiet kinds are subclasses with no state of their own, so the swap keeps every attribute
# Typer set and changes one method. tests/test_cli.py fails if a type shows again.
def _quiet(param: Any) -> Any:
    """`param` as its quiet kind, whose help column shows only what its metavar says."""
    if type(param) is core.TyperOption:
        param.__class__ = _QuietOption
    elif type(param) is core.TyperArgument:
        param.__class__ = _QuietArgument
    return param


class Command(core.TyperCommand):
    """A command whose `--help` shows beside an option only what its metavar says (FILE, N,
    URL, the choices), never the Python type Typer (0.2x) prints (`<bool>`, `<str>`,
    `<int range> [x>=1]`): every command of memagent is one (`cls=Command`)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return [_quiet(param) for param in super().get_params(ctx)]


class Group(core.TyperGroup):
    """A group of commands whose own `--help` is as Command's (`cls=Group`)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return [_quiet(param) for param in super().get_params(ctx)]


def choices(kind: type[Enum]) -> str:
    """The metavar of an option of `kind`: its choices, as `a|b|c`."""
    return "|".join(str(choice.value) for choice in kind)


def at_least(low: float, most: float | None = None) -> Callable[[Any], Any]:
    """The check of a number option, said as Typer says its own ranges; a Typer `min=` would
    also print the range in `--help`, where the help says it."""

    def check(value: Any) -> Any:
        _finite(value)
        if value is not None and value < low:
            raise typer.BadParameter(f"Input should be greater than or equal to {low:g}")
        if value is not None and most is not None and value > most:
            raise typer.BadParameter(f"Input should be less than or equal to {most:g}")
        return value

    return check


def _finite(value: Any) -> None:
    """Refuse NaN and the infinities, which Typer reads as floats: a NaN compares false with
    every bound, so a range check alone lets it through."""
    if isinstance(value, float) and not math.isfinite(value):
        raise typer.BadParameter("Input should be a finite number")


def _fraction(value: float) -> float:
    _finite(value)
    if value < 0:
        raise typer.BadParameter("Input should be greater than or equal to 0")
    if value > 1:
        raise typer.BadParameter("Input should be less than or equal to 1")
    return value


# Where an option shows in `--help`, grouped as llama.cpp groups its flags, in this order.
INPUT, MODEL, READING = "Input", "Model", "Reading"
OUTPUT, SERVER_PANEL, ENGINE = "Output", "Server (--backend openai)", "Engine (llama.cpp)"
_PANELS = (None, INPUT, MODEL, READING, OUTPUT, SERVER_PANEL, ENGINE)
# Secrets may come from the environment, so that they need not sit in shell history or in
# what `ps` shows; a resume hint never repeats them (cli/ask.py).
PASSWORD_VARIABLE = "MEMAGENT_PDF_PASSWORD"
# $OPENAI_API_KEY is not one of them: it is the OpenAI SDK's key for $OPENAI_BASE_URL
# (ReadFlags below sends it there, and to OpenAI, only).
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
FormatOpt = Annotated[
    DocumentFormat | None,
    typer.Option(
        "--format",
        metavar=choices(DocumentFormat),
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
        metavar=choices(OcrMode),
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
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print JSON instead of text.", rich_help_panel=OUTPUT)
]
QuietOpt = Annotated[
    bool, typer.Option("--quiet", "-q", help="Show no progress.", rich_help_panel=OUTPUT)
]
WatchOpt = Annotated[
    int,
    typer.Option(
        metavar="N",
        callback=at_least(1),
        help="With several questions read at once: the live view shows this one's memory.",
        rich_help_panel=OUTPUT,
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


# The engine's flags, each declared once; ModelFlags and ReadFlags below give them to the
# commands. Engine settings are named as llama.cpp names them.
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
GpuLayersOpt = Annotated[
    int | None,
    typer.Option(
        "--gpu-layers",
        "-ngl",
        metavar="N",
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
        metavar="N",
        callback=at_least(1, most=MOST_THREADS),
        show_default=False,
        help="CPU threads \\[default: physical cores].",
        rich_help_panel=MODEL,
    ),
]
ChunkTokensOpt = Annotated[
    int,
    typer.Option(
        metavar="N",
        callback=at_least(1),
        help="Model tokens of document per step.",
        rich_help_panel=READING,
    ),
]
MemoryTokensOpt = Annotated[
    int,
    typer.Option(
        metavar="N",
        callback=at_least(1),
        help="Most tokens the memory (each update) may take "
        "\\[default: the reader's: 1024, rememr1 2048].",
        show_default=False,
        rich_help_panel=READING,
    ),
]


def _reader_name(value: str | None) -> str | None:
    """A name the reader registry knows (readers.get), else Typer's one-line error."""
    if value is not None:
        try:
            readers.get(value)
        except UserError as exc:
            raise typer.BadParameter(exc.message.removeprefix("There is no reader ")) from None
    return value


ReaderOpt = Annotated[
    str | None,
    typer.Option(
        "--reader",
        metavar="|".join(readers.BUILT_IN),
        callback=_reader_name,
        show_default=False,
        help="How the chunks are read: memagent (every chunk into the memory), rememr1 "
        "(recalls earlier memories), infmem (searches, stops early), memreread (rereads for "
        "what its memory lacks), pi-mem (every chunk at once, in passes), or a plugin's "
        "\\[default: the model's own, from the registry or its file, else memagent].",
        rich_help_panel=READING,
    ),
]


TemperatureOpt = Annotated[
    float,
    typer.Option(
        metavar="N",
        callback=at_least(0.0),
        help="Sampling temperature; 0 is greedy, reproducible "
        "\\[default: the reader's: 0.7, infmem 0].",
        show_default=False,
        rich_help_panel=READING,
    ),
]
TopPOpt = Annotated[
    float,
    typer.Option(
        metavar="N",
        callback=_fraction,
        help="Nucleus sampling \\[default: the reader's: 0.95, infmem 1].",
        show_default=False,
        rich_help_panel=READING,
    ),
]
SeedOpt = Annotated[
    int | None,
    typer.Option(
        metavar="N",
        help="Random seed for sampling.",
        show_default=False,
        rich_help_panel=READING,
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
# One meaning for every command: how many readings go at once (ReadOptions decides how).
ParallelOpt = Annotated[
    int | None,
    typer.Option(
        "--parallel",
        metavar="N",
        callback=at_least(1),
        show_default=False,
        help="Readings at once: read together in one context (in-process), or in flight "
        "(--backend openai) \\[default: ask: all that fit in memory where the calibration says a "
        "batch pays, else 1; 1 with a server; eval: 1].",
        rich_help_panel=READING,
    ),
]
VerboseOpt = Annotated[
    bool,
    typer.Option("--verbose", "-v", help="Show llama.cpp's own log.", rich_help_panel=OUTPUT),
]
BackendOpt = Annotated[
    BackendKind,
    typer.Option(
        metavar=choices(BackendKind),
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
TimeoutOpt = Annotated[
    float,
    typer.Option(
        metavar="N",
        callback=at_least(1.0, most=MOST_TIMEOUT),
        help="Seconds one call to a server may take in all, to the last byte of its reply "
        "(--backend openai).",
        rich_help_panel=SERVER_PANEL,
    ),
]
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
RecalibrateOpt = Annotated[
    bool,
    typer.Option(
        "--recalibrate",
        help="Measure again what the model costs on this machine, and keep it: which draft "
        "rounds are exact and their cost; with inspect, its prompt and reply speeds.",
        rich_help_panel=ENGINE,
    ),
]
FlashAttnOpt = Annotated[
    FlashAttn,
    typer.Option(
        "--flash-attn",
        "-fa",
        metavar=choices(FlashAttn),
        help="Flash attention.",
        rich_help_panel=ENGINE,
    ),
]
CacheTypeKOpt = Annotated[
    CacheType,
    typer.Option(
        "--cache-type-k",
        "-ctk",
        metavar=choices(CacheType),
        help="KV cache type for K.",
        rich_help_panel=ENGINE,
    ),
]
CacheTypeVOpt = Annotated[
    CacheType,
    typer.Option(
        "--cache-type-v",
        "-ctv",
        metavar=choices(CacheType),
        help="KV cache type for V (quantized needs flash attention).",
        rich_help_panel=ENGINE,
    ),
]
BatchSizeOpt = Annotated[
    int,
    typer.Option(
        "--batch-size",
        "-b",
        metavar="N",
        callback=at_least(1),
        help="Prompt tokens per llama_decode call.",
        rich_help_panel=ENGINE,
    ),
]
UbatchSizeOpt = Annotated[
    int,
    typer.Option(
        "--ubatch-size",
        "-ub",
        metavar="N",
        callback=at_least(1),
        help="Physical batch size.",
        rich_help_panel=ENGINE,
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

# The defaults of every flag, from the one place that owns each.
LLAMA, SERVER, SAMPLING = LlamaOptions(), ServerOptions(), Sampling()


@dataclass(frozen=True)
class ModelFlags:
    """The engine flags of `inspect`: the model, how llama.cpp runs it, and the windows a
    document is read in (what its token counts and a time estimate depend on)."""

    model: ModelOpt = None
    gpu_layers: GpuLayersOpt = LLAMA.gpu_layers
    threads: ThreadsOpt = LLAMA.threads
    chunk_tokens: ChunkTokensOpt = protocol.DEFAULT_CHUNK_TOKENS
    memory_tokens: MemoryTokensOpt = protocol.DEFAULT_MEMORY_TOKENS
    reader: ReaderOpt = None
    encoding: EncodingOpt = SERVER.encoding
    verbose: VerboseOpt = LLAMA.verbose
    speculate: SpeculateOpt = LLAMA.speculate
    exact: ExactOpt = LLAMA.exact
    flash_attn: FlashAttnOpt = LLAMA.flash_attn
    cache_type_k: CacheTypeKOpt = LLAMA.cache_type_k
    cache_type_v: CacheTypeVOpt = LLAMA.cache_type_v
    batch_size: BatchSizeOpt = LLAMA.batch_size
    ubatch_size: UbatchSizeOpt = LLAMA.ubatch_size
    repack: RepackOpt = LLAMA.repack

    def llama(self) -> LlamaOptions:
        """llama.cpp's options, checked (a sentence for what it cannot run)."""
        return LlamaOptions(
            threads=self.threads,
            gpu_layers=self.gpu_layers,
            verbose=self.verbose,
            speculate=self.speculate,
            exact=self.exact,
            flash_attn=self.flash_attn,
            cache_type_k=self.cache_type_k,
            cache_type_v=self.cache_type_v,
            batch_size=self.batch_size,
            ubatch_size=self.ubatch_size,
            repack=self.repack,
        )

    def options(self, ctx: typer.Context | None = None) -> ReadOptions:
        """What the flags say, checked: an in-process model and its windows."""
        return ReadOptions(
            BackendOptions(
                model=self.model, llama=self.llama(), server=ServerOptions(encoding=self.encoding)
            ),
            Settings(self.chunk_tokens, self.memory_tokens),
            reader=self.reader,
            given=_given(ctx, ("memory_tokens",)),
        )


@dataclass(frozen=True)
class ReadFlags(ModelFlags):
    """The engine flags of every command that reads (`ask`, `eval`): ModelFlags, sampling,
    a server instead of the model in this process, and --parallel."""

    temperature: TemperatureOpt = SAMPLING.temperature
    top_p: TopPOpt = SAMPLING.top_p
    seed: SeedOpt = SAMPLING.seed
    parallel: ParallelOpt = None
    backend: BackendOpt = BackendKind.llama
    base_url: BaseUrlOpt = SERVER.base_url
    api_key: ApiKeyOpt = SERVER.api_key
    served_model: ServedModelOpt = SERVER.served_model
    timeout: TimeoutOpt = SERVER.timeout
    recalibrate: RecalibrateOpt = LLAMA.recalibrate

    def llama(self) -> LlamaOptions:
        return dataclasses.replace(super().llama(), recalibrate=self.recalibrate)

    def options(self, ctx: typer.Context | None = None) -> ReadOptions:
        """What the flags say, checked (`ctx`: the command line, which says which of the
        reader's own values were given: the others are its authors'); with a server, the key
        it gets (--api-key, else $OPENAI_API_KEY where that key belongs), said once on stderr
        if it goes in the clear."""
        api_key = self.api_key
        if self.backend == BackendKind.openai:
            api_key = api_key or openai_api_key(self.base_url, os.environ)
            warn_if_in_the_clear(self.base_url, api_key)
        server = ServerOptions(
            base_url=self.base_url,
            api_key=api_key,
            served_model=self.served_model,
            encoding=self.encoding,
            timeout=self.timeout,
        )
        return ReadOptions(
            BackendOptions(BackendKind(self.backend), self.model, self.llama(), server),
            Settings(
                self.chunk_tokens,
                self.memory_tokens,
                Sampling(self.temperature, self.top_p, self.seed),
            ),
            self.parallel,
            reader=self.reader,
            given=_given(ctx, READER_DEFAULTS),
        )


def _given(ctx: typer.Context | None, names: tuple[str, ...]) -> frozenset[str]:
    """Which of the options `names` the command line gave: the others are the reader's
    authors' (run/engine.py reading_settings)."""
    if ctx is None:
        return frozenset(names)  # not from a command line: every value is the caller's
    sources = {name: ctx.get_parameter_source(name) for name in names}
    return frozenset(
        name for name, source in sources.items() if source is not None and source.name != "DEFAULT"
    )


# A command's parameter of one of these types receives its engine flags (`reads`); its
# default, FROM_FLAGS, only stands in for them.
ReadFlagsOpt = Annotated[ReadOptions, ReadFlags]
ModelFlagsOpt = Annotated[ReadOptions, ModelFlags]
FROM_FLAGS = ReadOptions()


def reads(command: F) -> F:
    """Give `command` the engine flags: its parameter typed ReadFlagsOpt (or ModelFlagsOpt)
    stands for them in the signature Typer reads, and receives them as one ReadOptions,
    checked. Every option is ordered by its help panel, so that the panels of every command
    come in one order."""
    signature = inspect.signature(command, eval_str=True)
    (marker,) = [p for p in signature.parameters.values() if _flags_kind(p.annotation)]
    kind = _flags_kind(marker.annotation)
    assert kind is not None
    hints = typing.get_type_hints(kind, include_extras=True)
    names = [field.name for field in dataclasses.fields(kind)]
    keyword = inspect.Parameter.KEYWORD_ONLY
    flags = [
        inspect.Parameter(field.name, keyword, default=field.default, annotation=hints[field.name])
        for field in dataclasses.fields(kind)
    ]
    params: list[inspect.Parameter] = []
    for param in signature.parameters.values():
        params += flags if param is marker else [param.replace(kind=keyword)]
    # Typer hands the command line's context to a parameter of this type: which flags it
    # gave, and which are defaults (ModelFlags.options).
    wants_context = "ctx" in signature.parameters
    if not wants_context:
        params.append(inspect.Parameter("ctx", keyword, annotation=typer.Context))
    params.sort(key=_panel_rank)

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        given = kind(**{name: kwargs.pop(name) for name in names})
        ctx = kwargs["ctx"] if wants_context else kwargs.pop("ctx")
        return command(**kwargs, **{marker.name: given.options(ctx)})

    wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper  # type: ignore[return-value]


def _flags_kind(annotation: Any) -> type[ModelFlags] | None:
    for extra in getattr(annotation, "__metadata__", ()):
        if isinstance(extra, type) and issubclass(extra, ModelFlags):
            return extra
    return None


def _panel_rank(param: inspect.Parameter) -> int:
    info = next(
        (m for m in getattr(param.annotation, "__metadata__", ()) if hasattr(m, "rich_help_panel")),
        None,
    )
    panel = getattr(info, "rich_help_panel", None)
    return _PANELS.index(panel) if panel in _PANELS else len(_PANELS)


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
