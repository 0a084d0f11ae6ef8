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


_BRACES = re.compile("[{}]")


def extract_boxed(reply: str) -> str | None:
    """Content of the last `\\boxed{...}` in `reply`, braces matched; None if there is none.
    An unclosed box falls back to the one before it. One pass over the braces finds where
    each box closes, so a reply of many unclosed boxes costs no more than its length."""
    marker = "\\boxed{"
    starts = []  # where each box's content starts
    at = reply.find(marker)
    while at >= 0:
        starts.append(at + len(marker))
        at = reply.find(marker, at + 1)
    if not starts:
        return None
    boxes = {start - 1 for start in starts}  # the positions of their opening braces
    closes: dict[int, int] = {}
    open_braces: list[int] = []
    for brace in _BRACES.finditer(reply, starts[0] - 1):
        if brace.group() == "{":
            open_braces.append(brace.start())
        elif open_braces and (opened := open_braces.pop()) in boxes:
            closes[opened] = brace.start()
    for start in reversed(starts):
        if start - 1 in closes:
            return reply[start : closes[start - 1]]
    return None


_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """Lowercase, drop punctuation and articles, collapse whitespace (SQuAD style)."""
    text = text.lower().translate(_PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def needle_recall(prediction: str, expected: list[str]) -> float:
    """RULER needle score: the fraction of expected values found in the prediction."""
    if not expected:
        return 0.0
    found = sum(1 for value in expected if value.lower() in prediction.lower())
    return found / len(expected)
