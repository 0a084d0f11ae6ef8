"""What a trace says, in words: where its answer came from, the run's facts, a step's title,
when a text was in the memory. Pure functions of trace records (no Rich): the terminal,
Markdown and HTML views print the same sentences."""

from __future__ import annotations

from collections.abc import Sequence

from memagent_cli import readers
from memagent_cli.provenance import Source
from memagent_cli.trace import StepRecord, Trace
from memagent_cli.views.console import home_relative


def evidence(loaded: Trace) -> str | None:
    """Where the trace's answer came from, in words; None when there is no answer."""
    if loaded.final is None:
        return None
    return evidence_line(loaded.final.evidence, loaded.total_steps)


def evidence_line(found: Sequence[Source] | None, total: int) -> str | None:
    """ "from pp. 131–150, step 7 of 30", from an answer's evidence; "no source: ..." when
    the final memory does not hold the answer's words; None with nothing to trace."""
    if found is None:
        return None
    if not found:
        return "no source in the document: the final memory does not hold the answer's words"
    several = len(found) > 1
    return "from " + "; ".join(source_text(source, total, several) for source in found)


def source_text(source: Source, total: int, several: bool = False) -> str:
    """ "pp. 131–150, step 7 of 30", with the words it brought in when there are `several`."""
    found = "found by a search at " if source.retrieved else ""
    text = f"{source_place(source)}, {found}step {source.step} of {total}"
    if several and source.words:
        text += f" ({' '.join(source.words)})"
    return text


def source_place(source: Source) -> str:
    """Where one evidence step read: "p. 3", "pp. 3–5", chapters, or its tokens."""
    if source.pages:
        return f"p. {source.pages}" if source.one_page else f"pp. {source.pages}"
    if source.chapters:
        return source.chapters
    first, last = source.tokens
    return f"tokens {first:,}–{last:,}"


def about(loaded: Trace) -> list[tuple[str, str]]:
    """Question, document, model and settings as (label, text) pairs."""
    header = loaded.header
    doc, model = header.document, header.model
    counts = [f"{doc[k]:,} {k}" for k in ("characters", "tokens", "chunks") if k in doc]
    size = model.get("size")
    gib = f", {size / 2**30:.2f} GiB" if isinstance(size, int) else ""
    settings = ", ".join(f"{k.replace('_', ' ')} {_value(v)}" for k, v in header.settings.items())
    return [
        ("question", header.question),
        (
            "document",
            f"{home_relative(doc['path'])} ({', '.join([doc['format'], *counts])})",
        ),
        ("model", f"{model['name']} ({home_relative(model['path'])}{gib})"),
        ("settings", settings),
        ("created", f"{header.created} by memagent {header.memagent}"),
    ]


def _value(value: object) -> str:
    if value is None:
        return "none"
    return f"{value:,}" if type(value) is int else str(value)  # not a bool


def step_title(record: StepRecord) -> str:
    """ "step 3, p. 1–2, tokens 120–180": steps count from 1, as `memagent ask` counts."""
    span = f", {record.span}" if record.span else ""
    return f"step {record.index + 1}{span}, tokens {record.tokens[0]:,}–{record.tokens[1]:,}"


def stopped(loaded: Trace) -> str | None:
    """ "after step 3 of 30: the planner said STOP 3 times in a row" for a reader that
    answered before the last chunk (readers/); None for a reading of every chunk."""
    final = loaded.final
    if final is None or not final.stopped:
        return None
    return f"after step {len(loaded.steps)} of {loaded.total_steps}: {final.stopped}"


def reader_actions(loaded: Trace, record: StepRecord) -> list[tuple[str, str]]:
    """What a reader after MemAgent did at a step besides its update, as (label, text): what
    its steps carry, as its spec says (Spec.fields: InfMem's searches, ReMemR1's recall, a
    reread's sub-question, a merge's memory, ...), then the units of the document a search
    found that the update was shown, with their pages or chapters."""
    spec = readers.find(readers.named_in(loaded.header.settings))
    actions = list(spec.actions(record.extra)) if spec is not None else []
    if record.found:
        spans = record.found_spans or ("",) * len(record.found)
        units = (
            f"{span} (tokens {a:,}–{b:,})" if span else f"tokens {a:,}–{b:,}"
            for span, (a, b) in zip(spans, record.found, strict=False)
        )
        actions.append(("units found", ", ".join(units)))
    return actions


def presence(hits: list[int], steps: int, pattern: str) -> str:
    """When the text entered and left the memory, given the step numbers (from 1) it is in:
    "in the memory at steps 2–4 and 7 (of steps 1–9)"."""
    runs: list[list[int]] = []
    for i in hits:
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    parts = [f"{a}" if a == b else f"{a}–{b}" for a, b in runs]
    listed = ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]
    label = "step" if len(hits) == 1 else "steps"
    of = "of step 1" if steps == 1 else f"of steps 1–{steps}"
    return f"{pattern!r} is in the memory at {label} {listed} ({of})."
