"""`memagent inspect`'s report as a person reads it: tables on stdout."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from memagent_cli.run.time_left import duration
from memagent_cli.views import console as display


def print_report(report: dict[str, Any]) -> None:
    """The report as tables on stdout. Every cell is plain text, never Rich markup: paths,
    titles and chapter names come from the user's files and may contain "[/bold]"."""
    from rich.table import Table

    def row(table: Table, *cells: str) -> None:
        table.add_row(*(Text(cell) for cell in cells))

    out = display.results_console()
    doc = report["document"]
    summary = Table.grid(padding=(0, 2))
    row(summary, "document", doc["path"])
    row(summary, "format", doc["format"] + (f" ({doc['title']})" if doc["title"] else ""))
    if doc["unit"] == "page":
        without, ocr = doc["pages_without_text"], doc["ocr"]
        parts = [f"{len(ocr['pages'])} read by OCR"] if ocr else []
        parts += [f"{without} without text"] if without else []
        row(summary, "pages", f"{doc['pages']:,}" + (f" ({', '.join(parts)})" if parts else ""))
        if ocr:
            low = ocr["low_confidence"]
            unsure = f"; low confidence on p. {', '.join(low)}" if low else ""
            row(summary, "OCR", f"{ocr['engine']}{unsure}")
        estimate = report.get("ocr_estimate")
        if estimate:
            row(
                summary,
                "OCR time",
                f"{estimate['pages']:,} pages without a text layer: about "
                f"{duration(estimate['seconds'])} of OCR on {estimate['cores']} cores (an "
                f"estimate: {estimate['seconds_per_page_per_core']:g} s per page per core, "
                f"{estimate['assumes']})",
            )
    elif doc["unit"] == "chapter":
        row(summary, "chapters", f"{doc['sections']:,}")
    row(summary, "characters", f"{doc['characters']:,}")
    tok = report["tokenizer"]
    how = (
        f"{tok['model']} tokenizer"
        if tok["kind"] == "model"
        else (
            f"tiktoken {tok['encoding']}, approximate for "
            + (f"{tok['stands_for']}'s tokenizer" if tok.get("stands_for") else "the model")
        )
    )
    row(summary, "tokens", f"{report['tokens']:,} ({how})")
    row(summary, "chunks", f"{len(report['chunks']):,} of {report['chunk_tokens']:,} tokens")
    pull = report.get("pull")
    if pull:
        row(summary, "pull", _pull(tok.get("stands_for", "the model"), pull))
    est = report["estimate"]
    if est and "error" in est:
        row(summary, "estimate", est["error"])
    elif est:
        sooner = f"; {est['may_stop_sooner']}" if est.get("may_stop_sooner") else ""
        sooner += f"; {est['faster']}" if est.get("faster") else ""
        row(
            summary,
            "estimate",
            f"{_how_long(est)}, reading every chunk{sooner}{_learned(est)} (an estimate: "
            f"{len(est['calls']):,} calls; at a step's "
            f"depth of {est['depth']:,} tokens the prompt reads at "
            f"{est['prompt_tokens_per_second']:,.0f} tok/s and the reply decodes at "
            f"{est['generation_tokens_per_second']:,.1f} tok/s, {_measured(est)}; assumes "
            f"{est['assumes']})",
        )
    out.print(summary)
    table = Table("chunk", "tokens", "characters", "span", box=None, pad_edge=False)
    for c in report["chunks"]:
        row(
            table,
            str(c["chunk"]),
            f"{c['tokens'][0]:,}–{c['tokens'][1]:,}",
            f"{c['chars'][0]:,}–{c['chars'][1]:,}",
            c["span"],
        )
    out.print()
    out.print(table)


def print_pages(pages: list[dict[str, Any]]) -> None:
    """The text memagent reads, as pdftotext prints a PDF: each page ended by a form feed,
    and started here by a line with its label ("==> p. 3 (OCR) <==", as `head` names files),
    so that an extraction can be checked before a long reading. The text is printable
    (memagent_cli/text.py): the form feed is memagent's, never the document's."""
    for page in pages:
        if page["label"]:
            mark = " (OCR)" if page["ocr"] else ""
            display.result(f"==> {page['label']}{mark} <==")
        display.result(page["text"], end="\n\f")


def _how_long(estimate: dict[str, Any]) -> str:
    """ "about X ... (at most Y ...)" where past readings taught the estimate; before any,
    "about X ... (L to Y ...)"."""
    most = duration(estimate.get("seconds_at_most", estimate["seconds_per_question"]))
    about = duration(estimate["seconds_per_question"])
    if not estimate.get("learned"):
        least = estimate.get("seconds_at_least")
        if least is None:  # a report from before the range
            return f"at most {most} per question on this machine"
        return (
            f"about {about} per question on this machine ({duration(least)} to {most}, "
            "by how long the model's replies run: its first reading here tells)"
        )
    return (
        f"about {about} per question on this machine "
        f"(at most {most} if every memory is written in full)"
    )


def _pull(name: str, pull: dict[str, Any]) -> str:
    """What getting a model not pulled yet takes: its download, and its conversion."""
    from rich.filesize import decimal

    then = (
        f"; then about {duration(pull['conversion_seconds'])} to convert and quantize to "
        f"{pull['quant']} on {pull['cores']} cores"
        if pull["converted"]
        else ""
    )
    return (
        f"{name} is not pulled yet (memagent models pull {name}): "
        f"{decimal(pull['download_bytes'])} to download, about "
        f"{duration(pull['download_seconds'])} at {pull['download_rate'] / 1e6:.0f} MB/s"
        f"{then} (an estimate: {pull['assumes']})"
    )


def _measured(estimate: dict[str, Any]) -> str:
    """When the rates were measured: now (in how long), or kept from an earlier look."""
    when = estimate.get("speed_measured", "now")
    if when == "now":
        return f"measured in {duration(estimate['measure_seconds'])}"
    return f"measured on this machine {when} and kept (--recalibrate measures again)"


def _learned(estimate: dict[str, Any]) -> str:
    """Where the estimate learned how long replies run, if it did."""
    learned = estimate.get("learned")
    if not learned:
        return ""
    readings = learned["readings"]
    return f"; learned from {readings} reading{'s' if readings != 1 else ''} with this model"
