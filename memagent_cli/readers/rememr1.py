"""ReMemR1 (arXiv 2509.23040): MemAgent's linear scan, where each step may also ask with
`<recall>query</recall>` for the best-matching earlier memory, shown on the next step.
No extra model calls: the recall is a TF-IDF search over the memories written so far.

Everything here is as the authors' evaluation runs it (syr-cn/ReMemR1 at 43e69f3,
`taskutils/memory_eval/utils/rememr1.py` and `tf_idf_retriever.py`, `run_eval.py`'s
ReMemR1 configs): the strings byte for byte, one user message per call through the
model's own chat template, the memory as the whole reply minus its recall tags. Their
past memories are a Python set, so a tie in the TF-IDF search went whichever way string
hashing put it; here it goes to the memory written last (docs/readers.md).
"""

from __future__ import annotations

import math
import re
from array import array
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from memagent_cli.backend import Sampling
from memagent_cli.chunking import Chunk, Tokenizer, token_pieces
from memagent_cli.reader import (
    Answer,
    Answering,
    Finished,
    Listener,
    Prompt,
    Reader,
    Reading,
    Settings,
    Step,
    StepFinished,
    StepStarted,
)
from memagent_cli.readers.spec import Spec, StepField

UPDATE_TEMPLATE = (
    "You are presented with a problem, a section of an article that may contain the answer "
    "to the problem, and a previous memory. You should generate response in the following "
    "format:\n- Output your thinking process in <thinking>your_thinking_process</thinking>."
    "\n- Read the provided section carefully and update the memory with the new information "
    "that helps to answer the problem in only one <update>the_updated_memory</update> "
    "action. Be sure to retain all relevant details from the previous memory while adding "
    "any new, useful information.\n- If you notice partial key evidence that is not enough "
    "to answer the problem, also output only one `<recall>query</recall>` (e.g. "
    "`<recall>who's the president of the United States?</recall>`) to retrieve information "
    "in previous memories.\n\n<problem> \n{prompt}\n</problem>\n\n<recalled_memory>\n"
    "{recalled_memory}\n</recalled_memory>\n\n<memory>\n{memory}\n</memory>\n\n<section>\n"
    "{chunk}\n</section>\n\nUpdated memory:\n"
)

FINAL_TEMPLATE = (
    "You are presented with a problem and a previous memory. Please answer the problem based "
    "on the previous memory and put the answer in \\boxed{{}}.\n\n<problem> \n{prompt}\n"
    "</problem>\n\n<recalled_memory>\n{recalled_memory}\n</recalled_memory>\n\n<memory>\n"
    "{memory}\n</memory>\n\nYour answer:\n"
)

INITIAL_MEMORY = "No previous memory"
NO_RECALL = "No memory was recalled."
REPLY_TOKENS = 2048  # RECURRENT_MAX_NEW of the ReMemR1 configs: updates and the answer
TEMPERATURE = 0.7  # test_qa.py calls with temperature=0.7, top_p=0.95
TOP_P = 0.95

Pieces = Callable[[str], Sequence[bytes]]
"""The model's tokens of a text (no BOS), each as its bytes: what TF-IDF counts."""


@dataclass(frozen=True)
class Update:
    """An update reply, parsed: the new memory (the reply minus its `<recall>` tags,
    `<thinking>` and `<update>` included) and the recall query, if any."""

    memory: str
    recall: str | None


@dataclass(frozen=True)
class State:
    """What the reader carries from step to step: the memory, the text the next prompt
    shows as recalled, and every distinct memory so far in the order first written
    (their set, with an order)."""

    memory: str = INITIAL_MEMORY
    recalled: str = NO_RECALL
    past: tuple[str, ...] = ()


def after_update(state: State, update: Update, memories: Memories) -> State:
    """The state after a step: the new memory joins the past ones before the recall is
    searched, so a recall may bring back the memory just written, as theirs does.
    `memories` holds the reading's past memories as TF-IDF reads them (any it does not
    hold yet are added)."""
    past = state.past if update.memory in state.past else (*state.past, update.memory)
    memories.extend(past)
    if update.recall is None:
        recalled = NO_RECALL
    else:
        # Their retriever returns None when no memory has a single term, and the next
        # prompt then reads "None".
        found = memories.top1(update.recall)
        recalled = "None" if found is None else past[found]
    return State(update.memory, recalled, past)


# --- prompts -------------------------------------------------------------------------


def render_update(question: str, memory: str, recalled: str, chunk: str) -> str:
    """The user message of one step, sent through the model's own chat template."""
    return UPDATE_TEMPLATE.format(
        prompt=question, chunk=chunk, memory=memory, recalled_memory=recalled
    )


def render_final(question: str, memory: str, recalled: str) -> str:
    """The final user message: the last memory and the last recall."""
    return FINAL_TEMPLATE.format(prompt=question, memory=memory, recalled_memory=recalled)


# --- replies -------------------------------------------------------------------------

# Their parsing is two regular expressions, `<recall>(.+)</recall>` (greedy, no DOTALL) for
# the query and `<recall>.*?</recall>` (DOTALL) removed for the memory, which re runs in
# quadratic time on a reply of unclosed tags. The functions below find the same text in
# linear time; tests/test_readers_protocol.py holds them against the expressions.
_OPEN, _CLOSE = "<recall>", "</recall>"


def _recall_query(reply: str) -> str | None:
    """What `<recall>(.+)</recall>` finds: from the first `<recall>` that has a `</recall>`
    later on its line, at least a character on, to the last such `</recall>`."""
    start = reply.find(_OPEN)
    while start >= 0:
        line_end = reply.find("\n", start)
        line_end = len(reply) if line_end < 0 else line_end
        close = reply.rfind(_CLOSE, start + len(_OPEN) + 1, line_end)
        if close >= 0:
            return reply[start + len(_OPEN) : close]
        if line_end == len(reply):  # a later `<recall>` on this line has less room still
            return None
        start = reply.find(_OPEN, line_end)
    return None


def _recalls_removed(reply: str) -> str:
    """`reply` with each `<recall>...</recall>` (the nearest close, across lines) removed."""
    kept, at = [], 0
    start = reply.find(_OPEN)
    while start >= 0:
        close = reply.find(_CLOSE, start + len(_OPEN))
        if close < 0:  # no later `<recall>` is closed either
            break
        kept.append(reply[at:start])
        at = close + len(_CLOSE)
        start = reply.find(_OPEN, at)
    kept.append(reply[at:])
    return "".join(kept)


def parse_update(reply: str) -> Update:
    """The memory is the reply with every closed `<recall>...</recall>` removed, then
    stripped. The query is the text from the first `<recall>` to the last `</recall>` of
    the same line (several tags on one line give one query spanning them); a tag that
    spans lines, is unclosed or empty gives none."""
    return Update(_recalls_removed(reply).strip(), _recall_query(reply))


_BRACES = re.compile("[{}]")


def _last_boxed(text: str) -> str | None:
    if "\\boxed " in text:
        return "\\boxed " + text.split("\\boxed ")[-1].split("$")[0]
    index = text.rfind("\\boxed")
    if index < 0:
        index = text.rfind("\\fbox")
        if index < 0:
            return None
    depth = 0
    for brace in _BRACES.finditer(text, index):
        depth += 1 if brace.group() == "{" else -1
        if brace.group() == "}" and depth == 0:
            return text[index : brace.end()]
    return None


def parse_answer(reply: str) -> str | None:
    """The answer in a final reply: after the last `</think>` if any, the content of the
    last `\\boxed{...}` (braces matched), or what follows the last `\\boxed ` up to a `$`.
    None without one, and where their extraction fails an assertion (`\\fbox{...}`, or
    `\\boxed` not followed by `{`)."""
    response = reply.strip()
    after = response.split("</think>")[-1].strip() if "</think>" in response else response
    boxed = _last_boxed(after or response)
    if boxed is None:
        return None
    if "\\boxed " in boxed:
        return boxed[len("\\boxed ") :]
    if not boxed.startswith("\\boxed{") or not boxed.endswith("}"):
        return None
    return boxed[len("\\boxed{") : -1]


# --- retrieval -----------------------------------------------------------------------


def _byte_level() -> dict[int, str]:
    """GPT-2's byte-to-character map, which Qwen's token strings are written in: a space
    is `Ġ`, a newline `Ċ`, printable ASCII itself."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shifted = iter(range(256, 512))
    return {b: chr(b) if b in printable else chr(next(shifted)) for b in range(256)}


_BYTE_LEVEL = _byte_level()


def terms(text: str, pieces: Pieces) -> list[str]:
    """TF-IDF's terms of a text: the model's token strings of the lowercased text, each
    with its `Ġ` (its spaces) removed, as their tokenizer wrapper writes them. A token
    that was only a space is the empty term, which counts like any other."""
    lowered = text.lower().lower()  # their vectorizer lowercases, then their tokenizer
    return ["".join(_BYTE_LEVEL[b] for b in piece if b != 0x20) for piece in pieces(lowered)]


class Terms:
    """Each text's terms, counted, found once: a memory is tokenized when it is written and
    never again at a later recall (through a server, a tokenize request each time)."""

    def __init__(self, pieces: Pieces) -> None:
        self._pieces = pieces
        self._counted: dict[str, Counter[str]] = {}

    def __call__(self, text: str) -> Counter[str]:
        counts = self._counted.get(text)
        if counts is None:
            counts = self._counted[text] = Counter(terms(text, self._pieces))
        return counts


class Memories:
    """The distinct memories of one reading so far, as TF-IDF reads them: each memory's
    term counts added once, when written, so that a search is arithmetic over the counts
    (numpy's, in C), not tokenizing and counting every memory again at every step."""

    def __init__(self, counted: Terms | Pieces) -> None:
        self._counted = counted if isinstance(counted, Terms) else Terms(counted)
        self._clear()

    def _clear(self) -> None:
        self.texts: list[str] = []
        self._columns: dict[str, int] = {}  # each term's column
        self._df = array("q")  # per column: memories holding the term
        # Per (memory, term) held: the memory's row, the term's column, its count.
        self._rows, self._cells, self._counts = array("q"), array("q"), array("d")

    def extend(self, memories: Sequence[str]) -> Memories:
        """Holds `memories`: those held must be their first ones, in order (a resumed or
        another reading starts from scratch)."""
        held = len(self.texts)
        if held > len(memories) or (held and memories[held - 1] != self.texts[-1]):
            self._clear()
            held = 0
        for memory in memories[held:]:
            row = len(self.texts)
            self.texts.append(memory)
            for term, count in self._counted(memory).items():
                column = self._columns.setdefault(term, len(self._columns))
                if column == len(self._df):
                    self._df.append(0)
                self._df[column] += 1
                self._rows.append(row)
                self._cells.append(column)
                self._counts.append(count)
        return self

    def scores(self, query: str) -> list[float] | None:
        """scikit-learn's TfidfVectorizer defaults (raw counts, idf ln((1 + n) / (1 + df))
        + 1, each row L2-normalized) fitted on the memories, and the cosine of the query's
        row with each memory's. None when the memories hold no term at all, where fitting
        fails."""
        import numpy as np

        if not self._columns:
            return None
        n = len(self.texts)
        df = np.frombuffer(self._df, dtype=np.int64)
        idf = np.log((1 + n) / (1 + df)) + 1
        rows = np.frombuffer(self._rows, dtype=np.int64)
        cells = np.frombuffer(self._cells, dtype=np.int64)
        weights = np.frombuffer(self._counts, dtype=np.float64) * idf[cells]
        norms = np.sqrt(np.bincount(rows, weights=weights * weights, minlength=n))
        asked = np.zeros(len(df))
        for term, count in self._counted(query).items():
            if term in self._columns:
                asked[self._columns[term]] = count * idf[self._columns[term]]
        length = math.sqrt(float(asked @ asked))
        if not length:
            return [0.0] * n
        dots = np.bincount(rows, weights=weights * (asked / length)[cells], minlength=n)
        unit = np.divide(dots, norms, out=np.zeros(n), where=norms > 0)
        return [float(score) for score in unit]

    def top1(self, query: str) -> int | None:
        """The index of the memory most like `query`. A tie goes to the memory written
        last, as a stable sort reversed (their `np.argsort(sims)[::-1]`) picks it when the
        memories are in the order written. None when the memories hold no term at all."""
        scores = self.scores(query)
        if scores is None or not query:
            return None
        best = max(scores)
        return max(i for i, score in enumerate(scores) if score == best)


def tfidf_scores(query: str, memories: Sequence[str], pieces: Pieces) -> list[float] | None:
    """Memories.scores of `memories`, tokenized with `pieces`."""
    return Memories(pieces).extend(memories).scores(query)


def top1(query: str, memories: Sequence[str], pieces: Pieces) -> int | None:
    """Memories.top1 of `memories`, tokenized with `pieces`."""
    return Memories(pieces).extend(memories).top1(query)


# --- the loop ------------------------------------------------------------------------


def reader(pieces: Pieces) -> Reader:
    """ReMemR1's loop, with `pieces` the model's tokens of a text (what TF-IDF counts),
    each text's asked once for every reading of the loop."""
    counted = Terms(pieces)

    def rememr1(
        question: str,
        chunks: Sequence[Chunk],
        settings: Settings,
        listener: Listener = lambda event: None,
        done: Sequence[Step] = (),
    ) -> Reading:
        steps, state, memories = list(done), State(), Memories(counted)
        for step in steps:  # an interrupted run's steps: their memories and last recall
            state = after_update(state, Update(step.memory, step.extra.get("recall")), memories)
        for chunk in chunks[len(steps) :]:
            listener(StepStarted(chunk, len(chunks)))
            message = render_update(question, state.memory, state.recalled, chunk.text)
            reply = yield Prompt(message, settings.memory_tokens)
            update = parse_update(reply.text)
            state = after_update(state, update, memories)
            recall = {} if update.recall is None else {"recall": update.recall}
            steps.append(Step(chunk, update.memory, reply, recall))
            listener(StepFinished(steps[-1], len(chunks)))
        listener(Answering(state.memory))
        message = render_final(question, state.memory, state.recalled)
        reply = yield Prompt(message, REPLY_TOKENS)
        answer = Answer(question, parse_answer(reply.text), reply.text, steps, reply)
        listener(Finished(answer))
        return answer

    return rememr1


def _loop(tokenizer: Tokenizer, tokens: Sequence[int]) -> Reader:
    return reader(token_pieces(tokenizer))


SPEC = Spec(
    name="rememr1",
    summary="recalls earlier memories",
    loop=_loop,
    templates={"update": UPDATE_TEMPLATE, "final": FINAL_TEMPLATE},
    bare=(render_update("", "", "", ""), render_final("", "", "")),
    sampling=Sampling(TEMPERATURE, TOP_P),
    memory_tokens=REPLY_TOKENS,
    answer_tokens=REPLY_TOKENS,
    memories=2,  # the last memory, and a recalled one
    # A step's query for an earlier memory: the next step is shown the memory it finds.
    fields=(StepField("recall", str, "asked to recall", lambda query: (repr(query),)),),
)
