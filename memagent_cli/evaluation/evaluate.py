"""An evaluation: the authors' data files or needle cases in, ordinary runs, a results
file out.

Each case is an ordinary `ask` run through the run module (same protocol, trace, cache and
backends); this module only turns cases into runs and runs into results. What a person
sees of them is views/evaluation.py's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memagent_cli import trace
from memagent_cli.backends.llama_cpp import LlamaOptions
from memagent_cli.documents.document import Document
from memagent_cli.documents.inputs import read_document
from memagent_cli.documents.ocr import OcrOptions
from memagent_cli.documents.pdf import OCR_AUTO
from memagent_cli.errors import STOPS, Interrupted, UserError, stop_code
from memagent_cli.evaluation import data, niah, results
from memagent_cli.evaluation.data import Case
from memagent_cli.evaluation.runner import AnswerCases, Answered, check_resumable, evaluate
from memagent_cli.progress import SILENT, Layout, Note, Reporter
from memagent_cli.run import batch, journal
from memagent_cli.run.ask import Result, Run, RunOptions, Stopped
from memagent_cli.run.engine import Engine, ReadOptions, open_model
from memagent_cli.run.session import open_session

_BIG_FILE = 256 << 20  # the authors' eval_6400.json is about 2 GB: say what takes a while


@dataclass(frozen=True)
class EvalOptions:
    """How an evaluation runs, apart from its cases."""

    read: ReadOptions  # the model, its reader and the settings, as for `ask`
    output: Path | None = None  # results file; default: a new one in the data folder
    reuse: bool = True  # a greedy case already run (same trace header) is not read again
    parallel: int = 1
    write_traces: bool = True
    report: Reporter = SILENT  # progress lines and notes


class EvalStopped(UserError):
    """The evaluation ended before its last case; the results file keeps those finished."""

    def __init__(self, reason: str, exit_code: int, output: Path) -> None:
        super().__init__(reason)
        self.exit_code, self.output = exit_code, output


def eval_files(paths: Sequence[str], limit: int | None, options: EvalOptions) -> results.Results:
    """Run the cases of the authors' files (the first `limit` of each); the finished results,
    or EvalStopped."""
    files = data.data_files(paths)
    checked = []
    for path in files:
        if path.stat().st_size > _BIG_FILE:
            _note(options)(f"checking {path} ({path.stat().st_size / 1e9:.1f} GB)")
        checked.append(data.check(path, limit))
    questions = sorted({q for file in checked for q in file.questions})

    def cases() -> Iterable[Case]:
        for file in checked:
            yield from data.read_cases(file.path, limit)

    total = sum(len(file.ids) for file in checked)
    output = options.output or results.default_path(files[0])
    results.read(output, missing_ok=True)  # fails in seconds, before any model loads
    with _writer(output, options) as writer:
        backend, settings = open_model(options.read, _note(options))
        engine = Engine.for_questions(backend, settings, questions)
        return _run(cases(), total, writer, options, engine)


def _writer(output: Path, options: EvalOptions) -> results.Writer:
    """The results file, locked, and the data folder checked, before any model loads: a
    second eval on the same file, or files that cannot be written, fail in seconds."""
    writer = results.Writer(output)
    try:
        if options.write_traces:
            journal.check_data_folder()
    except BaseException:
        writer.close()
        raise
    return writer


def eval_niah(
    haystack: str,
    *,
    lengths: str,
    depths: str,
    variant: str,
    seed: int,
    options: EvalOptions,
    ocr: OcrOptions = OCR_AUTO,
) -> results.Results:
    """Build needle cases from the document at `haystack` (its PDF pages read by `ocr` where
    they need it) and run them; the finished results, or EvalStopped."""
    parsed_lengths, parsed_depths = niah.parse_lengths(lengths), niah.parse_depths(depths)
    if variant not in niah.VARIANTS:
        raise UserError(f"Unknown needle variant {variant}; choose {', '.join(niah.VARIANTS)}.")
    document = read_document(haystack, password=None, report=options.report, ocr=ocr)
    output = options.output or results.default_path(Path(f"niah-{variant}"))
    results.read(output, missing_ok=True)
    with _writer(output, options) as writer:
        # Cases are cut with the model's own tokenizer, so the backend comes first.
        backend, settings = open_model(options.read, _note(options))
        _note(options)(f"building {len(parsed_lengths) * len(parsed_depths)} needle cases")
        cases = niah.build_cases(
            document.text,
            backend.tokenize,
            lengths=parsed_lengths,
            depths=parsed_depths,
            variant=variant,
            seed=seed,
        )
        questions = sorted({case.question for case in cases})
        engine = Engine.for_questions(backend, settings, questions)
        return _run(cases, len(cases), writer, options, engine)


def _run(
    cases: Iterable[Case], total: int, writer: results.Writer, options: EvalOptions, engine: Engine
) -> results.Results:
    note = _note(options)
    output = writer.path
    earlier = results.read(output, missing_ok=True)
    if earlier.skipped:
        options.report.warn(f"{output}: skipped {earlier.skipped} damaged lines.")
    info = run_info(engine)
    check_resumable(earlier, info)
    left = total - len(earlier.finished)
    note(f"results: {output}")
    if earlier.records:
        note(f"continuing: {len(earlier.records)} cases done, about {max(left, 0)} to run")
    counter = {"n": len(earlier.records)}
    # Which trace each case writes: a kill loses no case in flight, nor one finished while
    # an earlier case was still running (records are written in the cases' order).
    cases_journal = None
    if options.write_traces:
        named = {"command": "eval", "output": str(output.resolve())}
        cases_journal = journal.open_journal(named | journal.run_identity(engine))
    answers = _answers(engine, options, cases_journal, max(left, 1))
    ended = False
    try:
        # The evaluation as a whole: cases done and the time left, over each case's own view.
        with writer, options.report.progress("cases") as progress:

            def finished(record: dict[str, Any]) -> None:
                counter["n"] += 1
                note(
                    f"[{counter['n']}/{total}] {record['group']} {record['id']}: "
                    f"sub_em {record['sub_em']:.2f} · {record['tokens']:,} tokens · "
                    f"{record['seconds']:.1f}s"
                )
                progress("evaluating", counter["n"], total)

            progress("evaluating", counter["n"], total)
            try:
                evaluate(
                    cases,
                    answers,
                    writer,
                    finished=earlier.finished,
                    run_info=info,
                    on_record=finished,
                )
            except Stopped as stop:
                raise EvalStopped(stop.message, stop.exit_code, output) from None
            except STOPS as exc:  # between two cases
                name = exc if isinstance(exc, Interrupted) else "SIGINT"
                raise EvalStopped(f"Interrupted ({name}).", stop_code(exc), output) from None
        ended = True
    finally:
        if cases_journal is not None:
            cases_journal.close(finished=ended)
    return results.read(output)


# Eval took no flag for these engine settings before it took every flag `ask` takes: its
# older results files ran with llama.cpp's defaults and name none of them. A run names each
# only where it differs, so that those files continue as before and a run with other
# arithmetic cannot continue them. (--exact, which eval always took, was never named.)
_NAMED_UNLESS = {
    "flash_attn": LlamaOptions.flash_attn,
    "cache_type_k": LlamaOptions.cache_type_k,
    "cache_type_v": LlamaOptions.cache_type_v,
    "speculate": True,
}


def run_info(engine: Engine) -> dict[str, Any]:
    """What every record of a results file must share: the model (by name) and the settings
    that make two readings the same run (trace/folder.py), the engine's where _NAMED_UNLESS
    says."""
    same = trace.run_identity(engine.model_record, engine.settings_record())["settings"]
    settings = {key: same[key] for key in trace.READING_SETTINGS if key in same}  # a reader
    for key, usual in _NAMED_UNLESS.items():
        if same.get(key, usual) not in (usual, None):
            settings[key] = same[key]
    return {"model": engine.model_record.get("name"), "settings": settings}


def _run_of(
    case: Case,
    engine: Engine,
    options: EvalOptions,
    cases_journal: journal.Journal | None,
) -> Run:
    """The run that answers `case`: its document, trace and journal line."""
    text = case.context.strip()
    document = Document(
        text=text,
        path=f"{case.group}-{case.id}",
        format="text",
        sha256=hashlib.sha256(text.encode("utf-8", "replace")).hexdigest(),
    )
    session = open_session(document, engine)
    how = RunOptions(
        reuse=options.reuse,
        trace=trace.default_path(document.path) if options.write_traces else None,
        journal=cases_journal and cases_journal.entry(f"{case.group}\n{case.id}"),
    )
    return Run(session, case.question, how, name=f"{case.group} {case.id}")


def _answered(result: Result) -> Answered:
    calls = [step.generation for step in result.answered.steps] + [result.answered.final]
    return Answered(
        reply=result.answered.reply,
        tokens=len(result.session.tokens),
        seconds=sum(call.seconds for call in calls),
        prompt_tokens=sum(call.prompt_tokens for call in calls),
        generated_tokens=sum(call.completion_tokens for call in calls),
        trace=str(result.trace_path) if result.trace_path else None,
        cached=result.cached,
    )


def _answers(
    engine: Engine, options: EvalOptions, cases_journal: journal.Journal | None, left: int
) -> AnswerCases:
    """Every case answered in order, of `left` to read, as many at once as --parallel says
    (run/batch.py's outcomes: in-process in one context, with a server in flight from
    threads); the first stop is raised once the cases finished before it are yielded."""

    def run_of(case: Case) -> Run:
        return _run_of(case, engine, options, cases_journal)

    def answers(cases: Iterable[Case]) -> Iterator[tuple[Case, Answered]]:
        # Cases are told apart by name when several are read at once.
        layout = Layout(documents=2, by_name=True)
        outcomes = batch.outcomes(
            cases,
            run_of,
            options.report,
            layout,
            readings=left,
            parallel=options.parallel,
            stop_on_first=True,
        )
        for case, outcome in outcomes:
            assert isinstance(outcome, Result)  # a Stopped is raised
            yield case, _answered(outcome)

    return answers


def _note(options: EvalOptions) -> Note:
    return options.report.note
