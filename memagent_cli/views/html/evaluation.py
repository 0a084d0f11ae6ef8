"""The HTML report of evaluations (`eval report --html`): the accuracy chart against the
paper's, the needle grid by depth and length, and per results file its scores and cases."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from memagent_cli.evaluation import plot, report
from memagent_cli.evaluation.results import Results
from memagent_cli.views.console import home_relative
from memagent_cli.views.html._page import LABEL_WIDTH, UNREAD, escape, page


def eval_report(runs: Sequence[Results]) -> str:
    """One page for results files: the accuracy chart (for one needle run, its depth x length
    grid too), drawn inline as SVG, then per file its score table by length group and every
    case."""
    parts = [
        "<header><h1>memagent eval report</h1>"
        f'<p class="sub">{len(runs)} results file{"s" if len(runs) != 1 else ""}: '
        f"{escape(', '.join(home_relative(r.path) for r in runs))}</p></header>"
    ]
    parts.append("<h2>Accuracy versus length</h2>")
    parts.append(_accuracy_chart([(r.label, report.summarize(r.records)) for r in runs]))
    records = [r for run in runs for r in run.records]
    if len(runs) == 1 and records and all(r.get("depth") is not None for r in records):
        parts.append("<h2>Needle recall by depth and length</h2>")
        parts.append(_depth_grid(*report.depth_grid(records)))
    for run in runs:
        parts.append(_eval_run(run))
    return page("memagent eval report", "".join(parts))


# Lines of the accuracy chart: the runs in these colours, the paper's rows dashed in grey.
RUN_COLOURS = ("#0969da", "#e8890c", "#1a7f37", "#8250df", "#cf222e", "#bf8700", "#57606a")
PAPER_COLOURS = ("#8c959f", "#afb8c1")


def _accuracy_chart(runs: Sequence[tuple[str, Sequence[report.GroupRow]]]) -> str:
    """Accuracy (sub_em) versus document tokens on a log scale, as `eval --plot` draws it: a
    line per run, the paper's RL-MemAgent rows dashed for reference."""
    lines: list[tuple[str, str, bool, list[tuple[float, float]]]] = []
    for (name, values), colour in zip(plot.REFERENCE.items(), PAPER_COLOURS, strict=True):
        points = list(zip(plot.REFERENCE_TOKENS, values, strict=True))
        lines.append((f"{name} (paper)", colour, True, points))
    for i, (label, rows) in enumerate(runs):
        points = [(r.tokens, r.sub_em) for r in rows if r.tokens > 0]
        lines.append((label, RUN_COLOURS[i % len(RUN_COLOURS)], False, points))
    ticks = sorted({x for *_, points in lines for x, _ in points})
    low, high = math.log10(ticks[0]), math.log10(ticks[-1])
    if high - low < 0.1:  # one length only: give it room
        low, high = low - 0.5, high + 0.5
    x0, x1, y0, y1 = 60.0, 700.0, 20.0, 300.0

    def at(tokens: float, percent: float) -> tuple[float, float]:
        x = x0 + (math.log10(tokens) - low) / (high - low) * (x1 - x0)
        return x, y1 - (min(max(percent, -2.0), 102.0) + 2) / 104 * (y1 - y0)

    out = [
        '<svg viewBox="0 0 1000 350" role="img" '
        'aria-label="Accuracy (sub_em, %) versus document tokens, one line per run">'
    ]
    for percent in (0, 25, 50, 75, 100):
        _, y = at(ticks[0], percent)
        out.append(f'<line x1="{x0}" x2="{x1}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e9ef"/>')
        out.append(
            f'<text class="dim" x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end">{percent}</text>'
        )
    free = 0.0
    for tokens in ticks:
        x, _ = at(tokens, 0)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y0}" y2="{y1}" stroke="#f0f2f5"/>')
        name = report.length_label(tokens)
        if x >= free:  # lengths too close to the one before keep their grid line only
            out.append(
                f'<text class="dim" x="{x:.1f}" y="{y1 + 18}" text-anchor="middle">'
                f"{escape(name)}</text>"
            )
            free = x + len(name) * LABEL_WIDTH + 6
    out.append(
        f'<text class="dim" x="{(x0 + x1) / 2:.0f}" y="{y1 + 40}" text-anchor="middle">'
        "document tokens (log scale)</text>"
        f'<text class="dim" x="{x0 - 44}" y="{(y0 + y1) / 2:.0f}" text-anchor="middle" '
        f'transform="rotate(-90 {x0 - 44} {(y0 + y1) / 2:.0f})">accuracy (sub_em, %)</text>'
    )
    for row, (label, colour, dashed, points) in enumerate(lines):
        placed = [(*at(t, v), t, v) for t, v in points]
        dash = ' stroke-dasharray="6 4"' if dashed else ""
        width = 1.5 if dashed else 2.5
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y, _, _ in placed)
        out.append(
            f'<polyline points="{path}" fill="none" stroke="{colour}" '
            f'stroke-width="{width}"{dash}/>'
        )
        for x, y, tokens, value in placed:
            tip = f"{label}: {value:.2f}% at {report.length_label(tokens)} tokens"
            out.append(
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{3 if dashed else 4}" fill="{colour}">'
                f"<title>{escape(tip)}</title></circle>"
            )
        ly = 30 + row * 20
        out.append(
            f'<line x1="720" x2="748" y1="{ly - 4}" y2="{ly - 4}" stroke="{colour}" '
            f'stroke-width="{width}"{dash}/>'
            f'<text x="756" y="{ly}">{escape(_shorten(label, 36))}</text>'
        )
    out.append("</svg>")
    return "".join(out)


def _shorten(text: str, most: int) -> str:
    return text if len(text) <= most else "…" + text[-(most - 1) :]


def _depth_grid(lengths: Sequence[str], depths: Sequence[float], grid: Sequence[Sequence]) -> str:
    """Needle recall (%) by depth (rows) and length (columns), red to green, blank where
    nothing ran: the heatmap `eval niah --plot` draws."""
    x0, y0, cell_w, cell_h = 70.0, 10.0, min(120.0, 900.0 / max(len(lengths), 1)), 28.0
    height = y0 + cell_h * len(depths) + 40
    out = [
        f'<svg viewBox="0 0 1000 {height:.0f}" role="img" '
        'aria-label="Needle recall by depth and length">'
    ]
    for row, (depth, values) in enumerate(zip(depths, grid, strict=True)):
        y = y0 + row * cell_h
        out.append(
            f'<text class="dim" x="{x0 - 6}" y="{y + cell_h / 2 + 4:.1f}" text-anchor="end">'
            f"{depth:g}%</text>"
        )
        for column, value in enumerate(values):
            x = x0 + column * cell_w
            fill = UNREAD if value is None else _red_to_green(float(value))
            tip = f"depth {depth:g}%, {lengths[column]}: " + (
                "not run" if value is None else f"{float(value):.0f}%"
            )
            out.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{cell_w:.1f}" height="{cell_h}" '
                f'fill="{fill}" stroke="#fff"><title>{escape(tip)}</title></rect>'
            )
            if value is not None:
                out.append(
                    f'<text x="{x + cell_w / 2:.1f}" y="{y + cell_h / 2 + 4:.1f}" '
                    f'text-anchor="middle">{float(value):.0f}</text>'
                )
    for column, name in enumerate(lengths):
        x = x0 + (column + 0.5) * cell_w
        out.append(
            f'<text class="dim" x="{x:.1f}" y="{y0 + cell_h * len(depths) + 18:.1f}" '
            f'text-anchor="middle">{escape(name)}</text>'
        )
    out.append("</svg>")
    return "".join(out)


def _red_to_green(percent: float) -> str:
    """A colour from red (0%) through yellow (50%) to green (100%)."""
    stops = ((0.0, (215, 48, 39)), (50.0, (254, 224, 139)), (100.0, (26, 152, 80)))
    value = min(max(percent, 0.0), 100.0)
    (a, ca), (b, cb) = (stops[0], stops[1]) if value <= 50 else (stops[1], stops[2])
    t = (value - a) / (b - a)
    r, g, bl = (round(p + (q - p) * t) for p, q in zip(ca, cb, strict=True))
    return f"#{r:02x}{g:02x}{bl:02x}"


def _eval_run(run: Results) -> str:
    first = run.records[0] if run.records else {}
    facts = [("Cases", f"{len(run.records):,}")]
    if first.get("model"):
        facts.append(("Model", str(first["model"])))
    if isinstance(first.get("settings"), dict):
        settings = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in first["settings"].items())
        facts.append(("Settings", settings))
    if run.skipped:
        facts.append(("Skipped", f"{run.skipped} damaged lines"))
    cells = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in facts)
    head = "".join(
        f"<th>{name}</th>" if name == "group" else f'<th class="num">{escape(name)}</th>'
        for name in report.COLUMNS
    )
    rows = report.summarize(run.records)
    pooled = report.overall(run.records)
    body = []
    for row in rows + ([pooled] if pooled and len(rows) > 1 else []):
        values = report.cells(row)
        tds = "".join(
            f"<td>{escape(v)}</td>" if i == 0 else f'<td class="num">{escape(v)}</td>'
            for i, v in enumerate(values)
        )
        body.append(f'<tr class="overall">{tds}</tr>' if row is pooled else f"<tr>{tds}</tr>")
    cases = "".join(_case(r) for r in run.records)
    return (
        f'<section><h2>{escape(home_relative(run.path))}</h2><dl class="facts">{cells}</dl>'
        f"<table><tr>{head}</tr>{''.join(body)}</table>"
        f"<details><summary>Every case ({len(run.records):,})</summary><table><tr>"
        '<th>id</th><th>group</th><th class="num">tokens</th><th class="num">sub_em</th>'
        '<th>gold</th><th>prediction</th><th class="num">seconds</th></tr>'
        f"{cases}</table></details></section>"
    )


def _case(record: dict[str, Any]) -> str:
    gold = record.get("gold", "")
    gold = ", ".join(map(str, gold)) if isinstance(gold, list) else str(gold)
    prediction = record.get("prediction")
    shown = (
        escape(str(prediction))
        if prediction is not None
        else '<span class="note">(no \\boxed{})</span>'
    )
    return (
        f"<tr><td>{escape(str(record['id']))}</td><td>{escape(str(record['group']))}</td>"
        f'<td class="num">{float(record["tokens"]):,.0f}</td>'
        f'<td class="num">{float(record["sub_em"]):.2f}</td><td>{escape(gold)}</td>'
        f'<td>{shown}</td><td class="num">{float(record["seconds"]):.1f}</td></tr>'
    )
