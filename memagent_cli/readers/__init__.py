"""The readers after MemAgent: each a small module of templates, reply parsing, retrieval
and the state carried between steps, as its authors' released evaluation code runs it
(docs/readers.md). MemAgent's own templates stay in `memagent_cli/protocol.py`."""

from __future__ import annotations

from collections.abc import Sequence

from memagent_cli import reader
from memagent_cli.backend import Backend, Sampling
from memagent_cli.chunking import Tokenizer
from memagent_cli.errors import UserError
from memagent_cli.reader import Reader, Settings, memagent

NAMES = ("memagent", "infmem", "rememr1")
DEFAULT = "memagent"


def make(name: str, tokenizer: Tokenizer, tokens: Sequence[int] = ()) -> Reader:
    """The reader `name` (one of NAMES) of a document of `tokens`, with the model's
    tokenizer where it needs one."""
    if name == "infmem":
        from memagent_cli.readers import infmem

        return infmem.reader(tokenizer, tokens)
    if name == "rememr1":
        from memagent_cli.readers import rememr1

        return rememr1.reader(
            lambda text: [tokenizer.detokenize([t]) for t in tokenizer.tokenize(text)]
        )
    if name == DEFAULT:
        return memagent
    raise UserError(f"The {name} reader is not in this memagent yet; use --reader memagent.")


def sampling(name: str) -> Sampling:
    """How the authors of reader `name` sampled for their reported numbers: InfMem's
    evaluation greedily (ruler_hqa.py: temperature 0, top_p 1), ReMemR1's at 0.7 and 0.95
    (test_qa.py), MemAgent's as its protocol says (0.7 and 0.95; protocol.md)."""
    if name == "infmem":
        from memagent_cli.readers import infmem

        return Sampling(infmem.TEMPERATURE, infmem.TOP_P)
    if name == "rememr1":
        from memagent_cli.readers import rememr1

        return Sampling(rememr1.TEMPERATURE, rememr1.TOP_P)
    return Sampling()


def context_needed(backend: Backend, questions: Sequence[str], settings: Settings) -> int:
    """Context tokens one call of `settings.reader` needs (reader.context_needed)."""
    if settings.reader == "rememr1":
        from memagent_cli.readers import rememr1

        return reader.context_needed(
            backend, questions, settings, templates=rememr1.TEMPLATES, memories=rememr1.MEMORIES
        )
    if settings.reader == "infmem":
        from memagent_cli.readers import infmem

        if not hasattr(backend, "complete"):
            raise UserError(
                f"The {backend.name} backend cannot send a prompt a reader writes whole, "
                "as --reader infmem does; read with llama.cpp in this process."
            )

        extra = infmem.extra_tokens(settings.chunk_tokens)
        history = infmem.HISTORY_TOKENS
        return reader.context_needed(
            backend, questions, settings, templates=infmem.TEMPLATES, extra=extra + history
        )
    return reader.context_needed(backend, questions, settings)
