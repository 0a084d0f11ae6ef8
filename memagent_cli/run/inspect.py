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
from memagent_cli.run import history
from memagent_cli.run.history import History
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
    written: float = 1.0,
    answered: float = 1.0,
) -> list[CallSize]:
    """Every call of a reading of chunks of `chunks` tokens by `reader`, each memory
    update's reply `written` and the answer's `answered` of what the protocol allows (the
    memory's budget, the final answer's; history.reply_limits), every memory after the first
    (`first_memory` tokens) as long as an update's reply. At 1 and 1, the default: what
    reading everything costs at most."""
    update, final = history.reply_limits(reader, memory_tokens)
    reply, answer = _part(update, written), _part(final, answered)
    full = _part(memory_tokens, written)  # what the next prompt shows of a memory
    calls, memory = [], first_memory
    if reader == "infmem":
        # Each call thinks first (at most THINKING_TOKENS), then replies; the second stage
        # continues the first's prompt, which stays in the cache.
        for tokens in chunks:
            units = infmem.RESULTS * min(infmem.UNIT_TOKENS, tokens)  # a search every step
            calls.append(CallSize(templates.planner + memory, reply))
            calls.append(CallSize(templates.update + memory + units + tokens, reply))
            memory = full
        return [*calls, CallSize(templates.final + memory, answer)]
    recalled = 0  # ReMemR1 shows an earlier memory beside the last once one exists
    for tokens in chunks:
        calls.append(CallSize(templates.update + memory + recalled + tokens, reply))
        memory = full
        recalled = full if reader == "rememr1" else 0
    return [*calls, CallSize(templates.final + memory + recalled, answer)]


def _part(tokens: int, fraction: float) -> int:
    """`fraction` of `tokens`, a token at least."""
    return max(round(tokens * fraction), 1)


def call_seconds(call: CallSize, speed: Speed, decoding: float = 1.0) -> float:
    """Seconds of one call: its prompt read from an empty context, then its reply decoded
    one token at a time (the first comes with the prompt), that price times `decoding`
    (History.decode_factor: what drafts saved)."""
    return speed.prefill_seconds(call.prompt) + decoding * speed.decode_seconds(
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
    past: History | None = None,
) -> dict[str, Any]:
    """Seconds one question takes when `settings.reader` reads every chunk: each call priced
    at the prefill and decode rates of the depths it reaches, measured on this machine
    (`measure`: speed.measure within MEASURE_BUDGET seconds). Its replies run as long, and
    decode at the cost, that this model's past readings here show (`past`; by default the
    data folder's traces, history.past_readings); at most, and without any, every reply
    is as long as allowed."""
    try:
        context = context_needed(backend, [_QUESTION], settings)
    except BudgetError as exc:
        return {"error": exc.message}
    if past is None:
        described = backend.describe()
        past = history.past_readings(described.model, described.engine, settings.reader)
    templates = reader_templates(backend, settings.reader, len(chunks))
    first = len(backend.tokenize(protocol.INITIAL_MEMORY))
    sizes = [c.tokens for c in chunks]
    memory = settings.memory_tokens
    calls = reading_calls(settings.reader, sizes, templates, memory, first)
    deepest = max(calls, key=lambda call: call.prompt)
    with report.progress("bytes") as progress:
        backend.prepare(context, progress=progress)
    report.note("measuring the model's speed at the depth of a step...")
    sample = backend.tokenize(chunks[0].text) or backend.tokenize(_QUESTION)
    if measure is None:
        speed = speeds.measure(backend, sample, deepest.prompt, budget=MEASURE_BUDGET)
    else:
        speed = measure(backend, sample, deepest.prompt)
    factor = past.decode_factor(speed) or 1.0
    written, answered = past.written() or 1.0, past.answered() or 1.0
    # The bound keeps a learned cost of decoding above one token a decode (drafts that cost
    # more than they saved), never a saving: longer replies may copy less.
    most = sum(call_seconds(call, speed, max(factor, 1.0)) for call in calls)
    likely = calls
    if past.readings:
        likely = reading_calls(settings.reader, sizes, templates, memory, first, written, answered)
    seconds = sum(call_seconds(call, speed, factor) for call in likely) if past.readings else most
    stops = _STOPS_EARLY.get(settings.reader)
    return {
        # The estimate: what past readings of this model here say, else the bound.
        "seconds_per_question": round(seconds, 1),
        "seconds_at_most": round(most, 1),  # every memory written in full
        # Each call's prompt and longest reply in tokens, and the lines the rates lie on.
        "calls": [[call.prompt, call.reply] for call in calls],
        "likely_calls": [[call.prompt, call.reply] for call in likely],
        "learned": _learned(past, written, answered, factor, past.ignored(speed)),
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
        "assumes": _assumes(past, settings, written, answered, factor)
        + f"; rates measured to depth {speed.measured_to:,}"
        + _beyond(speed, deepest.prompt),
    }


def _learned(
    past: History, written: float, answered: float, factor: float, ignored: int = 0
) -> dict | None:
    """What the estimate took from past readings (`--json`): from how many traces, and how
    many of their calls it left out (values no machine gives); None where there were none."""
    if not past.readings:
        return None
    return {
        "readings": past.readings,
        "calls": len(past.calls),
        "ignored_calls": ignored,
        "memory_fraction": round(written, 3),
        "answer_fraction": round(answered, 3),
        "decode_factor": round(factor, 3),
    }


def _assumes(
    past: History, settings: Settings, written: float, answered: float, factor: float
) -> str:
    """What the estimate assumes, in words."""
    update, final = history.reply_limits(settings.reader, settings.memory_tokens)
    if not past.readings:
        return (
            "every chunk is read and every reply is as long as allowed "
            f"({settings.memory_tokens} tokens a memory, {final} the answer), one token per "
            "decode (drafts that copy the document make replies faster): an upper bound. The "
            "estimate learns how long this model's replies run, and what drafts save, from "
            "its readings on this machine"
        )
    readings = f"{past.readings} reading{'s' if past.readings != 1 else ''}"
    return (
        f"every chunk is read; replies as long as in {readings} with this model on this "
        f"machine (memories {written:.0%} of the {update:,} tokens allowed, answers "
        f"{answered:.0%} of {final:,}), each decoded at {factor:.2f}x the price of one "
        "token per decode; at most, every reply as long as allowed"
    )


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
