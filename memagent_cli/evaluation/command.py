"""`memagent eval`, `eval niah` and `eval report`: data in, ordinary runs, results out.

Each case is an ordinary `ask` run through the run module (same protocol, trace, cache and
backends); this module only turns cases into runs and runs into results.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from memagent_cli import display, run, trace
from memagent_cli.backends.factory import BackendOptions, open_backend
from memagent_cli.documents import Document
from memagent_cli.errors import UserError
from memagent_cli.evaluation import data, niah, plot, report, results
from memagent_cli.evaluation.data import Case
from memagent_cli.evaluation.runner import Answered, check_resumable, evaluate
from memagent_cli.reader import Settings, context_needed
from memagent_cli.session import Engine, open_engine, open_session

_BIG_FILE = 256 << 20  # the authors' eval_6400.json is about 2 GB: say what takes a while


@dataclass(frozen=True)
class EvalOptions:
    """How an evaluation runs, apart from its cases."""

    backend: BackendOptions
    settings: Settings
    output: Path | None = None  # results file; default: a new one in the data folder
    use_cache: bool = True  # a greedy case already run (same trace header) is not read again
    parallel: int = 1
    write_traces: bool = True
    quiet: bool = False
    as_json: bool = False
    plot: Path | None = None


def eval_files(paths: Sequence[str], limit: int | None, options: EvalOptions) -> int:
    """Run the cases of the authors' files (the first `limit` of each); the exit code."""
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
    _before_running(output, options)
    engine = open_engine(options.backend, options.settings, questions, _note(options))
    return _run(cases(), total, output, options, engine)


def eval_niah(
    haystack: str,
    *,
    lengths: str,
    depths: str,
    variant: str,
    seed: int,
    options: EvalOptions,
) -> int:
    """Build needle cases from the document at `haystack`, run them, show table and heatmap."""
    from memagent_cli.inputs import read_document

    parsed_lengths, parsed_depths = niah.parse_lengths(lengths), niah.parse_depths(depths)
    if variant not in niah.VARIANTS:
        raise UserError(f"Unknown needle variant {variant}; choose {', '.join(niah.VARIANTS)}.")
    document = read_document(haystack, password=None, quiet=options.quiet)
    output = options.output or results.default_path(Path(f"niah-{variant}"))
    _before_running(output, options)
    # Cases are cut with the model's own tokenizer, so the backend comes first.
    backend = open_backend(options.backend, _note(options))
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
    engine = Engine(backend, options.settings, context_needed(backend, questions, options.settings))
    return _run(cases, len(cases), output, options, engine)


def show_report(paths: Sequence[Path], *, as_json: bool, plot_path: Path | None) -> None:
    """Summaries of finished results files, compared in one plot."""
    runs = [results.read(path) for path in paths]
    if plot_path is not None:
        plot.require()
    if as_json:
        print(json.dumps({"runs": [report.to_json(r) for r in runs]}, ensure_ascii=False))
    else:
        out = display.results_console()
        for r in runs:
            report.print_table(out, r, title=len(runs) > 1)
    if plot_path is not None:
        _plot(runs, plot_path)


def _before_running(output: Path, options: EvalOptions) -> None:
    """What can fail in seconds fails before any model loads."""
    if options.plot is not None:
        plot.require()
    results.read(output, missing_ok=True)


def _run(
    cases: Iterable[Case], total: int, output: Path, options: EvalOptions, engine: Engine
) -> int:
    note = _note(options)
    earlier = results.read(output, missing_ok=True)
    if earlier.skipped:
        display.warn(f"{output}: skipped {earlier.skipped} damaged lines.")
    info = run_info(engine)
    check_resumable(earlier, info)
    left = total - len(earlier.finished)
    note(f"results: {output}")
    if earlier.records:
        note(f"continuing: {len(earlier.records)} cases done, about {max(left, 0)} to run")
    counter = {"n": len(earlier.records)}

    def finished(record: dict[str, Any]) -> None:
        counter["n"] += 1
        note(
            f"[{counter['n']}/{total}] {record['group']} {record['id']}: "
            f"sub_em {record['sub_em']:.2f} · {record['tokens']:,} tokens · "
            f"{record['seconds']:.1f}s"
        )

    answer = _answerer(engine, options)
    with results.Writer(output) as writer:
        try:
            evaluate(
                cases,
                answer,
                writer,
                finished=earlier.finished,
                run_info=info,
                parallel=options.parallel,
                on_record=finished,
            )
        except run.Stopped as stop:
            return _stopped(stop.message, stop.exit_code, output)
        except KeyboardInterrupt:
            return _stopped("Interrupted (SIGINT).", 130, output)
    finished_run = results.read(output)
    unboxed = sum(r.get("prediction") is None for r in finished_run.records)
    if unboxed:
        note(
            f"{unboxed} of {len(finished_run.records)} final replies put no answer in "
            "\\boxed{}; they score 0, as in the authors' script (each record keeps the reply)."
        )
    _show(finished_run, options)
    return 0


def _stopped(message: str, code: int, output: Path) -> int:
    display.error(message)
    display.note(f"finished cases are in {output}; run the same command again to continue")
    return code


def run_info(engine: Engine) -> dict[str, Any]:
    """What every record of a results file must share: the model and the settings."""
    settings = engine.settings
    return {
        "model": engine.model_record.get("name"),
        "settings": {
            "chunk_tokens": settings.chunk_tokens,
            "memory_tokens": settings.memory_tokens,
            "temperature": settings.sampling.temperature,
            "top_p": settings.sampling.top_p,
            "seed": settings.sampling.seed,
        },
    }


def _answerer(
    engine: Engine, options: EvalOptions
) -> Callable[[Case, threading.Event | None], Answered]:
    run_options = run.RunOptions(quiet=options.quiet, use_cache=options.use_cache)

    def answer(case: Case, cancel: threading.Event | None) -> Answered:
        text = case.context.strip()
        document = Document(
            text=text,
            path=f"{case.group}-{case.id}",
            format="text",
            sha256=hashlib.sha256(text.encode("utf-8", "replace")).hexdigest(),
        )
        session = open_session(document, engine)
        trace_path = trace.default_path(document.path) if options.write_traces else None
        label = f"{case.group} {case.id}" if options.parallel > 1 else ""
        result = run.ask(
            session,
            case.question,
            replace(run_options, trace=trace_path, label=label, cancel=cancel),
        )
        calls = [step.generation for step in result.answer.steps] + [result.answer.final]
        return Answered(
            reply=result.answer.reply,
            tokens=len(session.tokens),
            seconds=sum(call.seconds for call in calls),
            prompt_tokens=sum(call.prompt_tokens for call in calls),
            generated_tokens=sum(call.completion_tokens for call in calls),
            trace=str(result.trace_path) if result.trace_path else None,
            cached=result.cached,
        )

    return answer


def _show(run_results: results.Results, options: EvalOptions) -> None:
    if options.as_json:
        print(json.dumps(report.to_json(run_results), ensure_ascii=False))
    else:
        report.print_table(display.results_console(), run_results)
    if options.plot is not None:
        _plot([run_results], options.plot)


def _plot(runs: list[results.Results], path: Path) -> None:
    records = [r for run_results in runs for r in run_results.records]
    if len(runs) == 1 and records and all(r.get("depth") is not None for r in records):
        plot.plot_heatmap(*report.depth_grid(records), path)
    else:
        plot.plot_accuracy([(r.label, report.summarize(r.records)) for r in runs], path)
    display.note(f"plot: {path}")


def _note(options: EvalOptions) -> Callable[[str], None]:
    return (lambda message: None) if options.quiet else display.note
