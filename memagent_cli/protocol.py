"""The MemAgent protocol: templates, initial memory, reply handling and scoring.

These strings are an interface the released models were trained on (arXiv 2507.02259 and
the authors' code); they must stay byte-exact, as tests/test_protocol.py checks against a
copy made by hand.
"""

from __future__ import annotations

import re
import string

UPDATE_TEMPLATE = (
    "You are presented with a problem, a section of an article that may contain the answer "
    "to the problem, and a previous memory. Please read the provided section carefully and "
    "update the memory with the new information that helps to answer the problem. Be sure to "
    "retain all relevant details from the previous memory while adding any new, useful "
    "information.\n\n<problem> \n{prompt}\n</problem>\n\n<memory>\n{memory}\n</memory>\n\n"
    "<section>\n{chunk}\n</section>\n\nUpdated memory:\n"
)

FINAL_TEMPLATE = (
    "You are presented with a problem and a previous memory. Please answer the problem based "
    "on the previous memory and put the answer in \\boxed{{}}.\n\n<problem> \n{prompt}\n"
    "</problem>\n\n<memory>\n{memory}\n</memory>\n\nYour answer:\n"
)

INITIAL_MEMORY = "No previous memory"
READER = "memagent"  # the reader these templates are (readers/memagent.py)
FINAL_MAX_TOKENS = 1024
DEFAULT_CHUNK_TOKENS = 5000
DEFAULT_MEMORY_TOKENS = 1024


def render_update(question: str, memory: str, chunk: str) -> str:
    """The user message that asks the model to fold one chunk into its memory."""
    return UPDATE_TEMPLATE.format(prompt=question, memory=memory, chunk=chunk)


def render_final(question: str, memory: str) -> str:
    """The user message that asks the model to answer from its last memory."""
    return FINAL_TEMPLATE.format(prompt=question, memory=memory)


# Both prompts with nothing filled in: what a call adds to its parts.
BARE_TEMPLATES = (render_update("", "", ""), render_final("", ""))


def strip_think(reply: str) -> str:
    """Keep only what follows the last `</think>`, as the trained models expect."""
    marker = "</think>"
    index = reply.rfind(marker)
    return reply if index < 0 else reply[index + len(marker) :]


def extract_boxed(reply: str) -> str | None:
    """Content of the last `\\boxed{...}` in `reply`, braces matched; None if there is none."""
    marker = "\\boxed{"
    start = reply.rfind(marker)
    while start >= 0:
        depth = 0
        for i in range(start + len(marker) - 1, len(reply)):
            if reply[i] == "{":
                depth += 1
            elif reply[i] == "}":
                depth -= 1
                if depth == 0:
                    return reply[start + len(marker) : i]
        # Unclosed box: fall back to the one before it.
        start = reply.rfind(marker, 0, start)
    return None


def normalize_answer(text: str) -> str:
    """Lowercase, drop punctuation and articles, collapse whitespace (SQuAD style)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def needle_recall(prediction: str, expected: list[str]) -> float:
    """RULER needle score: the fraction of expected values found in the prediction."""
    if not expected:
        return 0.0
    found = sum(1 for value in expected if value.lower() in prediction.lower())
    return found / len(expected)
