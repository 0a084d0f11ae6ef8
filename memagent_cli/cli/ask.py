"""`memagent ask`: options in, one batch of runs out."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

from memagent_cli import protocol
from memagent_cli.cli import options
from memagent_cli.cli.options import (
    LLAMA,
    SAMPLING,
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
    NoCacheOpt,
    NoTraceOpt,
    PasswordOpt,
    QuietOpt,
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
from memagent_cli.run.engine import BackendKind
from memagent_cli.trace import check_new, read_trace
from memagent_cli.views import console
from memagent_cli.views.progress import reporter


@user_errors
def ask(
    document: DocumentsArg,
    questions: Annotated[
        list[str] | None,
        typer.Argument(help="One or more questions.", show_default=False, metavar="QUESTION"),
    ] = None,
    questions_file: Annotated[
        Path | None,
        typer.Option("--questions", help="File of questions, one per line.", show_default=False),
    ] = None,
    documents_file: Annotated[
        Path | None,
        typer.Option(
            "--documents", show_default=False, help="File of document paths, one per line."
        ),
    ] = None,
    glob: Annotated[
        str | None,
        typer.Option(
            show_default=False,
            help="With a folder as DOCUMENT: read only files matching this pattern.",
        ),
    ] = None,
    model: ModelOpt = None,
    chunk_tokens: ChunkTokensOpt = protocol.DEFAULT_CHUNK_TOKENS,
    memory_tokens: MemoryTokensOpt = protocol.DEFAULT_MEMORY_TOKENS,
    temperature: TemperatureOpt = SAMPLING.temperature,
    top_p: TopPOpt = SAMPLING.top_p,
    seed: SeedOpt = None,
    password: PasswordOpt = None,
    format: FormatOpt = None,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
    trace: Annotated[
        Path | None,
        typer.Option(
            help="Write the trace here \\[default: a new file in the data folder].",
            show_default=False,
            dir_okay=False,
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
        ),
    ] = None,
    resume_latest: Annotated[
        bool,
        typer.Option(
            "--resume-latest",
            help="Continue the newest unfinished trace of the same document, question, model "
            "and settings.",
        ),
    ] = False,
    no_cache: NoCacheOpt = False,
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
    verbose: VerboseOpt = False,
) -> None:
    """Read DOCUMENT chunk by chunk into a memory and answer each QUESTION from it."""
    from memagent_cli.backend import Sampling
    from memagent_cli.documents import inputs
    from memagent_cli.reader import Settings
    from memagent_cli.run import ask as run
    from memagent_cli.run import batch, engine

    asked = [q.strip() for q in questions or [] if q.strip()]
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
    )
    paths = inputs.document_paths(document, documents_file, glob)
    if len(paths) > 1 and (trace is not None or resume is not None):
        raise typer.BadParameter(
            "a named trace is for one document; leave the path out with several documents.",
            param_hint="--trace" if trace is not None else "--resume",
        )
    # Before any model loads: a trace that cannot be written, or one to resume that is not there.
    if trace is not None and not no_trace:
        check_new(trace)
    if resume is not None:
        read_trace(resume)
    options.stop_on_sigterm()
    settings = Settings(chunk_tokens, memory_tokens, Sampling(temperature, top_p, seed))
    report = reporter(quiet)
    how = batch.Options(
        run=run.RunOptions(
            trace=trace,
            resume=resume,
            resume_latest=resume_latest,
            use_cache=not no_cache,
            report=report,
        ),
        write_traces=not no_trace,
        password=password,
        format=format,
        parallel=1 if in_process else parallel or 1,
        together=parallel if in_process else 1,
        watch=watch - 1,
    )
    warned = False

    def emit(result: run.Result) -> None:
        nonlocal warned
        if as_json:
            print(json.dumps(result.to_json(), ensure_ascii=False), flush=True)
        else:
            print(result.stdout_line(), flush=True)
        if result.answer.answer is None and not warned:
            console.warn(
                "the model put no answer in \\boxed{}; printed its raw final reply instead."
            )
            warned = True

    hinted = False

    def stopped(stop: run.Stopped) -> None:
        nonlocal hinted
        console.error(stop.message)
        if stop.trace_path is not None and not hinted:
            one_run = len(paths) == 1 and len(asked) == 1
            console.note("resume with: " + _resume_command(stop.trace_path if one_run else None))
            hinted = True

    def open_engine() -> engine.Engine:
        with report.progress("bytes") as progress:  # an hf: model may be pulled
            return engine.open_engine(backend_options, settings, asked, report.note, progress)

    code = batch.ask_all(paths, asked, open_engine, how, emit, stopped)
    if code:
        raise typer.Exit(code)


def _resume_command(trace_path: Path | None) -> str:
    """This command line again, continuing from `trace_path`; with several runs, the same
    command, which continues each run where its trace ends (run/journal.py)."""
    if trace_path is None:
        return "memagent " + shlex.join(sys.argv[1:])
    words, skip = [], False
    for arg in sys.argv[1:]:
        if skip:
            skip = False
        elif arg in ("--resume", "--trace"):
            skip = True
        elif arg != "--resume-latest" and not arg.startswith(("--resume=", "--trace=")):
            words.append(arg)
    return "memagent " + shlex.join([*words, "--resume", str(trace_path)])
