"""`memagent inspect`: what a document is and what reading it will take."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from memagent_cli.cli import options
from memagent_cli.cli.options import (
    FROM_FLAGS,
    OCR,
    OUTPUT,
    DocumentArg,
    FormatOpt,
    JsonOpt,
    ModelFlagsOpt,
    NoDocumentCacheOpt,
    OcrLangOpt,
    OcrOpt,
    PasswordOpt,
    QuietOpt,
    RecalibrateOpt,
    choices,
    reads,
    user_errors,
)
from memagent_cli.documents.ocr import OcrOptions
from memagent_cli.views import console
from memagent_cli.views.progress import reporter


class Tokenizer(StrEnum):
    """What counts a document's tokens for `inspect`."""

    model = "model"
    tiktoken = "tiktoken"


@user_errors
@reads
def inspect(
    document: DocumentArg,
    read: ModelFlagsOpt = FROM_FLAGS,
    tokenizer: Annotated[
        Tokenizer,
        typer.Option(
            metavar=choices(Tokenizer),
            help="Count tokens with the model's tokenizer, or with tiktoken.",
        ),
    ] = Tokenizer.model,
    estimate: Annotated[
        bool,
        typer.Option(
            help="Estimate a question's time from the model's speed measured at a step's depth."
        ),
    ] = True,
    recalibrate: RecalibrateOpt = False,
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
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Show DOCUMENT's format, pages, tokens and chunks without asking the model anything."""
    import dataclasses
    import os

    from memagent_cli import api
    from memagent_cli.documents import inputs
    from memagent_cli.models import local, registry
    from memagent_cli.run import unpulled
    from memagent_cli.views import inspect as views

    report = reporter(quiet)
    loaded = inputs.read_document(
        document,
        password=password,
        format=format,
        report=report,
        use_cache=not no_document_cache,
        ask_password=options.ask_password(),
        ocr=OcrOptions(ocr, ocr_lang),
        scanned_ok=True,  # --ocr never: the pages OCR would read are counted and estimated
    )
    if text:
        pages = api.document_pages(loaded)
        if as_json:
            console.result_json(pages, indent=2)
        else:
            views.print_pages(pages)
        return
    named = read.backend.model or os.environ.get(local.ENV_VAR)
    if tokenizer == "model" and (entry := unpulled.not_pulled(named)):
        # A registry model not pulled yet: priced from its shape, nothing downloaded.
        name = entry[0]
        how = read.reader or registry.reader_for(name)
        llama = dataclasses.replace(read.backend.llama, recalibrate=recalibrate)
        windows = dataclasses.replace(read.settings, reader=how)
        found = unpulled.inspect_unpulled(
            loaded, name, entry[1], windows, llama, estimate=estimate, report=report
        )
        if as_json:
            console.result_json(found, indent=2)
        else:
            views.print_report(found)
        return
    model = None
    if tokenizer == "model":
        read = dataclasses.replace(
            read,
            backend=dataclasses.replace(
                read.backend,
                llama=dataclasses.replace(read.backend.llama, recalibrate=recalibrate),
            ),
        )
        model = api.Model.open(read, report.note)
    found = api.inspect(
        loaded,
        model,
        windows=read.settings,
        encoding=read.backend.server.encoding,
        estimate=estimate,
        report=report,
    )
    if as_json:
        console.result_json(found, indent=2)
    else:
        views.print_report(found)
