"""The HTML report of runs (`trace --html`, `ask --report`): per question its answer and
sources, the document strip, the facts, a chart of memory and time, and every step's memory
as a word diff, with a tab per question when there are several."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memagent_cli import protocol
from memagent_cli.provenance import Source
from memagent_cli.text import json_count
from memagent_cli.trace import StepRecord, Trace
from memagent_cli.views.console import home_relative
from memagent_cli.views.html._page import (
    LABEL_WIDTH,
    SOURCE,
    STEP,
    STEP2,
    UNREAD,
    escape,
    page,
)
from memagent_cli.views.traces import diffs, wording


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
        return page(f"memagent: {title}", head + sections[0].replace(' class="run"', "", 1))
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
    return page(f"memagent: {title}", body, "".join(rules))


def _index(runs: Sequence[Trace]) -> str:
    rows = []
    for number, loaded in enumerate(runs, start=1):
        final = loaded.final
        answer = "" if final is None else _answer_text(loaded)
        where = wording.evidence(loaded) or str(loaded.status)
        rows.append(
            f'<tr><td class="num">{number}</td><td><label for="tab-{number}">'
            f"{escape(loaded.header.question)}</label></td><td>{escape(answer)}</td>"
            f"<td>{escape(where)}</td>"
            f'<td class="num">{len(loaded.steps)}/{loaded.total_steps}</td></tr>'
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
    evidence = (final.evidence or []) if final else []
    sources = {s.step: s for s in evidence if not s.retrieved}  # the chunks the answer came from
    found: dict[int, list[Source]] = {}  # the units a search found (readers/infmem.py)
    for s in evidence:
        if s.retrieved:
            found.setdefault(s.step, []).append(s)
    held = {w for s in evidence for w in s.words}
    parts = [f'<section class="run" id="{ident}">']
    tag = f"Question {number}: " if runs > 1 else "Question: "
    parts.append(f"<h2>{escape(tag)}{escape(loaded.header.question)}</h2>")
    parts.append(_answer_box(loaded, ident))
    parts.append("<h3>The document and the steps that read it</h3>")
    parts.append(_strip(loaded, ident, sources, [s for s in evidence if s.retrieved]))
    parts.append(_facts(loaded))
    if loaded.steps:
        parts.append("<h3>Memory size and time per step</h3>")
        parts.append(_chart(loaded, sources))
        parts.append("<h3>Memory at each step</h3>")
        changes = diffs.changes(loaded)
        before = [protocol.INITIAL_MEMORY, *(s.memory for s in loaded.steps)]
        for record, previous, change in zip(loaded.steps, before, changes, strict=False):
            parts.append(_step(loaded, record, previous, change, ident, sources, held, found))
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
    if early := wording.stopped(loaded):  # a reader that answered before the last chunk
        note += f'<div class="stopped">Stopped early {escape(early)}.</div>'
    where = ""
    total = loaded.total_steps
    if not final.evidence and (line := wording.evidence(loaded)):
        where = f'<div class="evidence">{escape(line[0].upper() + line[1:])}.</div>'
    elif final.evidence:
        several = len(final.evidence) > 1
        links = "; ".join(
            f'<a href="#{ident}-step-{s.step}">{escape(wording.source_text(s, total, several))}</a>'
            for s in final.evidence
        )
        where = f'<div class="evidence">From {links}.</div>'
    return (
        '<div class="answer-box"><div class="sub">Answer</div>'
        f'<div class="answer">{escape(text)}</div>{note}{where}</div>'
    )


def _facts(loaded: Trace) -> str:
    rows = [(label.capitalize(), text) for label, text in wording.about(loaded)[1:]]
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


def _strip(
    loaded: Trace, ident: str, sources: dict[int, Source], found: Sequence[Source] = ()
) -> str:
    """The document from its first token to its last, each step's chunk a block on it, a
    tick where each step starts named by its page or chapter (its first token in a text),
    the source steps marked with the answer above them, and so the units a search `found`
    that the answer came from."""
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
        tip = wording.step_title(record)
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
    marked = [(f"step {n}", s) for n, s in sources.items()]
    marked += [(f"found at step {s.step}", s) for s in found]
    for label, source in marked:
        x = (source.tokens[0] + source.tokens[1]) / 2 / total * width
        out.append(
            f'<path d="M{x:.1f} {top - 2} l-6 -9 h12 z" fill="{SOURCE}">'
            f"<title>{escape(wording.source_place(source))}</title></path>"
        )
        out.append(
            f'<text x="{min(max(x, 60), width - 60):.1f}" y="{top - 14}" text-anchor="middle">'
            f"{escape(label)}</text>"
        )
    out.extend(_boundaries(loaded.steps, total, width, top + height))
    out.append(
        f'<text class="dim" x="{width / 2:.0f}" y="{top + height + 46}" text-anchor="middle">'
        f"{total:,} tokens, {loaded.total_steps} steps</text>"
    )
    out.append("</svg>")
    legend = (
        '<div class="legend"><span><i style="background: var(--step)"></i>a step\'s chunk'
        '</span><span><i style="background: var(--source)"></i>a step the answer came from'
        '</span><span><i style="background: #eef1f5; border: 1px solid #d1d9e0"></i>not read'
        "</span><span>| where a step starts</span></div>"
    )
    return "".join(out) + legend


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
    end_left = width - len(end) * LABEL_WIDTH
    free, shown = 0.0, None
    for token, place, tip in ticks:
        x = token / total * width
        out.append(
            f'<line x1="{x:.2f}" x2="{x:.2f}" y1="{y}" y2="{y + 7}" stroke="#59636e">'
            f"<title>{escape(tip)}</title></line>"
        )
        label_end = x + len(place) * LABEL_WIDTH + 8
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


def _chart(loaded: Trace, sources: dict[int, Source]) -> str:
    """Two panels over the steps: memory tokens (bars, against the budget), then seconds."""
    steps = loaded.steps
    budget = loaded.header.settings.get("memory_tokens")
    budget = budget if json_count(budget) else None
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
    sources: dict[int, Source],
    held: set[str],
    found: dict[int, list[Source]] | None = None,
) -> str:
    number = record.index + 1
    source = sources.get(number)
    badge = ""
    if source is not None:
        brought = escape(": " + " ".join(source.words)) if source.words else ""
        badge = f'<span class="badge">the answer came from here{brought}</span>'
    if units := (found or {}).get(number):
        brought = escape(": " + " ".join(w for unit in units for w in unit.words))
        badge += f'<span class="badge">the answer came from a unit this step found{brought}</span>'
        source = source or units[0]
    span = f"<span>{escape(record.span)}</span>" if record.span else ""
    head = (
        f'<header><h4>Step {number} <span class="sub">of {loaded.total_steps}</span>'
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
        _piece(kind, text, held) for kind, text in diffs.word_diff(previous, record.memory)
    )
    actions = "".join(
        f"<li>{escape(label.capitalize())}: {escape(text)}</li>"
        for label, text in wording.reader_actions(loaded, record)
    )
    if actions:  # what a reader after MemAgent did besides its update (readers/)
        actions = f'<ul class="actions">{actions}</ul>'
    cls = "step source" if source is not None else "step"
    return (
        f'<article class="{cls}" id="{ident}-step-{number}">{head}{metrics}{actions}'
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


def _number(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _rate(tokens: int, seconds: float) -> str:
    return f"{_number(tokens / seconds)} tok/s" if seconds > 0 else "–"
