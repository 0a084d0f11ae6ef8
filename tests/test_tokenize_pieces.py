"""Tokenizing a huge single line in pieces cut at safe spaces: the same tokens as the whole
(issue 10: a 50 MB line took 1.5 GB to tokenize at once)."""

from __future__ import annotations

import random

import pytest
from support.models import default_model_path

from memagent_cli.chunking import tokenize_in_pieces

# Pieces a tokenizer's pre-split treats specially: runs of spaces, newlines after
# punctuation, contractions, digits, accents, CJK, tabs.
TRICKY = [
    " ",
    "  ",
    "   ",
    "\n",
    "\n\n",
    " \n",
    "!\n",
    "?! ",
    "'s",
    "'ll ",
    "don't",
    "é",
    "über",
    "123",
    "4567",
    "中文",
    "\t",
    " -- ",
    "word",
    "Word",
    "sea",
    ".",
    ",",
    "\u00a0",
    "😀",
]


def tricky_text(seed: int, length: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice(TRICKY) for _ in range(length))


@pytest.fixture(scope="module")
def cl100k():
    from memagent_cli.backends.tokenizers import encoding

    return encoding("cl100k_base").encode_ordinary


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("piece_chars", [1, 7, 64, 1000])
def test_pieces_tokenize_like_the_whole(cl100k, seed: int, piece_chars: int) -> None:
    text = tricky_text(seed, 3000)

    assert tokenize_in_pieces(text, cl100k, piece_chars=piece_chars) == cl100k(text)


@pytest.mark.parametrize(
    "text",
    ["", "x", " ", "nospacesatall" * 100, " leading and trailing ", "a  b   c\n\n d", "😀 😀"],
)
def test_pieces_at_the_edges(cl100k, text: str) -> None:
    assert tokenize_in_pieces(text, cl100k, piece_chars=3) == cl100k(text)


def test_pieces_report_progress_in_characters(cl100k) -> None:
    text = tricky_text(1, 5000)
    calls: list[tuple[int, int]] = []

    tokenize_in_pieces(text, cl100k, piece_chars=500, progress=lambda *c: calls.append(c))

    assert len(calls) >= len(text) // 1000
    assert [done for done, _ in calls] == sorted({done for done, _ in calls})
    assert calls[-1] == (len(text), len(text))


def test_each_piece_is_about_the_size_asked(cl100k) -> None:
    text = "word " * 100_000
    sizes: list[int] = []

    def tokenize(piece: str) -> list[int]:
        sizes.append(len(piece))
        return cl100k(piece)

    tokenize_in_pieces(text, tokenize, piece_chars=10_000)

    assert max(sizes) <= 10_000 and min(sizes[:-1]) >= 9_990 and sum(sizes) == len(text)


@pytest.mark.model
@pytest.mark.usefixtures("on_tiny_model")
def test_pieces_tokenize_like_the_whole_with_the_model() -> None:
    from memagent_cli.backends.llama_cpp import LlamaCppBackend, LlamaOptions

    backend = LlamaCppBackend(default_model_path(), LlamaOptions(threads=2, gpu_layers=0))
    for seed in range(3):
        text = tricky_text(seed, 20_000)
        whole = backend.tokenize(text)
        for piece_chars in (13, 500, 4096):
            assert tokenize_in_pieces(text, backend.tokenize, piece_chars=piece_chars) == whole
