"""Inspecting a document: what it is and what reading it will take, before asking."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from memagent_cli import cpus, protocol
from memagent_cli.backend import Backend
from memagent_cli.backends import speed as speeds
from memagent_cli.backends.llama_cpp import LlamaCppBackend
from memagent_cli.backends.speed import Speed
from memagent_cli.backends.tokenizers import DEFAULT_ENCODING, TiktokenTokenizer
from memagent_cli.chunking import Chunk, Tokenizer
from memagent_cli.documents import ocr
from memagent_cli.documents.document import Document
from memagent_cli.errors import BudgetError
from memagent_cli.progress import SILENT, Reporter
from memagent_cli.reader import Settings
from memagent_cli.readers import context_needed, infmem, rememr1
from memagent_cli.run.session import cut, describe_document

# A question of a usual length, for the prompts priced before any question is asked.
_QUESTION = "What is this document about?"
# Seconds the measurement may take before it stops short of a step's depth (speed.measure):
# on the default model it reaches the depth well before, on a 7B it does not.
MEASURE_BUDGET = 60.0
# Readers that may answer before the last chunk, and why (readers/infmem.py's EARLY_STOP).
_STOPS_EARLY = {"infmem": f"its planner may say STOP {infmem.EARLY_STOP} times in a row"}


def inspect_document(
    document: Document,
    *,
    backend: Backend | None,
    encoding: str | None,
    chunk_tokens: int,
    memory_tokens: int,
    estimate: bool,
    reader: str = "memagent",
    report: Reporter = SILENT,
) -> dict[str, Any]:
    """Everything `inspect` reports on a document read by documents.inputs.read_document, as
    plain data (the JSON output). Tokens are counted with `backend`'s tokenizer, or with
    tiktoken's `encoding` when no backend is given; a model in this process (llama.cpp)
    estimates a question's time for `reader` (estimate_reading)."""
    tokenizer: Tokenizer
    if backend is None:
        tokenizer = TiktokenTokenizer(encoding or DEFAULT_ENCODING)
        about = {"kind": "tiktoken", "encoding": tokenizer.name, "exact": False}
    else:
        tokenizer = backend
        described = backend.describe().model
        about = {"kind": "model", "model": described["name"], "path": described["path"]}
        about["exact"] = True
    tokens, chunks = cut(document, tokenizer, chunk_tokens, report)
    found: dict[str, Any] = {
        "document": describe_document(document),
        "tokenizer": about,
        "tokens": len(tokens),
        "chunk_tokens": chunk_tokens,
        "chunks": [c.where(document.span(c.char_start, c.char_end)) for c in chunks],
        "ocr_estimate": ocr_estimate(document.ocr.needed),
        "estimate": None,
    }
    if estimate and chunks and isinstance(backend, LlamaCppBackend):  # none: a scan unread
        settings = Settings(chunk_tokens, memory_tokens, reader=reader)
        found["estimate"] = estimate_reading(backend, chunks, settings, report)
    return found


def ocr_estimate(pages: int) -> dict[str, Any] | None:
    """Seconds OCR takes for `pages` pages on this machine's cores, from the rate measured by
    bench/ocr.py (documents/ocr.py's SECONDS_PER_PAGE); None for no pages."""
    if not pages:
        return None
    cores = cpus.usable()
    return {
        "pages": pages,
        "seconds": round(pages * ocr.SECONDS_PER_PAGE / cores, 1),
        "cores": cores,
        "seconds_per_page_per_core": ocr.SECONDS_PER_PAGE,
        "assumes": "pages of body text at the rate bench/ocr.py measured on a 2-core Xeon",
    }


def document_pages(document: Document) -> list[dict[str, Any]]:
    """The text memagent reads from `document`, page by page (chapter by chapter): each with
    its label ("p. 3", a chapter's title) and whether OCR read it. A document without pages
    or chapters is one part with no label."""
    if not document.sections:
        return [{"label": "", "ocr": False, "text": document.text}]
    recognized = set(document.ocr.pages)
    starts = [s.start for s in document.sections] + [len(document.text) + 2]
    return [
        {
            "label": f"p. {section.label}" if document.unit == "page" else section.label,
            "ocr": section.label in recognized,
            "text": document.text[section.start : starts[index + 1] - 2],
        }
        for index, section in enumerate(document.sections)
    ]


@dataclass(frozen=True)
class CallSize:
    """One call of a reading as the estimate prices it: its prompt and reply in tokens."""

    prompt: int
    reply: int


@dataclass(frozen=True)
class Templates:
    """Prompt tokens of a reader's calls before any memory, chunk or units are put in: chat
    markup, template and question. `planner`: InfMem's planner call (0 for other readers)."""

    update: int
    final: int
    planner: int = 0


def reading_calls(
    reader: str,
    chunks: Sequence[int],
    templates: Templates,
    memory_tokens: int,
    first_memory: int,
) -> list[CallSize]:
    """Every call of a reading of chunks of `chunks` tokens by `reader`, each reply as long as
    the protocol allows (the memory's budget, the final answer's) and every memory after
    the first (`first_memory` tokens) full: what reading everything costs at most."""
    calls, memory = [], first_memory
    if reader == "infmem":
        # Each call thinks first (at most THINKING_TOKENS), then replies; the second stage
        # continues the first's prompt, which stays in the cache.
        reply = infmem.THINKING_TOKENS + memory_tokens
        for tokens in chunks:
            units = infmem.RESULTS * min(infmem.UNIT_TOKENS, tokens)  # a search every step
            calls.append(CallSize(templates.planner + memory, reply))
            calls.append(CallSize(templates.update + memory + units + tokens, reply))
            memory = memory_tokens
        return [*calls, CallSize(templates.final + memory, reply)]
    recalled = 0  # ReMemR1 shows an earlier memory beside the last once one exists
    for tokens in chunks:
        calls.append(CallSize(templates.update + memory + recalled + tokens, memory_tokens))
        memory = memory_tokens
        recalled = memory_tokens if reader == "rememr1" else 0
    return [*calls, CallSize(templates.final + memory + recalled, protocol.FINAL_MAX_TOKENS)]


def call_seconds(call: CallSize, speed: Speed) -> float:
    """Seconds of one call: its prompt read from an empty context, then its reply decoded
    one token at a time (the first comes with the prompt)."""
    return speed.prefill_seconds(call.prompt) + speed.decode_seconds(
        max(call.reply - 1, 0), call.prompt + 1
    )


def reader_templates(backend: Backend, reader: str, steps: int) -> Templates:
    """The tokens of `reader`'s calls with nothing filled in, with a usual question."""
    question = len(backend.tokenize(_QUESTION))
    if reader == "infmem":

        def sized(text: str) -> int:
            return len(backend.tokenize(text)) + question

        return Templates(
            update=sized(infmem.chat(infmem.render_update("", "", [], ""))),
            final=sized(infmem.chat(infmem.render_final("", ""))),
            planner=sized(infmem.chat(infmem.render_planner("", "", 0, steps, ()))),
        )
    update, final = rememr1.TEMPLATES if reader == "rememr1" else _MEMAGENT_TEMPLATES
    overhead = backend.chat_overhead() + question
    return Templates(
        update=overhead + len(backend.tokenize(update)),
        final=overhead + len(backend.tokenize(final)),
    )


_MEMAGENT_TEMPLATES = (protocol.render_update("", "", ""), protocol.render_final("", ""))


def estimate_reading(
    backend: LlamaCppBackend,
    chunks: list[Chunk],
    settings: Settings,
    report: Reporter = SILENT,
    measure: Callable[[LlamaCppBackend, list[int], int], Speed] | None = None,
) -> dict[str, Any]:
    """Seconds one question takes when `settings.reader` reads every chunk: each call priced
    at the prefill and decode rates of the depths it reaches, measured on this machine
    (`measure`: speed.measure within MEASURE_BUDGET seconds), its reply as long as allowed."""
    try:
        context = context_needed(backend, [_QUESTION], settings)
    except BudgetError as exc:
        return {"error": exc.message}
    templates = reader_templates(backend, settings.reader, len(chunks))
    first = len(backend.tokenize(protocol.INITIAL_MEMORY))
    calls = reading_calls(
        settings.reader, [c.tokens for c in chunks], templates, settings.memory_tokens, first
    )
    deepest = max(calls, key=lambda call: call.prompt)
    with report.progress("bytes") as progress:
        backend.prepare(context, progress=progress)
    report.note("measuring the model's speed at the depth of a step...")
    sample = backend.tokenize(chunks[0].text) or backend.tokenize(_QUESTION)
    if measure is None:
        speed = speeds.measure(backend, sample, deepest.prompt, budget=MEASURE_BUDGET)
    else:
        speed = measure(backend, sample, deepest.prompt)
    seconds = sum(call_seconds(call, speed) for call in calls)
    stops = _STOPS_EARLY.get(settings.reader)
    return {
        "seconds_per_question": round(seconds, 1),
        # Each call's prompt and longest reply in tokens, and the lines the rates lie on.
        "calls": [[call.prompt, call.reply] for call in calls],
        "speed": dataclasses.asdict(speed),
        "prompt_tokens": sum(call.prompt for call in calls),
        "reply_tokens": sum(call.reply for call in calls),
        "depth": deepest.prompt,
        "prompt_tokens_per_second": round(speed.prefill_rate(deepest.prompt // 2), 1),
        "generation_tokens_per_second": round(speed.decode_rate(deepest.prompt), 1),
        "measured_depth": speed.measured_to,
        "measure_seconds": round(speed.seconds, 1),
        "reader": settings.reader,
        "reads_everything": True,
        "may_stop_sooner": f"the {settings.reader} reader may stop sooner: {stops}"
        if stops
        else None,
        "assumes": "every chunk is read and every reply is as long as allowed "
        f"({settings.memory_tokens} tokens a memory, {protocol.FINAL_MAX_TOKENS} the answer); "
        "one token per decode (drafts that copy the document make replies faster); rates "
        f"measured to depth {speed.measured_to:,}" + _beyond(speed, deepest.prompt),
    }


def _beyond(speed: Speed, depth: int) -> str:
    """What the estimate assumes past the depth measured."""
    if speed.measured_to >= depth:
        return ""
    if speed.prefill_slope or speed.decode_slope:
        return f" of {depth:,}, the rates' fall with depth carried on beyond"
    return (
        f" of {depth:,} within {MEASURE_BUDGET:.0f} s, and taken as the same deeper (attention "
        "costs more with depth: deeper calls may be slower)"
    )
