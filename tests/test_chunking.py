"""Model-token windows: sizes, no overlap, and detokenized windows that cover the document."""

import unicodedata
from pathlib import Path

import pytest
from support import gguf_files, qwen_material
from support.models import default_model_path, real_model_path
from support.story import story

from memagent_cli.backends.llama_cpp import LlamaCppBackend, LlamaOptions
from memagent_cli.chunking import chunk_text, make_chunks


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


# --- every token's text, at every length ------------------------------------------------

# Runs a book holds (rules between sections, table gaps, pypdf's layout spacing, code): in
# byte-level vocabularies many of their tokens are longer than 32 bytes, the buffer in which
# llama-cpp-python's own detokenize put each token, dropping any token that did not fit.
RUNS = (" ", "-", "*", "=", "_", "~", "#", ".", "\t", "\n", "—", "\u3000", "ab")


def long_runs() -> str:
    """Lines of runs of every kind, at lengths around the old 32-byte limit and far past it,
    between words."""
    lines = []
    for run in RUNS:
        for length in (31, 32, 33, 40, 64, 80, 128, 129, 200, 257):
            lines.append(f"{run * length}Section {length}{run * (length // 3)}end.")
    return "\n".join(lines)


def byte_level_bytes() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character to byte (how a GGUF writes BPE tokens)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shifted = iter(range(256, 512))
    return {chr(b) if b in printable else chr(next(shifted)): b for b in range(256)}


NORMAL, CONTROL, USER_DEFINED = 1, 3, 4  # gguf.TokenType


def vocabulary_path(name: str, request: pytest.FixtureRequest) -> Path:
    """The GGUF of a vocabulary the tests use: the tiny model's (Qwen2's tokenizer), the real
    Qwen2.5 material's (memagent-7b's and ReMemR1's vocabulary), the default model's."""
    if name == "tiny":
        return request.getfixturevalue("tiny_model")
    if name == "qwen2.5":
        return qwen_material.shipped_gguf()
    return real_model_path()


VOCABULARIES = ["tiny", "qwen2.5", pytest.param("smollm2", marks=pytest.mark.real_model)]


@pytest.mark.model
@pytest.mark.parametrize("name", VOCABULARIES)
def test_every_token_of_the_vocabulary_comes_back_whole(name, request):
    path = vocabulary_path(name, request)
    meta, _ = gguf_files.read(path)
    assert meta["tokenizer.ggml.model"] == "gpt2"
    alphabet = byte_level_bytes()
    backend = LlamaCppBackend(path, LlamaOptions(threads=1, gpu_layers=0))
    expected = []
    vocabulary = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    for text, kind in zip(*vocabulary, strict=True):
        if kind == NORMAL:
            expected.append(bytes(alphabet[c] for c in text))
        elif kind in (CONTROL, USER_DEFINED):  # as they are: `</s>` may be one to llama.cpp
            expected.append(text.encode("utf-8"))
        else:  # padding up to the embedding's rows: no text
            expected.append(b"")
    got = [backend.detokenize([token]) for token in range(len(expected))]
    wrong = [(t, expected[t], got[t]) for t in range(len(expected)) if got[t] != expected[t]]
    assert not wrong, f"{len(wrong)} tokens, e.g. {wrong[:3]}"
    assert max(len(piece) for piece in got) > 64  # long pieces were there to lose
    assert backend.detokenize(range(len(expected))) == b"".join(expected)


@pytest.mark.model
@pytest.mark.parametrize("name", VOCABULARIES)
def test_a_document_of_long_runs_chunks_back_to_itself(name, request):
    backend = LlamaCppBackend(vocabulary_path(name, request), LlamaOptions(threads=1, gpu_layers=0))
    text = long_runs()
    for size in (1, 7, 64, 500):
        tokens, chunks = chunk_text(text, backend, size)
        pieces = [backend.detokenize(tokens[c.token_start : c.token_end]) for c in chunks]
        assert b"".join(pieces) == text.encode(), size
        assert chunks[0].char_start == 0 and chunks[-1].char_end == len(text)
        for before, after in zip(chunks, chunks[1:], strict=False):
            assert before.char_end == after.char_start
        # A chunk's text is the document's, but where a window cuts a character in two.
        whole = [c for c in chunks if "\ufffd" not in c.text]
        assert all(text[c.char_start : c.char_end] == c.text for c in whole)
        assert len(whole) >= len(chunks) // 2


# --- the text as the model's tokenizer normalizes it --------------------------------------

# The same words composed (NFC) and decomposed (NFD: as some PDFs, macOS and Vietnamese and
# Korean input methods write them).
WORDS = {
    "french": "Le café était déjà fermé; où êtes-vous, Hélène? Ça dépend.",
    "vietnamese": "Tiếng Việt có dấu: người, được, những, chuyện, thuở ấy.",
    "korean": "한국어 문장입니다. 읽기 쉬운 글자, 한글.",
    "swedish": "Å, ä och ö: Ångström såg ön från båten.",
}


def nfd(text: str) -> str:
    return unicodedata.normalize("NFD", text)


class CharTokenizer:
    """A token per character, normalizing as `normalization` says (NFC: Qwen's)."""

    def __init__(self, normalization: str | None = "NFC") -> None:
        self.normalization = normalization

    def tokenize(self, text: str) -> list[int]:
        if self.normalization:
            text = unicodedata.normalize(self.normalization, text)
        return [ord(c) for c in text]

    def detokenize(self, tokens) -> bytes:
        return "".join(map(chr, tokens)).encode()


def assert_tiles(chunks, document: str) -> None:
    assert chunks[0].char_start == 0 and chunks[-1].char_end == len(document)
    for before, after in zip(chunks, chunks[1:], strict=False):
        assert before.char_end == after.char_start


@pytest.mark.parametrize("language", sorted(WORDS))
def test_decomposed_text_is_read_composed_and_placed_in_the_text_as_extracted(language):
    document = nfd(WORDS[language]) * 3
    assert document != WORDS[language] * 3
    for size in (1, 2, 5, 17):
        tokens, chunks = chunk_text(document, CharTokenizer(), size)
        assert tokens == [ord(c) for c in WORDS[language] * 3]  # the model reads NFC
        assert "".join(c.text for c in chunks) == WORDS[language] * 3
        assert_tiles(chunks, document)  # the ranges are the document's, as extracted
        for chunk in chunks:
            original = document[chunk.char_start : chunk.char_end]
            assert unicodedata.normalize("NFC", original) == chunk.text


def test_a_tokenizer_that_does_not_normalize_reads_the_text_as_it_is():
    document = nfd(WORDS["french"])
    tokens, chunks = chunk_text(document, CharTokenizer(None), 7)
    assert tokens == [ord(c) for c in document]
    assert "".join(c.text for c in chunks) == document
    assert all(document[c.char_start : c.char_end] == c.text for c in chunks)


def test_a_character_composed_into_several_keeps_the_chunks_tiling():
    # e + cedilla + acute composes to ȩ (U+0229) + acute: two characters from three, where a
    # window may fall between them; the rest of the text around stays exact.
    document = "ab" + "e\u0301\u0327" * 5 + "cd" + nfd(WORDS["vietnamese"])
    for size in (1, 2, 3):
        _, chunks = chunk_text(document, CharTokenizer(), size)
        assert "".join(c.text for c in chunks) == unicodedata.normalize("NFC", document)
        assert_tiles(chunks, document)


def test_normalized_offsets_map_back_exactly():
    from memagent_cli.chunking import normalized

    document = "x" + nfd(WORDS["korean"]) + "\u212b" + nfd(WORDS["vietnamese"]) + "e\u0301"
    text = normalized(document, "NFC")
    assert text.text == unicodedata.normalize("NFC", document)
    offsets = [text.original(n) for n in range(len(text.text) + 1)]
    assert offsets[0] == 0 and offsets[-1] == len(document)
    assert offsets == sorted(offsets)
    for n, at in enumerate(offsets):  # here every composed character comes from one place
        assert unicodedata.normalize("NFC", document[:at]) == text.text[:n]
    plain = normalized("already composed: é", "NFC")
    assert plain.text == "already composed: é" and plain.original(5) == 5


@pytest.mark.model
def test_qwens_tokenizer_reads_decomposed_text_composed(tiny_model):
    """Qwen2's tokenizer (the tiny model's, memagent-7b's, ReMemR1's, InfMem's Qwen3) composes
    Unicode first in Hugging Face's hands: llama.cpp does not, so memagent does."""
    backend = LlamaCppBackend(tiny_model, LlamaOptions(threads=1, gpu_layers=0))
    assert backend.normalization == "NFC"
    composed = " ".join(WORDS.values()) + "\n"
    document = nfd(composed) * 4
    tokens, chunks = chunk_text(document, backend, 50)
    assert tokens == backend.tokenize(composed * 4) == backend.tokenize(document)
    assert len(tokens) < len(backend._vocab.tokenize(document.encode(), False, False)) / 1.5
    assert_tiles(chunks, document)
    whole = [c for c in chunks if "\ufffd" not in c.text]
    assert len(whole) >= len(chunks) // 2
    for chunk in whole:
        original = document[chunk.char_start : chunk.char_end]
        assert unicodedata.normalize("NFC", original) == chunk.text


@pytest.mark.real_model
def test_a_tokenizer_without_normalization_reads_the_text_as_it_is():
    backend = LlamaCppBackend(real_model_path(), LlamaOptions(threads=1, gpu_layers=0))
    assert backend.normalization is None
    document = nfd(WORDS["french"])
    assert backend.tokenize(document) != backend.tokenize(WORDS["french"])


# --- through a server: the rule for the model's normalization -----------------------------


def header_only_gguf(path, pre: str):
    """A GGUF file of a header alone, whose tokenizer's pre-tokenizer is `pre`."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_tokenizer_pre(pre)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def with_tail(words: str) -> tuple[str, int]:
    """Decomposed `words` and an ASCII tail, and a chunk size in the stand-in's tokens (a
    byte each) that cuts the composed text inside the tail: a window that cuts a character
    in two comes back from a server's detokenize with U+FFFD (llama-server's too)."""
    return nfd(words) + " " + "tail " * 40, len(f"{words} ".encode()) + 10


def read_through(server, document: str, size: int):
    """`document` chunked by a server's tokenizer, its tokens, and the message it is sent
    as."""
    from memagent_cli.backend import Sampling
    from memagent_cli.backends.openai import OpenAIBackend, ServerOptions

    backend = OpenAIBackend(ServerOptions(base_url=server.url))
    tokens, chunks = chunk_text(document, backend, size)
    backend.generate(f"<section>\n{document}\n</section>", max_tokens=8, sampling=Sampling())
    return backend, tokens, chunks, server.messages[-1]


def test_a_server_s_qwen_model_reads_the_text_composed(tmp_path):
    """Issue 47: in this process a Qwen GGUF's text is composed (NFC) before tokenizing, as
    the authors' tokenizer does; through a server it went as extracted. Where the server
    names its model's file (llama-server's /props) and it is here, its pre-tokenizer
    decides, and the ranges are still the document's as extracted."""
    from support.fake_openai import FakeServer

    document, size = with_tail(WORDS["vietnamese"] + " " + WORDS["french"])
    composed = unicodedata.normalize("NFC", document)
    model = header_only_gguf(tmp_path / "qwen.gguf", "qwen2")
    with FakeServer(tokenizer=True, model_path=str(model)) as server:
        backend, tokens, chunks, sent = read_through(server, document, size)
    assert tokens == list(composed.encode()) and len(chunks) > 1
    assert "".join(c.text for c in chunks) == composed
    assert_tiles(chunks, document)
    assert composed in sent and document not in sent
    assert backend.normalization == "NFC"

    other = header_only_gguf(tmp_path / "llama.gguf", "llama-bpe")
    with FakeServer(tokenizer=True, model_path=str(other)) as server:
        backend, tokens, chunks, sent = read_through(server, document, len(document) * 4)
    assert tokens == list(document.encode()) and document in sent
    assert_tiles(chunks, document)
    assert backend.normalization is None


def test_a_server_whose_tokenizer_composes_is_read_composed():
    """A server whose tokenizer composes itself (the Hugging Face tokenizer of a Qwen model,
    as vLLM serves it) sent back composed chunks that were placed as if they were the
    document's own characters: the ranges drifted off the text as extracted."""
    from support.fake_openai import FakeServer

    document, size = with_tail(WORDS["korean"] + " " + WORDS["swedish"])
    with FakeServer(tokenizer=True, composes=True) as server:
        backend, _, chunks, _ = read_through(server, document, size)
    assert len(chunks) > 1
    assert_tiles(chunks, document)
    for chunk in chunks:
        original = document[chunk.char_start : chunk.char_end]
        assert unicodedata.normalize("NFC", original) == chunk.text
    assert backend.normalization == "NFC"


def test_a_server_that_says_nothing_of_its_model_reads_the_text_as_extracted():
    from support.fake_openai import FakeServer

    document = nfd(WORDS["french"])
    with FakeServer(tokenizer=True) as server:
        backend, tokens, chunks, sent = read_through(server, document, len(document) * 4)
    assert tokens == list(document.encode()) and document in sent
    assert_tiles(chunks, document)
    assert backend.normalization is None


def test_a_server_s_windows_that_split_a_character_still_tile_the_document():
    """Issue 47: a window of a server's tokens that ends inside a character came back from
    its /detokenize with U+FFFD (llama-server's does), one character more on each side of the
    cut, and every later chunk's range shifted (a 168-character Vietnamese text ended at
    179). llama-server gives each token's piece as bytes where it is no character of its own
    (`with_pieces`): the windows are joined from those, byte for byte, as in this process."""
    from support.fake_openai import FakeServer

    document = WORDS["vietnamese"] + " " + WORDS["korean"]
    size = 7  # a token a byte: most windows end inside a character
    with FakeServer(tokenizer=True) as server:
        _, tokens, chunks, _ = read_through(server, document, size)
    assert len(chunks) == -(-len(document.encode()) // size)
    assert sum(not c.text.isascii() and "\ufffd" in c.text for c in chunks) > 1  # cuts seen
    assert_tiles(chunks, document)


DETOKENIZING = {  # servers that give no token's bytes but vLLM's token strings
    "token-strs": {"vllm_tokenizer": True, "token_strs": True},
    "detokenize-only": {"vllm_tokenizer": True},
    "sglang": {"sglang_tokenizer": True},  # vLLM's request shape, its text under `text`
}


@pytest.mark.parametrize("kind", DETOKENIZING)
def test_a_vllm_server_s_windows_that_split_a_character_still_tile_the_document(kind):
    """Issue 47: through a server that only detokenizes (vLLM, SGLang), a window that ends inside a
    character came back with U+FFFD on both sides of the cut, and the ranges after it were
    off by a character or two. vLLM gives each token's string (`return_token_strs`), which a
    byte-level BPE (Qwen2's, Llama 3's) spells a byte a character: the windows are joined
    from those bytes. Where it gives none, each window's text is placed in the document by
    its bytes: a cut is where the document's bytes decode as the server's text does."""
    from support.fake_openai import FakeServer

    document = WORDS["vietnamese"] + " " + WORDS["korean"] + " \ufffd한\ufffd 끝."
    data = document.encode()
    for size in (1, 2, 7, 64):
        with FakeServer(**DETOKENIZING[kind]) as server:
            _, tokens, chunks, _ = read_through(server, document, size)
            detokenized = server.paths.count("/detokenize")
        assert tokens == list(data) and len(chunks) == -(-len(data) // size)
        assert_tiles(chunks, document)
        for chunk in chunks:  # a character cut in two is the chunk's where it ends
            assert chunk.char_end == len(data[: chunk.token_end].decode("utf-8", "ignore"))
            assert chunk.text == data[chunk.token_start : chunk.token_end].decode(errors="replace")
        assert detokenized == (0 if kind == "token-strs" else len(chunks))


def test_a_server_whose_text_is_not_its_tokens_bytes_says_the_ranges_are_inexact():
    """A server that gives no token's bytes and whose decoding cleans up spaces (Llama 3's
    tokenizer in vLLM: " ." becomes ".") gives no way to place a cut exactly: said once."""
    from support.fake_openai import FakeServer

    from memagent_cli.backends.openai import OpenAIBackend, ServerOptions

    document = "Wait . Yes ! " + WORDS["korean"] + " Done , then ."
    notes: list[str] = []
    with FakeServer(vllm_tokenizer=True, clean_up=True) as server:
        backend = OpenAIBackend(ServerOptions(base_url=server.url), note=notes.append)
        chunk_text(document, backend, 5)
        chunk_text(document, backend, 3)
    assert len(notes) == 1 and "off by a character or two" in notes[0], notes
    with FakeServer(vllm_tokenizer=True) as server:
        backend = OpenAIBackend(ServerOptions(base_url=server.url), note=notes.append)
        _, chunks = chunk_text(document, backend, 5)
    assert len(notes) == 1  # placed by its bytes: nothing to say
    assert_tiles(chunks, document)


def test_windows_placed_by_their_bytes_are_where_the_document_s_bytes_put_them():
    """placed_by_bytes on random texts of one- to four-byte characters, the document's own
    U+FFFD among them, cut into windows of random byte lengths and decoded as a server
    decodes them: each window ends where the characters it completes end. Only next to the
    document's own U+FFFD can two places give the same texts (a cut U+FFFD reads as a
    whole one): then one of them, a character or two apart."""
    import random

    from memagent_cli.chunking import placed_by_bytes

    rng = random.Random(47)
    alphabet = ["a", " ", "é", "한", "😀", "\ufffd", "ấ"]
    for _ in range(300):
        document = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))
        data = document.encode()
        cuts, at = [], 0
        while at < len(data):
            at = min(len(data), at + rng.randint(1, 6))
            cuts.append(at)
        texts = [data[a:b].decode(errors="replace") for a, b in zip([0, *cuts], cuts, strict=False)]
        ends = placed_by_bytes(document, texts)
        assert ends is not None and ends[-1] == len(document)
        expected = [len(data[:cut].decode("utf-8", "ignore")) for cut in cuts]
        if "\ufffd" not in document:
            assert ends == expected
        else:
            assert all(a <= b for a, b in zip([0, *ends], ends, strict=False))
            assert all(abs(a - b) <= 2 for a, b in zip(ends, expected, strict=True))


@pytest.mark.model
def test_a_qwen_model_on_another_machine_s_llama_server_reads_the_text_composed():
    """Issue 47: a llama-server on another machine names a model file memagent cannot read
    (/props model_path), and llama.cpp does not compose text: a Qwen model there read a
    decomposed text as extracted, in other tokens than its authors' tokenizer gives. Its
    tokens tell it: Qwen2's vocabulary (Qwen2's, Qwen2.5's, Qwen3's) splits a sample into
    Qwen2's ids, and its chat template is Qwen's ChatML."""
    from support.fake_openai import FakeServer

    from memagent_cli import gguf_header
    from memagent_cli.backends.openai import OpenAIBackend, ServerOptions

    document = WORDS["vietnamese"] + " " + WORDS["french"] + " " + WORDS["korean"]
    decomposed = nfd(document)
    qwen = qwen_material.shipped_gguf()
    template = gguf_header.read(qwen).fields["tokenizer.chat_template"]
    remote = "/srv/models/Qwen2.5-7B-Instruct-Q4_K_M.gguf"  # not on this machine
    served = {"tokenizer": True, "vocabulary": str(qwen), "model_path": remote}
    with FakeServer(**served, chat_template=template) as server:
        backend, tokens, chunks, sent = read_through(server, decomposed, 9)
        assert tokens == backend.tokenize(document)  # the composed text's tokens
    assert backend.normalization == "NFC"
    assert document in sent and decomposed not in sent
    assert_tiles(chunks, decomposed)
    # The same vocabulary behind another family's chat template is not taken for Qwen's.
    other = "{% for m in messages %}<｜User｜>{{ m['content'] }}<｜Assistant｜>{% endfor %}"
    with FakeServer(**served, chat_template=other) as server:
        backend = OpenAIBackend(ServerOptions(base_url=server.url))
        assert backend.normalization is None
