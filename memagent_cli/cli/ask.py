"""`memagent ask`: options in, one batch of runs out."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

from memagent_cli import protocol
from memagent_cli.backends.openai import without_credentials
from memagent_cli.cli import options
from memagent_cli.cli.options import (
    INPUT,
    LLAMA,
    OCR,
    OUTPUT,
    SAMPLING,
    SECRET_OPTIONS,
    SERVER,
    ApiKeyOpt,
    BackendOpt,
    BaseUrlOpt,
    BatchSizeOpt,
    CacheTypeKOpt,
    CacheTypeVOpt,
    ChunkTokensOpt,
    DocumentsArg,
    EncodingOpt,
    ExactOpt,
    FlashAttnOpt,
    FormatOpt,
    GpuLayersOpt,
    JsonOpt,
    MemoryTokensOpt,
    ModelOpt,
    NoDocumentCacheOpt,
    NoReuseOpt,
    NoTraceOpt,
    OcrLangOpt,
    OcrOpt,
    PasswordOpt,
    QuietOpt,
    ReaderOpt,
    RepackOpt,
    SeedOpt,
    ServedModelOpt,
    SpeculateOpt,
    TemperatureOpt,
    ThreadsOpt,
    TimeoutOpt,
    TogetherOpt,
    TopPOpt,
    UbatchSizeOpt,
    VerboseOpt,
    WatchOpt,
    user_errors,
)
from memagent_cli.documents.ocr import OcrOptions
from memagent_cli.run.engine import BackendKind
from memagent_cli.text import decoded
from memagent_cli.trace import check_new, check_resumable, read_trace
from memagent_cli.views import console, html
from memagent_cli.views.progress import reporter
from memagent_cli.views.traces import evidence_line


@user_errors
def ask(
    document: DocumentsArg = None,
    questions: Annotated[
        list[str] | None,
        typer.Argument(help="One or more questions.", show_default=False, metavar="QUESTION"),
    ] = None,
    questions_file: Annotated[
        Path | None,
        typer.Option(
            "--questions",
            metavar="FILE",
            help="File of questions, one per line.",
            show_default=False,
            rich_help_panel=INPUT,
        ),
    ] = None,
    documents_file: Annotated[
        Path | None,
        typer.Option(
            "--documents",
            metavar="FILE",
            show_default=False,
            help="File of document paths, one per line.",
            rich_help_panel=INPUT,
        ),
    ] = None,
    glob: Annotated[
        str | None,
        typer.Option(
            metavar="PATTERN",
            show_default=False,
            help="With a folder as DOCUMENT: read only files matching this pattern.",
            rich_help_panel=INPUT,
        ),
    ] = None,
    model: ModelOpt = None,
    reader: ReaderOpt = None,
    chunk_tokens: ChunkTokensOpt = protocol.DEFAULT_CHUNK_TOKENS,
    memory_tokens: MemoryTokensOpt = protocol.DEFAULT_MEMORY_TOKENS,
    temperature: TemperatureOpt = SAMPLING.temperature,
    top_p: TopPOpt = SAMPLING.top_p,
    seed: SeedOpt = None,
    password: PasswordOpt = None,
    format: FormatOpt = None,
    no_document_cache: NoDocumentCacheOpt = False,
    ocr: OcrOpt = OCR.mode,
    ocr_lang: OcrLangOpt = OCR.languages,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
    trace: Annotated[
        Path | None,
        typer.Option(
            help="Write the trace here \\[default: a new file in the data folder; none for an "
            "encrypted document].",
            show_default=False,
            dir_okay=False,
            rich_help_panel=OUTPUT,
        ),
    ] = None,
    no_trace: NoTraceOpt = False,
    resume: Annotated[
        Path | None,
        typer.Option(
            metavar="TRACE",
            show_default=False,
            dir_okay=False,
            help="Continue the interrupted run in TRACE after its last finished step.",
            rich_help_panel=OUTPUT,
        ),
    ] = None,
    resume_latest: Annotated[
        bool,
        typer.Option(
            "--resume-latest",
            help="Continue the newest unfinished trace of the same document, question, model "
            "and settings.",
            rich_help_panel=OUTPUT,
        ),
    ] = False,
    no_reuse: NoReuseOpt = False,
    backend: BackendOpt = BackendKind.llama,
    base_url: BaseUrlOpt = None,
    api_key: ApiKeyOpt = None,
    served_model: ServedModelOpt = None,
    encoding: EncodingOpt = SERVER.encoding,
    parallel: TogetherOpt = None,
    watch: WatchOpt = 1,
    timeout: TimeoutOpt = SERVER.timeout,
    gpu_layers: GpuLayersOpt = None,
    threads: ThreadsOpt = None,
    speculate: SpeculateOpt = LLAMA.speculate,
    exact: ExactOpt = LLAMA.exact,
    flash_attn: FlashAttnOpt = LLAMA.flash_attn,
    cache_type_k: CacheTypeKOpt = LLAMA.cache_type_k,
    cache_type_v: CacheTypeVOpt = LLAMA.cache_type_v,
    batch_size: BatchSizeOpt = LLAMA.batch_size,
    ubatch_size: UbatchSizeOpt = LLAMA.ubatch_size,
    repack: RepackOpt = LLAMA.repack,
    verbose: VerboseOpt = False,
    report_file: Annotated[
        Path | None,
        options.html_file(
            "--html", "Also write an HTML report of the runs to FILE: a tab per question.", OUTPUT
        ),
    ] = None,
) -> None:
    """Read DOCUMENT chunk by chunk into a memory and answer each QUESTION from it."""
    import dataclasses

    from memagent_cli import api
    from memagent_cli.backend import Sampling
    from memagent_cli.documents import inputs
    from memagent_cli.models import registry
    from memagent_cli.reader import Settings
    from memagent_cli.run import engine, journal

    if documents_file is not None and document is not None:
        # The documents come from the file, so every argument is a question, as `rg -f FILE`
        # takes its patterns from FILE and its arguments as paths.
        questions, document = [document, *(questions or [])], None
    elif documents_file is None and document is None:
        raise typer.BadParameter(
            "give a DOCUMENT, or a file of them with --documents FILE.", param_hint="DOCUMENT"
        )
    asked = [decoded(q).strip() for q in questions or [] if q.strip()]
    if questions_file is not None:
        asked += inputs.read_list(questions_file, "questions")
    if not asked:
        raise typer.BadParameter(
            "give at least one question, as an argument or with --questions FILE.",
            param_hint="QUESTION",
        )
    for option, named in (("--trace", trace), ("--resume", resume)):
        if named is not None and len(asked) > 1:
            raise typer.BadParameter(
                f"{option} names one trace, but there are several questions; leave the path "
                "out to use one trace per question in the data folder.",
                param_hint=option,
            )
    named = {"--trace": trace is not None, "--resume": resume is not None}
    chosen = [name for name, on in {**named, "--resume-latest": resume_latest}.items() if on]
    if len(chosen) > 1:
        raise typer.BadParameter(f"give one of {' and '.join(chosen)}.", param_hint=chosen[0])
    in_process = backend != BackendKind.openai  # reads several questions together in one pass
    backend_options = options.backend_options(
        backend,
        1 if in_process else parallel or 1,
        model=model,
        base_url=base_url,
        api_key=api_key,
        served_model=served_model,
        encoding=encoding,
        threads=threads,
        gpu_layers=gpu_layers,
        timeout=timeout,
        verbose=verbose,
        speculate=speculate,
        exact=exact,
        flash_attn=flash_attn,
        cache_type_k=cache_type_k,
        cache_type_v=cache_type_v,
        batch_size=batch_size,
        ubatch_size=ubatch_size,
        repack=repack,
    )
    paths = inputs.document_paths(document, documents_file, glob)
    if len(paths) > 1 and (trace is not None or resume is not None):
        raise typer.BadParameter(
            "a named trace is for one document; leave the path out with several documents.",
            param_hint="--trace" if trace is not None else "--resume",
        )
    # Before any model loads: a trace that cannot be written, one to resume that is not there
    # or that another run is writing, or a data folder where traces cannot be kept.
    if trace is not None and not no_trace:
        check_new(trace)
    if resume is not None:
        read_trace(resume)
        check_resumable(resume)
    if not no_trace and trace is None and resume is None:
        journal.check_data_folder()
    if report_file is not None:
        html.check_writable(report_file)
    options.stop_on_sigterm()
    settings = Settings(chunk_tokens, memory_tokens, Sampling(temperature, top_p, seed))
    report = reporter(quiet)
    warned = False
    reported: list = []  # the runs an --html report shows: answered, or stopped with a trace

    def emit(result: api.Result) -> None:
        nonlocal warned
        if as_json:
            console.result_json(result.to_json())
        else:
            console.result(result.text)
        if where := evidence_line(result.evidence, result.chunks):
            report.note(where)
        if report_file is not None:
            reported.append(result.to_trace())
        if result.answer is None and not warned:
            console.warn(
                "the model put no answer in \\boxed{}; printed its raw final reply instead."
            )
            warned = True

    hinted = untraced = False

    def stopped(stop: api.Stopped) -> None:
        nonlocal hinted, untraced
        console.error(stop.message)
        if report_file is not None and stop.trace_path is not None and stop.trace_path.is_file():
            reported.append(read_trace(stop.trace_path))
        if stop.trace_path is not None and not hinted:
            one_run = len(paths) == 1 and len(asked) == 1
            command, left_out = _resume_command(stop.trace_path if one_run else None)
            console.note("resume with: " + command)
            if left_out:
                names = " and ".join(left_out)
                variables = " and ".join("$" + _SECRETS[name] for name in left_out)
                again = "them" if len(left_out) > 1 else "it"
                console.note(f"({names} left out: give {again} again, or set {variables})")
            hinted = True
        if stop.trace_path is None and stop.encrypted and not no_trace and not untraced:
            console.note(
                "an encrypted document's run keeps no trace, so none resumes: the same "
                "command reads it again from the first step."
            )
            untraced = True

    def open_model() -> api.Model:
        with report.progress("bytes") as progress:  # an hf: model may be pulled
            opened = engine.open_backend(backend_options, report.note, progress)
        how = reader.value if reader else registry.reader_for(opened.name)
        return api.Model(opened, dataclasses.replace(settings, reader=how))

    batch = api.ask_batch(
        paths,
        asked,
        open_model,
        traces=not no_trace,
        trace_path=trace,
        resume=resume,
        resume_latest=resume_latest,
        reuse=not no_reuse,
        parallel=parallel if in_process else parallel or 1,
        watch=watch - 1,
        password=password,
        ask_password=options.ask_password(),
        format=format,
        document_cache=not no_document_cache,
        ocr=OcrOptions(ocr, ocr_lang),
        report=report,
    )
    for outcome in batch:
        if isinstance(outcome, api.Stopped):
            stopped(outcome)
        else:
            emit(outcome)
    code = batch.exit_code
    if report_file is not None and reported:
        html.write(report_file, html.trace_report(reported))
        report.note(f"report: {report_file}")
    elif report_file is not None:
        console.warn(f"no report written to {report_file}: no question was read.")
    if code:
        raise typer.Exit(code)


# The options a resume hint leaves out, and the variable that gives each instead: secrets,
# and a server URL with user:password@ in it.
_BASE_URL = "--base-url"
_SECRETS = {**SECRET_OPTIONS, _BASE_URL: "MEMAGENT_BASE_URL"}


def _resume_command(trace_path: Path | None) -> tuple[str, list[str]]:
    """This command line again, continuing from `trace_path`; with several runs, the same
    command, which continues each run where its trace ends (run/journal.py). Also the
    secret options left out of it: a hint printed to a terminal or a log must never repeat
    a password, an API key or credentials in a URL."""
    dropped = ("--resume", "--trace", *_SECRETS) if trace_path else tuple(_SECRETS)
    words: list[str] = []
    rest: list[str] = []
    left_out: list[str] = []
    args = iter(sys.argv[1:])
    for arg in args:
        name, equals, value = arg.partition("=")
        if arg == "--":  # what follows are arguments, never options
            rest = [arg, *args]
        elif name in dropped:
            if not equals:
                value = next(args, "")  # its value is the next word
            if name == _BASE_URL and without_credentials(value) == value:
                words += [arg] if equals else [arg, value]  # no credentials in it: kept
            elif name in _SECRETS and name not in left_out:
                left_out.append(name)
        elif arg != "--resume-latest" or not trace_path:
            words.append(arg)
    if trace_path:
        words += ["--resume", str(trace_path)]
    return "memagent " + shlex.join(words + rest), left_out
