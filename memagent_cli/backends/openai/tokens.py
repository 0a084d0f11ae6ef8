"""A server's tokens: the first tokenize endpoint it answers (llama-server's, vLLM's,
llama-cpp-python's), else tiktoken, whose counts only approximate the model's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memagent_cli.backends.openai.client import (
    SHORT_REPLY_BYTES,
    BackendError,
    Client,
)
from memagent_cli.backends.tokenizers import TiktokenTokenizer
from memagent_cli.chunking import Tokenizer
from memagent_cli.progress import Note
from memagent_cli.text import json_count

# A tokenize endpoint may answer a long text at length: up to this many bytes per byte of
# the text sent (a token per byte, as JSON), and a detokenize endpoint per token sent (a
# token's text, escaped), over SHORT_REPLY_BYTES.
_BYTES_PER_BYTE = 16
_BYTES_PER_TOKEN = 256


# Runs whose tokens are longer than 32 bytes in byte-level vocabularies (Qwen2's, SmolLM2's).
_LONG_PIECES = "=" * 80 + "\n" + " " * 40 + "x"

# Windows detokenized in one request (detokenize_many): at most this many tokens, each window
# followed by the separator's tokens, whose text splits the reply again.
_BATCH_TOKENS = 16384
_SEPARATOR = "\x00"  # one byte: a token of its own in a byte-level vocabulary, rare in text


class _LosesText(BackendError):
    """A detokenize endpoint that does not give back the text it was tokenized from."""


def find_tokenizer(client: Client, model: str, encoding: str, note: Note) -> Tokenizer:
    """The first tokenize endpoint `client`'s server answers, asked once without retries;
    else tiktoken's `encoding`, with a note that chunk sizes are approximate. So is a server
    whose detokenize drops long tokens' text (llama-cpp-python's own server)."""
    for candidate in (_LlamaServerTokenizer, _VllmTokenizer, _LlamaCppPythonTokenizer):
        tokenizer = candidate(client, model)
        try:
            tokenizer.probe()
        except _LosesText:
            note(
                f"The server's {tokenizer.detokenize_path} drops the text of long tokens "
                "(llama-cpp-python's own server does; `python -m "
                "memagent_cli.backends.llama_server` does not): chunks are cut with tiktoken "
                f"{encoding}, so their sizes in the model's tokens are approximate."
            )
            break
        except BackendError:
            continue
        return tokenizer
    else:
        note(
            "The server has no tokenize endpoint: chunks are cut with tiktoken "
            f"{encoding}, so their sizes in the model's tokens are approximate."
        )
    return TiktokenTokenizer(encoding)


class _ServerTokenizer:
    """One server's tokenize/detokenize endpoints, with any BOS it adds stripped."""

    tokenize_path = detokenize_path = ""

    def __init__(self, client: Client, model: str) -> None:
        self._client, self._model = client, model
        self._prefix: list[int] | None = None
        # Each token's exact bytes, where the server gave them with its tokens (llama-server's
        # with_pieces): windows of them are joined here, with no request.
        self._known: dict[int, bytes] = {}
        self._alone: dict[int, bytes] = {}  # tokens detokenized each on its own (pieces())
        self._separator: tuple[list[int], str] | None = None  # found once (detokenize_many)

    def _call(
        self, path: str, body: dict[str, Any], probe: bool = False, most_bytes: int = 0
    ) -> dict[str, Any]:
        most_bytes += SHORT_REPLY_BYTES
        return self._client.request(
            path,
            body,
            retry=not probe,
            most_bytes=most_bytes,
            seconds=self._client.discovery_seconds if probe else None,
        )

    def probe(self) -> None:
        """Fails unless this server has these endpoints: asked once, within seconds."""
        self._tokens("a", probe=True)

    def tokenize(self, text: str) -> list[int]:
        return self._unprefixed(self._tokens(text))

    def _unprefixed(self, tokens: list[Any]) -> list[Any]:
        """`tokens` without what the server adds to any text (a BOS), found once."""
        if self._prefix is None:
            self._prefix = []  # what the server adds to empty text, e.g. a BOS token
            self._prefix = self._tokens("")
        prefix = self._prefix
        ids = [t.get("id") if isinstance(t, dict) else t for t in tokens[: len(prefix)]]
        return tokens[len(prefix) :] if prefix and ids == prefix else tokens

    def pieces(self, text: str) -> list[bytes]:
        """Each token's bytes of `text`: a request for its tokens, and one for each token
        not seen before (the server joins the text of the tokens it is given)."""
        tokens = self.tokenize(text)
        alone = self._alone
        for token in tokens:
            if token not in alone:
                alone[token] = self._known.get(token) or self.detokenize([token])
        return [alone[token] for token in tokens]

    def _tokens(self, text: str, probe: bool = False) -> list[int]:
        return [t.get("id") if isinstance(t, dict) else t for t in self._listed(text, probe)]

    def _listed(self, text: str, probe: bool = False, **asked: Any) -> list[Any]:
        """The server's list of tokens of `text`: ids, or objects with an id (`asked`, such
        as llama-server's with_pieces, adds to the request)."""
        body = {**self._tokenize_body(text), **asked}
        # A long text has a long answer, longer with each token's piece.
        most = (4 if asked else 1) * _BYTES_PER_BYTE * len(text.encode("utf-8"))
        raw = self._call(self.tokenize_path, body, probe, most).get("tokens")
        ids = (
            [t.get("id") if isinstance(t, dict) else t for t in raw]
            if isinstance(raw, list)
            else []
        )
        if not isinstance(raw, list) or not all(json_count(i) for i in ids):
            raise BackendError(
                f"The server at {self._client.server} answered {self.tokenize_path} without "
                "a list of token ids."
            )
        return raw

    def detokenize(self, tokens: Sequence[int]) -> bytes:
        """The bytes of `tokens`: their pieces joined where each was seen with its bytes
        (tokenize()), else the server's detokenize endpoint."""
        known = self._known
        if tokens and all(token in known for token in tokens):
            return b"".join(known[token] for token in tokens)
        return self._detokenized(list(tokens)).encode("utf-8")

    def _detokenized(self, tokens: list[int]) -> str:
        """The text the server's detokenize endpoint gives `tokens`."""
        body = self._detokenize_body(tokens)
        reply = self._call(self.detokenize_path, body, most_bytes=_BYTES_PER_TOKEN * len(tokens))
        text = reply.get("content", reply.get("prompt", reply.get("text", "")))
        if not isinstance(text, str):
            raise BackendError(
                f"The server at {self._client.server} answered {self.detokenize_path} "
                "without the text of the tokens."
            )
        return text

    def detokenize_many(self, windows: Sequence[Sequence[int]]) -> list[bytes]:
        """Each window's bytes, as detokenize() gives them, in few requests: windows of tokens
        seen with their bytes are joined here; the others go up to _BATCH_TOKENS tokens a
        request, each followed by a separator token, and the reply is split at the
        separator's text. A server's decoding of bytes replaces a character cut at a
        window's edge whatever follows it, so each part is the window's own text. A batch
        whose reply does not split into its windows (a window that spells the separator) is
        asked a window a request."""
        got: list[bytes | None] = [None] * len(windows)
        batch: list[int] = []
        size = 0  # the batch's tokens, separators included
        known = self._known
        for place, window in enumerate(windows):
            if not window or all(token in known for token in window):
                got[place] = self.detokenize(window)
                continue
            if batch and size + len(window) + 1 > _BATCH_TOKENS:
                self._batch(windows, batch, got)
                batch, size = [], 0
            batch.append(place)
            size += len(window) + 1
        if batch:
            self._batch(windows, batch, got)
        return got  # type: ignore[return-value]

    def _batch(
        self, windows: Sequence[Sequence[int]], batch: list[int], got: list[bytes | None]
    ) -> None:
        """Fills `got` at the places of `batch`, in one request where the reply splits."""
        separator = self._find_separator() if len(batch) > 1 else None
        if separator is not None:
            ids, text = separator
            tokens = [token for place in batch for token in [*windows[place], *ids]]
            try:
                parts = self._detokenized(tokens).split(text)
            except BackendError:  # refused at that length: a window a request
                parts = []
            if len(parts) == len(batch) + 1 and parts[-1] == "":
                for place, part in zip(batch, parts, strict=False):
                    got[place] = part.encode("utf-8")
                return
        for place in batch:
            got[place] = self.detokenize(windows[place])

    def _find_separator(self) -> tuple[list[int], str] | None:
        """The separator's tokens and the text the server gives them back as, found once;
        None where it does not come back as itself."""
        if self._separator is None:
            ids = self.tokenize(_SEPARATOR)
            text = self._detokenized(ids) if ids else ""
            self._separator = (ids, text) if text == _SEPARATOR else ([], "")
        return self._separator if self._separator[1] else None

    def _tokenize_body(self, text: str) -> dict[str, Any]:
        raise NotImplementedError

    def _detokenize_body(self, tokens: list[int]) -> dict[str, Any]:
        return {"tokens": tokens}


class _LlamaServerTokenizer(_ServerTokenizer):
    tokenize_path, detokenize_path = "/tokenize", "/detokenize"

    def _tokenize_body(self, text: str) -> dict[str, Any]:
        # Plain text: a document's `<|im_end|>` is its characters, as in this process.
        return {"content": text, "add_special": False, "parse_special": False}

    def tokenize(self, text: str) -> list[int]:
        """`text`'s tokens, each one's piece kept (`with_pieces`, in the same request): a
        window of them is then detokenized from their pieces, byte for byte, as in this
        process, where llama-server's /detokenize answers a character that a window's end
        cuts in two with U+FFFD on both sides of the cut (one character more each, and every
        later chunk's range shifted)."""
        listed = self._unprefixed(self._listed(text, with_pieces=True))
        ids = [t.get("id") if isinstance(t, dict) else t for t in listed]
        for token, item in zip(ids, listed, strict=True):
            piece = _piece(item)
            if piece is not None:
                self._known.setdefault(token, piece)
        return ids

    def reads_markup(self, text: str) -> bool:
        """Whether llama-server's tokens of `text` differ where it parses its control
        tokens (as it does a chat prompt's, and a completion's): `text` spells one."""
        parsed = self._listed(text, parse_special=True)
        return [t.get("id") if isinstance(t, dict) else t for t in parsed] != self._tokens(text)

    def pieces(self, text: str) -> list[bytes]:
        """Each token's bytes of `text`, in one request: llama-server gives each token's
        piece with `with_pieces` (text, or a list of bytes where not UTF-8 on its own). A
        server that does not is asked as any other."""
        listed = self._unprefixed(self._listed(text, with_pieces=True))
        pieces = [_piece(token) for token in listed]
        if any(piece is None for piece in pieces):
            return super().pieces(text)
        return pieces  # type: ignore[return-value]


def _piece(token: Any) -> bytes | None:
    """A token's bytes as llama-server's `with_pieces` gives them; None without them."""
    piece = token.get("piece") if isinstance(token, dict) else None
    if isinstance(piece, str):
        return piece.encode("utf-8")
    if isinstance(piece, list) and all(json_count(b) and b < 256 for b in piece):
        return bytes(piece)
    return None


def _byte_characters() -> dict[str, int]:
    """The byte each character of a byte-level BPE's token strings stands for: GPT-2's
    bytes_to_unicode (Qwen2's, Qwen3's, Llama 3's tokenizers), printable bytes as
    themselves and the others shifted past 255, in order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    return {
        **{chr(b): b for b in printable},
        **{chr(256 + n): b for n, b in enumerate(others)},
    }


_BYTE_OF = _byte_characters()
# A text whose tokens' strings tell a byte-level BPE: spaces, a newline, several-byte
# characters (composed: NFC), digits.
_BYTES_SAMPLE = "Việt 中文 a  b\n\t42 été"


def _spelled(string: object) -> bytes | None:
    """The bytes a byte-level BPE token's string spells; None where it spells none."""
    if not isinstance(string, str) or any(c not in _BYTE_OF for c in string):
        return None
    return bytes(_BYTE_OF[c] for c in string)


class _VllmTokenizer(_ServerTokenizer):
    tokenize_path, detokenize_path = "/tokenize", "/detokenize"
    _byte_level = False  # its token strings spell each token's bytes (probe)

    def probe(self) -> None:
        """Also finds whether the server gives each token's string (vLLM's
        `return_token_strs`, in its recent versions) and they spell the tokens' bytes, as a
        byte-level BPE's do: a sample's strings join back into its bytes."""
        super().probe()
        try:
            tokens, strings = self._with_strings(_BYTES_SAMPLE, probe=True)
        except BackendError:
            return
        pieces = [_spelled(s) for s in strings or ()]
        self._byte_level = (
            strings is not None
            and len(strings) == len(tokens)
            and b"".join(p or b"" for p in pieces) == _BYTES_SAMPLE.encode()
            and None not in pieces
        )

    def _with_strings(self, text: str, probe: bool = False) -> tuple[list[int], list | None]:
        """`text`'s tokens, and their strings where the server gives them."""
        body = {**self._tokenize_body(text), "return_token_strs": True}
        most = 4 * _BYTES_PER_BYTE * len(text.encode("utf-8"))
        reply = self._call(self.tokenize_path, body, probe, most)
        tokens, strings = reply.get("tokens"), reply.get("token_strs")
        if not isinstance(tokens, list) or not all(json_count(t) for t in tokens):
            raise BackendError(
                f"The server at {self._client.server} answered {self.tokenize_path} without "
                "a list of token ids."
            )
        return tokens, strings if isinstance(strings, list) else None

    def tokenize(self, text: str) -> list[int]:
        """`text`'s tokens; where the server's token strings spell bytes, each token's bytes
        kept from them (in the same request): a window of them is then joined here, byte for
        byte, as in this process, where vLLM's /detokenize answers a character that a
        window's end cuts in two with U+FFFD on both sides of the cut."""
        if not self._byte_level:
            return super().tokenize(text)
        tokens, strings = self._with_strings(text)
        unprefixed = self._unprefixed(tokens)
        if strings is not None and len(strings) == len(tokens):
            known = self._known
            for token, string in zip(
                unprefixed, strings[len(tokens) - len(unprefixed) :], strict=True
            ):
                piece = _spelled(string)
                if piece is not None:
                    known.setdefault(token, piece)
        return unprefixed

    def _tokenize_body(self, text: str) -> dict[str, Any]:
        return {"model": self._model, "prompt": text, "add_special_tokens": False}

    def _detokenize_body(self, tokens: list[int]) -> dict[str, Any]:
        return {"model": self._model, "tokens": tokens}


class _LlamaCppPythonTokenizer(_ServerTokenizer):
    tokenize_path, detokenize_path = "/extras/tokenize", "/extras/detokenize"

    def probe(self) -> None:
        """Also fails where the text of a long token does not come back: llama-cpp-python
        0.3.36's server detokenizes a token into 32 bytes and drops a longer one."""
        super().probe()
        tokens = self._tokens(_LONG_PIECES, probe=True)
        body = self._detokenize_body(tokens)
        reply = self._call(self.detokenize_path, body, probe=True)
        if reply.get("text") != _LONG_PIECES:
            raise _LosesText(f"{self.detokenize_path} loses text")

    def _tokenize_body(self, text: str) -> dict[str, Any]:
        return {"input": text, "model": self._model}

    def _detokenize_body(self, tokens: list[int]) -> dict[str, Any]:
        return {"tokens": tokens, "model": self._model}
