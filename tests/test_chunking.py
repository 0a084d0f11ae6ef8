"""Model-token windows: sizes, no overlap, and detokenized windows that cover the document."""

import pytest
from support.models import default_model_path
from support.story import story

from memagent_cli.backends.llama_cpp import LlamaCppBackend, LlamaOptions
from memagent_cli.chunking import make_chunks


def byte_tokens(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def byte_detokenize(tokens) -> bytes:
    return bytes(tokens)


def test_windows_have_the_asked_size_and_no_overlap():
    tokens = byte_tokens("x" * 1003)
    chunks = make_chunks(tokens, 100, byte_detokenize)
    assert [c.tokens for c in chunks] == [100] * 10 + [3]
    assert chunks[0].token_start == 0 and chunks[-1].token_end == 1003
    for before, after in zip(chunks, chunks[1:], strict=False):
        assert before.token_end == after.token_start
        assert before.char_end == after.char_start


def test_a_character_split_between_windows_belongs_to_the_window_where_it_ends():
    text = "aé" * 5  # é is two bytes
    chunks = make_chunks(byte_tokens(text), 2, byte_detokenize)
    assert sum(c.char_end - c.char_start for c in chunks) == len(text)
    assert chunks[-1].char_end == len(text)
    # The first window holds "a" and half of "é": one whole character.
    assert (chunks[0].char_start, chunks[0].char_end) == (0, 1)


def test_chunk_size_must_be_positive():
    with pytest.raises(ValueError):
        make_chunks([1, 2, 3], 0, byte_detokenize)


@pytest.mark.model
@pytest.mark.usefixtures("on_tiny_model")
def test_real_tokenizer_windows_cover_the_document():
    backend = LlamaCppBackend(default_model_path(), LlamaOptions(threads=1, gpu_layers=0))
    text = story(300) + " Ünïcödé ✓ 漢字 at the end."
    tokens = backend.tokenize(text)
    chunks = make_chunks(tokens, 257, backend.detokenize)
    assert len(chunks) == -(-len(tokens) // 257)
    assert all(c.tokens == 257 for c in chunks[:-1]) and 0 < chunks[-1].tokens <= 257
    assert "".join(c.text for c in chunks) == text
    for c in chunks:
        assert text[c.char_start : c.char_end] == c.text


class PrefixingTokenizer:
    """Like a SentencePiece model that adds a prefix token to every call: cutting a text
    changes its tokens, so it must be tokenized whole."""

    def tokenize(self, text: str) -> list[int]:
        return [0] + list(text.encode())

    def detokenize(self, tokens) -> bytes:
        return bytes(t for t in tokens if t)


def test_a_long_text_is_cut_into_the_same_chunks_as_one_tokenization():
    from memagent_cli.backends.tokenizers import TiktokenTokenizer
    from memagent_cli.chunking import chunk_text

    text = "The keeper crossed the old bridge at dawn, counting every stone twice. " * 16_000
    assert len(text) > 1 << 20  # long enough to be tokenized in pieces
    tokenizer = TiktokenTokenizer()
    whole = tokenizer.tokenize(text)
    tokens, chunks = chunk_text(text, tokenizer, 5000)
    assert tokens == whole
    assert chunks == make_chunks(whole, 5000, tokenizer.detokenize)

    prefixing = PrefixingTokenizer()
    tokens, _ = chunk_text(text, prefixing, 5000)
    assert tokens == prefixing.tokenize(text)  # one call: its tokenizer does not cut cleanly
