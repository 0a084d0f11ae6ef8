"""MemReread (arXiv 2605.10268): MemAgent's pass over the document, then, while its memory
lacks the answer, a sub-question, a reread of the whole document for it, and its answer
integrated into the memory; at most three rereads, then the answer.

Everything here is as the authors' evaluation runs it (iiGray/MemReread at c5393fb,
`recursive/prompts.py` filled as `recursive/tools.py` fills it, the loop of
`exp/interface/mem_reread_api.py` with `quick_start.py`'s and `run_eval*.sh`'s settings):
the strings byte for byte, one user message per call in Qwen3's chat template with thinking
off, their reply limits and sampling, and their parsing. docs/readers.md says where each
rule comes from, and what this module does where their code crashed.

A reread's steps are steps of the trace, each naming the chunk it read again
(StepRecord.chunk) and the sub-question it read for; the last step of a reread also keeps
the sub-answer and the memory the integration left, so that a resumed reading asks what
the whole one would have asked.
"""

from __future__ import annotations

import re
from collections.abc import Generator, Sequence
from dataclasses import dataclass

from memagent_cli import protocol
from memagent_cli.backend import Backend, Generation, Raw, Sampling
from memagent_cli.chunking import Chunk, Tokenizer
from memagent_cli.errors import BudgetError, UserError
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

# Their reading template is MemAgent's update template, byte for byte: every read,
# of the first pass and of each reread, is MemAgent's.
READ_TEMPLATE = protocol.UPDATE_TEMPLATE

DECOMPOSE_TEMPLATE = (
    "You are a Question Analysis and Query Generation Agent.\nYou will receive a QUESTION, a "
    "MEMORY containing known facts and evidence, and a QUERY_HISTORY containing previously "
    "submitted exploratory queries with their results. Your task is to analyze whether the "
    "information in the MEMORY is sufficient to fully answer the QUESTION. If it is "
    "insufficient, you must generate a single targeted exploratory query to fill the most "
    "critical gap.\n\nCritical Rules & Analysis Steps:\n1. Focus on QUESTION: Evaluate only "
    "whether MEMORY can answer the current QUESTION. Do not attempt to answer or re-query any "
    "other questions.\n2. Compare needs with MEMORY: Break the QUESTION down into specific "
    "information needs and compare them with what the MEMORY already contains. Identify if any "
    "crucial facts are still missing, uncertain, or incomplete.\n3. Review QUERY_HISTORY: "
    "Avoid repeating any query already asked and recorded in QUERY_HISTORY.\n4. You MUST NOT "
    "answer the QUESTION directly. Your output must strictly follow the decision logic below.\n"
    "\nDecision Logic & Actions:\n- IF SUFFICIENT: If the MEMORY already contains all "
    "necessary information to fully address the QUESTION, you must stop immediately. Do not "
    "generate any query and do not generate any further text.\n- IF INSUFFICIENT: If the "
    "MEMORY lacks necessary information for the QUESTION, you must leverage the known "
    "information in the MEMORY to identify and submit the single highest-priority exploratory "
    "query that must be resolved first to push the QUESTION forward.\n\nGuidelines for the "
    "Priority Query (Only if MEMORY is insufficient for the QUESTION):\n1. Highest Priority: "
    "Among all possible information gaps for the QUESTION, select only the one query whose "
    "resolution is most critical and foundational for answering the QUESTION.\n2. No "
    "Repetition: The query must NOT duplicate any query already present in the QUERY_HISTORY. "
    "Review the history carefully and ensure your proposed query is novel and represents "
    "genuine progress.\n3. Independence: The query must be answerable in isolation without "
    "requiring answers to other queries.\n4. Sufficiency: Resolving this query, combined with "
    "the existing MEMORY, must meaningfully progress toward fully resolving the QUESTION.\n5. "
    "Self-Contained Expression: The query must be fully self-contained and free of any "
    "references to the original QUESTION, MEMORY, or external context. Never use pronouns, "
    'option labels, or context-dependent phrases like "the entity mentioned above", "option '
    'A", or "this event". Instead, explicitly state all relevant entities, values, and '
    "content.\n6. Output Format: Submit exclusively this single highest-priority query by "
    "wrapping it in <query> tags. Output exactly one query; never submit multiple queries.\n7. "
    "Confirmed Information Exclusion: Do NOT generate a query targeting any information "
    "enclosed within <confirmed>...</confirmed> tags in the MEMORY. These tags denote facts, "
    "evidence, or confirmed absences that have already been explicitly verified and resolved. "
    "Only generate queries for information whose existence, value, or status remains "
    "uncertain, ambiguous, or entirely unaddressed in the MEMORY. This prevents redundant "
    "exploration of settled information and directs attention to genuinely unresolved gaps.\n\n"
    "QUESTION that you need to focus on:\n<question>\n{question}\n</question>\n\n<memory>\n"
    "{memory}\n</memory>\n\n<query_history>\n{decomposed_history}\n</query_history>\n\n"
)

ANSWER_TEMPLATE = (
    "You are presented with a problem and a previous memory. Please answer the problem based "
    "on the previous memory and put the answer in \\boxed{{}}.\n\n<problem> \n{question}\n"
    "</problem>\n\n<memory>\n{memory}\n</memory>\n\nYour answer:\n"
)

INTEGRATE_TEMPLATE = (
    "You are a memory integration assistant.\nYou will receive three inputs: a QUESTION, a "
    "current MEMORY snippet, and a reference subquestion-answer pair obtained from the latest "
    "question progression step.\n\nYour task is to integrate the information from the "
    "reference into the MEMORY so that the updated MEMORY progresses towards answering the "
    "original QUESTION.\n\nFollow these rules strictly:\n1. Do not answer the original "
    "QUESTION directly; your sole output is the integrated MEMORY.\n2. When information in the "
    "reference conflicts with existing MEMORY content, prioritize the reference information as "
    "it represents fresh research.\n3. Eliminate redundant information; if a fact already "
    "exists in MEMORY, do not add it again.\n4. Filter out any information irrelevant to the "
    "original QUESTION; retain only content that contributes to answering it.\n5. Express all "
    "integrated information in fluent, coherent natural language. Do not copy the reference "
    "verbatim; instead, extract key facts and synthesize them into descriptive prose.\n6. "
    "Cross-Source Evidence Tagging: Wrap a statement in <confirmed>...</confirmed> tags if the "
    "exact same factual claim (regarding existence, occurrence, or verified absence of "
    "evidence) appears in BOTH the current <memory> input AND the <subanswer> section of the "
    "reference. This cross-source consistency indicates higher reliability. Do NOT tag "
    "information that appears in only one of these two sources, or that is speculative, "
    "uncertain, or inferred.\n7. Preserve Existing Confirmed Tags: If the current <memory> "
    "already contains information enclosed in <confirmed>...</confirmed> tags, and this "
    "information is not contradicted by the reference, retain these tagged segments verbatim "
    "in the updated MEMORY. Integrate them naturally into the surrounding prose without "
    "removing or altering the tags.\n\nYour final output should be a concise, well-structured "
    "MEMORY that consolidates all verified, relevant information needed to resolve the "
    "original QUESTION.\n\n<question>\n{question}\n</question>\n\n<memory>\n{memory}\n"
    "</memory>\n\n<reference>\n<subquestion>\n{subquestion}\n</subquestion>\n<subanswer>\n"
    "{answer}\n</subanswer>\n</reference>\n\nUpdated memory:\n"
)

INITIAL_MEMORY = "No previous memory"  # their NO_MEMORY: every pass starts from it
NO_HISTORY = "NO HISTORY"  # the query history before the first reread
CHUNK_TOKENS = 5000  # quick_start.chunk_worker, the evaluation's --chunk 5000
READ_TOKENS = 1024  # Memory.read_chunk: every read's reply
DECOMPOSE_TOKENS = 8192  # Memory.try_progress: the decomposing reply
ANSWER_TOKENS = 1024  # set_answer_via_memory: sub-answers and the final answer
INTEGRATE_TOKENS = 1024  # update_from_submemory
REREADS = 3  # quick_start.py --max-reread, run_eval*.sh --width 4 --nodes 4 (depth 1)
SUBQUESTION_LONGER_THAN = 5  # try_progress keeps a query of more characters only
TEMPERATURE = 0.7  # call_api / call_deployed: every call
TOP_P = 0.95
# Qwen3's chat template with enable_thinking=False writes an empty thinking block after
# the generation prompt; a GGUF's template rendered by llama.cpp is not told to, so the
# reader writes its prompts whole.
THINKING_OFF = "<think>\n\n</think>\n\n"


# --- prompts -------------------------------------------------------------------------


def chat(user: str) -> str:
    """Qwen3's chat template for one user message, no system message, with the generation
    prompt and thinking off: the text their server built for every call."""
    return qwen.chat(user, after=THINKING_OFF)


def raw_chat(user: str) -> Raw:
    """`chat` as a prompt written whole: only Qwen3's turn markers and the thinking block
    are markup, so the words of a document, a memory or a question stay plain text."""
    return qwen.raw_chat(user, after=THINKING_OFF)


def render_read(question: str, memory: str, chunk: str) -> str:
    """A read's user message: the pass's question (the original one, or a reread's
    sub-question), the pass's memory and the chunk."""
    return READ_TEMPLATE.format(prompt=question, memory=memory, chunk=chunk)


def query_history(history: Sequence[tuple[str, str]]) -> str:
    """The `<query_history>` block: one line per finished reread, its sub-question and its
    whole sub-answer reply; their "NO HISTORY" before the first."""
    if not history:
        return NO_HISTORY
    return "\n".join(f"<query>{asked}</query> <result>{found}</result>" for asked, found in history)


def render_decompose(question: str, memory: str, history: Sequence[tuple[str, str]]) -> str:
    """The decomposing call's user message: the original question, the main memory and the
    rereads so far."""
    return DECOMPOSE_TEMPLATE.format(
        question=question, memory=memory, decomposed_history=query_history(history)
    )


def render_answer(question: str, memory: str) -> str:
    """A sub-answer's user message (the sub-question, the reread's memory) and the final
    one's (the question, the main memory): theirs are the same template."""
    return ANSWER_TEMPLATE.format(question=question, memory=memory)


def render_integrate(question: str, memory: str, subquestion: str, subanswer: str) -> str:
    """The integrating call's user message: the original question, the main memory, and
    the sub-question with its whole sub-answer reply. Theirs passes the reread's memory
    too, but the template has no place for it: the model never sees it."""
    return INTEGRATE_TEMPLATE.format(
        question=question, memory=memory, subquestion=subquestion, answer=subanswer
    )


# --- replies -------------------------------------------------------------------------

_QUERY = re.compile(r"<query>(.+)</query>", re.DOTALL)  # greedy, case-sensitive: theirs


def subquestion(reply: str) -> str | None:
    """The sub-question of a decomposing reply: the text from the first `<query>` to the
    last `</query>` (across lines, so two queries give one, tags and all), without leading
    `{` and trailing `}`, stripped; only if it is longer than 5 characters. None (no tags,
    an unclosed or misspelt tag, a query too short) means the memory suffices: no more
    rereading."""
    match = _QUERY.search(reply)
    if match is None:
        return None
    query = match.group(1).lstrip("{").rstrip("}").strip()
    return query if len(query) > SUBQUESTION_LONGER_THAN else None


def parse_memory(reply: str) -> str:
    """A read's or an integration's new memory: what follows the last `</think>`, not
    stripped (an empty reply leaves an empty memory)."""
    return protocol.strip_think(reply)


def parse_answer(reply: str) -> str | None:
    """The answer in the final reply: the content of its last `\\boxed{...}`, braces
    matched; None without one. (Their evaluation scores the text after the last `\\boxed`;
    the reply is kept whole either way.)"""
    return protocol.extract_boxed(reply)


def held(steps: Sequence[Step]) -> list[str]:
    """The memory the reading holds after each step, as evidence reads it: the first
    pass's own; during a reread, the main memory and the reread's own so far; after its
    integration, the integrated memory."""
    memories, main = [], ""
    for step in steps:
        question, merged = step.extra.get("question"), step.extra.get("merged")
        if question is None or merged is not None:
            main = step.memory if question is None else str(merged)
            memories.append(main)
        else:
            memories.append(f"{main}\n{step.memory}")
    return memories


# --- the loop ------------------------------------------------------------------------

# Tokens a call needs beyond its prompt's and its reply's: re-tokenizing, and markup.
_SLACK = 48
# A sub-question as long as a usual question, for the context a reading needs: the
# decomposing prompt shows every earlier one.
SUBQUESTION_TOKENS = 64


@dataclass(frozen=True)
class Reread:
    """One reread as its steps keep it: the sub-question, and once its last step is
    recorded, the sub-answer and the memory the integration left."""

    question: str
    answer: str | None = None
    merged: str | None = None


def rereads_done(steps: Sequence[Step], chunks: int) -> list[Reread]:
    """The rereads an interrupted reading's steps hold, after its first pass of `chunks`
    steps: the last one may be unfinished (no answer yet)."""
    found = []
    for start in range(chunks, len(steps), chunks or 1):
        part = steps[start : start + chunks]
        last = part[-1] if len(part) == chunks else None
        question = part[0].extra.get("question")
        if question is None:  # a trace edited by hand: its header still said memreread
            raise UserError(
                f"Step {start + 1} of the trace is a reread's but names no sub-question; "
                "it cannot be resumed."
            )
        held = last.extra if last is not None else {}
        found.append(Reread(question, held.get("answer"), held.get("merged")))
    return found


def reader(tokenizer: Tokenizer | None = None) -> Reader:
    """MemReread's loop; `tokenizer`, the model's (a backend, with its context), sizes the
    decomposing reply where the context cannot hold their 8192 tokens."""

    def decompose_tokens(message: str) -> int:
        limit = getattr(tokenizer, "context_limit", None)
        if tokenizer is None or not isinstance(limit, int):
            return DECOMPOSE_TOKENS
        prompt = len(tokenizer.tokenize(chat(message))) + _SLACK
        room = limit - prompt
        if room < 1:
            raise BudgetError(
                f"MemReread's decomposing prompt takes about {prompt:,} tokens, more than the "
                f"model's context of {limit:,} holds with a reply; lower --memory-tokens or "
                "read with another --reader."
            )
        return min(DECOMPOSE_TOKENS, room)

    def memreread(
        question: str,
        chunks: Sequence[Chunk],
        settings: Settings,
        listener: Listener = lambda event: None,
        done: Sequence[Step] = (),
    ) -> Reading:
        steps, n = list(done), len(chunks)

        def read_pass(
            asked: str, start: int, asking: Generation | None, last: bool
        ) -> Generator[Prompt, Generation, tuple[str, Generation | None]]:
            """Read every chunk for `asked` from a fresh memory, as the pass whose first
            step is `start`; the steps done already are skipped. `asking`: the decomposing
            call, joined to the first step; `last`: hold the last step back (returned with
            the memory, None when there is nothing to hold) for its reread's answer."""
            memory, held, total = INITIAL_MEMORY, None, start + n  # the steps begun
            for i, chunk in enumerate(chunks):
                if start + i < len(steps):
                    memory = steps[start + i].memory
                    continue
                listener(StepStarted(chunk, total, start + i))
                reply = yield Prompt(
                    "", settings.memory_tokens, raw=raw_chat(render_read(asked, memory, chunk.text))
                )
                memory = parse_memory(reply.text)
                generation = joined(asking, reply) if asking is not None and i == 0 else reply
                if last and i == n - 1:
                    held = generation
                    break
                sub = {"question": asked} if start else {}
                steps.append(Step(chunk, memory, generation, sub))
                listener(StepFinished(steps[-1], total, start + i))
            return memory, held

        memory, _ = yield from read_pass(question, 0, None, last=False)
        history: list[tuple[str, str]] = []
        earlier = rereads_done(steps, n)
        deciding: Generation | None = None  # the decomposing call that found no query
        for k in range(REREADS):
            start = n * (k + 1)
            if k < len(earlier):
                asked, asking = earlier[k].question, None
            else:
                message = render_decompose(question, memory, history)
                reply = yield Prompt("", decompose_tokens(message), raw=raw_chat(message))
                sub = subquestion(reply.text)
                if sub is None:
                    deciding = reply
                    break
                asked, asking = sub, reply
            if k < len(earlier) and earlier[k].merged is not None:
                answer, merged = earlier[k].answer, earlier[k].merged
                assert answer is not None
                memory = merged
                history.append((asked, answer))
                continue
            submemory, held = yield from read_pass(asked, start, asking, last=True)
            reply = yield Prompt("", ANSWER_TOKENS, raw=raw_chat(render_answer(asked, submemory)))
            answer = reply.text
            message = render_integrate(question, memory, asked, answer)
            integrated = yield Prompt("", settings.memory_tokens, raw=raw_chat(message))
            memory = parse_memory(integrated.text)
            history.append((asked, answer))
            if n:
                costs = [c for c in (held, reply, integrated) if c is not None]
                reread = {"question": asked, "answer": answer, "merged": memory}
                step = Step(chunks[-1], submemory, joined(*costs), reread)
                steps.append(step)
                listener(StepFinished(step, start + n, start + n - 1))
        listener(Answering(memory))
        reply = yield Prompt("", ANSWER_TOKENS, raw=raw_chat(render_answer(question, memory)))
        final = reply if deciding is None else joined(deciding, reply)
        answer = Answer(question, parse_answer(reply.text), reply.text, steps, final)
        listener(Finished(answer))
        return answer

    return memreread


# --- what it costs -------------------------------------------------------------------


def _calls(
    spec: Spec,
    chunks: Sequence[int],
    templates: Templates,
    replies: Replies,
    memory: int,
    first_memory: int,
) -> list[CallSize]:
    """At most: MemAgent's pass, then every reread (a decomposing call, a pass with the
    sub-question, a sub-answer, an integration), then the answer. A reading whose memory
    holds the answer sooner stops rereading."""
    question = SUBQUESTION_TOKENS  # a sub-question's tokens, besides the question's

    def read_pass() -> list[CallSize]:
        calls, shown = [], first_memory
        for tokens in chunks:
            calls.append(CallSize(templates.update + shown + tokens, replies.update))
            shown = memory
        return calls

    calls = read_pass()
    for k in range(REREADS):
        history = k * (question + replies.answer)
        calls.append(CallSize(templates.planner + memory + history, DECOMPOSE_TOKENS))
        calls += read_pass()
        calls.append(CallSize(templates.final + memory, replies.answer))
        calls.append(CallSize(templates.merge + memory + question + replies.answer, replies.update))
    return [*calls, CallSize(templates.final + memory, replies.answer)]


def _templates(spec: Spec, backend: Backend, steps: int) -> Templates:
    """Its calls' tokens with nothing filled in: the prompts it writes whole, chat included,
    with a usual question."""
    question = len(backend.tokenize(USUAL_QUESTION))

    def sized(text: str) -> int:
        return len(backend.tokenize(chat(text))) + question

    return Templates(
        update=sized(render_read("", "", "")),
        final=sized(render_answer("", "")),
        planner=sized(render_decompose("", "", ())),
        merge=sized(render_integrate("", "", "", "")),
    )


@dataclass(frozen=True)
class _Spec(Spec):
    """MemReread's calls besides MemAgent's: the decomposing one shows the query history
    and may reply with up to 8192 tokens, where the context holds them; the integrating
    one shows a sub-answer."""

    def context_needed(
        self, backend: Backend, questions: Sequence[str], settings: Settings, steps: int = 0
    ) -> int:
        base = super().context_needed(backend, questions, settings, steps)
        asked = max(len(backend.tokenize(q.strip())) for q in questions)
        memory, limit = settings.memory_tokens, backend.context_limit
        overhead = backend.chat_overhead() + asked + memory + _SLACK
        integrate = (
            overhead
            + len(backend.tokenize(render_integrate("", "", "", "")))
            + SUBQUESTION_TOKENS
            + ANSWER_TOKENS
            + memory
        )
        if integrate > limit:
            raise BudgetError(
                f"MemReread's integration of a sub-answer needs about {integrate:,} tokens, "
                f"more than the model's context of {limit:,}; lower --memory-tokens or read "
                "with another --reader."
            )
        history = (REREADS - 1) * (SUBQUESTION_TOKENS + ANSWER_TOKENS + 8)
        template = len(backend.tokenize(render_decompose("", "", ())))
        decompose = overhead + template + history + DECOMPOSE_TOKENS
        return max(base, integrate, min(decompose, limit))


def _loop(tokenizer: Tokenizer, tokens: Sequence[int]) -> Reader:
    return reader(tokenizer)


SPEC = _Spec(
    name="memreread",
    summary="rereads for what its memory lacks",
    loop=_loop,
    templates={
        "update": READ_TEMPLATE,
        "decompose": DECOMPOSE_TEMPLATE,
        "final": ANSWER_TEMPLATE,
        "integrate": INTEGRATE_TEMPLATE,
    },
    bare=(render_read("", "", ""), render_answer("", "")),
    sampling=Sampling(TEMPERATURE, TOP_P),
    memory_tokens=READ_TOKENS,
    answer_tokens=ANSWER_TOKENS,
    stops_early=f"it rereads only while its memory lacks the answer, {REREADS} times at most",
    held=held,
    writes_whole=True,  # Qwen3's chat, thinking off, written whole (readers/chat.py)
    price=_calls,
    template_tokens=_templates,
    # A reread's steps: the sub-question it reads for; its last step, the sub-answer and
    # the memory the integration left.
    fields=(
        StepField("question", str, "reread for", lambda question: (repr(question),)),
        StepField("answer", str, "its answer"),
        StepField("merged", str, "merged into the memory"),
    ),
)
