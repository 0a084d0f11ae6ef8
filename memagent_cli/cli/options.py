"""Options and checks shared by several commands, defined once."""

from __future__ import annotations

import dataclasses
import functools
import signal
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer

from memagent_cli.backend import Sampling
from memagent_cli.backends.llama_cpp import CacheType, FlashAttn, LlamaOptions
from memagent_cli.backends.openai import ServerOptions
from memagent_cli.documents.document import DocumentFormat
from memagent_cli.errors import Interrupted, UserError
from memagent_cli.run.engine import BackendKind, BackendOptions
from memagent_cli.views import console

# The defaults of every option below, from the one place that owns each.
LLAMA, SERVER, SAMPLING = LlamaOptions(), ServerOptions(), Sampling()

F = TypeVar("F", bound=Callable[..., Any])

DocumentArg = Annotated[
    str,
    typer.Argument(help="Text, Markdown, PDF or EPUB file, or - for stdin.", metavar="DOCUMENT"),
]
DocumentsArg = Annotated[
    str,
    typer.Argument(
        help="Text, Markdown, PDF or EPUB file, a folder of them, or - for stdin.",
        metavar="DOCUMENT",
    ),
]
ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        show_default=False,
        help="GGUF file, registry name, or hf:OWNER/NAME[:QUANT] (pulled on first use) "
        "\\[default: $MEMAGENT_MODEL, else the default model].",
    ),
]
ChunkTokensOpt = Annotated[int, typer.Option(min=1, help="Model tokens of document per step.")]
MemoryTokensOpt = Annotated[
    int, typer.Option(min=1, help="Most tokens the memory (each update) may take.")
]
FormatOpt = Annotated[
    DocumentFormat | None,
    typer.Option(
        "--format",
        show_default=False,
        help="Read DOCUMENT as text, pdf or epub, whatever its content looks like.",
    ),
]
PasswordOpt = Annotated[
    str | None, typer.Option(help="Password of an encrypted PDF.", show_default=False)
]
GpuLayersOpt = Annotated[
    int | None,
    typer.Option(
        "--gpu-layers",
        "-ngl",
        show_default=False,
        help="Layers to offload to the GPU \\[default: all when llama.cpp was built with GPU "
        "support, else 0].",
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
    ),
]
EncodingOpt = Annotated[
    str, typer.Option(help="tiktoken encoding, where the model's own tokenizer is not at hand.")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="Show no progress.")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Show llama.cpp's own log.")]


TemperatureOpt = Annotated[
    float, typer.Option(min=0.0, help="Sampling temperature; 0 is greedy, reproducible.")
]
TopPOpt = Annotated[float, typer.Option(min=0.0, max=1.0, help="Nucleus sampling.")]
SeedOpt = Annotated[int | None, typer.Option(help="Random seed for sampling.", show_default=False)]
BackendOpt = Annotated[
    BackendKind,
    typer.Option(help="llama (in-process GGUF) or openai (an OpenAI-compatible server)."),
]
BaseUrlOpt = Annotated[
    str | None,
    typer.Option(
        envvar="MEMAGENT_BASE_URL",
        show_default=False,
        help="Server URL for --backend openai, e.g. http://127.0.0.1:8080/v1.",
    ),
]
ApiKeyOpt = Annotated[
    str | None, typer.Option(envvar="MEMAGENT_API_KEY", show_default=False, help="Server API key.")
]
ServedModelOpt = Annotated[
    str | None,
    typer.Option(
        envvar="MEMAGENT_SERVED_MODEL",
        show_default=False,
        help="Model name on the server \\[default: the first it serves].",
    ),
]
ParallelOpt = Annotated[
    int,
    typer.Option(
        min=1,
        help="Cases at once: read together in one context (in-process), or in flight "
        "(--backend openai).",
    ),
]
TogetherOpt = Annotated[
    int | None,
    typer.Option(
        "--parallel",
        min=1,
        show_default=False,
        help="Questions read at once: in one pass of an in-process model \\[default: all "
        "that fit in memory], or runs in flight (--backend openai) \\[default: 1].",
    ),
]
WatchOpt = Annotated[
    int,
    typer.Option(
        min=1, help="With several questions read at once: the live view shows this one's memory."
    ),
]
TimeoutOpt = Annotated[
    float, typer.Option(min=1.0, help="Seconds a server may take for one call (--backend openai).")
]
NoTraceOpt = Annotated[bool, typer.Option("--no-trace", help="Write no trace.")]
NoCacheOpt = Annotated[
    bool,
    typer.Option("--no-cache", help="Read again even if an identical greedy run finished."),
]


# Engine settings, named as llama.cpp names them.
SpeculateOpt = Annotated[
    bool,
    typer.Option(
        "--speculate/--no-speculate",
        help="Draft memory tokens from the prompt and verify them in one batch (exact: the "
        "output is the same either way).",
    ),
]
ExactOpt = Annotated[
    bool,
    typer.Option(
        "--exact",
        help="Decode every token on llama.cpp's batched kernels, so that the output is "
        "byte-identical with and without speculation and with and without other questions "
        "read together; up to 1.9x slower per token on a CPU where few drafts are accepted.",
    ),
]
FlashAttnOpt = Annotated[FlashAttn, typer.Option("--flash-attn", "-fa", help="Flash attention.")]
CacheTypeKOpt = Annotated[
    CacheType, typer.Option("--cache-type-k", "-ctk", help="KV cache type for K.")
]
CacheTypeVOpt = Annotated[
    CacheType,
    typer.Option(
        "--cache-type-v", "-ctv", help="KV cache type for V (quantized needs flash attention)."
    ),
]
BatchSizeOpt = Annotated[
    int, typer.Option("--batch-size", "-b", min=1, help="Prompt tokens per llama_decode call.")
]
UbatchSizeOpt = Annotated[
    int, typer.Option("--ubatch-size", "-ub", min=1, help="Physical batch size.")
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
    """SIGTERM stops a run as Ctrl-C does: the trace keeps every finished step."""
    signal.signal(signal.SIGTERM, _on_sigterm)


_LLAMA_FIELDS = {f.name for f in dataclasses.fields(LlamaOptions)}
_SERVER_FIELDS = {f.name for f in dataclasses.fields(ServerOptions)}


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
    return BackendOptions(
        kind=BackendKind(backend),
        model=fields.get("model"),
        llama=LlamaOptions(**llama),
        server=ServerOptions(**server),
    )
