"""Inspecting a document: what it is and what reading it will take, before asking."""

from __future__ import annotations

from typing import Any

from memagent_cli import cpus, protocol
from memagent_cli.backend import Sampling
from memagent_cli.backends.llama_cpp import LlamaCppBackend
from memagent_cli.backends.tokenizers import DEFAULT_ENCODING, TiktokenTokenizer
from memagent_cli.chunking import Chunk
from memagent_cli.documents import ocr
from memagent_cli.documents.document import Document
from memagent_cli.errors import BudgetError
from memagent_cli.progress import SILENT, Reporter
from memagent_cli.reader import Settings, context_needed
from memagent_cli.run.engine import BackendOptions, open_backend
from memagent_cli.run.session import cut, describe_document

_WARMUP_QUESTION = "What is this document about?"
_WARMUP_PROMPT_TOKENS = 256
_WARMUP_REPLY_TOKENS = 32


def inspect_document(
    document: Document,
    *,
    model: BackendOptions | None,
    encoding: str | None,
    chunk_tokens: int,
    memory_tokens: int,
    estimate: bool,
    report: Reporter = SILENT,
) -> dict[str, Any]:
    """Everything `inspect` reports on a document read by documents.inputs.read_document, as
    plain data (the JSON output). Tokens are counted with the `model`'s tokenizer, or with
    tiktoken's `encoding` when no model is given."""
    backend = None
    if model is None:
        tokenizer = TiktokenTokenizer(encoding or DEFAULT_ENCODING)
        about = {"kind": "tiktoken", "encoding": tokenizer.name, "exact": False}
    else:
        tokenizer = backend = open_backend(model, report.note)
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
        found["estimate"] = estimate_seconds(backend, chunks, chunk_tokens, memory_tokens, report)
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


def estimate_seconds(
    backend: LlamaCppBackend,
    chunks: list[Chunk],
    chunk_tokens: int,
    memory_tokens: int,
    report: Reporter = SILENT,
) -> dict[str, Any]:
    """Seconds one question will take, from a short measured warm-up of the model."""
    settings = Settings(chunk_tokens, memory_tokens, Sampling(temperature=0.0))
    try:
        context = context_needed(backend, [_WARMUP_QUESTION], settings)
    except BudgetError as exc:
        return {"error": exc.message}
    report.note("measuring the model's speed with a short warm-up...")
    with report.progress("bytes") as progress:
        backend.prepare(context, progress=progress)
    sample = backend.detokenize(backend.tokenize(chunks[0].text)[:_WARMUP_PROMPT_TOKENS])
    message = protocol.render_update(
        _WARMUP_QUESTION, protocol.INITIAL_MEMORY, sample.decode("utf-8", errors="replace")
    )
    warm = backend.generate(message, max_tokens=_WARMUP_REPLY_TOKENS, sampling=settings.sampling)
    prompt_rate = warm.prompt_tokens / max(warm.prompt_seconds, 1e-6)
    gen_rate = max(warm.completion_tokens, 1) / max(warm.generation_seconds, 1e-6)
    fixed = warm.prompt_tokens - _WARMUP_PROMPT_TOKENS  # chat + template + question
    seconds = sum(
        (fixed + memory_tokens + c.tokens) / prompt_rate + memory_tokens / gen_rate for c in chunks
    )
    seconds += (fixed + memory_tokens) / prompt_rate + memory_tokens / gen_rate  # the answer
    return {
        "seconds_per_question": round(seconds, 1),
        "prompt_tokens_per_second": round(prompt_rate, 1),
        "generation_tokens_per_second": round(gen_rate, 1),
        "assumes": "each memory update writes --memory-tokens tokens; speeds from a "
        f"{warm.prompt_tokens}-token warm-up, so long prompts may read slower",
    }
