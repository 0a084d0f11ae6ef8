"""Which spellings in a text a server would read as the served model's chat control tokens:
llama-server, vLLM and SGLang tokenize a chat prompt, and a completion's prompt, with
them, so a document that spells `<|im_end|>` there can end a turn."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from memagent_cli.backends.openai.client import BackendError

# What a control token looks like: ChatML's and Llama 3's `<|im_end|>`, `<|eot_id|>`;
# DeepSeek's `<｜end▁of▁sentence｜>`; tags such as `</s>` and `<start_of_turn>`; Mistral's
# `[INST]`. Only these shapes are looked for.
_SHAPED = re.compile(
    r"<\|[^\s<>|]{1,64}\|>|<｜[^\s<>｜]{1,64}｜>|</?[A-Za-z_][\w.:-]{0,63}>|\[/?[A-Za-z_]\w{0,31}\]"
)
# Markup where the server cannot say which spellings are its model's control tokens: any
# `<|...|>` or `<｜...｜>`, the spellings of its chat template (llama-server's /props), and
# these, of the chat formats of Llama 2 and Mistral, Gemma, and SentencePiece models.
KNOWN = frozenset(
    {
        "<s>",
        "</s>",
        "<unk>",
        "<pad>",
        "<bos>",
        "<eos>",
        "<start_of_turn>",
        "<end_of_turn>",
        "[INST]",
        "[/INST]",
        "[SYSTEM_PROMPT]",
        "[/SYSTEM_PROMPT]",
        "[TOOL_CALLS]",
        "[AVAILABLE_TOOLS]",
        "[/AVAILABLE_TOOLS]",
        "[TOOL_RESULTS]",
        "[/TOOL_RESULTS]",
    }
)
_BATCH_BYTES = 1 << 16  # of spellings asked about in one pair of requests


def spelled(text: str) -> list[str]:
    """The distinct spellings in `text` shaped as chat control tokens, in order."""
    return list(dict.fromkeys(match.group() for match in _SHAPED.finditer(text)))


def _bracketed(spelling: str) -> bool:
    return spelling.startswith(("<|", "<｜"))


class Markup:
    """The served model's markup among the spellings of texts, each spelling asked about
    once. Where the server tokenizes text with and without its control tokens (llama-server's
    /tokenize and `parse_special`), a spelling is markup exactly when the two differ; else
    it is markup when it is `<|...|>`-shaped, in the server's chat template, or KNOWN."""

    def __init__(
        self, props: Callable[[], dict[str, Any]], reads_markup: Callable[[str], bool] | None
    ) -> None:
        """`props()`: llama-server's /props, or nothing; `reads_markup(text)`: whether the
        server's tokens of `text` differ with its control tokens parsed, None where it
        cannot say."""
        self._props, self._reads_markup = props, reads_markup
        self._known: dict[str, bool] = {}
        self._template: frozenset[str] | None = None  # its chat template's spellings
        self._exact: bool | None = None  # whether reads_markup is trusted: found once

    def first(self, text: str) -> str | None:
        """The first spelling in `text` that the server would read as markup; None."""
        shaped = spelled(text)
        self._ask([s for s in shaped if s not in self._known])
        return next((s for s in shaped if self._known[s]), None)

    def _ask(self, spellings: list[str]) -> None:
        if not spellings:
            return
        if self._exact is None:
            self._exact = self._trusted()
        if not self._exact:
            template = self._template_spellings()
            for s in spellings:
                self._known[s] = _bracketed(s) or s in KNOWN or s in template
            return
        for batch in _batches(spellings):
            self._split(batch)

    def _split(self, spellings: list[str]) -> None:
        """Asks about a batch at once; where it holds markup, about each half."""
        assert self._reads_markup is not None
        if not self._reads_markup("\n".join(spellings)):
            self._known.update(dict.fromkeys(spellings, False))
        elif len(spellings) == 1:
            self._known[spellings[0]] = True
        else:
            half = len(spellings) // 2
            self._split(spellings[:half])
            self._split(spellings[half:])

    def _trusted(self) -> bool:
        """Whether `reads_markup` tells: it finds markup among the chat template's own
        spellings (a server that took no notice of `parse_special` would find none)."""
        template = self._template_spellings()
        if self._reads_markup is None or not template:
            return False
        try:
            return self._reads_markup("\n".join(sorted(template)))
        except BackendError:
            return False

    def _template_spellings(self) -> frozenset[str]:
        if self._template is None:
            template = self._props().get("chat_template")
            self._template = frozenset(spelled(template) if isinstance(template, str) else ())
        return self._template


def _batches(spellings: list[str]) -> Iterable[list[str]]:
    batch: list[str] = []
    size = 0
    for spelling in spellings:
        if batch and size + len(spelling) > _BATCH_BYTES:
            yield batch
            batch, size = [], 0
        batch.append(spelling)
        size += len(spelling) + 1
    if batch:
        yield batch
