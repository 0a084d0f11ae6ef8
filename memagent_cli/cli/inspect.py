"""`memagent inspect`: what a document is and what reading it will take."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from memagent_cli import protocol
from memagent_cli.backends.llama_cpp import LlamaOptions
from memagent_cli.cli import options
from memagent_cli.cli.options import (
    OCR,
    OUTPUT,
    SERVER,
    ChunkTokensOpt,
    DocumentArg,
    EncodingOpt,
    FormatOpt,
    GpuLayersOpt,
    JsonOpt,
    MemoryTokensOpt,
    ModelOpt,
    NoDocumentCacheOpt,
    OcrLangOpt,
    OcrOpt,
    PasswordOpt,
    QuietOpt,
    RepackOpt,
    ThreadsOpt,
    VerboseOpt,
    user_errors,
)
from memagent_cli.documents.ocr import OcrOptions
from memagent_cli.run.engine import BackendOptions
from memagent_cli.views import console
from memagent_cli.views.progress import reporter


class Tokenizer(StrEnum):
    """What counts a document's tokens for `inspect`."""

    model = "model"
    tiktoken = "tiktoken"


@user_errors
def inspect(
    document: DocumentArg,
    model: ModelOpt = None,
    chunk_tokens: ChunkTokensOpt = protocol.DEFAULT_CHUNK_TOKENS,
    memory_tokens: MemoryTokensOpt = protocol.DEFAULT_MEMORY_TOKENS,
    tokenizer: Annotated[
        Tokenizer, typer.Option(help="Count tokens with the model's tokenizer, or with tiktoken.")
    ] = Tokenizer.model,
    encoding: EncodingOpt = SERVER.encoding,
    estimate: Annotated[
        bool, typer.Option(help="Estimate a question's time from a short model warm-up.")
    ] = True,
    password: PasswordOpt = None,
    format: FormatOpt = None,
    no_document_cache: NoDocumentCacheOpt = False,
    ocr: OcrOpt = OCR.mode,
    ocr_lang: OcrLangOpt = OCR.languages,
    text: Annotated[
        bool,
        typer.Option(
            "--text",
            help="Print the text memagent reads, page by page (chapter by chapter), each "
            "under a line with its label, instead of the report.",
            rich_help_panel=OUTPUT,
        ),
    ] = False,
    gpu_layers: GpuLayersOpt = None,
    threads: ThreadsOpt = None,
    repack: RepackOpt = None,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Show DOCUMENT's format, pages, tokens and chunks without asking the model anything."""
    from memagent_cli.documents import inputs
    from memagent_cli.run import inspect as inspection
    from memagent_cli.views import inspect as views

    report = reporter(quiet)
    read = inputs.read_document(
        document,
        password=password,
        format=format,
        report=report,
        use_cache=not no_document_cache,
        ask_password=options.ask_password(),
        ocr=OcrOptions(ocr, ocr_lang),
    )
    if text:
        pages = inspection.document_pages(read)
        if as_json:
            console.result_json(pages, indent=2)
        else:
            views.print_pages(pages)
        return
    found = inspection.inspect_document(
        read,
        model=BackendOptions(
            model=model,
            llama=LlamaOptions(
                threads=threads, gpu_layers=gpu_layers, verbose=verbose, repack=repack
            ),
        )
        if tokenizer == "model"
        else None,
        encoding=encoding,
        chunk_tokens=chunk_tokens,
        memory_tokens=memory_tokens,
        estimate=estimate and tokenizer == "model",
        report=report,
    )
    if as_json:
        console.result_json(found, indent=2)
    else:
        views.print_report(found)
