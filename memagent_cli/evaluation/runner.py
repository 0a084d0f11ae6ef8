"""Running an evaluation: each case answered by an ordinary run, scored, and its record
appended the moment it finishes, so an interruption loses at most the cases in flight.

The runner knows cases, scores and results files; how a case is answered (the run module,
a model, a server) comes in as a function.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from memagent_cli.errors import UserError
from memagent_cli.evaluation.data import Case
from memagent_cli.evaluation.results import Results, Writer
from memagent_cli.evaluation.scoring import score_reply


@dataclass(frozen=True)
class Answered:
    """What a run of one case produced."""

    reply: str  # the final reply, as the model wrote it
    tokens: int  # document tokens read
    seconds: float  # model time of every call (a cached answer keeps its original time)
    prompt_tokens: int
    generated_tokens: int
    trace: str | None
    cached: bool = False


# Answer every case of an iterable, in its order, several at once where it can
# (run/batch.py's outcomes); a run that fails raises once the cases finished before, and
# those in flight that finish anyway, are yielded.
AnswerCases = Callable[[Iterable[Case]], Iterable[tuple[Case, Answered]]]


@dataclass
class Outcome:
    """How far an evaluation got."""

    ran: int = 0
    skipped: int = 0  # finished in an earlier run of the same results file
    records: list[dict[str, Any]] = field(default_factory=list)


def check_resumable(earlier: Results, run_info: dict[str, Any]) -> None:
    """Refuse to mix runs: a results file continues only with the same model and settings."""
    for record in earlier.records:
        theirs = {key: record.get(key) for key in run_info}
        if theirs != run_info:
            changed = ", ".join(k for k in run_info if theirs[k] != run_info[k])
            raise UserError(
                f"{earlier.path} holds results of another {changed}; give a new --output, "
                "or the same options to continue it."
            )


def record_of(case: Case, answered: Answered, run_info: dict[str, Any]) -> dict[str, Any]:
    """The results line of one finished case."""
    score = score_reply(answered.reply, case.answers, case.kind)
    record: dict[str, Any] = {
        "id": case.id,
        "group": case.group,
        "kind": case.kind,
        "question": case.question,
        "gold": case.answers[0] if case.kind == "qa" else list(case.answers),
        "prediction": score.prediction,
        "reply": answered.reply,
        "sub_em": score.sub_em,
        "em": score.em,
        "f1": score.f1,
        "seconds": round(answered.seconds, 3),
        "tokens": answered.tokens,
        "prompt_tokens": answered.prompt_tokens,
        "generated_tokens": answered.generated_tokens,
        "trace": answered.trace,
        "cached": answered.cached,
    }
    if case.depth is not None:
        record["depth"] = case.depth
    return record | run_info


def evaluate(
    cases: Iterable[Case],
    answers: AnswerCases,
    writer: Writer,
    *,
    finished: set[tuple[str, str]],
    run_info: dict[str, Any],
    on_record: Callable[[dict[str, Any]], None] = lambda record: None,
) -> Outcome:
    """Answer every case not in `finished` by `answers`, appending each record as its case
    finishes. An exception from a run (Ctrl-C, a failing server) stops the evaluation once
    the cases that finish anyway are kept (`AnswerCases`)."""
    outcome = Outcome()

    def todo() -> Iterator[Case]:
        for case in cases:
            if case.key in finished:
                outcome.skipped += 1
            else:
                yield case

    def keep(case: Case, answered: Answered) -> None:
        record = record_of(case, answered, run_info)
        writer.add(record)
        outcome.ran += 1
        outcome.records.append(record)
        on_record(record)

    for case, answered in answers(todo()):
        keep(case, answered)
    return outcome
