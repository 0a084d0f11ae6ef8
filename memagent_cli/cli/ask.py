"""`memagent ask`: options in, one batch of runs out."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from memagent_cli.backends.openai import without_credentials
from memagent_cli.cli import options
from memagent_cli.cli.options import (
    FROM_FLAGS,
    INPUT,
    OCR,
    OUTPUT,
    SECRET_OPTIONS,
    DocumentsArg,
    FormatOpt,
    JsonOpt,
    NoDocumentCacheOpt,
    NoReuseOpt,
    NoTraceOpt,
    OcrLangOpt,
    OcrOpt,
    PasswordOpt,
    QuietOpt,
    ReadFlagsOpt,
    WatchOpt,
    reads,
    user_errors,
)
from memagent_cli.documents.ocr import OcrOptions
from memagent_cli.progress import Reporter
from memagent_cli.text import decoded
from memagent_cli.trace import check_new, check_resumable, read_trace
from memagent_cli.views import console, html
from memagent_cli.views.progress import reporter
from memagent_cli.views.traces import evidence_line

if TYPE_CHECKING:
    from memagent_cli.api import Result, Stopped

# The end of `ask --help` (docs/cli.md repeats it): whole commands a user can paste. Rich
# markup is on, so no square brackets.
EXAMPLES = """Examples:

  memagent ask book.pdf "Who betrayed the captain, and why?" -m memagent-7b
  memagent ask book.pdf "Who wrote the letter?" "When was it sent?"
  memagent ask library/ --glob "*.pdf" --questions questions.txt --json > answers.jsonl
  pdftotext report.pdf - | memagent ask - "Who signed the contract?"
  memagent ask book.pdf "Who keeps the tower?" --backend openai --base-url http://127.0.0.1:8080/v1

The answer goes to stdout; where it came from (from pp. 131-150, step 7 of 30), progress
and errors go to stderr. Exit codes: 0 answered, 1 an error, 2 a usage error, 130 Ctrl-C,
143 SIGTERM. In scripts read --json, one object a line, with jq: an answer may span lines
(docs/asking.md)."""

QuestionsArg = Annotated[
    list[str] | None,
    typer.Argument(help="One or more questions.", show_default=False, metavar="QUESTION"),
]
QuestionsFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--questions",
        metavar="FILE",
        help="File of questions, one per line.",
        show_default=False,
        rich_help_panel=INPUT,
    ),
]
DocumentsFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--documents",
        metavar="FILE",
        show_default=False,
        help="File of document paths, one per line.",
        rich_help_panel=INPUT,
    ),
]
GlobOpt = Annotated[
    str | None,
    typer.Option(
        metavar="PATTERN",
        show_default=False,
        help="With a folder as DOCUMENT: read only files matching this pattern.",
        rich_help_panel=INPUT,
    ),
]
TraceOpt = Annotated[
    Path | None,
    typer.Option(
        metavar="FILE",
        help="Write the trace here \\[default: a new file in the data folder; none for an "
        "encrypted document].",
        show_default=False,
        dir_okay=False,
        rich_help_panel=OUTPUT,
    ),
]
ResumeOpt = Annotated[
    Path | None,
    typer.Option(
        metavar="TRACE",
        show_default=False,
        dir_okay=False,
        help="Continue the interrupted run in TRACE after its last finished step.",
        rich_help_panel=OUTPUT,
    ),
]
ResumeLatestOpt = Annotated[
    bool,
    typer.Option(
        "--resume-latest",
        help="Continue the newest unfinished trace of the same document, question, model "
        "and settings.",
        rich_help_panel=OUTPUT,
    ),
]
HtmlOpt = Annotated[
    Path | None,
    options.html_file(
        "--html", "Also write an HTML report of the runs to FILE: a tab per question.", OUTPUT
    ),
]


@user_errors
@reads
def ask(
    ctx: typer.Context,
    document: DocumentsArg = None,
    questions: QuestionsArg = None,
    questions_file: QuestionsFileOpt = None,
    documents_file: DocumentsFileOpt = None,
    glob: GlobOpt = None,
    password: PasswordOpt = None,
    format: FormatOpt = None,
    no_document_cache: NoDocumentCacheOpt = False,
    ocr: OcrOpt = OCR.mode,
    ocr_lang: OcrLangOpt = OCR.languages,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
    trace: TraceOpt = None,
    no_trace: NoTraceOpt = False,
    resume: ResumeOpt = None,
    resume_latest: ResumeLatestOpt = False,
    no_reuse: NoReuseOpt = False,
    watch: WatchOpt = 1,
    read: ReadFlagsOpt = FROM_FLAGS,
    report_file: HtmlOpt = None,
) -> None:
    """Read DOCUMENT chunk by chunk into a memory and answer each QUESTION from it."""
    from memagent_cli import api
    from memagent_cli.documents import inputs

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
    if watch > (count := len(asked)):  # else the live view shows question 1's, unsaid
        are = "is 1 question" if count == 1 else f"are {count} questions"
        raise typer.BadParameter(f"there {are}; watch one of 1 to {count}.", param_hint="--watch")
    _check_named_traces(trace, resume, resume_latest, len(asked))
    paths = inputs.document_paths(document, documents_file, glob)
    _check_outputs(trace, resume, report_file, no_trace, several=len(paths) > 1)
    options.stop_on_sigterm()
    report = reporter(quiet)
    shown = _Shown(report, as_json, report_file, no_trace, ctx, len(paths) * len(asked) == 1)

    def open_model() -> api.Model:
        with report.progress("bytes") as progress:  # an hf: model may be pulled
            opened = api.Model.open(read, report.note, progress)
        _say_if_install_check(opened.backend.name)
        return opened

    batch = api.ask_batch(
        paths, asked, open_model, traces=not no_trace, trace_path=trace, resume=resume,
        resume_latest=resume_latest, reuse=not no_reuse, parallel=read.parallel,
        watch=watch - 1, password=password, ask_password=options.ask_password(),
        format=format, document_cache=not no_document_cache, ocr=OcrOptions(ocr, ocr_lang),
        report=report,
    )  # fmt: skip
    for outcome in batch:
        if isinstance(outcome, api.Stopped):
            shown.stopped(outcome)
        else:
            shown.result(outcome)
    shown.write_report()
    if batch.exit_code:
        raise typer.Exit(batch.exit_code)


def _say_if_install_check(name: str) -> None:
    """A model the registry keeps only to check the install says so when asked a question:
    a warning, which --quiet keeps."""
    from memagent_cli.models import registry

    if registry.install_check(name):
        console.warn(
            f"{name} only checks the install: it is too small to answer a real question. For "
            "real answers: memagent models pull memagent-7b, then ask with --model memagent-7b "
            "(docs/models.md says what each model costs)."
        )


def _check_named_traces(
    trace: Path | None, resume: Path | None, resume_latest: bool, questions: int
) -> None:
    """A trace named by --trace or --resume is one question's; one way to name it."""
    for option, named in (("--trace", trace), ("--resume", resume)):
        if named is not None and questions > 1:
            raise typer.BadParameter(
                f"{option} names one trace, but there are several questions; leave the path "
                "out to use one trace per question in the data folder.",
                param_hint=option,
            )
    given = (("--trace", trace is not None), ("--resume", resume is not None))
    chosen = [name for name, on in (*given, ("--resume-latest", resume_latest)) if on]
    if len(chosen) > 1:
        raise typer.BadParameter(f"give one of {' and '.join(chosen)}.", param_hint=chosen[0])


def _check_outputs(
    trace: Path | None,
    resume: Path | None,
    report_file: Path | None,
    no_trace: bool,
    *,
    several: bool,
) -> None:
    """Before any model loads: a trace that cannot be written, one to resume that is not
    there or that another run is writing, a data folder where traces cannot be kept, or a
    report that cannot be written."""
    from memagent_cli.run import journal

    if several and (trace is not None or resume is not None):
        raise typer.BadParameter(
            "a named trace is for one document; leave the path out with several documents.",
            param_hint="--trace" if trace is not None else "--resume",
        )
    if trace is not None and not no_trace:
        check_new(trace)
    if resume is not None:
        read_trace(resume)
        check_resumable(resume)
    if not no_trace and trace is None and resume is None:
        journal.check_data_folder()
    if report_file is not None:
        html.check_writable(report_file)


@dataclass
class _Shown:
    """What `ask` shows of its runs: each answer on stdout, each stop with how to resume it
    (once), and the --html report of them all."""

    report: Reporter
    as_json: bool
    report_file: Path | None
    no_trace: bool
    ctx: typer.Context
    one_run: bool
    reported: list[Any] = field(default_factory=list)  # answered, or stopped with a trace
    warned: bool = False
    hinted: bool = False
    untraced: bool = False

    def result(self, result: Result) -> None:
        if self.as_json:
            console.result_json(result.to_json())
        else:
            console.result(result.text)
        if where := evidence_line(result.evidence, result.chunks):
            self.report.note(where)
        if self.report_file is not None:
            self.reported.append(result.to_trace())
        if result.answer is None and not self.warned:
            console.warn(
                "the model put no answer in \\boxed{}; printed its raw final reply instead."
            )
            self.warned = True

    def stopped(self, stop: Stopped) -> None:
        console.error(stop.message)
        where = stop.trace_path
        if self.report_file is not None and where is not None and where.is_file():
            self.reported.append(read_trace(where))
        if where is not None and not self.hinted:
            command, left_out = resume_command(self.ctx, where if self.one_run else None)
            console.note("resume with: " + command)
            if left_out:
                names = " and ".join(left_out)
                variables = " and ".join("$" + _SECRETS[name] for name in left_out)
                again = "them" if len(left_out) > 1 else "it"
                console.note(f"({names} left out: give {again} again, or set {variables})")
            self.hinted = True
        if where is None and stop.encrypted and not self.no_trace and not self.untraced:
            console.note(
                "an encrypted document's run keeps no trace, so none resumes: the same "
                "command reads it again from the first step."
            )
            self.untraced = True

    def write_report(self) -> None:
        if self.report_file is not None and self.reported:
            html.write(self.report_file, html.trace_report(self.reported))
            self.report.note(f"report: {self.report_file}")
        elif self.report_file is not None:
            console.warn(f"no report written to {self.report_file}: no question was read.")


# The options a resume hint leaves out, and the variable that gives each instead: secrets,
# and a server URL with user:password@ in it.
_BASE_URL = "--base-url"
_SECRETS = {**SECRET_OPTIONS, _BASE_URL: "MEMAGENT_BASE_URL"}


def resume_command(ctx: typer.Context, trace_path: Path | None) -> tuple[str, list[str]]:
    """The command line `ctx` parsed, again, continuing from `trace_path`; with several
    runs, the same command, which continues each run where its trace ends (run/journal.py).
    Only what was given on the command line comes back (a value from a variable is there
    again for the next command), and never a secret: a hint printed to a terminal or a log
    must never repeat a password, an API key or credentials in a URL. Also the secret
    options so left out."""
    dropped = ("--resume", "--trace", "--resume-latest") if trace_path else ()
    words: list[str] = []
    arguments: list[str] = []
    left_out: list[str] = []
    for param in ctx.command.params:
        source = ctx.get_parameter_source(param.name) if param.name else None
        if source is None or source.name != "COMMANDLINE":
            continue  # a default, or a variable's value
        value = ctx.params[param.name]
        if param.param_type_name == "argument":
            arguments += [_word(v) for v in (value if isinstance(value, list) else [value])]
            continue
        name = next(opt for opt in param.opts if opt.startswith("--"))
        if name in _SECRETS and (name != _BASE_URL or without_credentials(value) != value):
            left_out.append(name)
        elif name not in dropped:
            words += _option_words(param, name, value)
    if trace_path:
        words += ["--resume", str(trace_path)]
    command = [ctx.info_name or "ask"]
    if any(word.startswith("-") and word != "-" for word in arguments):
        command += [*words, "--", *arguments]  # after --, no argument is read as an option
    else:
        command += [*arguments, *words]
    return "memagent " + shlex.join(command), left_out


def _option_words(param: Any, name: str, value: Any) -> list[str]:
    """An option as it is typed: a flag by its name (--no-X where it is off), else the name
    and its value."""
    if param.is_flag:
        if param.secondary_opts and not value:
            return [param.secondary_opts[0]]
        return [name] if value else []
    return [name, _word(value)]


def _word(value: Any) -> str:
    return str(value.value if isinstance(value, Enum) else value)
