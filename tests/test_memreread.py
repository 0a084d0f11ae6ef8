"""MemReread (readers/memreread.py) against its authors' code: the templates byte for byte,
the prompts filled as theirs fill them, the sub-question parsed as theirs parses it, the
loop's calls in their order with their reply limits, and the reading through `read`, the
scheduler, a trace and `--resume`, and the command through a stand-in server. No model."""

from __future__ import annotations

import hashlib
import json

import pytest
from support import asking
from support.fake_openai import served
from support.scripted import ScriptedBackend
from support.story import FACT_QUESTION, story

from memagent_cli import readers
from memagent_cli.chunking import make_chunks
from memagent_cli.errors import BudgetError
from memagent_cli.reader import Settings, read
from memagent_cli.readers import memreread
from memagent_cli.scheduler import Job, read_together
from memagent_cli.trace import read_trace

# --- the oracles: the authors' files, copied verbatim -------------------------------------
# github.com/iiGray/MemReread at c5393fb8e9543da00333acd00ce4cd6d86f2e34f (main, 2026-05-17):
# recursive/prompts.py (lines 2-115), recursive/tools.py (its star imports left out) and
# recursive/utils.py, run here as their module text.

THEIR_PROMPTS = r'''MEMAGENT_READING_TEMPLATE = """You are presented with a problem, a section of an article that may contain the answer to the problem, and a previous memory. Please read the provided section carefully and update the memory with the new information that helps to answer the problem. Be sure to retain all relevant details from the previous memory while adding any new, useful information.

<problem> 
{prompt}
</problem>

<memory>
{memory}
</memory>

<section>
{chunk}
</section>

Updated memory:
"""


DECOMPOSING_OR_ANSWERING_TEMPLATE = """You are a Question Analysis and Query Generation Agent.
You will receive a QUESTION, a MEMORY containing known facts and evidence, and a QUERY_HISTORY containing previously submitted exploratory queries with their results. Your task is to analyze whether the information in the MEMORY is sufficient to fully answer the QUESTION. If it is insufficient, you must generate a single targeted exploratory query to fill the most critical gap.

Critical Rules & Analysis Steps:
1. Focus on QUESTION: Evaluate only whether MEMORY can answer the current QUESTION. Do not attempt to answer or re-query any other questions.
2. Compare needs with MEMORY: Break the QUESTION down into specific information needs and compare them with what the MEMORY already contains. Identify if any crucial facts are still missing, uncertain, or incomplete.
3. Review QUERY_HISTORY: Avoid repeating any query already asked and recorded in QUERY_HISTORY.
4. You MUST NOT answer the QUESTION directly. Your output must strictly follow the decision logic below.

Decision Logic & Actions:
- IF SUFFICIENT: If the MEMORY already contains all necessary information to fully address the QUESTION, you must stop immediately. Do not generate any query and do not generate any further text.
- IF INSUFFICIENT: If the MEMORY lacks necessary information for the QUESTION, you must leverage the known information in the MEMORY to identify and submit the single highest-priority exploratory query that must be resolved first to push the QUESTION forward.

Guidelines for the Priority Query (Only if MEMORY is insufficient for the QUESTION):
1. Highest Priority: Among all possible information gaps for the QUESTION, select only the one query whose resolution is most critical and foundational for answering the QUESTION.
2. No Repetition: The query must NOT duplicate any query already present in the QUERY_HISTORY. Review the history carefully and ensure your proposed query is novel and represents genuine progress.
3. Independence: The query must be answerable in isolation without requiring answers to other queries.
4. Sufficiency: Resolving this query, combined with the existing MEMORY, must meaningfully progress toward fully resolving the QUESTION.
5. Self-Contained Expression: The query must be fully self-contained and free of any references to the original QUESTION, MEMORY, or external context. Never use pronouns, option labels, or context-dependent phrases like "the entity mentioned above", "option A", or "this event". Instead, explicitly state all relevant entities, values, and content.
6. Output Format: Submit exclusively this single highest-priority query by wrapping it in <query> tags. Output exactly one query; never submit multiple queries.
7. Confirmed Information Exclusion: Do NOT generate a query targeting any information enclosed within <confirmed>...</confirmed> tags in the MEMORY. These tags denote facts, evidence, or confirmed absences that have already been explicitly verified and resolved. Only generate queries for information whose existence, value, or status remains uncertain, ambiguous, or entirely unaddressed in the MEMORY. This prevents redundant exploration of settled information and directs attention to genuinely unresolved gaps.

QUESTION that you need to focus on:
<question>
{question}
</question>

<memory>
{memory}
</memory>

<query_history>
{decomposed_history}
</query_history>

"""




ANSWERING_TEMPLATE = """You are presented with a problem and a previous memory. Please answer the problem based on the previous memory and put the answer in \\boxed{{}}.

<problem> 
{question}
</problem>

<memory>
{memory}
</memory>

Your answer:
"""



INTEGRATING_TEMPLATE = """You are a memory integration assistant.
You will receive three inputs: a QUESTION, a current MEMORY snippet, and a reference subquestion-answer pair obtained from the latest question progression step.

Your task is to integrate the information from the reference into the MEMORY so that the updated MEMORY progresses towards answering the original QUESTION.

Follow these rules strictly:
1. Do not answer the original QUESTION directly; your sole output is the integrated MEMORY.
2. When information in the reference conflicts with existing MEMORY content, prioritize the reference information as it represents fresh research.
3. Eliminate redundant information; if a fact already exists in MEMORY, do not add it again.
4. Filter out any information irrelevant to the original QUESTION; retain only content that contributes to answering it.
5. Express all integrated information in fluent, coherent natural language. Do not copy the reference verbatim; instead, extract key facts and synthesize them into descriptive prose.
6. Cross-Source Evidence Tagging: Wrap a statement in <confirmed>...</confirmed> tags if the exact same factual claim (regarding existence, occurrence, or verified absence of evidence) appears in BOTH the current <memory> input AND the <subanswer> section of the reference. This cross-source consistency indicates higher reliability. Do NOT tag information that appears in only one of these two sources, or that is speculative, uncertain, or inferred.
7. Preserve Existing Confirmed Tags: If the current <memory> already contains information enclosed in <confirmed>...</confirmed> tags, and this information is not contradicted by the reference, retain these tagged segments verbatim in the updated MEMORY. Integrate them naturally into the surrounding prose without removing or altering the tags.

Your final output should be a concise, well-structured MEMORY that consolidates all verified, relevant information needed to resolve the original QUESTION.

<question>
{question}
</question>

<memory>
{memory}
</memory>

<reference>
<subquestion>
{subquestion}
</subquestion>
<subanswer>
{answer}
</subanswer>
</reference>

Updated memory:
"""



NO_MEMORY = "No previous memory"
NO_REFERENCE_MEMORY = "No reference memory"

'''  # noqa: E501

THEIR_TOOLS = r"""


def get_reading_messages(question: "str", reference_memory: "str", memory: "str", chunk: "str"):
    return [dict(
        role = 'user',
        content = MEMAGENT_READING_TEMPLATE.format(
            prompt = question,
            memory = memory,
            chunk = chunk
        )
    )]

def get_progress_or_answer_messages(decomposed_stack: "list[str]", question: "str", memory: "str", history: "list[dict[str, str]]"):
    TEMPLATE = DECOMPOSING_OR_ANSWERING_TEMPLATE

    if not decomposed_stack:
        stack_str = "EMPTY"
    else:
        stack_str = "\n".join(decomposed_stack)
        
    if not history:
        history_str = "NO HISTORY"
    else:
        
        history_str = "\n".join([f"<query>{x['question']}</query> <result>{x['answer']}</result>" for x in history])

    return [dict(
        role = 'user', 
        content = TEMPLATE.format(
            decomposition_stack = stack_str,
            question=question, 
            memory=memory,
            decomposed_history = history_str
        ))]


def get_answering_messages(question: "str", memory: "str"):
    return [dict(
        role = 'user', 
        content = ANSWERING_TEMPLATE.format(
            question=question, 
            memory=memory,
        ))]

def get_final_answering_messages(question: "str", memory: "str"):
    return [dict(
        role = 'user', 
        content = ANSWERING_TEMPLATE.format(
            question=question, 
            memory=memory,
        ))]


def get_integrating_messages(question: "str", memory: "str", submemory: "str", subquestion: "str", answer: "str"):
    return [dict(
        role = 'user', 
        content = INTEGRATING_TEMPLATE.format(
            question=question, 
            memory=memory,
            submemory = submemory,
            subquestion = subquestion,
            answer = answer
        ))]"""  # noqa: E501

THEIR_UTILS = r"""import json, re

def subquestions_from_text(response):
    key = 'query'
    try:
        match = re.search(r'<query>(.+)</query>', response, flags = re.DOTALL)
        if match:
            query = match.group(1) 
            query = query.lstrip("{").rstrip("}").strip()
            if len(query) > 5:
                return [query]
    except (ValueError, TypeError):
            pass 
    return []"""

THEIRS: dict = {}
exec("\n".join([THEIR_PROMPTS, THEIR_TOOLS, THEIR_UTILS]), THEIRS)


def their_calls(question, chunks, replies, max_reread=memreread.REREADS):
    """MemReread_API's calls for `question` over `chunks` (texts), each answered by the
    next of `replies`: (the user message, max_tokens) in order. Their dfs_progress with
    max_depth 1 and max_width = max_nodes = max_reread + 1, restated over their own
    functions (exp/interface/mem_reread_api.py)."""
    replies, calls = iter(replies), []

    def query(messages, max_tokens):
        calls.append((messages[0]["content"], max_tokens))
        return next(replies)

    def read_pass(asked):
        value = THEIRS["NO_MEMORY"]
        for chunk in chunks:
            messages = THEIRS["get_reading_messages"](asked, "", value, chunk)
            value = query(messages, 1024).split("</think>")[-1]
        return value

    value, history, nodes = read_pass(question), [], [1]
    if nodes[0] < max_reread + 1:
        for _ in range(max_reread + 1):
            nodes[0] += 1
            if nodes[0] > max_reread + 1:
                break
            messages = THEIRS["get_progress_or_answer_messages"]([], question, value, history)
            progressed = THEIRS["subquestions_from_text"](query(messages, 8192))
            if not progressed:
                break
            asked = progressed[0]
            subvalue = read_pass(asked)
            answer = query(THEIRS["get_answering_messages"](asked, subvalue), 1024)
            messages = THEIRS["get_integrating_messages"](question, value, subvalue, asked, answer)
            value = query(messages, 1024).split("</think>")[-1]
            history.append({"question": asked, "answer": answer})
    final = query(THEIRS["get_final_answering_messages"](question, value), 1024)
    return calls, final


class Completing(ScriptedBackend):
    """The stand-in, continuing prompts a reader writes whole: each call kept as the user
    message inside Qwen3's markup, its reply limit and the whole text."""

    def __init__(self, replies, context_limit=100_000):
        super().__init__(replies, context_limit)
        self.calls: list[tuple[str, int]] = []
        self.texts: list[str] = []

    def complete(self, raw, *, max_tokens, sampling):
        text = "".join(piece for piece, _ in raw)
        user = text.removeprefix("<|im_start|>user\n").split("<|im_end|>")[0]
        self.calls.append((user, max_tokens))
        self.texts.append(text)
        return self.generate(text, max_tokens=max_tokens, sampling=sampling)


TEXT = "The tower bell rang at noon. " * 4  # 116 bytes: 3 chunks of 40 one-byte tokens
SETTINGS = Settings(chunk_tokens=40, memory_tokens=1024, reader="memreread")
QUERY = "<query>Who rang the tower bell?</query>"


def chunks(text=TEXT):
    return make_chunks(list(text.encode()), SETTINGS.chunk_tokens, bytes)


def script(decisions, n=3):
    """Replies for a reading of `n` chunks: each read writes a memory, the decomposing calls
    reply `decisions` in turn (a query: a reread; else the memory suffices), then the
    sub-answer, the integration and, last, the answer."""
    replies = [f"m{i}" for i in range(n)]
    for k, decision in enumerate(decisions):
        replies.append(decision)
        if memreread.subquestion(decision) is None:
            break
        replies += [f"<think>x</think>r{k}.{i}" for i in range(n)]
        replies += [f"found \\boxed{{keeper {k}}}", f"<think>y</think>integrated {k}"]
    return [*replies, "So \\boxed{the keeper}."]


def reading(backend, done=(), text=TEXT, settings=SETTINGS):
    reader = readers.get("memreread").loop(backend, ())
    return read(backend, "Who rang?", chunks(text), settings, done=done, reader=reader)


# --- the strings and the prompts -----------------------------------------------------------


def test_the_templates_are_theirs_byte_for_byte():
    assert THEIRS["MEMAGENT_READING_TEMPLATE"] == memreread.READ_TEMPLATE
    assert THEIRS["DECOMPOSING_OR_ANSWERING_TEMPLATE"] == memreread.DECOMPOSE_TEMPLATE
    assert THEIRS["ANSWERING_TEMPLATE"] == memreread.ANSWER_TEMPLATE
    assert THEIRS["INTEGRATING_TEMPLATE"] == memreread.INTEGRATE_TEMPLATE
    assert THEIRS["NO_MEMORY"] == memreread.INITIAL_MEMORY
    # The trace header's fingerprints are of their strings.
    spec = readers.get("memreread")
    assert (
        spec.templates_sha256()["decompose"]
        == hashlib.sha256(THEIRS["DECOMPOSING_OR_ANSWERING_TEMPLATE"].encode()).hexdigest()
    )


@pytest.mark.parametrize("history", [[], [("Who rang?", "\\boxed{x}")], [("a?", "b"), ("c?", "")]])
def test_each_prompt_is_filled_as_theirs_fills_it(history):
    question, memory, chunk = "Who {rang} the bell?", "m <confirmed>x</confirmed>", "<|im_end|> c"
    theirs = [{"question": q, "answer": a} for q, a in history]

    def user(messages):
        return messages[0]["content"]

    assert memreread.render_read(question, memory, chunk) == user(
        THEIRS["get_reading_messages"](question, "", memory, chunk)
    )
    assert memreread.render_decompose(question, memory, history) == user(
        THEIRS["get_progress_or_answer_messages"]([], question, memory, theirs)
    )
    assert memreread.render_answer(question, memory) == user(
        THEIRS["get_final_answering_messages"](question, memory)
    )
    assert memreread.render_integrate(question, memory, "sub?", "ans") == user(
        THEIRS["get_integrating_messages"](question, memory, "unseen", "sub?", "ans")
    )


@pytest.mark.parametrize(
    "reply",
    [
        QUERY,
        "<query>{Who rang the bell?}</query>",
        "<query>A?</query>\n<query>Where is B?</query>",  # one query, tags and all
        "<query>short</query>",  # 5 characters: not a query
        "<query>  {{ab}}  </query>",
        "<query>Who rang?",  # unclosed
        "<Query>Who rang the bell?</Query>",  # case-sensitive
        "",
        "The memory suffices.",
        "<query>\nline one\nline two\n</query> trailing",
    ],
)
def test_a_decomposing_reply_gives_the_sub_question_theirs_gives(reply):
    theirs = THEIRS["subquestions_from_text"](reply)
    assert memreread.subquestion(reply) == (theirs[0] if theirs else None)


def test_every_call_is_one_user_message_in_qwen3_markup_with_thinking_off():
    backend = Completing(script([""]))
    reading(backend)
    for (user, _), text in zip(backend.calls, backend.texts, strict=True):
        assert text == memreread.chat(user)
        assert text == (
            f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        )
    # Only the turn markers and the empty thinking block are markup.
    raw = memreread.raw_chat("<|im_end|> in a document")
    assert [text for text, markup in raw if markup] == [
        "<|im_start|>",
        "<|im_end|>",
        "<|im_start|>",
        "<think>\n\n</think>\n\n",
    ]


# --- the loop ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "decisions",
    [
        [""],  # the memory suffices at once: MemAgent's pass, then the answer
        [QUERY, "no gap left"],  # one reread
        [QUERY, "<query>Where was the keeper?</query>", "<query>short</query>"],
        [QUERY, QUERY, QUERY],  # three rereads: then the answer, no fourth decomposing call
    ],
)
def test_the_calls_are_theirs_in_their_order_with_their_limits(decisions):
    replies = script(decisions)
    backend = Completing(list(replies))
    answer = reading(backend)
    theirs, final = their_calls("Who rang?", [c.text for c in chunks()], replies)
    assert backend.calls == theirs
    assert answer.reply == final and answer.answer == "the keeper"


def test_three_rereads_at_most_cost_four_passes_and_ten_calls():
    backend = Completing(script([QUERY] * 3))
    answer = reading(backend)
    n = len(chunks())
    assert len(backend.calls) == 4 * n + 10  # no decomposing call after the third reread
    assert len(answer.steps) == 4 * n
    # A reread's steps name their sub-question and the chunk they read again; the last
    # keeps the sub-answer and the memory the integration left (their text after </think>).
    last = answer.steps[2 * n - 1]
    assert (last.extra["question"], last.chunk.index) == ("Who rang the tower bell?", n - 1)
    assert last.memory == "r0.2" and last.extra["answer"] == "found \\boxed{keeper 0}"
    assert last.extra["merged"] == "integrated 0"
    assert [s.extra.get("question") for s in answer.steps[:n]] == [None] * n


def test_a_read_reply_keeps_what_follows_its_thinking_unstripped():
    backend = Completing(["<think>a</think> m0 \n", "", "m2", "", "\\boxed{x}"])
    answer = reading(backend)
    assert [s.memory for s in answer.steps] == [" m0 \n", "", "m2"]
    assert "<memory>\n m0 \n\n</memory>" in backend.calls[1][0]
    assert "<memory>\n\n</memory>" in backend.calls[2][0]  # an empty reply: an empty memory


def test_the_decomposing_reply_takes_what_the_context_leaves_up_to_8192():
    replies = script([""])
    roomy = Completing(list(replies))
    reading(roomy)
    assert roomy.calls[3][1] == memreread.DECOMPOSE_TOKENS
    small = Completing(list(replies), context_limit=6000)
    reading(small)
    prompt = len(memreread.chat(small.calls[3][0]).encode())
    assert small.calls[3][1] == 6000 - prompt - 48 < memreread.DECOMPOSE_TOKENS
    with pytest.raises(BudgetError, match="decomposing prompt takes about"):
        reading(Completing(list(replies), context_limit=3000))


def test_read_together_equals_read_alone():
    replies = script([QUERY, "enough"])
    alone = Completing(list(replies))
    whole = reading(alone)
    together = Completing([reply for reply in replies for _ in range(2)])
    reader = readers.get("memreread").loop(together, ())
    jobs = [Job("Who rang?", reader=reader), Job("Who rang?", reader=reader)]
    answers = read_together(together, jobs, chunks(), SETTINGS)
    assert [a.reply for a in answers] == [whole.reply] * 2
    assert together.calls[::2] == alone.calls


@pytest.mark.parametrize("decisions", [[QUERY, "enough"], [QUERY, QUERY, QUERY]])
def test_resumed_after_any_step_it_asks_what_the_whole_reading_asked(decisions):
    """Cut after every step in turn: the steps kept (a reread's sub-question, its
    sub-answer and integrated memory on its last step) are enough to ask the rest."""
    replies = script(decisions)
    alone = Completing(list(replies))
    whole = reading(alone)
    for cut in range(len(whole.steps) + 1):
        kept = whole.steps[:cut]
        # The calls a kept step stands for: its read, and the decomposing, sub-answer and
        # integrating calls joined to it.
        asked = sum(1 + ("question" in s.extra and s.chunk.index == 0) for s in kept)
        asked += sum(2 for s in kept if "merged" in s.extra)
        resumed = Completing(replies[asked:])
        again = reading(resumed, done=kept)
        assert resumed.calls == alone.calls[asked:], cut
        assert again.reply == whole.reply
        assert [s.memory for s in again.steps] == [s.memory for s in whole.steps]


# --- the run: its trace, `trace`, and --resume ------------------------------------------------


def test_a_trace_keeps_the_rereads_and_a_run_resumes_from_it(tmp_path):
    """The real pipeline writes each reread's steps to the trace (the chunk read again,
    the sub-question, the sub-answer and merged memory); a run stopped in the middle of a
    reread resumes from its trace and asks what the whole run asked after it."""
    from memagent_cli.documents import Document
    from memagent_cli.run import ask as run
    from memagent_cli.run.engine import Engine
    from memagent_cli.run.session import open_session

    document = Document(text=TEXT, path="/books/tower.txt", format="text", sha256="0" * 64)
    settings = Settings(chunk_tokens=40, memory_tokens=64, reader="memreread")

    def session(backend):
        return open_session(document, Engine(backend, settings, 8192))

    replies = script([QUERY, QUERY, "enough"])
    whole = Completing(list(replies))
    asking.ask(session(whole), "Who rang?", run.RunOptions(trace=tmp_path / "whole.jsonl"))
    written = read_trace(tmp_path / "whole.jsonl")
    n = len(chunks())
    assert len(written.steps) == 3 * n and written.finished
    reread = written.steps[n : 2 * n]
    assert [s.chunk_index for s in reread] == list(range(n))
    assert [s.index for s in reread] == list(range(n, 2 * n))
    assert {s.extra["question"] for s in reread} == {"Who rang the tower bell?"}
    assert reread[-1].extra["answer"] == "found \\boxed{keeper 0}"
    assert reread[-1].extra["merged"] == "integrated 0"
    assert written.header.settings["reader"] == "memreread"

    path = tmp_path / "cut.jsonl"
    with pytest.raises(run.Stopped):  # the replies run out inside the second reread: Ctrl-C
        asking.ask(
            session(Completing(replies[: 2 * n + 5])), "Who rang?", run.RunOptions(trace=path)
        )
    kept = read_trace(path).steps
    assert len(kept) == n + n + 1  # the first pass, the first reread, a step of the second
    resumed = Completing(replies[2 * n + 5 :])
    result = asking.ask(session(resumed), "Who rang?", run.RunOptions(resume=path, reuse=False))
    assert resumed.calls == whole.calls[2 * n + 5 :]
    assert result.answered.reply == replies[-1]
    assert read_trace(path).finished


def stand_in(prompt: str) -> str:
    """A MemReread model for the stand-in server: the first decomposing call asks one
    sub-question, the next finds the memory enough; reads, answers and the integration
    reply as the stand-in's MemAgent does."""
    from support import fake_openai

    user = prompt.split("<|im_start|>user\n", 1)[1].rsplit("<|im_end|>", 1)[0]
    if user.startswith("You are a Question Analysis"):
        return QUERY if "NO HISTORY" in user else "The memory is enough."
    return fake_openai.reply_to(user)


def test_the_command_reads_traces_shows_and_resumes_through_a_server(
    cli, fake_server, tmp_path, monkeypatch
):
    """`ask --reader memreread` through a server: its prompts, written whole, go to
    /v1/completions in Qwen3's markup with thinking off; `trace` and `trace --html` show
    the reread; a trace cut inside the reread resumes asking what the whole run asked."""
    from support import fake_openai

    monkeypatch.setattr(fake_openai, "completion_to", stand_in)
    book = tmp_path / "village.txt"
    book.write_text(story(60))
    sizes = ["--chunk-tokens", "200", "--memory-tokens", "48", "--temperature", "0"]
    args = [str(book), FACT_QUESTION, *served(fake_server, *sizes), "--reader", "memreread"]
    whole = cli("ask", *args, "--json", "--trace", str(tmp_path / "whole.jsonl"))
    assert whole.returncode == 0, whole.stderr
    result, asked = json.loads(whole.stdout), list(fake_server.prompts)
    n = result["document"]["chunks"]
    assert n >= 2 and fake_server.chat_calls == 0
    # A pass, a decomposing call, a reread, its answer and integration, another
    # decomposing call and the answer.
    assert len(asked) == n + 1 + n + 2 + 1 + 1
    assert asked[0] == memreread.chat(
        memreread.render_read(
            FACT_QUESTION,
            memreread.INITIAL_MEMORY,
            asked[0].split("<section>\n")[1].split("\n</section>")[0],
        )
    )
    assert result["chunks_read"] == 2 * n and result["steps"][n]["chunk"] == 0
    assert result["steps"][n]["question"] == "Who rang the tower bell?"

    shown = cli("trace", str(tmp_path / "whole.jsonl"), "--step", str(2 * n))
    assert shown.returncode == 0, shown.stderr
    assert "Reread for: 'Who rang the tower bell?'" in shown.stdout
    assert "Merged into the memory:" in shown.stdout
    page = tmp_path / "whole.html"
    html = cli("trace", str(tmp_path / "whole.jsonl"), "--html", str(page))
    assert html.returncode == 0, html.stderr
    assert "Reread for: &#x27;Who rang the tower bell?&#x27;" in page.read_text()

    # The trace as a run stopped after the reread's first step would have left it.
    lines = (tmp_path / "whole.jsonl").read_text().splitlines()
    cut = tmp_path / "cut.jsonl"
    cut.write_text("\n".join(lines[: 1 + n + 1]) + "\n")
    fake_server.prompts.clear()
    resumed = cli("ask", *args, "--json", "--resume", str(cut))
    assert resumed.returncode == 0, resumed.stderr
    assert fake_server.prompts == asked[n + 2 :]
    again = json.loads(resumed.stdout)
    assert again["reply"] == result["reply"]
    assert [s["memory"] for s in again["steps"]] == [s["memory"] for s in result["steps"]]


# --- what a reading costs and needs ---------------------------------------------------------


def test_inspect_prices_the_first_pass_and_every_reread_at_most():
    from memagent_cli.readers.spec import CallSize, Templates
    from memagent_cli.run.inspect import reading_calls

    templates = Templates(update=100, final=50, planner=800, merge=500)
    calls = reading_calls("memreread", [5000, 300], templates, 1024, first_memory=4)
    sub = memreread.SUBQUESTION_TOKENS
    reread = [
        CallSize(100 + 4 + 5000, 1024),  # a fresh memory for the sub-question
        CallSize(100 + 1024 + 300, 1024),
        CallSize(50 + 1024, 1024),  # the sub-answer
        CallSize(500 + 1024 + sub + 1024, 1024),  # the integration
    ]
    assert calls == [
        CallSize(100 + 4 + 5000, 1024),
        CallSize(100 + 1024 + 300, 1024),
        *[
            call
            for k in range(3)
            for call in [CallSize(800 + 1024 + k * (sub + 1024), 8192), *reread]
        ],
        CallSize(50 + 1024, 1024),
    ]
    assert len(calls) == 4 * 2 + 10
    assert "3 times at most" in readers.get("memreread").stops_early


def test_the_context_holds_the_decomposing_reply_where_the_model_can():
    spec, settings = readers.get("memreread"), Settings(500, 128, reader="memreread")
    roomy = spec.context_needed(ScriptedBackend([], context_limit=100_000), ["Who?"], settings)
    assert 8192 < roomy < 100_000
    # The default model's 8K: all of it, the decomposing reply taking what is left.
    small = ScriptedBackend([], context_limit=8192)
    assert spec.context_needed(small, ["Who?"], settings) == 8192
    with pytest.raises(BudgetError, match="MemReread's integration of a sub-answer needs"):
        spec.context_needed(ScriptedBackend([], context_limit=1500), ["Who?"], settings)


def test_the_evidence_reads_the_memory_a_reread_goes_on_with(tmp_path):
    """A reread's steps hold its own memory, read from nothing for the sub-question: the
    answer's words come from the first pass's step that found one (the main memory keeps
    it through the reread) and the reread's step that found the other."""
    from memagent_cli.documents import Document
    from memagent_cli.run import ask as run
    from memagent_cli.run.engine import Engine
    from memagent_cli.run.session import open_session

    replies = [
        *("nothing", "Pelican seen", "Pelican seen", QUERY),
        *("x", "Heron", "Heron", "\\boxed{Heron}", "Pelican and Heron"),
        *("enough", "So \\boxed{Pelican Heron}."),
    ]
    document = Document(text=TEXT, path="/books/tower.txt", format="text", sha256="0" * 64)
    session = open_session(document, Engine(Completing(replies), SETTINGS, 8192))
    result = asking.ask(session, "Who rang?", run.RunOptions(trace=tmp_path / "t.jsonl"))
    expected = [(2, ("pelican",)), (5, ("heron",))]
    assert [(s.step, s.words) for s in result.evidence] == expected
    assert [(s.step, s.words) for s in read_trace(tmp_path / "t.jsonl").final.evidence] == expected


def test_ctrl_c_in_a_reread_resumes_at_its_next_chunk_to_the_same_answer(
    memagent, env, fake_server, tmp_path, monkeypatch
):
    """Ctrl-C to a `memagent ask --reader memreread` process while the reread's second read
    waits on the server: exit 130, the trace keeps the first pass and the reread's first
    step; `--resume` asks what the whole run asked after them, to the same answer."""
    import signal
    import threading

    from support import fake_openai
    from support.command import interrupt_after_steps

    book = tmp_path / "village.txt"
    book.write_text(story(60))
    sizes = ["--chunk-tokens", "200", "--memory-tokens", "48", "--temperature", "0"]
    args = [str(book), FACT_QUESTION, *served(fake_server, *sizes), "--reader", "memreread"]
    args.append("--no-reuse")
    monkeypatch.setattr(fake_openai, "completion_to", stand_in)
    whole = memagent("ask", *args, "--json", "--no-trace")
    assert whole.returncode == 0, whole.stderr
    result, asked = json.loads(whole.stdout), list(fake_server.prompts)
    n = result["document"]["chunks"]
    fake_server.prompts.clear()
    interrupted = threading.Event()

    def held(prompt: str) -> str:  # the first pass, the decomposing call, one reread read
        if len(fake_server.prompts) > n + 2:
            interrupted.wait(timeout=60)
        return stand_in(prompt)

    monkeypatch.setattr(fake_openai, "completion_to", held)
    cut = tmp_path / "cut.jsonl"
    try:
        process, stdout, stderr = interrupt_after_steps(
            [*args, "--trace", str(cut)],
            cut,
            env,
            n + 1,
            interrupt=lambda p: (p.send_signal(signal.SIGINT), interrupted.set()),
        )
    finally:
        interrupted.set()
    assert process.returncode == 130, stderr
    assert stdout == "" and "Traceback" not in stderr
    assert len(read_trace(cut).steps) == n + 1 and not read_trace(cut).finished
    monkeypatch.setattr(fake_openai, "completion_to", stand_in)
    fake_server.prompts.clear()
    resumed = memagent("ask", *args, "--json", "--resume", str(cut))
    assert resumed.returncode == 0, resumed.stderr
    assert fake_server.prompts == asked[n + 2 :]
    again = json.loads(resumed.stdout)
    assert again["reply"] == result["reply"]
    assert [s["memory"] for s in again["steps"]] == [s["memory"] for s in result["steps"]]
    assert read_trace(cut).finished
