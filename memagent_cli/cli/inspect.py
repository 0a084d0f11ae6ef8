"""`memagent inspect`: what a document is and what reading it will take."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from memagent_cli import protocol
from memagent_cli.backends.factory import BackendOptions
from memagent_cli.cli.options import (
    ChunkTokensOpt,
    DocumentArg,
    EncodingOpt,
    FormatOpt,
    GpuLayersOpt,
    JsonOpt,
    MemoryTokensOpt,
    ModelOpt,
    PasswordOpt,
    QuietOpt,
    ThreadsOpt,
    VerboseOpt,
    user_errors,
)


@user_errors
def inspect(
    document: DocumentArg,
    model: ModelOpt = None,
    chunk_tokens: ChunkTokensOpt = protocol.DEFAULT_CHUNK_TOKENS,
    memory_tokens: MemoryTokensOpt = protocol.DEFAULT_MEMORY_TOKENS,
    tokenizer: Annotated[
        str, typer.Option(help="Count tokens with the model's tokenizer, or with tiktoken.")
    ] = "model",
    encoding: EncodingOpt = "cl100k_base",
    estimate: Annotated[
        bool, typer.Option(help="Estimate a question's time from a short model warm-up.")
    ] = True,
    password: PasswordOpt = None,
    format: FormatOpt = None,
    gpu_layers: GpuLayersOpt = None,
    threads: ThreadsOpt = None,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Show DOCUMENT's format, pages, tokens and chunks without asking the model anything."""
    from memagent_cli import inspection

    if tokenizer not in ("model", "tiktoken"):
        raise typer.BadParameter("choose model or tiktoken.", param_hint="--tokenizer")
    report = inspection.inspect_document(
        document,
        password=password,
        format=format,
        model=BackendOptions(model=model, threads=threads, gpu_layers=gpu_layers, verbose=verbose)
        if tokenizer == "model"
        else None,
        encoding=encoding,
        chunk_tokens=chunk_tokens,
        memory_tokens=memory_tokens,
        estimate=estimate and tokenizer == "model",
        quiet=quiet,
    )
    if as_json:
        print(json.dumps(report, ensure_ascii=False, indent=2))
    else:
        inspection.print_report(report)
