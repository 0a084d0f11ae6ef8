"""Summaries of results: one row per length group, as a table on stdout or one JSON object.

Scores are percentages of the cases in the group, as the authors print them
(`round(sum * 100 / n, 2)`); "boxed" is the share of final replies with a `\boxed{}` answer
(the others score 0); "tok/s" is document tokens read per second of model time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from memagent_cli.evaluation.results import Results


@dataclass(frozen=True)
class GroupRow:
    """One length group of one run."""

    group: str
    label: str  # the measured length, e.g. "28K"
    tokens: float  # mean document tokens
    cases: int
    sub_em: float  # percent; the paper's accuracy (needle files: recall)
    em: float | None  # percent; None when no case is QA
    f1: float | None
    seconds_per_case: float
    tokens_per_second: float | None
    boxed: float  # percent of final replies with a \boxed{} answer; the others score 0


COLUMNS = ("group", "length", "cases", "sub_em", "em", "f1", "boxed", "s/case", "tok/s")


def cells(row: GroupRow) -> list[str]:
    """One row as the score tables print it (the terminal's and the HTML report's)."""
    return [
        row.group,
        row.label,
        str(row.cases),
        _cell(row.sub_em),
        _cell(row.em),
        _cell(row.f1),
        _cell(row.boxed, "{:.0f}%"),
        f"{row.seconds_per_case:.1f}",
        _cell(row.tokens_per_second, "{:,.0f}"),
    ]


def _cell(value: float | None, form: str = "{:.2f}") -> str:
    return "-" if value is None else form.format(value)


def length_label(tokens: float) -> str:
    """Tokens as the paper labels lengths: K = 1024, M = 1024 K (7K, 896K, 1.75M)."""
    if tokens < 1024:
        return f"{tokens:.0f}"
    if tokens < 1024 * 1024:
        return f"{tokens / 1024:.0f}K"
    return f"{tokens / (1024 * 1024):.3g}M"


def summarize(records: Sequence[dict[str, Any]]) -> list[GroupRow]:
    """One row per group, shortest documents first; the overall row is `overall(...)`."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        groups.setdefault(str(record["group"]), []).append(record)
    rows = [_row(name, members) for name, members in groups.items()]
    return sorted(rows, key=lambda row: row.tokens)


def overall(records: Sequence[dict[str, Any]]) -> GroupRow | None:
    """Every case of a run pooled, or None for no cases."""
    return _row("all", list(records)) if records else None


def _row(name: str, members: list[dict[str, Any]]) -> GroupRow:
    n = len(members)
    tokens = sum(float(r["tokens"]) for r in members)
    seconds = sum(float(r["seconds"]) for r in members)
    return GroupRow(
        group=name,
        label=length_label(tokens / n),
        tokens=round(tokens / n, 1),
        cases=n,
        sub_em=_percent([r["sub_em"] for r in members]),
        em=_percent([r["em"] for r in members if r.get("em") is not None]),
        f1=_percent([r["f1"] for r in members if r.get("f1") is not None]),
        seconds_per_case=round(seconds / n, 2),
        tokens_per_second=round(tokens / seconds, 1) if seconds > 0 else None,
        boxed=_percent([r.get("prediction") is not None for r in members]),
    )


def _percent(values: list[Any]) -> Any:
    if not values:
        return None
    return round(sum(float(v) for v in values) * 100 / len(values), 2)


def depth_grid(records: Sequence[dict[str, Any]]) -> tuple[list[str], list[float], list[list]]:
    """Needle results as (length labels, depths, score[depth][length] in percent or None)."""
    rows = summarize(records)
    depths = sorted({float(r["depth"]) for r in records if r.get("depth") is not None})
    grid: list[list] = []
    for depth in depths:
        line = []
        for row in rows:
            cell = [
                r["sub_em"]
                for r in records
                if str(r["group"]) == row.group
                and r.get("depth") is not None
                and float(r["depth"]) == depth
            ]
            line.append(_percent(cell))
        grid.append(line)
    return [row.group for row in rows], depths, grid


def to_json(run: Results) -> dict[str, Any]:
    """One run's summary: its file, its groups and all cases pooled."""
    pooled = overall(run.records)
    return {
        "results": str(run.path),
        "cases": len(run.records),
        "groups": [asdict(row) for row in summarize(run.records)],
        "overall": asdict(pooled) if pooled else None,
        "skipped_lines": run.skipped,
    }
