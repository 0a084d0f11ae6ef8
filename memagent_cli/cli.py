"""The `memagent` command line: options in, calls out."""

from __future__ import annotations

import functools
import json
import shlex
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from memagent_cli import __version__, display, protocol
from memagent_cli.backends.factory import DEFAULT_TIMEOUT, KINDS, BackendOptions
from memagent_cli.errors import Interrupted, UserError
from memagent_cli.trace import check_new, default_dir, read_trace

app = typer.Typer(
    help="Answer questions about book-scale documents with a MemAgent model run locally "
    "through llama.cpp.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)

F = TypeVar("F", bound=Callable[..., Any])

# Options shared by several commands, defined once.
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
    str | None,
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
    document: DocumentsArg,
    questions: Annotated[
        list[str] | None,
        typer.Argument(help="One or more questions.", show_default=False, metavar="QUESTION"),
    ] = None,
    questions_file: Annotated[
        Path | None,
        typer.Option("--questions", help="File of questions, one per line.", show_default=False),
    ] = None,
    model: ModelOpt = None,
    chunk_tokens: ChunkTokensOpt = protocol.DEFAULT_CHUNK_TOKENS,
    memory_tokens: MemoryTokensOpt = protocol.DEFAULT_MEMORY_TOKENS,
    temperature: Annotated[
        float, typer.Option(min=0.0, help="Sampling temperature; 0 is greedy, reproducible.")
    ] = 0.7,
    top_p: Annotated[float, typer.Option(min=0.0, max=1.0, help="Nucleus sampling.")] = 0.95,
    seed: Annotated[
        int | None, typer.Option(help="Random seed for sampling.", show_default=False)
    ] = None,
    password: PasswordOpt = None,
    format: FormatOpt = None,
    gpu_layers: GpuLayersOpt = None,
    threads: ThreadsOpt = None,
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
    no_trace: Annotated[bool, typer.Option("--no-trace", help="Write no trace.")] = False,
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
    no_cache: Annotated[
        bool,
        typer.Option("--no-cache", help="Read again even if an identical greedy run finished."),
    ] = False,
    backend: Annotated[
        str, typer.Option(help="llama (in-process GGUF) or openai (an OpenAI-compatible server).")
    ] = "llama",
    base_url: Annotated[
        str | None,
        typer.Option(
            envvar="MEMAGENT_BASE_URL",
            show_default=False,
            help="Server URL for --backend openai, e.g. http://127.0.0.1:8080/v1.",
        ),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(envvar="MEMAGENT_API_KEY", show_default=False, help="Server API key."),
    ] = None,
    served_model: Annotated[
        str | None,
        typer.Option(
            envvar="MEMAGENT_SERVED_MODEL",
            show_default=False,
            help="Model name on the server \\[default: the first it serves].",
        ),
    ] = None,
    encoding: EncodingOpt = "cl100k_base",
    parallel: Annotated[
        int, typer.Option(min=1, help="Question runs in flight at once (--backend openai).")
    ] = 1,
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
    timeout: Annotated[
        float,
        typer.Option(min=1.0, help="Seconds a server may take for one call (--backend openai)."),
    ] = DEFAULT_TIMEOUT,
    verbose: VerboseOpt = False,
) -> None:
    """Read DOCUMENT chunk by chunk into a memory and answer each QUESTION from it."""
    from memagent_cli import batch, inputs, run, session
    from memagent_cli.backends import Sampling
    from memagent_cli.reader import Settings

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
    if backend not in KINDS:
        raise typer.BadParameter("choose llama or openai.", param_hint="--backend")
    if parallel > 1 and backend != "openai":
        raise typer.BadParameter(
            "one in-process model reads one question at a time; --parallel needs --backend openai.",
            param_hint="--parallel",
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
    signal.signal(signal.SIGTERM, _on_sigterm)
    backend_options = BackendOptions(
        kind=backend,
        model=model,
        base_url=base_url,
        api_key=api_key,
        served_model=served_model,
        encoding=encoding,
        threads=threads,
        gpu_layers=gpu_layers,
        timeout=timeout,
        verbose=verbose,
    )
    settings = Settings(chunk_tokens, memory_tokens, Sampling(temperature, top_p, seed))
    note = (lambda message: None) if quiet else display.note
    options = batch.Options(
        run=run.RunOptions(
            trace=trace,
            resume=resume,
            resume_latest=resume_latest,
            use_cache=not no_cache,
            quiet=quiet,
        ),
        write_traces=not no_trace,
        password=password,
        format=format,
        parallel=parallel,
    )
    warned = False

    def emit(result: run.Result) -> None:
        nonlocal warned
        if as_json:
            print(json.dumps(result.to_json(), ensure_ascii=False), flush=True)
        else:
            print(result.stdout_line(), flush=True)
        if result.answer.answer is None and not warned:
            display.warn(
                "the model put no answer in \\boxed{}; printed its raw final reply instead."
            )
            warned = True

    def stopped(stop: run.Stopped) -> None:
        display.error(stop.message)
        if stop.trace_path is not None:
            hint = _resume_command(stop.trace_path if len(paths) == 1 else None)
            display.note("resume with: " + hint)

    def open_engine() -> session.Engine:
        return session.open_engine(backend_options, settings, asked, note)

    code = batch.ask_all(paths, asked, open_engine, options, emit, stopped)
    if code:
        raise typer.Exit(code)


@app.command()
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


models_app = typer.Typer(
    help="List, describe, download and convert GGUF models.", no_args_is_help=True
)
app.add_typer(models_app, name="models")


@models_app.command("list")
@user_errors
def models_list(as_json: JsonOpt = False) -> None:
    """The registry's models and every GGUF found locally, read from their headers."""
    from memagent_cli import models, modelview

    rows = models.catalogue()
    if as_json:
        print(json.dumps([row.to_json() for row in rows], ensure_ascii=False, indent=2))
    else:
        modelview.print_catalogue(rows)


@models_app.command("info")
@user_errors
def models_info(
    model: Annotated[
        str,
        typer.Argument(
            help="GGUF file, registry name, or hf:OWNER/NAME[:QUANT] already pulled.",
            metavar="MODEL",
        ),
    ],
    as_json: JsonOpt = False,
) -> None:
    """One model's architecture, quantization, context and chat template."""
    from memagent_cli import models, modelview

    row = models.describe(model)
    if as_json:
        print(json.dumps(row.to_json(template=True), ensure_ascii=False, indent=2))
    else:
        modelview.print_info(row)


@models_app.command("pull")
@user_errors
def models_pull(
    model: Annotated[
        str,
        typer.Argument(
            help="OWNER/NAME[:QUANT] on the Hugging Face Hub (QUANT as llama.cpp's -hf reads "
            "it, default Q4_K_M), or a registry name.",
            metavar="MODEL",
        ),
    ],
    quiet: QuietOpt = False,
) -> None:
    """Download a GGUF into the data folder, resuming a partial download; a repository of
    Hugging Face weights is downloaded, converted and quantized. Prints the GGUF's path."""
    from memagent_cli import models, modelview

    with modelview.transfer_progress(quiet) as progress:
        print(models.pull(model, note=modelview.note(quiet), progress=progress).path)


@models_app.command("convert")
@user_errors
def models_convert(
    folder: Annotated[
        Path,
        typer.Argument(
            help="A Hugging Face model folder: config.json, safetensors, tokenizer.json.",
            metavar="PATH",
        ),
    ],
    quant: Annotated[
        str,
        typer.Option(
            "--quant", metavar="TYPE", help="llama.cpp type: Q4_K_M, Q5_K_M, Q8_0, F16, ..."
        ),
    ] = "Q4_K_M",
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            metavar="FILE",
            help="GGUF to write \\[default: where --model finds it].",
            show_default=False,
        ),
    ] = None,
    keep_f16: Annotated[
        bool, typer.Option("--keep-f16", help="Keep the F16 GGUF quantized from.")
    ] = False,
    quiet: QuietOpt = False,
) -> None:
    """Convert a local Hugging Face model to GGUF and quantize it; prints the GGUF's path."""
    from memagent_cli import models, modelview

    note = modelview.note(quiet)
    with modelview.transfer_progress(quiet) as progress:
        model = models.convert(
            folder, quant=quant, out=out, keep_f16=keep_f16, note=note, progress=progress
        )
    print(model.path)


@app.command("trace")
@user_errors
def trace_(
    trace: Annotated[
        Path | None,
        typer.Argument(
            # The backslash keeps Typer's Rich help from reading "[default: ...]" as markup.
            help="Trace file, or the name of one in the data folder "
            "\\[default: the most recent trace].",
            metavar="TRACE",
            show_default=False,
        ),
    ] = None,
    list_traces: Annotated[
        bool, typer.Option("--list", help="List the saved traces, newest first.")
    ] = False,
    step: Annotated[
        int | None,
        typer.Option(
            "--step",
            metavar="N",
            help="Show the memory after step N in full (step 1 reads the first chunk).",
            show_default=False,
        ),
    ] = None,
    diff: Annotated[
        int | None,
        typer.Option(
            "--diff",
            metavar="N",
            help="Show what step N changed in the memory (step 1: against the initial memory).",
            show_default=False,
        ),
    ] = None,
    grep: Annotated[
        str | None,
        typer.Option(
            "--grep",
            metavar="TEXT",
            show_default=False,
            help="Show the steps whose memory contains TEXT (any case).",
        ),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print the trace (or --list) as JSON: the records as written, where a step's "
            '"index" counts from 0.',
        ),
    ] = False,
    markdown: Annotated[
        bool, typer.Option("--markdown", help="Print a Markdown report of the run.")
    ] = False,
    follow_run: Annotated[
        bool, typer.Option("--follow", "-f", help="Show steps as a running `ask` writes them.")
    ] = False,
) -> None:
    """Show what the model kept, dropped and concluded at every step of a run."""
    from memagent_cli import tracereport, traceview

    views = {
        "--list": list_traces,
        "--step": step is not None,
        "--diff": diff is not None,
        "--grep": grep is not None,
        "--markdown": markdown,
        "--follow": follow_run,
    }
    chosen = [name for name, on in views.items() if on]
    if len(chosen) > 1:
        raise typer.BadParameter(f"{' and '.join(chosen)} are different views; pick one.")
    if as_json and chosen and chosen != ["--list"]:
        raise typer.BadParameter(f"--json goes with the whole trace or --list, not {chosen[0]}.")
    out = display.results_console()
    if list_traces:
        if trace is not None:
            raise typer.BadParameter("--list lists the data folder; leave out TRACE.")
        rows = tracereport.listing()
        if as_json:
            print(json.dumps(rows, ensure_ascii=False, indent=2))
        elif not rows:
            raise UserError(f"There are no traces in {default_dir()} yet.")
        else:
            tracereport.print_listing(out, rows)
        return
    path = traceview.locate(trace)
    if follow_run:
        try:
            traceview.follow(out, path)
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        return
    loaded = traceview.load(path)
    if as_json:
        print(json.dumps(loaded.to_json(), ensure_ascii=False, indent=2))
    elif markdown:
        print(tracereport.markdown(loaded), end="")
    elif step is not None:
        traceview.step(out, loaded, step)
    elif diff is not None:
        traceview.diff(out, loaded, diff)
    elif grep is not None:
        if not traceview.grep(out, loaded, grep):
            raise typer.Exit(1)
    else:
        traceview.summary(out, loaded)


def _resume_command(trace_path: Path | None) -> str:
    """This command line again, continuing from `trace_path` (or the newest unfinished trace
    of each run, with several documents)."""
    words, skip = [], False
    for arg in sys.argv[1:]:
        if skip:
            skip = False
        elif arg in ("--resume", "--trace"):
            skip = True
        elif arg != "--resume-latest" and not arg.startswith(("--resume=", "--trace=")):
            words.append(arg)
    words += ["--resume", str(trace_path)] if trace_path else ["--resume-latest"]
    return "memagent " + shlex.join(words)


def main() -> None:
    """Console entry point."""
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


# ------------------------------------------------------------------------- memagent eval


class _EvalGroup(typer.core.TyperGroup):
    """`memagent eval DATA...` runs the authors' files (the `run` command); `eval niah` and
    `eval report` are named."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


eval_app = typer.Typer(
    cls=_EvalGroup,
    help="Reproduce the paper's long-context results: `memagent eval DATA...` runs the "
    "authors' evaluation files, `eval niah` builds needle cases from a document, "
    "`eval report` compares runs.",
    no_args_is_help=True,
)
app.add_typer(eval_app, name="eval")

TemperatureOpt = Annotated[
    float, typer.Option(min=0.0, help="Sampling temperature; 0 is greedy, reproducible.")
]
TopPOpt = Annotated[float, typer.Option(min=0.0, max=1.0, help="Nucleus sampling.")]
SeedOpt = Annotated[int | None, typer.Option(help="Random seed for sampling.", show_default=False)]
BackendOpt = Annotated[
    str, typer.Option(help="llama (in-process GGUF) or openai (an OpenAI-compatible server).")
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
    int, typer.Option(min=1, help="Cases in flight at once (--backend openai).")
]
TimeoutOpt = Annotated[
    float, typer.Option(min=1.0, help="Seconds a server may take for one call (--backend openai).")
]
EvalOutputOpt = Annotated[
    Path | None,
    typer.Option(
        "--output",
        "-o",
        dir_okay=False,
        show_default=False,
        help="Results file (JSON Lines, one line per case); run again to continue it "
        "\\[default: a new file in the data folder].",
    ),
]
PlotOpt = Annotated[
    Path | None,
    typer.Option(
        "--plot",
        dir_okay=False,
        show_default=False,
        metavar="FILE.png",
        help="Draw accuracy versus length (needle runs: depth x length) with matplotlib.",
    ),
]
NoTraceOpt = Annotated[bool, typer.Option("--no-trace", help="Write no trace per case.")]
NoCacheOpt = Annotated[
    bool,
    typer.Option("--no-cache", help="Read again cases an identical greedy run has answered."),
]


def _eval_options(
    *, backend: str, parallel: int, settings: tuple[int, int, float, float, int | None], **kw: Any
) -> Any:
    """The options every eval run shares, checked as `ask` checks them."""
    from memagent_cli.backends import Sampling
    from memagent_cli.evaluation.command import EvalOptions
    from memagent_cli.reader import Settings

    if backend not in KINDS:
        raise typer.BadParameter("choose llama or openai.", param_hint="--backend")
    if parallel > 1 and backend != "openai":
        raise typer.BadParameter(
            "one in-process model reads one case at a time; --parallel needs --backend openai.",
            param_hint="--parallel",
        )
    chunk_tokens, memory_tokens, temperature, top_p, seed = settings
    backend_options = BackendOptions(
        kind=backend, **{k: kw.pop(k) for k in list(kw) if k in _BACKEND_FIELDS}
    )
    signal.signal(signal.SIGTERM, _on_sigterm)
    return EvalOptions(
        backend=backend_options,
        settings=Settings(chunk_tokens, memory_tokens, Sampling(temperature, top_p, seed)),
        parallel=parallel,
        **kw,
    )


_BACKEND_FIELDS = (
    "model", "base_url", "api_key", "served_model", "encoding", "threads", "gpu_layers",
    "timeout", "verbose",
)  # fmt: skip


@eval_app.command("run")
@user_errors
def eval_run(
    data: Annotated[
        list[str],
        typer.Argument(
            help="The authors' eval_*.json files (a JSON list or JSON Lines of context, "
            "input, answers, _id), RULER needle files (outputs), or folders of them; each "
            "file is one length group.",
            metavar="DATA...",
        ),
    ],
    limit: Annotated[
        int | None,
        typer.Option(min=1, show_default=False, help="Run the first N cases of each file."),
    ] = None,
    output: EvalOutputOpt = None,
    as_json: JsonOpt = False,
    plot: PlotOpt = None,
    model: ModelOpt = None,
    chunk_tokens: ChunkTokensOpt = protocol.DEFAULT_CHUNK_TOKENS,
    memory_tokens: MemoryTokensOpt = protocol.DEFAULT_MEMORY_TOKENS,
    temperature: TemperatureOpt = 0.7,
    top_p: TopPOpt = 0.95,
    seed: SeedOpt = None,
    backend: BackendOpt = "llama",
    base_url: BaseUrlOpt = None,
    api_key: ApiKeyOpt = None,
    served_model: ServedModelOpt = None,
    encoding: EncodingOpt = "cl100k_base",
    parallel: ParallelOpt = 1,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    gpu_layers: GpuLayersOpt = None,
    threads: ThreadsOpt = None,
    no_trace: NoTraceOpt = False,
    no_cache: NoCacheOpt = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Run every case of the authors' files as an ordinary ask, scored as their ruler_hqa.py."""
    from memagent_cli.evaluation import command

    options = _eval_options(
        backend=backend,
        parallel=parallel,
        settings=(chunk_tokens, memory_tokens, temperature, top_p, seed),
        model=model, base_url=base_url, api_key=api_key, served_model=served_model,
        encoding=encoding, threads=threads, gpu_layers=gpu_layers, timeout=timeout,
        verbose=verbose, output=output, write_traces=not no_trace, use_cache=not no_cache,
        quiet=quiet, as_json=as_json, plot=plot,
    )  # fmt: skip
    code = command.eval_files(data, limit, options)
    if code:
        raise typer.Exit(code)


@eval_app.command("niah")
@user_errors
def eval_niah(
    haystack: Annotated[
        str,
        typer.Option(
            "--haystack",
            metavar="DOCUMENT",
            help="Text, Markdown, PDF or EPUB file whose sentences hide the needles.",
        ),
    ],
    lengths: Annotated[
        str, typer.Option(help="Document lengths in model tokens (K = 1024).")
    ] = "8K,32K",
    depths: Annotated[
        str,
        typer.Option(help="How many depths from 0% to 100% (5), or percents (0,50,100)."),
    ] = "5",
    needles: Annotated[
        str, typer.Option(help="RULER variant: single, multikey, multivalue or multiquery.")
    ] = "single",
    seed: Annotated[
        int, typer.Option(help="Seed of the cases (keys, values, other needles) and sampling.")
    ] = 0,
    output: EvalOutputOpt = None,
    as_json: JsonOpt = False,
    plot: PlotOpt = None,
    model: ModelOpt = None,
    chunk_tokens: ChunkTokensOpt = protocol.DEFAULT_CHUNK_TOKENS,
    memory_tokens: MemoryTokensOpt = protocol.DEFAULT_MEMORY_TOKENS,
    temperature: TemperatureOpt = 0.7,
    top_p: TopPOpt = 0.95,
    backend: BackendOpt = "llama",
    base_url: BaseUrlOpt = None,
    api_key: ApiKeyOpt = None,
    served_model: ServedModelOpt = None,
    encoding: EncodingOpt = "cl100k_base",
    parallel: ParallelOpt = 1,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    gpu_layers: GpuLayersOpt = None,
    threads: ThreadsOpt = None,
    no_trace: NoTraceOpt = False,
    no_cache: NoCacheOpt = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Hide RULER key-value needles in a document at each depth and length, and ask for them."""
    from memagent_cli.evaluation import command

    options = _eval_options(
        backend=backend,
        parallel=parallel,
        settings=(chunk_tokens, memory_tokens, temperature, top_p, seed),
        model=model, base_url=base_url, api_key=api_key, served_model=served_model,
        encoding=encoding, threads=threads, gpu_layers=gpu_layers, timeout=timeout,
        verbose=verbose, output=output, write_traces=not no_trace, use_cache=not no_cache,
        quiet=quiet, as_json=as_json, plot=plot,
    )  # fmt: skip
    code = command.eval_niah(
        haystack, lengths=lengths, depths=depths, variant=needles, seed=seed, options=options
    )
    if code:
        raise typer.Exit(code)


@eval_app.command("report")
@user_errors
def eval_report(
    runs: Annotated[
        list[Path],
        typer.Argument(help="Results files of `memagent eval`.", metavar="RESULTS.jsonl..."),
    ],
    as_json: JsonOpt = False,
    plot: PlotOpt = None,
) -> None:
    """Summarize results files; --plot compares them with the paper's RL-MemAgent rows."""
    from memagent_cli.evaluation import command

    command.show_report(runs, as_json=as_json, plot_path=plot)
