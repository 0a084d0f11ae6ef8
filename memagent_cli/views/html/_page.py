"""The page every HTML report is: its head, the Content-Security-Policy, the shared CSS and
colours, escaping, and writing the file. Private to views/html/: the reports are traces.py
and evaluation.py."""

from __future__ import annotations

import html
import os
from pathlib import Path

from memagent_cli import __version__
from memagent_cli.errors import UserError
from memagent_cli.files import cannot_write, open_private
from memagent_cli.text import printable


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
.step .actions { margin: 4px 0 0; padding: 0 12px 0 32px; font-size: 0.9em;
  overflow-wrap: anywhere; }
.answer-box .stopped { margin-top: 4px; }
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

LABEL_WIDTH = 6.6  # an SVG unit per 12px character, the strip being about 1,000 px wide


def page(title: str, body: str, extra_css: str = "") -> str:
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
    existed = os.path.exists(path)  # False, not PermissionError, in a folder it cannot enter
    try:
        with open_private(path, "a"):
            pass
    except OSError as exc:
        raise UserError(f"Cannot write the report {path}: {cannot_write(path, exc)}.") from None
    if not existed:
        path.unlink()
