"""PI-Mem (arXiv 2608.03048): each pass reads every chunk against one shared memory, each
call saying `<check>yes</check>` and what is new, or `<check>no</check>`; what the chunks
found is merged into the memory; it stops after a pass in which no chunk found anything,
or after three passes, and answers from the memory.

Everything here is as the authors' evaluation runs PI-Mem-7B (JetAstra/PI-Mem at 410f0c1,
`taskutils/memory_eval/utils/parallel_boxed.py` with `run_qwen25.py`'s `pi-mem-trained`
config): the strings byte for byte, one user message per call through the model's chat
template (theirs asks for thinking off, which Qwen2.5's template ignores), their reply
limits and sampling, their parsing. docs/readers.md says where each rule comes from.

A pass's chunk calls depend only on the memory before the pass: their code sends them all
at once, and so does this one (reader.Prompts: together in-process, on --parallel threads to
a server, one by one in `read`). Each is a step of the trace, in chunk order, that names its
chunk (StepRecord.chunk, from the second pass on); the pass's last step also keeps the
memory its merge left, so that a resumed reading asks what the whole one would have asked,
from the first chunk whose step the trace does not hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memagent_cli.backend import Backend, Sampling
from memagent_cli.chunking import Chunk, Tokenizer
from memagent_cli.errors import BudgetError
from memagent_cli.reader import (
    Answer,
    Answering,
    Finished,
    Listener,
    Prompt,
    Prompts,
    Reader,
    Reading,
    Settings,
    Step,
    StepFinished,
    StepStarted,
    joined,
)
from memagent_cli.readers.rememr1 import parse_answer as _boxed_answer
from memagent_cli.readers.spec import (
    CallSize,
    Replies,
    Spec,
    StepField,
    Templates,
    templates_through_chat,
)

CHUNK_TEMPLATE = (
    "You are presented with a problem, a section of an article, and a global memory "
    "summarizing previously gathered information. Please read the section carefully and "
    "determine whether the section contains new information relevant to answering the problem "
    "beyond what is already in the global memory. First, output your judgment in the format "
    "<check>yes</check> if there is new information, or <check>no</check> if there is none. "
    "Then, if there is new information, extract and list the key details.\n\n<problem>\n"
    "{prompt}\n</problem>\n\n<memory>\n{memory}\n</memory>\n\n<section>\n{chunk}\n</section>\n"
    "\nYour response:\n"
)

MERGE_TEMPLATE = (
    "You are presented with a problem and key information extracted from multiple sections of "
    "an article. Please consolidate all the information into a single comprehensive memory. "
    "Remove redundancies and organize the information clearly, retaining all details relevant "
    "to answering the problem.\n\n<problem>\n{prompt}\n</problem>\n\n<extracted_information>\n"
    "{memories}\n</extracted_information>\n\nConsolidated memory:\n"
)

FINAL_TEMPLATE = (
    "You are presented with a problem and a previous memory. Please answer the problem based "
    "on the previous memory and put the answer in \\boxed{{}}.\n\n<problem>\n{prompt}\n"
    "</problem>\n\n<memory>\n{memory}\n</memory>\n\nYour answer:\n"
)

INITIAL_MEMORY = "No previous memory"  # NO_MEMORY: the memory of pass 1, and an empty merge
NO_NEW_INFO = "<check>no</check>"  # NO_NEW_INFO_MARKER
PREVIOUS_MEMORY_LABEL = "[Previous Memory]:"
SECTION_LABEL = "[Section {idx}]:"  # SECTION_LABEL_TEMPLATE
CHUNK_TOKENS = 5000  # RECURRENT_CHUNK_SIZE
REPLY_TOKENS = 1024  # RECURRENT_MAX_NEW: every chunk call's reply, and the answer's
MERGE_TOKENS = 1024  # PARALLEL_MERGE_MAX_TOKENS
MAX_PASSES = 3  # PARALLEL_MAX_PASSES
TEMPERATURE = 0.7  # ruler_hqa.py and the others: async_query_llm(..., 0.7, 0.95)
TOP_P = 0.95


# --- prompts -------------------------------------------------------------------------


def render_chunk(question: str, memory: str, chunk: str) -> str:
    """A chunk call's user message: the question, the shared memory, the chunk."""
    return CHUNK_TEMPLATE.format(prompt=question, chunk=chunk, memory=memory)


def merge_input(memory: str, found: Sequence[str]) -> str:
    """The `<extracted_information>` block (their _build_merge_memories): the memory so
    far, labelled, unless blank or still "No previous memory"; then each finding, stripped,
    labelled `[Section i]:` with i its place among the findings (not the chunk's number;
    an empty one is left out but keeps its number); a blank line between; "No previous
    memory" when nothing is left."""
    parts = []
    if memory.strip() and memory.strip() != INITIAL_MEMORY:
        parts.append(f"{PREVIOUS_MEMORY_LABEL}\n{memory.strip()}")
    for i, finding in enumerate(found, start=1):
        if finding.strip():
            parts.append(f"{SECTION_LABEL.format(idx=i)}\n{finding.strip()}")
    return "\n\n".join(parts) if parts else INITIAL_MEMORY


def render_merge(question: str, memory: str, found: Sequence[str]) -> str:
    """A merge's user message: the question and what to consolidate."""
    return MERGE_TEMPLATE.format(prompt=question, memories=merge_input(memory, found))


def render_final(question: str, memory: str) -> str:
    """The final call's user message."""
    return FINAL_TEMPLATE.format(prompt=question, memory=memory)


# --- replies -------------------------------------------------------------------------


def found_nothing(reply: str) -> bool:
    """Whether a chunk reply says nothing new: `<check>no</check>` anywhere in it, in any
    case. Anything else counts as new, a reply with no check tag or an empty one
    included (their _is_no_new_info)."""
    return NO_NEW_INFO in reply.lower()


def parse_finding(reply: str) -> str:
    """What a chunk call found, as the merge is shown it: the whole reply, check tag
    included, stripped (their client strips every reply)."""
    return reply.strip()


def parse_memory(reply: str) -> str:
    """The memory a merge leaves: its whole reply, stripped."""
    return reply.strip()


def parse_answer(reply: str) -> str | None:
    """The answer in a final reply, as their ruler_hqa.py takes it (MemAgent's extraction,
    the same as ReMemR1's): the content of the last `\\boxed{...}`, or what follows the
    last `\\boxed ` up to a `$`; None without one, and where their extraction fails an
    assertion (a reply whose only box is `\\fbox{...}`, or `\\boxed` not followed by `{`)."""
    return _boxed_answer(reply)


def held(steps: Sequence[Step]) -> list[str]:
    """The memory the reading holds after each step, as evidence reads it: a step keeps one
    chunk's finding, so within a pass, the memory before it and what the pass found so
    far; after a merge, the merged memory."""
    memories, memory, found = [], "", []
    for step in steps:
        if step.chunk.index == 0:  # a pass begins
            found = []
        if not found_nothing(step.memory):
            found.append(step.memory)
        if (merged := step.extra.get("merged")) is not None:
            memory, found = merged, []
        memories.append("\n".join([memory, *found]))
    return memories


# --- the loop ------------------------------------------------------------------------

# Tokens a merge holds per finding besides the finding: its label and the blank line.
LABEL_TOKENS = 8
_SLACK = 32


def reader(tokenizer: Tokenizer | None = None) -> Reader:
    """PI-Mem's loop; `tokenizer`, the model's (a backend, with its context), tells a merge
    that cannot fit before it is sent."""

    def check_merge(message: str, reply: int, found: int, number: int) -> None:
        limit = getattr(tokenizer, "context_limit", None)
        if tokenizer is None or not isinstance(limit, int):
            return
        overhead = getattr(tokenizer, "chat_overhead", lambda: 0)()
        needed = overhead + len(tokenizer.tokenize(message)) + reply + _SLACK
        if needed > limit:
            raise BudgetError(
                f"PI-Mem's merge after pass {number} shows what {found} chunks found: about "
                f"{needed:,} tokens with its reply, more than the model's context of "
                f"{limit:,}; read the document in parts, with larger --chunk-tokens or "
                "smaller --memory-tokens, or with another --reader."
            )

    def pimem(
        question: str,
        chunks: Sequence[Chunk],
        settings: Settings,
        listener: Listener = lambda event: None,
        done: Sequence[Step] = (),
    ) -> Reading:
        steps, n, memory = list(done), len(chunks), INITIAL_MEMORY
        for number in range(1, MAX_PASSES + 1):
            if not n:
                break
            start = (number - 1) * n
            findings = [step.memory for step in steps[start : start + n]]
            if len(findings) == n:  # the pass is done, its last step too, and its merge if any
                merged = steps[start + n - 1].extra.get("merged")
                if merged is None:
                    break
                memory = merged
                continue
            left, total = chunks[len(findings) :], number * n  # the steps of the passes begun
            for i, chunk in enumerate(left, start + len(findings)):
                listener(StepStarted(chunk, total, i))
            replies = yield Prompts(
                (
                    Prompt(render_chunk(question, memory, chunk.text), settings.memory_tokens)
                    for chunk in left
                ),
                what=f"pass {number}",
                unit="chunks",
                before=len(findings),
            )
            for i, (chunk, reply) in enumerate(zip(left, replies, strict=True), len(findings)):
                findings.append(parse_finding(reply.text))
                last = Step(chunk, findings[-1], reply)
                if i < n - 1:  # the pass's last step waits for its merge
                    steps.append(last)
                    listener(StepFinished(last, total, start + i))
            found = [f for f in findings if not found_nothing(f)]
            if not found:  # nothing new anywhere: no merge, the answer
                steps.append(last)
                listener(StepFinished(last, total, start + n - 1))
                break
            message = render_merge(question, memory, found)
            check_merge(message, settings.memory_tokens, len(found), number)
            reply = yield Prompt(message, settings.memory_tokens)
            memory = parse_memory(reply.text)
            generation = joined(last.generation, reply)
            step = Step(last.chunk, last.memory, generation, {"merged": memory})
            steps.append(step)
            listener(StepFinished(step, total, start + n - 1))
        listener(Answering(memory))
        reply = yield Prompt(render_final(question, memory), REPLY_TOKENS)
        answer = Answer(question, parse_answer(reply.text), reply.text, steps, reply)
        listener(Finished(answer))
        return answer

    return pimem


# --- what it costs -------------------------------------------------------------------


def _calls(
    spec: Spec,
    chunks: Sequence[int],
    templates: Templates,
    replies: Replies,
    memory: int,
    first_memory: int,
) -> list[CallSize]:
    """At most: three passes of every chunk, each followed by a merge, then the answer. A
    merge is priced as showing at most a chunk's worth of findings (most chunks find
    nothing new); a reading may stop after its first pass."""
    calls, shown = [], first_memory
    for _ in range(MAX_PASSES):
        calls += [CallSize(templates.update + shown + tokens, replies.update) for tokens in chunks]
        findings = min(len(chunks) * (replies.update + LABEL_TOKENS), max(chunks, default=0))
        calls.append(CallSize(templates.merge + shown + findings, replies.update))
        shown = memory
    return [*calls, CallSize(templates.final + shown, replies.answer)]


def _templates(spec: Spec, backend: Backend, steps: int) -> Templates:
    """Its calls' tokens with nothing filled in, through the model's chat template, with
    a usual question."""
    through_chat = templates_through_chat(spec, backend, steps)
    merge = through_chat.final - len(backend.tokenize(render_final("", "")))
    return Templates(
        update=through_chat.update,
        final=through_chat.final,
        merge=merge + len(backend.tokenize(render_merge("", "", ()))),
    )


@dataclass(frozen=True)
class _Spec(Spec):
    """PI-Mem's merge shows what every chunk of a pass found: its context has room for a
    merge of every chunk's finding, as far as the model's context goes."""

    def context_needed(
        self, backend: Backend, questions: Sequence[str], settings: Settings, steps: int = 0
    ) -> int:
        base = super().context_needed(backend, questions, settings, steps)
        asked = max(len(backend.tokenize(q.strip())) for q in questions)
        memory = settings.memory_tokens
        merge = (
            backend.chat_overhead()
            + len(backend.tokenize(render_merge("", "", ())))
            + asked
            + (steps + 1) * (memory + LABEL_TOKENS)  # the memory so far, and each finding
            + memory
            + _SLACK
        )
        return max(base, min(merge, backend.context_limit))


def _loop(tokenizer: Tokenizer, tokens: Sequence[int]) -> Reader:
    return reader(tokenizer)


SPEC = _Spec(
    name="pi-mem",
    summary="every chunk at once, in up to 3 passes",
    loop=_loop,
    templates={"update": CHUNK_TEMPLATE, "merge": MERGE_TEMPLATE, "final": FINAL_TEMPLATE},
    bare=(render_chunk("", "", ""), render_final("", "")),
    sampling=Sampling(TEMPERATURE, TOP_P),
    memory_tokens=REPLY_TOKENS,
    answer_tokens=REPLY_TOKENS,
    grows="PI-Mem's merge shows what every chunk found",
    stops_early=f"it reads every chunk in each of up to {MAX_PASSES} passes, and stops after "
    "a pass in which no chunk finds anything new",
    at_once=lambda chunks: max(chunks, 1),  # a pass's chunk calls
    held=held,
    price=_calls,
    template_tokens=_templates,
    # A pass's last step: the memory its merge left, which the next pass reads with.
    fields=(StepField("merged", str, "merged into the memory"),),
)
