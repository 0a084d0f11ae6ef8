"""`memagent eval`: the paper's evaluation files, needle cases and reports."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from memagent_cli import protocol
from memagent_cli.cli import options
from memagent_cli.cli.options import (
    LLAMA,
    OCR,
    SAMPLING,
    SERVER,
    ApiKeyOpt,
    BackendOpt,
    BaseUrlOpt,
    ChunkTokensOpt,
    EncodingOpt,
    ExactOpt,
    GpuLayersOpt,
    JsonOpt,
    MemoryTokensOpt,
    ModelOpt,
    NoReuseOpt,
    NoTraceOpt,
    OcrLangOpt,
    OcrOpt,
    ParallelOpt,
    QuietOpt,
    RepackOpt,
    SeedOpt,
    ServedModelOpt,
    TemperatureOpt,
    ThreadsOpt,
    TimeoutOpt,
    TopPOpt,
    VerboseOpt,
    user_errors,
)
from memagent_cli.documents.ocr import OcrOptions
from memagent_cli.evaluation.niah import VARIANTS
from memagent_cli.run.engine import BackendKind
from memagent_cli.views.progress import reporter


class _EvalGroup(typer.core.TyperGroup):
    """`memagent eval DATA...` runs the authors' files (the `run` command); `eval niah` and
    `eval report` are named."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


app = typer.Typer(
    cls=_EvalGroup,
    help="Reproduce the paper's long-context results: `memagent eval DATA...` runs the "
    "authors' evaluation files, `eval niah` builds needle cases from a document, "
    "`eval report` compares runs.",
    no_args_is_help=True,
)

# The needle variants evaluation/niah.py defines, as an Enum so that --help lists them.
Needles = StrEnum("Needles", {name: name for name in VARIANTS})
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


def _eval_options(
    *, backend: str, parallel: int, settings: tuple[int, int, float, float, int | None], **kw: Any
) -> Any:
    """The options every eval run shares, checked as `ask` checks them."""
    from memagent_cli.backend import Sampling
    from memagent_cli.evaluation import plot
    from memagent_cli.evaluation.evaluate import EvalOptions
    from memagent_cli.reader import Settings

    fields = {k: kw.pop(k) for k in list(kw) if k in _BACKEND_FIELDS}
    # In-process, --parallel N reads N cases at once in one context (run/ask.py ask_each).
    threads = parallel if backend == BackendKind.openai else 1
    backend_options = options.backend_options(backend, threads, "cases", **fields)
    chunk_tokens, memory_tokens, temperature, top_p, seed = settings
    if kw.pop("plot") is not None:
        plot.require()  # fails in seconds, before any model loads
    kw["report"] = reporter(kw.pop("quiet"))
    kw.pop("as_json")
    options.stop_on_sigterm()
    return EvalOptions(
        backend=backend_options,
        settings=Settings(chunk_tokens, memory_tokens, Sampling(temperature, top_p, seed)),
        parallel=parallel,
        **kw,
    )


_BACKEND_FIELDS = (
    "model", "base_url", "api_key", "served_model", "encoding", "threads", "gpu_layers",
    "timeout", "verbose", "exact", "repack",
)  # fmt: skip


@app.command("run")
@user_errors
def eval_run(
    data: Annotated[
        list[str],
        typer.Argument(
            help="The authors' eval_*.json files, RULER needle files, or folders of them.",
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
    temperature: TemperatureOpt = SAMPLING.temperature,
    top_p: TopPOpt = SAMPLING.top_p,
    seed: SeedOpt = None,
    backend: BackendOpt = BackendKind.llama,
    base_url: BaseUrlOpt = None,
    api_key: ApiKeyOpt = None,
    served_model: ServedModelOpt = None,
    encoding: EncodingOpt = SERVER.encoding,
    parallel: ParallelOpt = 1,
    timeout: TimeoutOpt = SERVER.timeout,
    gpu_layers: GpuLayersOpt = None,
    threads: ThreadsOpt = None,
    exact: ExactOpt = LLAMA.exact,
    repack: RepackOpt = LLAMA.repack,
    no_trace: NoTraceOpt = False,
    no_reuse: NoReuseOpt = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Run every case of the authors' files as an ordinary ask, scored as their ruler_hqa.py."""
    from memagent_cli.evaluation import evaluate
    from memagent_cli.views import evaluation as views

    options = _eval_options(
        backend=backend,
        parallel=parallel,
        settings=(chunk_tokens, memory_tokens, temperature, top_p, seed),
        model=model, base_url=base_url, api_key=api_key, served_model=served_model,
        encoding=encoding, threads=threads, gpu_layers=gpu_layers, timeout=timeout,
        verbose=verbose, exact=exact, repack=repack, output=output, write_traces=not no_trace,
        reuse=not no_reuse, quiet=quiet, as_json=as_json, plot=plot,
    )  # fmt: skip
    try:
        finished = evaluate.eval_files(data, limit, options)
    except evaluate.Stopped as stop:
        raise typer.Exit(views.stopped(stop)) from None
    views.show(finished, as_json=as_json, plot_path=plot, note=options.report)


@app.command("niah")
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
        str, typer.Option(metavar="LIST", help="Document lengths in model tokens (K = 1024).")
    ] = "8K,32K",
    depths: Annotated[
        str,
        typer.Option(
            metavar="LIST", help="How many depths from 0% to 100% (5), or percents (0,50,100)."
        ),
    ] = "5",
    needles: Annotated[
        Needles,
        typer.Option(help="RULER variant (docs/eval.md)."),
    ] = Needles.single,
    seed: Annotated[
        int, typer.Option(help="Seed of the cases (keys, values, other needles) and sampling.")
    ] = 0,
    ocr: OcrOpt = OCR.mode,
    ocr_lang: OcrLangOpt = OCR.languages,
    output: EvalOutputOpt = None,
    as_json: JsonOpt = False,
    plot: PlotOpt = None,
    model: ModelOpt = None,
    chunk_tokens: ChunkTokensOpt = protocol.DEFAULT_CHUNK_TOKENS,
    memory_tokens: MemoryTokensOpt = protocol.DEFAULT_MEMORY_TOKENS,
    temperature: TemperatureOpt = SAMPLING.temperature,
    top_p: TopPOpt = SAMPLING.top_p,
    backend: BackendOpt = BackendKind.llama,
    base_url: BaseUrlOpt = None,
    api_key: ApiKeyOpt = None,
    served_model: ServedModelOpt = None,
    encoding: EncodingOpt = SERVER.encoding,
    parallel: ParallelOpt = 1,
    timeout: TimeoutOpt = SERVER.timeout,
    gpu_layers: GpuLayersOpt = None,
    threads: ThreadsOpt = None,
    exact: ExactOpt = LLAMA.exact,
    repack: RepackOpt = LLAMA.repack,
    no_trace: NoTraceOpt = False,
    no_reuse: NoReuseOpt = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Hide RULER key-value needles in a document at each depth and length, and ask for them."""
    from memagent_cli.evaluation import evaluate
    from memagent_cli.views import evaluation as views

    options = _eval_options(
        backend=backend,
        parallel=parallel,
        settings=(chunk_tokens, memory_tokens, temperature, top_p, seed),
        model=model, base_url=base_url, api_key=api_key, served_model=served_model,
        encoding=encoding, threads=threads, gpu_layers=gpu_layers, timeout=timeout,
        verbose=verbose, exact=exact, repack=repack, output=output, write_traces=not no_trace,
        reuse=not no_reuse, quiet=quiet, as_json=as_json, plot=plot,
    )  # fmt: skip
    try:
        finished = evaluate.eval_niah(
            haystack,
            lengths=lengths,
            depths=depths,
            variant=needles,
            seed=seed,
            options=options,
            ocr=OcrOptions(ocr, ocr_lang),
        )
    except evaluate.Stopped as stop:
        raise typer.Exit(views.stopped(stop)) from None
    views.show(finished, as_json=as_json, plot_path=plot, note=options.report)


@app.command("report")
@user_errors
def eval_report(
    runs: Annotated[
        list[Path],
        typer.Argument(help="Results files of `memagent eval`.", metavar="RESULTS.jsonl..."),
    ],
    as_json: JsonOpt = False,
    plot: PlotOpt = None,
    html: Annotated[
        Path | None,
        options.html_file(
            "--html", "Also write an HTML report to FILE: the tables, every case and the plot."
        ),
    ] = None,
) -> None:
    """Summarize results files; --plot compares them with the paper's RL-MemAgent rows."""
    from memagent_cli.views import evaluation as views

    views.show_reports(runs, as_json=as_json, plot_path=plot, html_path=html)
