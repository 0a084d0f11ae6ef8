"""Reports a person opens in a browser: one self-contained HTML file per report, for runs
(`trace --html`, `ask --report`) and for evaluations (`eval report --html`).

Inline CSS and inline SVG, no script and nothing fetched: a Content-Security-Policy forbids
scripts, frames, images and every other request, so a report opens from disk, offline, and
prints. The renderers are pure functions of trace records and results files; every text
that comes from a document, a model or a file is escaped, so a memory holding `<script>` or
`javascript:` shows as those characters, and printable (memagent_cli/text.py), as on a
terminal.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memagent_cli import __version__, protocol
from memagent_cli.errors import UserError
from memagent_cli.evaluation import plot, report
from memagent_cli.evaluation.results import Results
from memagent_cli.files import cannot_write, open_private
from memagent_cli.text import printable
from memagent_cli.trace import StepRecord, Trace
from memagent_cli.views import traces
from memagent_cli.views.console import home_relative


def escape(text: str) -> str:
    """`text` as HTML text or an attribute's value: never markup, and printable."""
    return html.escape(printable(text))


POLICY = "default-src 'none'; style-src 'unsafe-inline'"
# Colours the SVG drawings share with the CSS (SVG attributes take no CSS variables).
STEP, STEP2, SOURCE, UNREAD = "#9fb3d9", "#c3d0ea", "#e8890c", "#eef1f5"

CSS = f"""
:root {{ --ink: #1f2328; --dim: #59636e; --line: #d1d9e0; --soft: #f6f8fa;
  --step: {STEP}; --step2: {STEP2}; --source: {SOURCE}; --added: #dafbe1; --added-ink: #116329;
  --dropped: #ffebe9; --dropped-ink: #82071e; --mark: #fff1a8; }}
"""
CSS += """* { box-sizing: border-box; }
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink);
  margin: 0 auto; max-width: 1100px; padding: 24px; }
h1 { font-size: 1.5em; margin: 0 0 4px; }
h2 { font-size: 1.3em; margin: 28px 0 8px; }
h3 { font-size: 1.05em; margin: 24px 0 8px; border-bottom: 1px solid var(--line); }
.sub, .note, footer { color: var(--dim); }
footer { margin-top: 40px; font-size: 0.85em; border-top: 1px solid var(--line); padding-top: 8px; }
code, .memory, pre { font: 13px/1.45 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { padding: 4px 10px; border-bottom: 1px solid var(--line); text-align: left;
  vertical-align: top; }
th { background: var(--soft); }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.overall td { font-weight: 600; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; margin: 8px 0; }
dl.facts dt { color: var(--dim); }
dl.facts dd { margin: 0; overflow-wrap: anywhere; }
.answer-box { border: 1px solid var(--line); border-left: 6px solid var(--source);
  border-radius: 6px; padding: 10px 14px; background: #fffaf2; margin: 12px 0; }
.answer-box .answer { font-size: 1.2em; font-weight: 600; white-space: pre-wrap;
  overflow-wrap: anywhere; }
.answer-box .evidence { margin-top: 4px; }
svg { display: block; width: 100%; height: auto; }
svg text { font: 12px system-ui, sans-serif; fill: var(--ink); }
svg .dim { fill: var(--dim); }
.legend { display: flex; flex-wrap: wrap; gap: 16px; font-size: 0.85em; color: var(--dim); }
.legend i { display: inline-block; width: 12px; height: 12px; margin-right: 4px;
  vertical-align: -1px; border-radius: 2px; }
.step { border: 1px solid var(--line); border-radius: 6px; margin: 10px 0; break-inside: avoid; }
.step > header { display: flex; flex-wrap: wrap; gap: 4px 14px; align-items: baseline;
  background: var(--soft); padding: 6px 12px; border-bottom: 1px solid var(--line); }
.step.source { border-color: var(--source); }
.step.source > header { background: #fff4e0; }
.step h4 { margin: 0; font-size: 1em; }
.step .metrics { padding: 6px 12px 0; font-size: 0.9em; color: var(--dim); }
.badge { background: var(--source); color: #fff; border-radius: 10px; padding: 0 8px;
  font-size: 0.85em; }
.meter { display: inline-block; width: 90px; height: 8px; background: var(--soft);
  border: 1px solid var(--line); border-radius: 4px; overflow: hidden; vertical-align: 0; }
.meter span { display: block; height: 100%; background: var(--step); }
.meter.full span { background: var(--dropped-ink); }
.memory { white-space: pre-wrap; overflow-wrap: anywhere; padding: 8px 12px 10px; margin: 0; }
del + ins { margin-left: 0.4em; }
ins { background: var(--added); color: var(--added-ink); text-decoration: none; }
del { background: var(--dropped); color: var(--dropped-ink); }
mark { background: var(--mark); border-bottom: 2px solid var(--source); }
.tabs > input { position: absolute; opacity: 0; pointer-events: none; }
.tabs > nav { display: flex; flex-wrap: wrap; gap: 4px; border-bottom: 2px solid var(--line);
  margin-top: 20px; }
.tabs > nav label { padding: 6px 12px; border: 1px solid var(--line); border-bottom: none;
  border-radius: 6px 6px 0 0; cursor: pointer; background: var(--soft); max-width: 320px;
  white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.tabs > .run { display: none; }
table.index label { cursor: pointer; text-decoration: underline; }
@media print {
  body { max-width: none; padding: 0; font-size: 11pt; }
  .tabs > nav, .tabs > input { display: none; }
  .tabs > .run { display: block !important; break-before: page; }
  * { -webkit-print-color-adjust: exact; print-color-adjust: exact; }
}
"""


# ---------------------------------------------------------------- a page


def _page(title: str, body: str, extra_css: str = "") -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{POLICY}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f'<meta name="generator" content="memagent {escape(__version__)}">\n'
        f"<title>{escape(title)}</title>\n<style>{CSS}{extra_css}</style>\n</head>\n<body>\n"
        f"{body}\n<footer>Written by memagent {escape(__version__)}. Steps count from 1, as "
        "<code>memagent ask</code> counts them.</footer>\n</body>\n</html>\n"
    )


def write(path: Path, page: str) -> None:
    """Write a report (0600 when new: it quotes the document); one sentence when it cannot
    be written."""
    try:
        with open_private(path, "w", errors="replace") as file:
            file.write(page)
    except OSError as exc:
        raise UserError(f"Cannot write the report {path}: {cannot_write(path, exc)}.") from None


def check_writable(path: Path) -> None:
    """Fail before a long run, not after it, when its report could not be written."""
    existed = path.exists()
    try:
        with open_private(path, "a"):
            pass
    except OSError as exc:
        raise UserError(f"Cannot write the report {path}: {cannot_write(path, exc)}.") from None
    if not existed:
        path.unlink()


def _number(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _rate(tokens: int, seconds: float) -> str:
    return f"{_number(tokens / seconds)} tok/s" if seconds > 0 else "–"


# ---------------------------------------------------------------- runs


def trace_report(runs: Sequence[Trace]) -> str:
    """One page for one or more runs: an index and a tab per question when there are several
    (printed one after another)."""
    if not runs:
        raise ValueError("a report needs at least one run")
    sections = [_run(number, loaded, len(runs)) for number, loaded in enumerate(runs, start=1)]
    documents = {Path(str(r.header.document.get("path", ""))).name for r in runs}
    title = runs[0].header.question if len(runs) == 1 else f"{len(runs)} questions"
    head = (
        f"<header><h1>memagent report: {escape(title)}</h1>"
        f'<p class="sub">{escape(", ".join(sorted(documents)))}</p></header>'
    )
    if len(runs) == 1:
        return _page(f"memagent: {title}", head + sections[0].replace(' class="run"', "", 1))
    tabs, rules = [], []
    for number in range(1, len(runs) + 1):
        checked = " checked" if number == 1 else ""
        tabs.append(f'<input type="radio" name="run" id="tab-{number}"{checked}>')
        rules.append(
            f"#tab-{number}:checked ~ #run-{number} {{ display: block; }}\n"
            f"#tab-{number}:checked ~ nav label[for=tab-{number}] "
            "{ background: #fff; font-weight: 600; border-color: var(--source); }\n"
        )
    labels = "".join(
        f'<label for="tab-{n}" title="{escape(r.header.question)}">{n}. '
        f"{escape(r.header.question)}</label>"
        for n, r in enumerate(runs, start=1)
    )
    body = (
        head
        + _index(runs)
        + '<main class="tabs">'
        + "".join(tabs)
        + f"<nav>{labels}</nav>"
        + "".join(sections)
        + "</main>"
    )
    return _page(f"memagent: {title}", body, "".join(rules))


def _index(runs: Sequence[Trace]) -> str:
    rows = []
    for number, loaded in enumerate(runs, start=1):
        final = loaded.final
        answer = "" if final is None else _answer_text(loaded)
        where = traces.evidence(loaded) or str(loaded.status)
        rows.append(
            f'<tr><td class="num">{number}</td><td><label for="tab-{number}">'
            f"{escape(loaded.header.question)}</label></td><td>{escape(answer)}</td>"
            f"<td>{escape(where)}</td>"
            f'<td class="num">{len(loaded.steps)}/{loaded.header.total_steps}</td></tr>'
        )
    return (
        '<table class="index"><tr><th class="num">#</th><th>question</th><th>answer</th>'
        '<th>source</th><th class="num">steps</th></tr>' + "".join(rows) + "</table>"
    )


def _answer_text(loaded: Trace) -> str:
    final = loaded.final
    assert final is not None
    return final.answer if final.answer is not None else final.reply.strip()


def _run(number: int, loaded: Trace, runs: int) -> str:
    """One question's run: answer and sources, the document strip, facts, chart, steps."""
    ident = f"run-{number}"
    final = loaded.final
    sources = {s["step"]: s for s in (final.evidence or [])} if final else {}
    held = {w for s in sources.values() for w in s.get("words", [])}
    parts = [f'<section class="run" id="{ident}">']
    tag = f"Question {number}: " if runs > 1 else "Question: "
    parts.append(f"<h2>{escape(tag)}{escape(loaded.header.question)}</h2>")
    parts.append(_answer_box(loaded, ident))
    parts.append("<h3>The document and the steps that read it</h3>")
    parts.append(_strip(loaded, ident, sources))
    parts.append(_facts(loaded))
    if loaded.steps:
        parts.append("<h3>Memory size and time per step</h3>")
        parts.append(_chart(loaded, sources))
        parts.append("<h3>Memory at each step</h3>")
        changes = traces.changes(loaded)
        before = [protocol.INITIAL_MEMORY, *(s.memory for s in loaded.steps)]
        for record, previous, change in zip(loaded.steps, before, changes, strict=False):
            parts.append(_step(loaded, record, previous, change, ident, sources, held))
    if final is not None:
        parts.append(f'<h3 id="{ident}-reply">Final reply</h3>')
        parts.append(f'<pre class="memory">{escape(final.reply)}</pre>')
    parts.append("</section>")
    return "".join(parts)


_ANSWER_SHOWN = 400  # characters of the answer shown on top


def _answer_box(loaded: Trace, ident: str) -> str:
    final = loaded.final
    if final is None:
        status = escape(str(loaded.status))
        return f'<div class="answer-box"><div class="answer">No answer yet</div>{status}</div>'
    note, text = "", _answer_text(loaded)
    if final.answer is None:
        note = "No answer in \\boxed{}: this is the raw final reply"
    if len(text) > _ANSWER_SHOWN:  # a runaway reply: all of it is under "Final reply"
        text = text[:_ANSWER_SHOWN].rstrip() + " …"
        note = (note or "A long answer") + f', cut here; <a href="#{ident}-reply">all of it</a>'
    if note:
        note = f'<div class="note">{note}.</div>'
    where = ""
    total = loaded.header.total_steps
    if not final.evidence and (line := traces.evidence(loaded)):
        where = f'<div class="evidence">{escape(line[0].upper() + line[1:])}.</div>'
    elif final.evidence:
        several = len(final.evidence) > 1
        links = "; ".join(
            f'<a href="#{ident}-step-{s["step"]}">'
            f"{escape(traces.source_text(s, total, several))}</a>"
            for s in final.evidence
        )
        where = f'<div class="evidence">From {links}.</div>'
    return (
        '<div class="answer-box"><div class="sub">Answer</div>'
        f'<div class="answer">{escape(text)}</div>{note}{where}</div>'
    )


def _facts(loaded: Trace) -> str:
    rows = [(label.capitalize(), text) for label, text in traces.about(loaded)[1:]]
    calls: list[Any] = [*loaded.steps, *([loaded.final] if loaded.final else [])]
    seconds = sum(c.seconds for c in calls)
    prompt = sum(c.prompt_tokens for c in calls)
    generated = sum(c.completion_tokens for c in calls)
    read = sum(s.tokens[1] - s.tokens[0] for s in loaded.steps)
    rows.append(
        ("Time", f"{seconds:,.1f} s for {len(loaded.steps)} steps and the answer"
         if loaded.final else f"{seconds:,.1f} s for {len(loaded.steps)} steps")
    )  # fmt: skip
    rows.append(
        ("Tokens", f"{read:,} of the document read; {prompt:,} prompt tokens in, "
         f"{generated:,} generated ({_rate(read, seconds)} of document)")
    )  # fmt: skip
    rows.append(("Status", str(loaded.status)))
    rows.append(("Trace", home_relative(loaded.path)))
    cells = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in rows)
    return f'<dl class="facts">{cells}</dl>'


def _strip(loaded: Trace, ident: str, sources: dict[int, dict[str, Any]]) -> str:
    """The document from its first token to its last, each step's chunk a block on it, a
    tick where each step starts named by its page or chapter (its first token in a text),
    the source steps marked with the answer above them."""
    width, top, height = 1000.0, 34.0, 30.0
    total = max(int(loaded.header.document.get("tokens") or 0), 1)
    if loaded.steps:
        total = max(total, loaded.steps[-1].tokens[1])
    out = [
        f'<svg viewBox="0 0 {width:.0f} 116" role="img" '
        f'aria-label="The document, {total:,} tokens, and the chunk each step read">'
    ]
    out.append(
        f'<rect x="0" y="{top}" width="{width:.0f}" height="{height}" fill="{UNREAD}" '
        'stroke="#d1d9e0"><title>not read</title></rect>'
    )
    for record in loaded.steps:
        number = record.index + 1
        x = record.tokens[0] / total * width
        w = max((record.tokens[1] - record.tokens[0]) / total * width, 0.5)
        fill = SOURCE if number in sources else (STEP if number % 2 else STEP2)
        tip = traces.step_title(record)
        out.append(
            f'<a href="#{ident}-step-{number}"><rect x="{x:.2f}" y="{top}" width="{w:.2f}" '
            f'height="{height}" fill="{fill}" stroke="#fff" stroke-width="0.5">'
            f"<title>{escape(tip)}</title></rect></a>"
        )
        if w >= 26:
            out.append(
                f'<text x="{x + w / 2:.1f}" y="{top + height / 2 + 4}" text-anchor="middle">'
                f"{number}</text>"
            )
    for number, source in sources.items():
        x = (source["tokens"][0] + source["tokens"][1]) / 2 / total * width
        out.append(
            f'<path d="M{x:.1f} {top - 2} l-6 -9 h12 z" fill="{SOURCE}">'
            f"<title>{escape(traces.source_place(source))}</title></path>"
        )
        out.append(
            f'<text x="{min(max(x, 30), width - 30):.1f}" y="{top - 14}" text-anchor="middle">'
            f"step {number}</text>"
        )
    out.extend(_boundaries(loaded.steps, total, width, top + height))
    out.append(
        f'<text class="dim" x="{width / 2:.0f}" y="{top + height + 46}" text-anchor="middle">'
        f"{total:,} tokens, {loaded.header.total_steps} steps</text>"
    )
    out.append("</svg>")
    legend = (
        '<div class="legend"><span><i style="background: var(--step)"></i>a step\'s chunk'
        '</span><span><i style="background: var(--source)"></i>a step the answer came from'
        '</span><span><i style="background: #eef1f5; border: 1px solid #d1d9e0"></i>not read'
        "</span><span>| where a step starts</span></div>"
    )
    return "".join(out) + legend


_LABEL_WIDTH = 6.6  # an SVG unit per 12px character, the strip being about 1,000 px wide


def _boundaries(steps: Sequence[StepRecord], total: int, width: float, y: float) -> list[str]:
    """A tick under the strip where each step starts and where the last one ends, labelled
    with the page or chapter it starts on whenever that changes, so the strip reads as the
    document's pages or chapters; labels that would overlap the one before are left out
    (each tick still says its place on hover)."""
    out: list[str] = []
    ticks = []
    for record in steps:
        start, number = record.tokens[0], record.index + 1
        if record.span:
            place = _starts_on(record.span)
            tip = f"step {number} starts on {place}, token {start:,}"
        else:  # a text: no pages, so its tokens
            place, tip = f"{start:,}", f"step {number} starts at token {start:,}"
        ticks.append((start, place, tip))
    # The page or chapter the document ends on, known when the last step read to its end.
    last_span = steps[-1].span if steps and steps[-1].tokens[1] >= total else ""
    end = _ends_on(last_span) if last_span else f"token {total:,}"
    end_left = width - len(end) * _LABEL_WIDTH
    free, shown = 0.0, None
    for token, place, tip in ticks:
        x = token / total * width
        out.append(
            f'<line x1="{x:.2f}" x2="{x:.2f}" y1="{y}" y2="{y + 7}" stroke="#59636e">'
            f"<title>{escape(tip)}</title></line>"
        )
        label_end = x + len(place) * _LABEL_WIDTH + 8
        if place != shown and x >= free and label_end <= end_left:
            out.append(f'<text class="dim" x="{x:.1f}" y="{y + 20}">{escape(place)}</text>')
            free, shown = label_end, place
    if not ticks:
        out.append(f'<text class="dim" x="0" y="{y + 20}">token 0</text>')
    out.append(
        f'<line x1="{width - 0.5:.1f}" x2="{width - 0.5:.1f}" y1="{y}" y2="{y + 7}" '
        'stroke="#59636e"/>'
    )
    if end != shown:  # else the last label already names the page the document ends on
        out.append(
            f'<text class="dim" x="{width:.0f}" y="{y + 20}" text-anchor="end">{escape(end)}</text>'
        )
    return out


def _starts_on(span: str) -> str:
    """The page or chapter a span starts on: "p. 3" of "p. 3–5", "Intro" of "Intro – Coda"."""
    if span.startswith("p. "):
        return span.split("–")[0]
    return span.split(" – ")[0]


def _ends_on(span: str) -> str:
    """The page or chapter a span ends on: "p. 5" of "p. 3–5", "Coda" of "Intro – Coda"."""
    if span.startswith("p. "):
        return "p. " + span.removeprefix("p. ").split("–")[-1]
    return span.split(" – ")[-1]


def _chart(loaded: Trace, sources: dict[int, dict[str, Any]]) -> str:
    """Two panels over the steps: memory tokens (bars, against the budget), then seconds."""
    steps = loaded.steps
    budget = loaded.header.settings.get("memory_tokens")
    budget = budget if isinstance(budget, int) and not isinstance(budget, bool) else None
    x0, x1 = 70.0, 960.0
    band = (x1 - x0) / len(steps)
    top_tokens = max([budget or 0, *(s.completion_tokens for s in steps), 1])
    top_seconds = max([*(s.seconds for s in steps), 0.001])
    out = [
        '<svg viewBox="0 0 1000 300" role="img" '
        'aria-label="Memory tokens and seconds of each step">'
    ]

    def panel(y0: float, y1: float, top: float, unit: str, title: str) -> None:
        out.append(f'<text class="dim" x="{x0}" y="{y0 - 8}">{title}</text>')
        for fraction in (0, 0.5, 1):
            y = y1 - fraction * (y1 - y0)
            out.append(f'<line x1="{x0}" x2="{x1}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e9ef"/>')
            value = f"{top * fraction:,.0f}" if unit == "" else f"{top * fraction:.1f}{unit}"
            out.append(
                f'<text class="dim" x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end">{value}</text>'
            )

    # Memory tokens per step, 24-160.
    t0, t1 = 24.0, 160.0
    panel(t0, t1, top_tokens, "", "memory tokens")
    for i, record in enumerate(steps):
        number = record.index + 1
        y = t1 - record.completion_tokens / top_tokens * (t1 - t0)
        fill = SOURCE if number in sources else STEP
        tip = f"step {number}: {record.completion_tokens:,} memory tokens"
        out.append(
            f'<rect x="{x0 + (i + 0.15) * band:.2f}" y="{y:.1f}" width="{band * 0.7:.2f}" '
            f'height="{t1 - y:.1f}" fill="{fill}"><title>{escape(tip)}</title></rect>'
        )
    if budget is not None:
        y = t1 - budget / top_tokens * (t1 - t0)
        out.append(
            f'<line x1="{x0}" x2="{x1}" y1="{y:.1f}" y2="{y:.1f}" stroke="#cf222e" '
            'stroke-dasharray="6 4"/>'
            f'<text x="{x1}" y="{y - 5:.1f}" text-anchor="end" fill="#cf222e">'
            f"budget {budget:,}</text>"
        )
    # Seconds per step, 196-262.
    s0, s1 = 196.0, 262.0
    panel(s0, s1, top_seconds, " s", "seconds")
    centres = [x0 + (i + 0.5) * band for i in range(len(steps))]
    heights = [s1 - s.seconds / top_seconds * (s1 - s0) for s in steps]
    points = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(centres, heights, strict=True))
    out.append(f'<polyline points="{points}" fill="none" stroke="#1f2328" stroke-width="1.5"/>')
    for x, y, record in zip(centres, heights, steps, strict=True):
        if len(steps) <= 60:
            tip = f"step {record.index + 1}: {record.seconds:.1f} s"
            out.append(
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="#1f2328">'
                f"<title>{escape(tip)}</title></circle>"
            )
    stride = max(1, math.ceil(len(steps) / 20))
    for i, (x, record) in enumerate(zip(centres, steps, strict=True)):
        if i % stride == 0 or i == len(steps) - 1:
            out.append(
                f'<text class="dim" x="{x:.1f}" y="{s1 + 18}" text-anchor="middle">'
                f"{record.index + 1}</text>"
            )
    out.append(f'<text class="dim" x="{x0 - 6}" y="{s1 + 18}" text-anchor="end">step</text>')
    out.append("</svg>")
    legend = (
        '<div class="legend"><span><i style="background: var(--step)"></i>memory tokens</span>'
        '<span><i style="background: var(--source)"></i>a step the answer came from</span>'
        '<span><i style="background: #cf222e; height: 2px"></i>the memory budget</span></div>'
    )
    return "".join(out) + legend


def _step(
    loaded: Trace,
    record: StepRecord,
    previous: str,
    change: tuple[int, int],
    ident: str,
    sources: dict[int, dict[str, Any]],
    held: set[str],
) -> str:
    number = record.index + 1
    source = sources.get(number)
    badge = ""
    if source is not None:
        brought = escape(": " + " ".join(source["words"])) if source.get("words") else ""
        badge = f'<span class="badge">the answer came from here{brought}</span>'
    span = f"<span>{escape(record.span)}</span>" if record.span else ""
    head = (
        f'<header><h4>Step {number} <span class="sub">of {loaded.header.total_steps}</span>'
        f"</h4>{span}<span>tokens {record.tokens[0]:,}–{record.tokens[1]:,}</span>{badge}</header>"
    )
    budget = loaded.header.settings.get("memory_tokens")
    size = f"{record.completion_tokens:,} memory tokens"
    meter = ""
    if isinstance(budget, int) and budget > 0:
        share = min(record.completion_tokens / budget, 1.0)
        full = " full" if record.finish_reason == "length" else ""
        meter = (
            f'<span class="meter{full}" title="{share:.0%} of the budget">'
            f'<span style="width: {share * 100:.1f}%"></span></span> '
        )
        size = f"{record.completion_tokens:,} of {budget:,} memory tokens"
    if record.finish_reason == "length":
        size += " (cut at the budget)"
    added, removed = change
    prompt = _rate(record.prompt_tokens, record.prompt_seconds)
    generation = _rate(record.completion_tokens, record.seconds - record.prompt_seconds)
    metrics = (
        f'<div class="metrics">{meter}{escape(size)} · <ins>+{added}</ins> <del>−{removed}</del> '
        f"words · {record.seconds:.1f} s · prompt {prompt} · generation {generation}</div>"
    )
    diff = "".join(
        _piece(kind, text, held) for kind, text in traces.word_diff(previous, record.memory)
    )
    cls = "step source" if source is not None else "step"
    return (
        f'<article class="{cls}" id="{ident}-step-{number}">{head}{metrics}'
        f'<div class="memory">{diff}</div></article>'
    )


def _piece(kind: str, text: str, held: set[str]) -> str:
    """One piece of a word diff; the answer's words are marked where the memory holds them."""
    if kind == "-":
        return f"<del>{escape(text)}</del>"
    shown = _marked(text, held) if held else escape(text)
    return f"<ins>{shown}</ins>" if kind == "+" else shown


def _marked(text: str, held: set[str]) -> str:
    out = []
    for word in re.split(r"(\s+)", text):
        if word.strip() and set(protocol.normalize_answer(word).split()) & held:
            out.append(f"<mark>{escape(word)}</mark>")
        else:
            out.append(escape(word))
    return "".join(out)


# ---------------------------------------------------------------- evaluations


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
    return _page("memagent eval report", "".join(parts))


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
            free = x + len(name) * _LABEL_WIDTH + 6
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
