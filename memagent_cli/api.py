"""memagent from Python: load a document, open a model, ask. This is the small, stable front
of the library, and what `memagent ask` itself calls: `ask_batch` takes what the command
takes (documents, questions, traces, journals, resume) as keyword arguments.

    from memagent_cli.api import ask, load_document, open_model

    book = load_document("book.pdf")
    model = open_model()  # the default model; or open_model("model.gguf"), open_model("hf:...")
    result = ask(model, book, "Who betrayed the captain?")
    print(result.text, result.evidence)

Nothing here prints: notes go to `note`, the reading's events (reader.py: StepStarted,
StepFinished, Replied, Answering, Finished) to `progress`, both silent by default;
`ask_batch` tells a `Reporter` (progress.py), as the command hands it its terminal. What the
library notes beside a call (files.NOTES: permissions it cannot restrict, the engine's
calibration) goes to the `memagent` logger, which the command prints.

`eval_files` and `eval_niah` are `memagent eval` and `memagent eval niah`, with the model
named as `open_model` names it:

    from memagent_cli.api import eval_files

    results = eval_files(["eval_50.json"], "model.gguf", limit=10)
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memagent_cli import protocol
from memagent_cli.backend import Backend, Sampling
from memagent_cli.backends.llama_cpp import LlamaOptions
from memagent_cli.backends.openai import ServerOptions
from memagent_cli.documents import Document
from memagent_cli.documents.inputs import read_document
from memagent_cli.documents.ocr import OcrOptions
from memagent_cli.evaluation import evaluate, niah
from memagent_cli.evaluation.results import Results as EvalResults
from memagent_cli.progress import (
    SILENT,
    Layout,
    Listener,
    Note,
    Progress,
    ReadingId,
    ReadingView,
    Reporter,
    silent,
)
from memagent_cli.provenance import Source
from memagent_cli.reader import (
    Answering,
    Finished,
    Replied,
    Settings,
    StepFinished,
    StepStarted,
)
from memagent_cli.run import batch as run_batch
from memagent_cli.run.ask import (
    Result,  # one answered question: the answer, every memory, where it came from, its trace
    Run,
    RunOptions,
    Stopped,  # a run that ended before its answer; its trace keeps every step
)
from memagent_cli.run.engine import (
    AUTHORS_SAMPLING,
    READER_DEFAULTS,
    BackendKind,
    BackendOptions,
    Engine,
    ReadOptions,
)
from memagent_cli.run.engine import open_model as open_reading
from memagent_cli.run.session import open_session

__all__ = [
    "NEEDLE_VARIANTS",
    "Answering",
    "BackendOptions",
    "Batch",
    "EvalResults",
    "EvalStopped",
    "Finished",
    "LlamaOptions",
    "Model",
    "OcrOptions",
    "ReadOptions",
    "Replied",
    "Result",
    "Sampling",
    "ServerOptions",
    "Settings",
    "Source",
    "StepFinished",
    "StepStarted",
    "Stopped",
    "ask",
    "ask_batch",
    "ask_many",
    "document_pages",
    "eval_files",
    "eval_niah",
    "inspect",
    "load_document",
    "open_model",
]

# The outcomes of `ask_batch`, in input order as they come: a Result for each answered run,
# a Stopped for each that ended early; once iterated, `exit_code` says how it went (0 all
# answered, 1 some document or run failed, 130 SIGINT, 143 SIGTERM).
Batch = run_batch.Batch
# An evaluation that ended before its last case; the results file keeps those finished.
EvalStopped = evaluate.EvalStopped
NEEDLE_VARIANTS = tuple(niah.VARIANTS)  # eval_niah's `needles`: RULER's variants


def load_document(
    path: str | Path,
    *,
    password: str | None = None,
    format: str | None = None,
    progress: Progress | None = None,
) -> Document:
    """The text of a text, Markdown, PDF or EPUB file (`-` is stdin) and where each
    character came from. `progress(what, done, total)` hears of pages extracted."""
    return read_document(str(path), password=password, format=format, report=_Callbacks(progress))


@dataclass
class Model:
    """A backend and the settings it reads by; the weights load on the first `ask`."""

    backend: Backend
    settings: Settings = field(default_factory=Settings)
    _engine: Engine | None = field(default=None, init=False, repr=False)

    @classmethod
    def open(
        cls, options: ReadOptions, note: Note = silent, progress: Progress | None = None
    ) -> Model:
        """The model `options` name, read by its reader (the one given, else the model's
        own) and sampled as that reader's authors did wherever `options.given` does not
        name a value: what `memagent ask`, `inspect` and `eval` open."""
        return cls(*open_reading(options, note, progress))

    def engine(self, questions: Sequence[str]) -> Engine:
        """An engine whose context holds one step of the longest of `questions`."""
        wanted = Engine.for_questions(self.backend, self.settings, list(questions))
        if self._engine is None or self._engine.context < wanted.context:
            self._engine = wanted
        return self._engine


def open_model(
    model: str | Path | None = None,
    *,
    reader: str | None = None,
    sampling: Sampling | None = None,
    chunk_tokens: int = protocol.DEFAULT_CHUNK_TOKENS,
    memory_tokens: int | None = None,
    llama: LlamaOptions | None = None,
    server: ServerOptions | None = None,
    note: Note = silent,
    progress: Progress | None = None,
) -> Model:
    """A model as `--model` names it (a GGUF path, a registry name, `hf:OWNER/NAME[:QUANT]`,
    None for $MEMAGENT_MODEL or the default model), run by llama.cpp with `llama`'s options;
    or, given `server`, the model an OpenAI-compatible server serves. It reads with
    `reader` (a name of readers.names()), else the reader the model was trained for, and
    samples with `sampling` and lets a memory take `memory_tokens`, else as that reader's
    authors did. An `hf:` model not pulled yet is pulled first, told through `note` and
    `progress`."""
    given = frozenset(AUTHORS_SAMPLING) if sampling is not None else frozenset()
    given |= {"memory_tokens"} if memory_tokens is not None else set()
    memory = protocol.DEFAULT_MEMORY_TOKENS if memory_tokens is None else memory_tokens
    settings = Settings(chunk_tokens, memory, sampling or Sampling())
    options = ReadOptions(_backend(model, llama, server), settings, reader=reader, given=given)
    return Model.open(options, note, progress)


def _backend(
    model: str | Path | None, llama: LlamaOptions | None, server: ServerOptions | None
) -> BackendOptions:
    """The backend `open_model`'s arguments name: a server's where one is given."""
    return BackendOptions(
        kind=BackendKind.openai if server is not None else BackendKind.llama,
        model=None if model is None else str(model),
        llama=llama or LlamaOptions(),
        server=server or ServerOptions(),
    )


def ask(
    model: Model,
    document: Document | str | Path,
    question: str,
    *,
    trace_path: Path | None = None,
    progress: Listener | None = None,
    note: Note = silent,
    parallel: int | None = None,
) -> Result:
    """Read `document` for `question` and answer from the final memory. With `trace_path`
    the trace is written there step by step. `progress(event)` hears of every step.
    `parallel`: calls at once, as `ask_many`'s."""
    return ask_many(
        model,
        document,
        [question],
        traces=[trace_path],
        progress=progress,
        note=note,
        parallel=parallel,
    )[0]


def ask_many(
    model: Model,
    document: Document | str | Path,
    questions: Sequence[str],
    *,
    traces: Sequence[Path | None] | None = None,
    progress: Listener | None = None,
    note: Note = silent,
    parallel: int | None = None,
) -> list[Result]:
    """Answer several questions about one document in one pass, each as it would alone:
    an in-process model reads them together, one sequence each, and the prompts a reading
    asks at once (a PI-Mem pass's chunks) in sequences of their own, as many as fit and pay
    by the calibration here; a server gets a call in flight a question. `parallel` says how
    many at once, as `memagent ask --parallel` does: sequences in one context, or calls in
    flight to a server. Raises Stopped (with the finished steps in its trace) when a
    reading ends early."""
    if not isinstance(document, Document):
        document = load_document(document)
    session = open_session(document, model.engine(questions))
    report = _Callbacks(None, progress, note)
    paths = list(traces) if traces is not None else [None] * len(questions)
    runs = [
        Run(session, question, RunOptions(trace=path, reuse=False), (0, index))
        for index, (question, path) in enumerate(zip(questions, paths, strict=True))
    ]
    if parallel is None and session.engine.threaded:
        parallel = len(runs)  # a call in flight each, as a server always read them
    found = run_batch.outcomes(
        runs,
        lambda run: run,
        report,
        Layout(questions=len(runs)),
        readings=len(runs),
        parallel=parallel,
        what="the questions",
    )
    outcomes = [outcome for _, outcome in found]
    for outcome in outcomes:
        if isinstance(outcome, Stopped):
            raise outcome
    return [outcome for outcome in outcomes if isinstance(outcome, Result)]


def ask_batch(
    documents: Sequence[str | Path],
    questions: Sequence[str],
    model: Model | Callable[[], Model],
    *,
    traces: bool = True,
    trace_path: Path | None = None,
    resume: Path | None = None,
    resume_latest: bool = False,
    reuse: bool = True,
    parallel: int | None = None,
    watch: int = 0,
    password: str | None = None,
    ask_password: Callable[[str], str] | None = None,
    format: str | None = None,
    document_cache: bool = True,
    ocr: OcrOptions | None = None,
    report: Reporter = SILENT,
) -> Batch:
    """Every question about every document, as `memagent ask` reads them. `model` may be
    a function that opens it, called once the first document was read (so a bad path fails
    before any weights load or download). Each run writes a trace in the data folder,
    recorded in the batch's journal so the same call after a stop continues every run
    (`traces=False`: none); `trace_path` names the one trace of one run; `resume` continues
    that trace, `resume_latest` the newest unfinished one of the same run. A greedy run
    finished before is answered from its trace unless `reuse` is False. `parallel`: readings
    at once (None: in-process all that fit in memory where the calibration says a batch
    pays here, else one; one with a server). Documents: an
    encrypted PDF's `password` (else `ask_password(path)`), `format`, `document_cache`,
    `ocr`."""
    asked = list(questions)

    def open_engine() -> Engine:
        opened = model() if callable(model) and not isinstance(model, Model) else model
        return opened.engine(asked)

    options = run_batch.Options(
        run=RunOptions(trace=trace_path, resume=resume, resume_latest=resume_latest, reuse=reuse),
        write_traces=traces,
        password=password,
        ask_password=ask_password,
        format=format,
        document_cache=document_cache,
        ocr=ocr or OcrOptions(),
        parallel=parallel,
        watch=watch,
        report=report,
    )
    paths = [str(path) for path in documents]
    return run_batch.Batch(paths, asked, open_engine, options)


# --- inspect: what a document is and what reading it takes, before asking -------------


def inspect(
    document: Document | str | Path,
    model: Model | None = None,
    *,
    windows: Settings | None = None,
    encoding: str | None = None,
    estimate: bool = True,
    report: Reporter = SILENT,
) -> dict[str, Any]:
    """What `memagent inspect` reports, as plain data (its JSON): the document, its tokens
    and chunks, the OCR it needs, and with `estimate` the seconds one question takes on this
    machine, learned from the traces of the model's past readings here where there are any
    (run/inspect.py's estimate_reading says what it assumes). Tokens are counted
    with `model`'s tokenizer and cut by its settings; without a model, with tiktoken's
    `encoding` and the `windows` of `Settings`, and nothing is estimated."""
    from memagent_cli.run import inspect as inspection

    if not isinstance(document, Document):
        document = load_document(document)
    settings = model.settings if model is not None else windows or Settings()
    return inspection.inspect_document(
        document,
        backend=model.backend if model is not None else None,
        encoding=encoding,
        chunk_tokens=settings.chunk_tokens,
        memory_tokens=settings.memory_tokens,
        estimate=estimate,
        reader=settings.reader,
        report=report,
    )


def eval_files(
    data: Sequence[str | Path],
    model: str | Path | None = None,
    *,
    llama: LlamaOptions | None = None,
    server: ServerOptions | None = None,
    settings: Settings | None = None,
    reader: str | None = None,
    read: ReadOptions | None = None,
    limit: int | None = None,
    output: Path | None = None,
    traces: bool = True,
    reuse: bool = True,
    parallel: int = 1,
    report: Reporter = SILENT,
) -> EvalResults:
    """Every case of the authors' evaluation files (or RULER needle files, or folders of
    them; the first `limit` of each), each read as an ordinary ask and scored as their
    ruler_hqa.py, as `memagent eval` runs them. `model`, `llama` and `server` name the model
    as `open_model` does. Results go to `output` (default: a new file in the data folder),
    one line per case; the same call on the same file continues it. A greedy case run before
    is not read again unless `reuse` is False; `traces=False` writes no trace per case;
    `parallel` cases are read at once. Cases are read by `reader`, else the model's own, and
    sampled as `settings` say, else as that reader's authors did; `read`, where given, says
    all of that at once, as the command's flags do. The finished results, or EvalStopped."""
    read = read or _read_options(model, llama, server, settings, reader)
    options = _eval_options(read, output, traces, reuse, parallel, report)
    return evaluate.eval_files([str(path) for path in data], limit, options)


def eval_niah(
    haystack: str | Path,
    model: str | Path | None = None,
    *,
    lengths: str = "8K,32K",
    depths: str = "5",
    needles: str = "single",
    ocr: OcrOptions | None = None,
    llama: LlamaOptions | None = None,
    server: ServerOptions | None = None,
    settings: Settings | None = None,
    reader: str | None = None,
    read: ReadOptions | None = None,
    output: Path | None = None,
    traces: bool = True,
    reuse: bool = True,
    parallel: int = 1,
    report: Reporter = SILENT,
) -> EvalResults:
    """RULER key-value needles hidden in the document at `haystack` (its PDF pages read by
    `ocr` where they need it) at each of `depths` (a count from 0% to 100%, or percents
    "0,50,100") and `lengths` (model tokens, K = 1024), asked for, as `memagent eval niah`
    does; `needles` is one of NEEDLE_VARIANTS. The sampling's seed seeds the cases (keys,
    values, other needles); without one, 0 seeds both, so the cases are reproducible. The
    other arguments are `eval_files`'s. The finished results, or EvalStopped."""
    read = read or _read_options(model, llama, server, settings, reader)
    seed = read.settings.sampling.seed
    if seed is None:
        seed = 0
        sampling = dataclasses.replace(read.settings.sampling, seed=seed)
        read = dataclasses.replace(
            read, settings=dataclasses.replace(read.settings, sampling=sampling)
        )
    options = _eval_options(read, output, traces, reuse, parallel, report)
    return evaluate.eval_niah(
        str(haystack),
        lengths=lengths,
        depths=depths,
        variant=needles,
        seed=seed,
        options=options,
        ocr=ocr or OcrOptions(),
    )


def _read_options(
    model: str | Path | None,
    llama: LlamaOptions | None,
    server: ServerOptions | None,
    settings: Settings | None,
    reader: str | None,
) -> ReadOptions:
    """What eval_files' and eval_niah's arguments say: `settings`, where given, with the
    sampling the caller chose."""
    given = frozenset(READER_DEFAULTS) if settings is not None else frozenset()
    return ReadOptions(
        _backend(model, llama, server), settings or Settings(), reader=reader, given=given
    )


def _eval_options(
    read: ReadOptions,
    output: Path | None,
    traces: bool,
    reuse: bool,
    parallel: int,
    report: Reporter,
) -> evaluate.EvalOptions:
    return evaluate.EvalOptions(
        read=read,
        output=output,
        reuse=reuse,
        parallel=parallel,
        write_traces=traces,
        report=report,
    )


def document_pages(document: Document) -> list[dict[str, Any]]:
    """The text memagent reads from `document`, page by page (chapter by chapter), each with
    its label and whether OCR read it: what `memagent inspect --text` prints."""
    from memagent_cli.run import inspect as inspection

    return inspection.document_pages(document)


class _Callbacks:
    """A Reporter made of the API's callbacks: progress bars and reading events go to the
    caller's functions, warnings and errors to `note`."""

    def __init__(
        self, progress: Progress | None, events: Listener | None = None, note: Note = silent
    ) -> None:
        self._progress, self._events = progress or silent, events or silent
        self.note = self.warn = self.error = note

    @contextlib.contextmanager
    def progress(self, unit: str) -> Iterator[Progress]:
        yield self._progress

    def reading(self, batch: Layout) -> ReadingView:
        return _EventView(self._events)


class _EventView:
    showing = False

    def __init__(self, events: Listener) -> None:
        self._events = events

    def __enter__(self) -> _EventView:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def started(self, reading: ReadingId) -> Listener:
        return self._events

    def ended(self, reading: ReadingId) -> None:
        return None
