"""Inspecting a document: what it is and what reading it will take, before asking."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memagent_cli import cpus, protocol, readers
from memagent_cli.backend import Backend
from memagent_cli.backends import speed as speeds
from memagent_cli.backends import speeds_store
from memagent_cli.backends.llama_cpp import LlamaCppBackend, can_offload
from memagent_cli.backends.speed import Speed
from memagent_cli.backends.tokenizers import DEFAULT_ENCODING, TiktokenTokenizer
from memagent_cli.chunking import Chunk, Tokenizer
from memagent_cli.documents import ocr
from memagent_cli.documents.document import Document
from memagent_cli.errors import BudgetError
from memagent_cli.progress import SILENT, Reporter
from memagent_cli.reader import Settings
from memagent_cli.readers.spec import USUAL_QUESTION, CallSize, Replies, Templates
from memagent_cli.run import history
from memagent_cli.run.history import History
from memagent_cli.run.session import cut, describe_document

# Seconds the measurement may take before it stops short of a step's depth (speed.measure):
# on the default model it reaches the depth well before, on a 7B it does not.
MEASURE_BUDGET = 60.0


@dataclass(frozen=True)
class Guess:
    """How long a reading's replies run, each a fraction of what the protocol allows (a
    memory update's, the answer's), and what decoding them costs against one token per
    decode where drafts are taken: what an estimate assumes before the model has read here."""

    written: float
    answered: float
    factor: float


# Before this model has read on this machine. The default model's readings of stories here
# (bench/results/2026-11-27-xeon-amx/estimate-smollm2*-summary.txt, and two more on
# 2026-11-29) ran their memories to 15-100% of the budget, most in full, their answers to
# 1-100%, and decoded with drafts at 0.4-0.8 the price of single decodes: the likely figure
# takes the middle of those, the range runs from their low end to the bound. Measured
# side by side on a data folder with no past reading: 159 s likely (99-237 s) for a reading
# of 161 s (bench/results/2026-11-29-xeon-amx/estimate-first-guess-summary.txt).
FIRST_GUESS = Guess(written=0.75, answered=0.25, factor=0.7)
LEAST_GUESS = Guess(written=0.25, answered=0.02, factor=0.4)
# A reading longer than this says so, with the faster routes (faster_routes).
HOUR = 3600.0


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
    if estimate and chunks and backend is not None and backend.local:  # none: a scan unread
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


def reading_calls(
    reader: str,
    chunks: Sequence[int],
    templates: Templates,
    memory_tokens: int,
    first_memory: int,
    written: float = 1.0,
    answered: float = 1.0,
) -> list[CallSize]:
    """Every call of a reading of chunks of `chunks` tokens by `reader` (Spec.calls), each
    memory update's reply `written` and the answer's `answered` of what the reader allows
    (Spec.replies), every memory after the first (`first_memory` tokens) as long as an
    update's reply. At 1 and 1, the default: what reading everything costs at most."""
    spec = readers.get(reader)
    limits = spec.replies(memory_tokens)
    replies = Replies(_part(limits.update, written), _part(limits.answer, answered))
    full = _part(memory_tokens, written)  # what the next prompt shows of a memory
    return spec.calls(chunks, templates, replies, full, first_memory)


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


@dataclass(frozen=True)
class Priced:
    """A reading's seconds: likely (learned, else FIRST_GUESS), its range's low end (before
    any reading; else None) and at most (every reply in full), its answer call's likely
    seconds, the likely calls, and what they assumed of replies and decoding."""

    seconds: float
    least: float | None
    most: float
    answer: float
    likely: list[CallSize]
    written: float
    answered: float
    factor: float


@dataclass(frozen=True)
class Reading:
    """The calls of a reading to price: `reader`'s over chunks of `sizes` tokens, with
    `templates`, a memory of at most `memory_tokens`, the first of `first_memory`."""

    reader: str
    sizes: Sequence[int]
    templates: Templates
    memory_tokens: int
    first_memory: int

    def calls(self, written: float = 1.0, answered: float = 1.0) -> list[CallSize]:
        return reading_calls(
            self.reader,
            self.sizes,
            self.templates,
            self.memory_tokens,
            self.first_memory,
            written,
            answered,
        )

    def priced(self, speed: Speed, past: History, speculating: bool) -> Priced:
        """Its seconds at `speed`, replies as long and decoding as cheap as `past` readings
        of the model here show; before any, as FIRST_GUESS says (drafts saving only where
        they are taken: `speculating`), from LEAST_GUESS to the bound."""
        factor = past.decode_factor(speed) or 1.0
        written, answered = past.written() or 1.0, past.answered() or 1.0
        # The bound keeps a learned cost of decoding above one token a decode (drafts that
        # cost more than they saved), never a saving: longer replies may copy less.
        most = sum(call_seconds(call, speed, max(factor, 1.0)) for call in self.calls())
        if past.readings:
            likely = self.calls(written, answered)
            seconds = [call_seconds(call, speed, factor) for call in likely]
            return Priced(sum(seconds), None, most, seconds[-1], likely, written, answered, factor)
        # Nothing learned yet: the bound alone overstated a first reading 1.4-1.9x.

        def guessed(guess: Guess) -> tuple[list[float], list[CallSize]]:
            calls = self.calls(guess.written, guess.answered)
            factor = guess.factor if speculating else 1.0
            return [call_seconds(call, speed, factor) for call in calls], calls

        seconds, likely = guessed(FIRST_GUESS)
        least = sum(guessed(LEAST_GUESS)[0])
        return Priced(sum(seconds), least, most, seconds[-1], likely, written, answered, factor)


def estimate_reading(
    backend: LlamaCppBackend,
    chunks: list[Chunk],
    settings: Settings,
    report: Reporter = SILENT,
    measure: Callable[[LlamaCppBackend, list[int], int], Speed] | None = None,
    past: History | None = None,
    kept_as: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Seconds one question takes when `settings.reader` reads every chunk: each call priced
    at the prefill and decode rates of the depths it reaches on this machine, as kept for
    this model and engine (backends/speeds_store.py; `kept_as` another key), else measured
    now and kept (`measure`: speed.measure within MEASURE_BUDGET seconds). Its replies run
    as long, and decode at the cost, that this model's past readings here show (`past`; by
    default the data folder's traces, history.past_readings); without any, as FIRST_GUESS
    says, within a range from LEAST_GUESS to the bound: every reply as long as allowed."""
    spec = readers.get(settings.reader)
    try:
        context = spec.context_needed(backend, [USUAL_QUESTION], settings)
    except BudgetError as exc:
        return {"error": exc.message}
    if past is None:
        described = backend.describe()
        past = history.past_readings(described.model, described.engine, settings.reader)
    templates = spec.call_templates(backend, len(chunks))
    first = len(backend.tokenize(protocol.INITIAL_MEMORY))
    sizes = [c.tokens for c in chunks]
    memory = settings.memory_tokens
    calls = reading_calls(settings.reader, sizes, templates, memory, first)
    deepest = max(calls, key=lambda call: call.prompt)
    speed, kept = _speed(backend, chunks, context, deepest.prompt, report, measure, kept_as)
    speculating = bool(backend.describe().engine.get("speculate", False))
    reading = Reading(settings.reader, sizes, templates, memory, first)
    priced = reading.priced(speed, past, speculating)
    most, least, seconds, likely = priced.most, priced.least, priced.seconds, priced.likely
    written, answered, factor = priced.written, priced.answered, priced.factor
    stops = spec.stops_early
    return {
        # The estimate: what past readings of this model here say, else FIRST_GUESS.
        "seconds_per_question": round(seconds, 1),
        # Before any reading: the low end of the range (LEAST_GUESS); else None.
        "seconds_at_least": None if least is None else round(least, 1),
        "seconds_at_most": round(most, 1),  # every memory written in full
        # Each call's prompt and longest reply in tokens, and the lines the rates lie on.
        "calls": [[call.prompt, call.reply] for call in calls],
        "likely_calls": [[call.prompt, call.reply] for call in likely],
        "learned": _learned(past, written, answered, factor, past.ignored(speed)),
        "speed": dataclasses.asdict(speed),
        # When the speed was measured: "now", or the time it was measured and kept.
        "speed_measured": kept or "now",
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
        # Over an hour: what reads faster, in a sentence; else None.
        "faster": faster_routes(settings.reader, _on_gpu(backend)) if seconds > HOUR else None,
        "assumes": _assumes(past, settings, written, answered, factor, speculating)
        + f"; rates measured to depth {speed.measured_to:,}"
        + _beyond(speed, deepest.prompt),
    }


def _on_gpu(backend: Backend) -> bool:
    """Whether llama.cpp runs `backend`'s layers on a GPU."""
    if not backend.local or backend.describe().engine.get("gpu_layers", 0) == 0:
        return False
    return can_offload()


def _speed(
    backend: LlamaCppBackend,
    chunks: list[Chunk],
    context: int,
    depth: int,
    report: Reporter,
    measure: Callable[[LlamaCppBackend, list[int], int], Speed] | None,
    kept_as: Mapping[str, Any] | None,
) -> tuple[Speed, str]:
    """The prefill and decode rates to `depth`: kept for this model and engine here (with
    when they were measured), else measured now (and kept, for the backend's own key or
    `kept_as`; with `measure` only for `kept_as`). `measure`, where given, loads what it
    times itself."""
    keeps = measure is None or kept_as is not None
    if keeps and backend.local:
        found = speeds_store.kept_for(backend, depth, kept_as, note=report.note)
        if found is not None:
            return found.speed, found.measured or "kept"
    sample = backend.tokenize(chunks[0].text) or backend.tokenize(USUAL_QUESTION)
    if measure is None:
        with report.progress("bytes") as progress:
            backend.prepare(context, progress=progress)
        report.note("measuring the model's speed at the depth of a step...")
        speed = speeds.measure(backend, sample, depth, budget=MEASURE_BUDGET)
    else:
        speed = measure(backend, sample, depth)
    if keeps and backend.local:
        key = kept_as if kept_as is not None else speeds_store.backend_key(backend)
        speeds_store.store(key, speed, depth)
    return speed, ""


def faster_routes(reader: str, on_gpu: bool) -> str:
    """What reads faster than `reader` with this model here, in a sentence: a reading of more
    than an hour says it (`on_gpu`: llama.cpp runs it on a GPU already)."""
    routes = ["a smaller model (-m qwen2.5-coder-1.5b)"]
    if readers.get(reader).stops_early is None:
        routes.append("a reader that stops once it has the answer (-m infmem-4b)")
    routes.append("a server on a GPU (--backend openai --base-url URL, docs/servers.md)")
    if not on_gpu:
        routes.append("llama.cpp built for a GPU (docs/install.md)")
    return "more than an hour; faster: " + ", ".join(routes[:-1]) + " or " + routes[-1]


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
    past: History,
    settings: Settings,
    written: float,
    answered: float,
    factor: float,
    speculating: bool = False,
) -> str:
    """What the estimate assumes, in words."""
    limits = readers.get(settings.reader).replies(settings.memory_tokens)
    update, final = limits.update, limits.answer
    if not past.readings:
        likely, low = FIRST_GUESS, LEAST_GUESS
        drafts = (
            f", decoded at {likely.factor:.2f}x the price of one token per decode (drafts "
            f"that copy; {low.factor:.2f}x at the low end)"
            if speculating
            else ", one token per decode"
        )
        return (
            f"every chunk is read; before this model has read here, memories "
            f"{likely.written:.0%} of the {update:,} tokens allowed and answers "
            f"{likely.answered:.0%} of {final:,}{drafts}; at the low end memories "
            f"{low.written:.0%} and answers {low.answered:.0%}; at most every reply as long "
            "as allowed, one token per decode. The estimate learns how long this model's "
            "replies run, and what drafts save, from its readings on this machine"
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
