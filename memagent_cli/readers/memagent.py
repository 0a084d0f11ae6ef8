"""MemAgent (arXiv 2507.02259): fold every chunk into a memory that each update overwrites,
then answer from the last memory. Its loop is reader.py's `memagent`, the reference every
other reader is read beside; its templates are protocol.py's."""

from __future__ import annotations

from collections.abc import Sequence

from memagent_cli import protocol
from memagent_cli.chunking import Tokenizer
from memagent_cli.reader import Reader, memagent
from memagent_cli.readers.spec import Spec


def _loop(tokenizer: Tokenizer, tokens: Sequence[int]) -> Reader:
    return memagent


SPEC = Spec(
    name=protocol.READER,
    summary="every chunk into the memory",
    loop=_loop,
    templates={"update": protocol.UPDATE_TEMPLATE, "final": protocol.FINAL_TEMPLATE},
    bare=protocol.BARE_TEMPLATES,
    implied=True,
)
