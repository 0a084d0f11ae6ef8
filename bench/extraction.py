"""Extraction speed: a generated 1,000-page PDF and a 1,000-chapter EPUB, read cold.

Run `python bench/extraction.py [--pages N]`. The cache goes to a temporary directory,
so every timing is a real extraction; a second, cached load is timed too.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from support import builders  # noqa: E402

VOCABULARY = (
    "memory chunk answer model page chapter reader token context window document evidence "
    "question the of and a to in is that for it as with was on be by this are from at"
)
WORDS = VOCABULARY.split()


def page_text(rng: random.Random, chars: int = 1800) -> str:
    """About `chars` characters of words in lines, like a page of a manual."""
    lines, line = [], []
    length = 0
    while length < chars:
        word = rng.choice(WORDS)
        line.append(word)
        length += len(word) + 1
        if len(line) == 12:
            lines.append(" ".join(line).capitalize() + ".")
            line = []
    lines.append(" ".join(line))
    return "\n".join(lines)


def timed(path: Path) -> tuple[float, object]:
    from memagent_cli.documents import load_document

    start = time.perf_counter()
    document = load_document(str(path))
    return time.perf_counter() - start, document


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=1000, help="pages (and chapters)")
    args = parser.parse_args()
    rng = random.Random(7)
    texts = [page_text(rng) for _ in range(args.pages)]
    with tempfile.TemporaryDirectory() as temp:
        folder = Path(temp)
        os.environ["XDG_CACHE_HOME"] = str(folder / "cache")
        print(f"building a {args.pages}-page PDF and a {args.pages}-chapter EPUB…", file=sys.stderr)
        pdf = builders.pdf(folder / "bench.pdf", texts, labels=[("D", "", 1)])
        chapters = [
            (f"c{i:04}.xhtml", f"Chapter {i + 1}", builders.xhtml(None, t.split("\n")))
            for i, t in enumerate(texts)
        ]
        book = builders.epub_book(folder / "bench.epub", chapters)
        rows = []
        documents = []
        for name, path in (("PDF", pdf), ("EPUB", book)):
            cold, document = timed(path)
            warm, cached = timed(path)
            assert cached.from_cache and cached.text == document.text  # type: ignore[attr-defined]
            units = len(document.sections)  # type: ignore[attr-defined]
            chars = len(document.text)  # type: ignore[attr-defined]
            size = path.stat().st_size / 1e6
            rows.append((name, units, chars, size, cold, units / cold, chars / cold, warm))
            documents.append((name, cold, document))
    header = ("format", "units", "chars", "MB", "cold s", "units/s", "chars/s", "cached s")
    print("  ".join(f"{h:>10}" for h in header))
    for name, units, chars, size, cold, ups, cps, warm in rows:
        print(
            f"{name:>10}  {units:>10}  {chars:>10}  {size:>10.1f}  {cold:>10.2f}  "
            f"{ups:>10.0f}  {cps:>10.0f}  {warm:>10.3f}"
        )
    share_of_ask(documents)


def share_of_ask(documents: list) -> None:
    """How much of a typical `ask` (default model and settings) extraction takes."""
    from memagent_cli import protocol
    from memagent_cli.chunking import make_chunks, tokenize_in_pieces
    from memagent_cli.reader import Settings
    from memagent_cli.run.engine import BackendOptions, open_backend
    from memagent_cli.run.inspect import estimate_reading

    backend = open_backend(BackendOptions())
    print()
    print(
        f"{'format':>10}  {'tokenize s':>10}  {'tokens':>10}  {'chunks':>10}  "
        f"{'ask est. s':>10}  {'extract %':>10}"
    )
    for name, extract_seconds, document in documents:
        start = time.perf_counter()
        tokens = tokenize_in_pieces(document.text, backend.tokenize)
        chunks = make_chunks(tokens, protocol.DEFAULT_CHUNK_TOKENS, backend.detokenize)
        tokenize_seconds = time.perf_counter() - start
        guess = estimate_reading(backend, chunks, Settings())
        ask = guess["seconds_per_question"]
        share = 100 * extract_seconds / (extract_seconds + tokenize_seconds + ask)
        print(
            f"{name:>10}  {tokenize_seconds:>10.2f}  {len(tokens):>10}  {len(chunks):>10}  "
            f"{ask:>10.0f}  {share:>10.3f}"
        )
    print(
        "(ask est.: one question with the default model, chunks of 5000 and memory of 1024 "
        "tokens, estimated from the model's speed measured at a step's depth)"
    )


if __name__ == "__main__":
    main()
