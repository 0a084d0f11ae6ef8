"""`memagent inspect`: what a document is and what reading it will take, before asking."""

from __future__ import annotations

from typing import Any

from memagent_cli import display, protocol
from memagent_cli.backends import Sampling
from memagent_cli.backends.factory import BackendOptions, open_backend
from memagent_cli.backends.llama_cpp import LlamaCppBackend
from memagent_cli.chunking import Chunk, chunk_text
from memagent_cli.errors import BudgetError
from memagent_cli.inputs import read_document
from memagent_cli.reader import Settings, context_needed
from memagent_cli.session import describe_document
from memagent_cli.tokenizers import TiktokenTokenizer

_WARMUP_QUESTION = "What is this document about?"
_WARMUP_PROMPT_TOKENS = 256
_WARMUP_REPLY_TOKENS = 32


def inspect_document(
    path: str,
    *,
    password: str | None,
    format: str | None = None,
    model: BackendOptions | None,
    encoding: str | None,
    chunk_tokens: int,
    memory_tokens: int,
    estimate: bool,
    quiet: bool,
) -> dict[str, Any]:
    """Everything `inspect` reports, as plain data (the JSON output). Tokens are counted with
    the `model`'s tokenizer, or with tiktoken's `encoding` when no model is given."""
    document = read_document(path, password=password, quiet=quiet, format=format)
    backend = None
    if model is None:
        tokenizer = TiktokenTokenizer(encoding or "cl100k_base")
        about = {"kind": "tiktoken", "encoding": tokenizer.name, "exact": False}
    else:
        tokenizer = backend = open_backend(model, display.note)
        described = backend.describe().model
        about = {"kind": "model", "model": described["name"], "path": described["path"]}
        about["exact"] = True
    tokens, chunks = chunk_text(document.text, tokenizer, chunk_tokens)
    report: dict[str, Any] = {
        "document": describe_document(document),
        "tokenizer": about,
        "tokens": len(tokens),
        "chunk_tokens": chunk_tokens,
        "chunks": [c.where(document.span(c.char_start, c.char_end)) for c in chunks],
        "estimate": None,
    }
    if estimate and isinstance(backend, LlamaCppBackend):
        report["estimate"] = estimate_seconds(backend, chunks, chunk_tokens, memory_tokens, quiet)
    return report


def estimate_seconds(
    backend: LlamaCppBackend,
    chunks: list[Chunk],
    chunk_tokens: int,
    memory_tokens: int,
    quiet: bool,
) -> dict[str, Any]:
    """Seconds one question will take, from a short measured warm-up of the model."""
    settings = Settings(chunk_tokens, memory_tokens, Sampling(temperature=0.0))
    try:
        context = context_needed(backend, [_WARMUP_QUESTION], settings)
    except BudgetError as exc:
        return {"error": exc.message}
    if not quiet:
        display.note("measuring the model's speed with a short warm-up...")
    backend.prepare(context)
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


def print_report(report: dict[str, Any]) -> None:
    """The report as tables on stdout. Every cell is plain text, never Rich markup: paths,
    titles and chapter names come from the user's files and may contain "[/bold]"."""
    from rich.table import Table
    from rich.text import Text

    def row(table: Table, *cells: str) -> None:
        table.add_row(*(Text(cell) for cell in cells))

    out = display.results_console()
    doc = report["document"]
    summary = Table.grid(padding=(0, 2))
    row(summary, "document", doc["path"])
    row(summary, "format", doc["format"] + (f" ({doc['title']})" if doc["title"] else ""))
    if doc["unit"] == "page":
        without = doc["pages_without_text"]
        pages = f"{doc['pages']:,}" + (f" ({without} without text)" if without else "")
        row(summary, "pages", pages)
    elif doc["unit"] == "chapter":
        row(summary, "chapters", f"{doc['sections']:,}")
    row(summary, "characters", f"{doc['characters']:,}")
    tok = report["tokenizer"]
    how = (
        f"{tok['model']} tokenizer"
        if tok["kind"] == "model"
        else (f"tiktoken {tok['encoding']}, approximate for the model")
    )
    row(summary, "tokens", f"{report['tokens']:,} ({how})")
    row(summary, "chunks", f"{len(report['chunks']):,} of {report['chunk_tokens']:,} tokens")
    est = report["estimate"]
    if est and "error" in est:
        row(summary, "estimate", est["error"])
    elif est:
        row(
            summary,
            "estimate",
            f"about {_duration(est['seconds_per_question'])} per question on this machine "
            f"(an estimate: prompt {est['prompt_tokens_per_second']:,.0f} tok/s, generation "
            f"{est['generation_tokens_per_second']:,.0f} tok/s measured; {est['assumes']})",
        )
    out.print(summary)
    table = Table("chunk", "tokens", "characters", "span", box=None, pad_edge=False)
    for c in report["chunks"]:
        row(
            table,
            str(c["index"] + 1),
            f"{c['tokens'][0]:,}–{c['tokens'][1]:,}",
            f"{c['chars'][0]:,}–{c['chars'][1]:,}",
            c["span"],
        )
    out.print()
    out.print(table)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"
