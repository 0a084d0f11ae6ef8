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
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from memagent_cli.backend import Sampling
from memagent_cli.chunking import Chunk, Tokenizer
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
from memagent_cli.readers.spec import Spec

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


def after_update(state: State, update: Update, pieces: Pieces) -> State:
    """The state after a step: the new memory joins the past ones before the recall is
    searched, so a recall may bring back the memory just written, as theirs does."""
    past = state.past if update.memory in state.past else (*state.past, update.memory)
    if update.recall is None:
        recalled = NO_RECALL
    else:
        # Their retriever returns None when no memory has a single term, and the next
        # prompt then reads "None".
        found = top1(update.recall, past, pieces)
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


def tfidf_scores(query: str, memories: Sequence[str], pieces: Pieces) -> list[float] | None:
    """scikit-learn's TfidfVectorizer defaults (raw counts, idf ln((1 + n) / (1 + df)) + 1,
    each row L2-normalized) fitted on the memories, and the cosine of the query's row with
    each memory's. None when the memories hold no term at all, where fitting fails."""
    documents = [Counter(terms(memory, pieces)) for memory in memories]
    df: Counter[str] = Counter()
    for counts in documents:
        df.update(counts.keys())
    if not df:
        return None
    n = len(documents)
    idf = {term: math.log((1 + n) / (1 + count)) + 1 for term, count in df.items()}

    def normalized(counts: Counter[str]) -> dict[str, float]:
        weights = {term: count * idf[term] for term, count in counts.items() if term in idf}
        norm = math.sqrt(sum(w * w for w in weights.values()))
        return {term: w / norm for term, w in weights.items()} if norm else {}

    asked = normalized(Counter(terms(query, pieces)))
    rows = [normalized(counts) for counts in documents]
    return [sum(w * row.get(term, 0.0) for term, w in asked.items()) for row in rows]


def top1(query: str, memories: Sequence[str], pieces: Pieces) -> int | None:
    """The index of the memory most like `query`. A tie goes to the memory written last,
    as a stable sort reversed (their `np.argsort(sims)[::-1]`) picks it when the memories
    are in the order written. None when the memories hold no term at all."""
    scores = tfidf_scores(query, memories, pieces)
    if scores is None or not query:
        return None
    best = max(scores)
    return max(i for i, score in enumerate(scores) if score == best)


# --- the loop ------------------------------------------------------------------------


def _remembered(pieces: Pieces) -> Pieces:
    """`pieces`, each text's kept: every recall fits TF-IDF anew on every past memory, as
    their code does, and a memory's tokens never change; tokenized again at each recall,
    the memories would make a step's work (and its requests through a server) grow with
    the steps before it."""
    known: dict[str, Sequence[bytes]] = {}

    def remembered(text: str) -> Sequence[bytes]:
        found = known.get(text)
        if found is None:
            found = known[text] = pieces(text)
        return found

    return remembered


def reader(model_pieces: Pieces) -> Reader:
    """ReMemR1's loop, with `model_pieces` the model's tokens of a text (what TF-IDF
    counts), each text's tokenized once per reading."""

    def rememr1(
        question: str,
        chunks: Sequence[Chunk],
        settings: Settings,
        listener: Listener = lambda event: None,
        done: Sequence[Step] = (),
    ) -> Reading:
        pieces = _remembered(model_pieces)
        steps, state = list(done), State()
        for step in steps:  # an interrupted run's steps: their memories and last recall
            state = after_update(state, Update(step.memory, step.recall), pieces)
        for chunk in chunks[len(steps) :]:
            listener(StepStarted(chunk, len(chunks)))
            message = render_update(question, state.memory, state.recalled, chunk.text)
            reply = yield Prompt(message, settings.memory_tokens)
            update = parse_update(reply.text)
            state = after_update(state, update, pieces)
            steps.append(Step(chunk, update.memory, reply, recall=update.recall))
            listener(StepFinished(steps[-1], len(chunks)))
        listener(Answering(state.memory))
        message = render_final(question, state.memory, state.recalled)
        reply = yield Prompt(message, REPLY_TOKENS)
        answer = Answer(question, parse_answer(reply.text), reply.text, steps, reply)
        listener(Finished(answer))
        return answer

    return rememr1


def _loop(tokenizer: Tokenizer, tokens: Sequence[int]) -> Reader:
    return reader(lambda text: [tokenizer.detokenize([t]) for t in tokenizer.tokenize(text)])


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
)
