"""InfMem (arXiv 2602.02704): before each chunk a planner either calls a BM25 search over
the document or says STOP; the memory update sees the units found and the chunk; after
three STOPs in a row it answers at once.

Everything here is as the authors' evaluation runs it (UCMP13753/InfMem at 4f4de32,
`taskutils/memory_eval/utils/infmem.py` with `run.py`'s `infmem` config): the strings
byte for byte, the prompt text they build themselves (Qwen-Agent's function-call system
message inside Qwen3's chat template, sent to `/completions`), the two thinking stages,
and the parsing. docs/readers.md says where each rule comes from and where their code
was nondeterministic or crashed, and what this module does there.
"""

from __future__ import annotations

import bisect
import codecs
import json
import math
import re
from collections import Counter
from collections.abc import Generator, Sequence
from dataclasses import dataclass, replace

from memagent_cli.backend import Backend, Generation, Raw, Sampling
from memagent_cli.chunking import Chunk, Tokenizer, detokenize_all, placed_by_bytes
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
    joined,
)
from memagent_cli.readers import chat as qwen
from memagent_cli.readers.spec import (
    USUAL_QUESTION,
    CallSize,
    Replies,
    Spec,
    StepField,
    Templates,
)

PLANNER_TEMPLATE = (
    "\nYou are a Retrieval Planner.  \n\nYour ONLY task is to decide whether to perform "
    "another retrieval using `retrievesearch`, or STOP retrieving.\n\nYou MUST NOT answer the "
    "QUESTION.  \nAnother model will use MEMORY to answer later.\n\nGuidelines:\n- Retrieval "
    "is cheap. Unless MEMORY clearly contains all essential information, you are encouraged to "
    "retrieve.\n- You may retrieve multiple times. At each step, refine your search direction."
    "\n- Avoid repeating any previous queries in RETRIEVAL_HISTORY (unless meaningfully "
    "refined).\n\nWhen deciding whether to retrieve again:\n1. Break the QUESTION into "
    "specific sub-questions or information needs.\n2. Compare these needs with what MEMORY "
    "already contains.\n3. Identify which facts are still missing, uncertain, or incomplete."
    "\n4. If something important is missing, design a NEW search query focused only on that "
    "missing information.\n   - You may explore related clues hinted in MEMORY.\n   - Queries "
    "should be concise, specific, and actionable.\n5. If MEMORY already contains all "
    "necessary information, choose to STOP.\n\nIf you choose retrieval, you MUST output a "
    "function call to `retrievesearch` with:\n- a new `query` (different from "
    "RETRIEVAL_HISTORY unless refined),\n- and a `top_k` suited to your confidence (small: "
    "focused; large: broad exploration).\n- In early retrieval steps, you may exlore more "
    "documents.\n- In later steps, focus on refining MEMORY.\n\n\nORIGINAL QUESTION:\n"
    "{prompt}\n\n<retrieval_history>\n{retrieval_history}\n</retrieval_history>\n\n\n\n"
    "CURRENT MEMORY:\n{memory}\n\n"
)

UPDATE_TEMPLATE = (
    "You are presented with a problem, a section of an article that may contain the answer "
    "to the problem, and a previous memory. Please read the provided section carefully and "
    "update the memory with the new information that helps to answer the problem.\n\nthe "
    "given section have two parts. One is reetrieved chunk, which are retrieved by given "
    "question. another is the recurrent chunk which are given recurrently. Both chunks might "
    "contain useful information, the retrieved chunk might have higher chance.\n\n\n\n"
    "<problem>\n{prompt}\n</problem>\n\n<retrieved_chunk>\n{retrieve}\n</retrieved_chunk>\n\n"
    "<recurrent_chunk>\n{chunk}\n</recurrent_chunk>\n\n<memory>\n{memory}\n</memory>\n\n\n"
    "Updated memory:\n"
)

FINAL_TEMPLATE = (
    "You are presented with a problem and a previous memory. Please answer the problem based "
    'on the previous memory and format your response as follows "Therefore, the answer is '
    '(insert answer here)".\n\n<problem> \n{prompt}\n</problem>\n\n<memory>\n{memory}\n'
    "</memory>\n\nYour answer:\n"
)

INITIAL_MEMORY = "No previous memory"
REPLY_TOKENS = 1024  # RECURRENT_MAX_NEW: the answer stage of every call
THINKING_TOKENS = 1024  # call_llm_text's thinking_budget: the thinking stage of every call
UNIT_TOKENS = 500  # RETRIEVE_CHUNK_SIZE
RESULTS = 4  # the units every search returns, whatever top_k the planner asks for
EARLY_STOP = 3
DEFAULT_TOP_K = 8  # TOP_K: what the history shows for a call whose arguments do not parse
TEMPERATURE = 0.0  # ruler_hqa.py calls with temperature=0, top_p=1
TOP_P = 1.0
THINKING_CLOSE = "\n\nConsidering the limited time, I must stop thinking now.\n</think>\n\n"

# Qwen-Agent's function-call markers (qwen_agent/llm/fncall_prompts/qwen_fncall_prompt.py).
FN_NAME = "✿FUNCTION✿"
FN_ARGS = "✿ARGS✿"
FN_RESULT = "✿RESULT✿"
FN_EXIT = "✿RETURN✿"

SEARCH_TOOL = "retrievesearch"
SEARCH_PARAMETERS = {
    "type": "object",
    "properties": {
        "query": {
            "type": "string",
            "description": "Concise search query focusing on key entities / concepts.",
        },
        "top_k": {
            "type": "integer",
            "description": "Number of chunks to retrieve (3-20).",
            "minimum": 3,
            "maximum": 20,
            "default": 8,
        },
    },
    "required": ["query"],
}

# Qwen-Agent's FN_CALL_TEMPLATE["en_parallel"] filled with the one tool, as
# QwenFnCallPrompt.preprocess_fncall_messages(lang="en", parallel_function_calls=True)
# writes it into the system message it adds.
TOOL_SYSTEM = (
    "# Tools\n\n## You have access to the following tools:\n\n"
    f"### {SEARCH_TOOL}\n\n{SEARCH_TOOL}: Search over pre-indexed context chunks using BM25. "
    f"Parameters: {json.dumps(SEARCH_PARAMETERS, ensure_ascii=False)} Format the arguments as "
    "a JSON object.\n\n"
    "## Insert the following command in your reply when you need to call N tools in parallel:"
    f"\n\n{FN_NAME}: The name of tool 1, should be one of [{SEARCH_TOOL}]\n"
    f"{FN_ARGS}: The input of tool 1\n{FN_NAME}: The name of tool 2\n"
    f"{FN_ARGS}: The input of tool 2\n...\n{FN_NAME}: The name of tool N\n"
    f"{FN_ARGS}: The input of tool N\n{FN_RESULT}: The result of tool 1\n"
    f"{FN_RESULT}: The result of tool 2\n...\n{FN_RESULT}: The result of tool N\n"
    f"{FN_EXIT}: Reply based on tool results. Images need to be rendered as ![](url)"
)


@dataclass(frozen=True)
class Search:
    """One search the planner asked for: what BM25 looks for, and the `top_k` as the
    retrieval history shows it (it changes nothing else: every search returns 4 units)."""

    query: str
    top_k: str


@dataclass(frozen=True)
class Call:
    """One function call found in a planner reply: the name and the raw arguments."""

    name: str
    arguments: str


@dataclass(frozen=True)
class Plan:
    """A planner reply, parsed: STOP (the word anywhere in the reply, thinking included),
    or the calls it made and the searches among them."""

    stop: bool
    calls: tuple[Call, ...] = ()
    searches: tuple[Search, ...] = ()

    @property
    def counts_as_stop(self) -> bool:
        """A STOP, or a reply with no call at all: both count towards the early stop."""
        return self.stop or not self.calls


@dataclass(frozen=True)
class State:
    """What the reader carries from step to step.

    `step` is the index of the chunk about to be read, so the number of chunks read
    (their evaluation reports `step + 1` for a reading that stops early); `searches` the
    whole retrieval history; `stops` the STOPs in a row; `query` the search whose units
    this step's update shows (the last of this step's plan), None when it made none."""

    step: int = 0
    memory: str = INITIAL_MEMORY
    searches: tuple[Search, ...] = ()
    stops: int = 0
    query: str | None = None

    @property
    def answering(self) -> bool:
        """Whether the planner has stopped often enough in a row to answer now."""
        return self.stops >= EARLY_STOP


def after_plan(state: State, plan: Plan) -> State:
    """The state once the planner has replied: its searches join the history, and the
    STOP count moves as their loop moves it (a call resets it to 0; a reply with neither
    STOP nor a call resets it and then counts 1)."""
    stops = state.stops if plan.stop else 0
    if plan.counts_as_stop:
        stops += 1
    query = plan.searches[-1].query if plan.searches else None
    return replace(state, searches=state.searches + plan.searches, stops=stops, query=query)


def after_update(state: State, memory: str) -> State:
    """The state once a chunk has been read: the next step, with the new memory."""
    return replace(state, step=state.step + 1, memory=memory, query=None)


# --- prompts -------------------------------------------------------------------------


def chat(user: str, system: str | None = None) -> str:
    """Qwen3's chat template (Qwen/Qwen3-4B's tokenizer, as their run.py loads it) for one
    user message after an optional system message, with the generation prompt and
    enable_thinking=True, which adds nothing after `<|im_start|>assistant\\n`."""
    return qwen.chat(user, system)


def retrieval_history(step: int, steps: int, searches: Sequence[Search]) -> str:
    """The `<retrieval_history>` block: the step (1-based) out of the chunks, then every
    search so far. It is never empty, so their "None yet." fallback never shows."""
    lines = (
        f"Step {i}: query={search.query!r}, top_k={search.top_k}"
        for i, search in enumerate(searches, 1)
    )
    head = f"Current retrieval step: {step + 1}  Maximum allowed retrieval steps: {steps}\n"
    return head + "\n".join(lines)


def render_planner(
    question: str, memory: str, step: int, steps: int, searches: Sequence[Search]
) -> str:
    """The planner's user message before chunk `step` (0-based) of `steps`."""
    history = retrieval_history(step, steps, searches)
    return PLANNER_TEMPLATE.format(prompt=question, memory=memory, retrieval_history=history)


def retrieved_block(units: Sequence[str]) -> str:
    """The `<retrieved_chunk>` block: the units found, ranked; empty without a search."""
    return "\n\n".join(f"[Retrieved #{rank}] {text}" for rank, text in enumerate(units, 1))


def render_update(question: str, memory: str, units: Sequence[str], chunk: str) -> str:
    """The memory update's user message: the units found and the chunk."""
    return UPDATE_TEMPLATE.format(
        prompt=question, retrieve=retrieved_block(units), chunk=chunk, memory=memory
    )


def render_final(question: str, memory: str) -> str:
    """The final call's user message."""
    return FINAL_TEMPLATE.format(prompt=question, memory=memory)


# --- the two thinking stages of every call -------------------------------------------


def closed_thinking(first: str) -> str:
    """The first stage's text (at most THINKING_TOKENS) as the second stage continues
    it: unchanged if it holds `</think>`, else with their fixed closing sentence."""
    return first if "</think>" in first else first.rstrip() + THINKING_CLOSE


def second_stage_prompt(prompt: str, first: str) -> str:
    """The text the second stage (at most REPLY_TOKENS) continues from."""
    return prompt + closed_thinking(first)


def joined_reply(first: str, second: str) -> str:
    """The reply the rest of the reader sees: both stages, as their client joins them."""
    return (closed_thinking(first) + second.strip()).strip()


# --- replies -------------------------------------------------------------------------

# Their parser is one regular expression (qwen_fncall_prompt.py's `parse_fncall`):
#
#   FN_NAME:\s*([^\n]+)\s*FN_ARGS:\s*([^✿]+?)(?=FN_RESULT|FN_EXIT|FN_NAME|$)   (DOTALL)
#
# which re runs in quadratic time (each `FN_NAME:` scans to the end of its line and back),
# hours for a hostile reply. `_calls` finds the same matches in linear time: the name is
# greedy, so it runs to the last place on its line where an `FN_ARGS:` whose arguments
# end well can follow; tests/test_readers_protocol.py holds it against the expression.
_NAME_MARK, _ARGS_MARK = FN_NAME + ":", FN_ARGS + ":"
_SPACE = re.compile(r"\s*")


def _calls(reply: str) -> list[tuple[str, str]]:
    """(name, arguments) of each match of their expression in `reply`, in order."""
    size = len(reply)
    newlines = [m.start() for m in re.finditer("\n", reply)]
    ends: dict[int, tuple[int, int] | None] = {}

    def spaces(at: int) -> int:  # the end of the whitespace from `at`
        match = _SPACE.match(reply, at)
        return match.end() if match else at

    def arguments(at: int) -> tuple[int, int] | None:
        """The arguments' span after an `FN_ARGS:` that ends at `at`, if their end is
        one the expression accepts: a marker, or the end of the reply."""
        if at in ends:
            return ends[at]
        start = spaces(at)
        mark = reply.find("✿", start)
        found: tuple[int, int] | None = None
        if mark < 0:  # `$`: the end, or before a newline that ends the reply
            if start < size:
                found = (start, size - 1 if reply.endswith("\n") else size)
            elif start > at:  # only whitespace: one character of it is the arguments
                found = (size - 1, size)
        elif reply.startswith((FN_RESULT, FN_EXIT, FN_NAME), mark):
            if start < mark:
                found = (start, mark)
            elif start > at:
                found = (mark - 1, mark)
        ends[at] = found
        return found

    # Every `FN_ARGS:` whose arguments end well, in order: the last of a line wins.
    good, at = [], reply.find(_ARGS_MARK)
    while at >= 0:
        if arguments(at + len(_ARGS_MARK)) is not None:
            good.append(at)
        at = reply.find(_ARGS_MARK, at + 1)

    def line_end(at: int) -> int:
        index = bisect.bisect_left(newlines, at)
        return newlines[index] if index < len(newlines) else size

    def match(after: int) -> tuple[int, int, tuple[int, int]] | None:
        """The name's span and the arguments' of a match whose `FN_NAME:` ends at `after`."""
        first = spaces(after)  # the name starts here, unless that fails
        if first < size:
            end = line_end(first)
            mark = spaces(end)  # an `FN_ARGS:` after the line, past whitespace only
            if end < size and reply.startswith(_ARGS_MARK, mark):
                span = arguments(mark + len(_ARGS_MARK))
                if span is not None:
                    return first, end, span
            index = bisect.bisect_left(good, end) - 1  # the last good one on the line
            if index >= 0 and good[index] > first:
                mark = good[index]
                span = arguments(mark + len(_ARGS_MARK))
                assert span is not None
                return first, mark, span
        # An `FN_ARGS:` right after the whitespace: the name is the last character of that
        # whitespace that is not a newline.
        if reply.startswith(_ARGS_MARK, first):
            span = arguments(first + len(_ARGS_MARK))
            name = next((i for i in range(first - 1, after - 1, -1) if reply[i] != "\n"), -1)
            if span is not None and name >= 0:
                return name, name + 1, span
        return None

    calls, at = [], reply.find(_NAME_MARK)
    while at >= 0:
        found = match(at + len(_NAME_MARK))
        if found is None:
            at = reply.find(_NAME_MARK, at + 1)
            continue
        start, end, (args_start, args_end) = found
        calls.append((reply[start:end], reply[args_start:args_end]))
        at = reply.find(_NAME_MARK, args_end)
    return calls


def _trailing_comment_removed(arguments: str) -> str:
    arguments = arguments.strip()
    if arguments.startswith("{") and (k := arguments.rfind("}")) > 0:
        arguments = arguments[: k + 1]
    if arguments.startswith("```") and (k := arguments.rfind("\n```")) > 0:
        arguments = arguments[: k + 4]
    return arguments


def _search(call: Call, question: str) -> Search:
    """The search a `retrievesearch` call asks for. Arguments that are not a JSON object
    give the question and top_k 8, as their loop falls back; so does a query that is not
    a string, where their search would crash (docs/readers.md)."""
    try:
        arguments = json.loads(call.arguments)
        query = arguments.get("query", question)
        top_k = arguments.get("top_k", DEFAULT_TOP_K)
    except Exception:  # their loop catches any failure here, as this does
        return Search(question, str(DEFAULT_TOP_K))
    if not isinstance(query, str):
        return Search(question, str(DEFAULT_TOP_K))
    return Search(query, str(top_k))


def parse_plan(reply: str, question: str) -> Plan:
    """A planner reply: STOP if the word appears anywhere (case-sensitive, thinking
    included); else every `✿FUNCTION✿: name ✿ARGS✿: arguments` in it."""
    if "STOP" in reply:
        return Plan(stop=True)
    calls = tuple(
        Call(name.strip(), _trailing_comment_removed(arguments.strip()))
        for name, arguments in _calls(reply)
    )
    searches = tuple(_search(c, question) for c in calls if c.name == SEARCH_TOOL)
    return Plan(stop=False, calls=calls, searches=searches)


def after_thinking(reply: str) -> str:
    """What follows the last `</think>`, stripped; the whole reply if there is none."""
    return reply.split("</think>")[-1].strip() if "</think>" in reply else reply


def parse_memory(reply: str) -> str:
    """The new memory from an update reply: what follows the thinking."""
    return after_thinking(reply)


def parse_answer(reply: str) -> str | None:
    """The answer in a final reply: after the thinking, asterisks removed, what follows
    the last "the answer is" (case-sensitive), stripped of spaces and full stops; None
    when the phrase is missing."""
    response = after_thinking(reply).strip().replace("*", "")
    if "the answer is" not in response:
        return None
    answer = response.rsplit("the answer is", 1)[-1].strip()
    answer = answer.replace("<｜Assistant｜>", "").replace("<｜end▁of▁sentence｜>", "")
    return answer.strip().strip(".").strip()


# --- retrieval -----------------------------------------------------------------------


@dataclass(frozen=True)
class Unit:
    """A retrieval unit: up to UNIT_TOKENS tokens inside one chunk."""

    chunk: int
    token_start: int
    token_end: int


def units(chunks: Sequence[tuple[int, int]], size: int = UNIT_TOKENS) -> list[Unit]:
    """The units of a document cut into chunks (token spans): each chunk in windows of
    `size`, restarting at each chunk, the last of each maybe shorter. Each unit's text is
    its tokens detokenized on their own."""
    return [
        Unit(index, start, min(end, start + size))
        for index, (chunk_start, end) in enumerate(chunks)
        for start in range(chunk_start, end, size)
    ]


def unit_chars(
    found: Sequence[Unit], raw: Sequence[bytes], chunks: Sequence[Chunk]
) -> list[tuple[int, int]]:
    """Where each of a document's units (`found`: all of them, in order, as `units` cuts
    `chunks`) sits in its characters, given each unit's bytes: counted as
    chunking.make_chunks counts a chunk's (a character split between two units counts in
    the unit where it ends), inside its chunk. A server that only detokenizes gives a
    character a unit cuts in two as U+FFFD on both sides of the cut: then the units are
    placed by the document's own bytes, as chunks are (placed_by_bytes)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    ends, count = [], 0
    for index, data in enumerate(raw):
        count += len(decoder.decode(data, final=index == len(raw) - 1))
        ends.append(count)
    normal = chunks[0].normal if chunks else None
    read = normal.text if normal is not None else chunks[0].document if chunks else ""
    if read and count != len(read):
        texts = [data.decode("utf-8", errors="replace") for data in raw]
        ends = placed_by_bytes(read, texts) or ends
    placed: list[tuple[int, int]] = []
    for unit, start, end in zip(found, [0, *ends[:-1]], ends, strict=True):
        chunk = chunks[unit.chunk]
        if normal is not None:  # in the document as extracted (NFC text: Normalized)
            start, end = normal.original(start), normal.original(end)
        low, high = chunk.char_start, chunk.char_end
        start = low if unit.token_start == chunk.token_start else min(max(start, low), high)
        end = high if unit.token_end == chunk.token_end else min(max(end, start), high)
        placed.append((start, end))
    return placed


def words(text: str) -> list[str]:
    """BM25's terms: the text lowercased, split on whitespace."""
    return text.lower().split()


@dataclass(frozen=True)
class BM25:
    """rank_bm25.BM25Okapi (0.2.2) over the units' words: k1 1.5, b 0.75, and idf
    log(N - n + 0.5) - log(n + 0.5) with a negative idf raised to 0.25 times the mean
    idf. Scores are computed in the same order of float operations as its numpy code."""

    frequencies: tuple[dict[str, int], ...]
    lengths: tuple[int, ...]
    idf: dict[str, float]
    average_length: float
    k1: float = 1.5
    b: float = 0.75

    @classmethod
    def build(
        cls, texts: Sequence[str], k1: float = 1.5, b: float = 0.75, epsilon: float = 0.25
    ) -> BM25:
        corpus = [words(text) for text in texts]
        if not corpus:
            raise ValueError("BM25 needs at least one unit")
        frequencies = tuple(dict(Counter(document)) for document in corpus)
        documents_with: Counter[str] = Counter()
        for counts in frequencies:
            documents_with.update(counts.keys())
        n = len(corpus)
        idf = {
            word: math.log(n - freq + 0.5) - math.log(freq + 0.5)
            for word, freq in documents_with.items()
        }
        total = 0.0  # a plain running sum, as theirs: Python 3.12's sum() compensates
        for value in idf.values():
            total += value
        floor = epsilon * (total / len(idf)) if idf else 0.0
        idf = {word: (floor if value < 0 else value) for word, value in idf.items()}
        lengths = tuple(len(document) for document in corpus)
        return cls(frequencies, lengths, idf, sum(lengths) / n, k1, b)

    def scores(self, query: Sequence[str]) -> list[float]:
        """The score of every unit for the query's words (a repeated word counts again)."""
        k1, b = self.k1, self.b
        scores = [0.0] * len(self.lengths)
        if self.average_length == 0:  # every unit empty: theirs divides 0 by 0
            return scores
        for word in query:
            idf = self.idf.get(word) or 0
            for i, (counts, length) in enumerate(zip(self.frequencies, self.lengths, strict=True)):
                freq = counts.get(word) or 0
                scores[i] += idf * (
                    freq * (k1 + 1) / (freq + k1 * (1 - b + b * length / self.average_length))
                )
        return scores

    def search(self, query: str, n: int = RESULTS) -> list[int]:
        """The indices of the `n` best units for `query`, best first. Their numpy argsort
        orders ties as it likes; here a tie goes to the unit that comes first in the
        document, as a stable sort would."""
        scores = self.scores(words(query))
        return sorted(range(len(scores)), key=lambda i: -scores[i])[:n]


# --- the loop ------------------------------------------------------------------------


def raw_chat(user: str, system: str | None = None) -> Raw:
    """`chat` as a prompt written whole: the same text, in which only Qwen3's turn markers
    are markup, so the words of a document, a memory or a question stay plain text."""
    return qwen.raw_chat(user, system)


def _thought(
    prompt: Raw, settings: Settings
) -> Generator[Prompt, Generation, tuple[str, Generation]]:
    """One call in two stages, as their client makes it: thinking (at most THINKING_TOKENS),
    then the reply after the thinking, closed if it was not (at most the memory's tokens,
    1024 by default as theirs). The joined reply, and both stages' cost."""
    first = yield Prompt("", THINKING_TOKENS, raw=prompt)
    closed = (*prompt, (closed_thinking(first.text), False))
    second = yield Prompt("", settings.memory_tokens, raw=closed)
    return joined_reply(first.text, second.text), joined(first, second)


def reader(tokenizer: Tokenizer, tokens: Sequence[int]) -> Reader:
    """InfMem's loop over a document of `tokens`; `tokenizer` gives each unit's text. The
    BM25 index over the units is built on first use, once for every question."""
    built: list[tuple[list[Unit], list[str], list[tuple[int, int]], BM25 | None]] = []

    def search_index(
        chunks: Sequence[Chunk],
    ) -> tuple[list[Unit], list[str], list[tuple[int, int]], BM25 | None]:
        if not built:
            found = units([(c.token_start, c.token_end) for c in chunks])
            # In few requests through a server: none where its tokens came with their bytes.
            raw = detokenize_all(tokenizer, [tokens[u.token_start : u.token_end] for u in found])
            texts = [data.decode("utf-8", errors="replace") for data in raw]
            chars = unit_chars(found, raw, chunks)
            built.append((found, texts, chars, BM25.build(texts) if texts else None))
        return built[0]

    def infmem(
        question: str,
        chunks: Sequence[Chunk],
        settings: Settings,
        listener: Listener = lambda event: None,
        done: Sequence[Step] = (),
    ) -> Reading:
        found, texts, chars, index = search_index(chunks)
        steps, state = list(done), State()
        for step in steps:  # an interrupted run's steps: their searches, STOPs and memory
            searches = tuple(Search(*search) for search in step.extra.get("searches", ()))
            stops = step.extra.get("stops", 0)
            state = replace(state, searches=state.searches + searches, stops=stops)
            state = after_update(state, step.memory)
        stopped = None
        for chunk in chunks[len(steps) :]:
            listener(StepStarted(chunk, len(chunks)))
            user = render_planner(question, state.memory, state.step, len(chunks), state.searches)
            reply, planning = yield from _thought(raw_chat(user, TOOL_SYSTEM), settings)
            plan = parse_plan(reply, question)
            state = after_plan(state, plan)
            if state.answering:
                stopped = f"the planner said STOP {EARLY_STOP} times in a row"
                break
            shown = index.search(state.query) if index and state.query is not None else []
            user = render_update(question, state.memory, [texts[i] for i in shown], chunk.text)
            reply, update = yield from _thought(raw_chat(user), settings)
            state = after_update(state, parse_memory(reply))
            steps.append(
                Step(
                    chunk,
                    state.memory,
                    joined(planning, update),
                    _extra(plan.searches, state.stops),
                    found=tuple((found[i].token_start, found[i].token_end) for i in shown),
                    found_chars=tuple(chars[i] for i in shown),
                )
            )
            listener(StepFinished(steps[-1], len(chunks)))
        listener(Answering(state.memory, stopped))
        user = render_final(question, state.memory)
        reply, final = yield from _thought(raw_chat(user), settings)
        answer = Answer(question, parse_answer(reply), reply, steps, final, stopped)
        listener(Finished(answer))
        return answer

    return infmem


# The planner is shown every search so far, and their server cut nothing (their InfMem
# config's RECURRENT_MAX_CONTEXT_LEN is 1e11): the room for its retrieval history grows with
# the document, a search a step of SEARCH_TOKENS (a line "Step 12: query='...', top_k=5"
# with a query of about 15 words), and HISTORY_TOKENS at least (about 40 searches).
HISTORY_TOKENS = 1024
SEARCH_TOKENS = 24


def extra_tokens(chunk_tokens: int, steps: int = 0) -> int:
    """Tokens a call needs beyond MemAgent's parts, for chunks of `chunk_tokens` and a
    document of `steps` chunks: the units found, the thinking stage the reply continues,
    and the planner's retrieval history."""
    history = max(HISTORY_TOKENS, steps * SEARCH_TOKENS)
    return RESULTS * min(UNIT_TOKENS, chunk_tokens) + THINKING_TOKENS + history


def _price(
    spec: Spec,
    chunks: Sequence[int],
    templates: Templates,
    replies: Replies,
    memory: int,
    first_memory: int,
) -> list[CallSize]:
    """A planner call and an update call a chunk, a search every step, then the answer; each
    call thinks first, and its second stage continues the first's prompt in the cache."""
    calls, shown = [], first_memory
    for tokens in chunks:
        units = RESULTS * min(UNIT_TOKENS, tokens)
        calls.append(CallSize(templates.planner + shown, replies.update))
        calls.append(CallSize(templates.update + shown + units + tokens, replies.update))
        shown = memory
    return [*calls, CallSize(templates.final + shown, replies.answer)]


def _templates(spec: Spec, backend: Backend, steps: int) -> Templates:
    """Its calls' tokens with nothing filled in: the prompts it writes whole, chat included."""
    question = len(backend.tokenize(USUAL_QUESTION))

    def sized(text: str) -> int:
        return len(backend.tokenize(text)) + question

    return Templates(
        update=sized(chat(render_update("", "", [], ""))),
        final=sized(chat(render_final("", ""))),
        planner=sized(chat(render_planner("", "", 0, steps, ()))),
    )


def _extra(searches: Sequence[Search], stops: int) -> dict[str, object]:
    """What a step keeps of its plan (SEARCHES, STOPS): the searches asked for, and the
    STOPs in a row so far where there are any."""
    extra: dict[str, object] = {}
    if searches:
        extra["searches"] = tuple((search.query, search.top_k) for search in searches)
    if stops:
        extra["stops"] = stops
    return extra


SEARCHES = StepField(
    "searches",
    "pairs",
    "searched",
    lambda searches: [f"{query!r} (top_k {top_k})" for query, top_k in searches],
    empty=(),
)
STOPS = StepField(
    "stops",
    int,
    "planner",
    lambda stops: (f"no search; STOP {stops} in a row ({EARLY_STOP} end the reading)",),
    empty=0,
)

SPEC = Spec(
    name="infmem",
    summary="searches, stops early",
    loop=reader,
    templates={"planner": PLANNER_TEMPLATE, "update": UPDATE_TEMPLATE, "final": FINAL_TEMPLATE},
    bare=(render_update("", "", [], ""), render_final("", "")),
    sampling=Sampling(TEMPERATURE, TOP_P),
    answer_tokens=REPLY_TOKENS,
    thinking_tokens=THINKING_TOKENS,
    step_calls=2,
    extra_tokens=extra_tokens,
    stops_early=f"its planner may say STOP {EARLY_STOP} times in a row",
    grows="InfMem's planner is shown every search so far",
    writes_whole=True,
    price=_price,
    template_tokens=_templates,
    fields=(SEARCHES, STOPS),
)
