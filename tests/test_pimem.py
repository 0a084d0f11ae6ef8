"""PI-Mem (readers/pimem.py) against its authors' code: the templates byte for byte, the
merge input built as theirs builds it, a chunk reply judged and a final reply parsed as
theirs, the passes' calls in their order with their limits and stop rules, and the reading
through `read`, the scheduler, a trace and `--resume`, and the command through a stand-in
server. No model."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from support import asking
from support.fake_openai import served
from support.scripted import ScriptedBackend
from support.story import FACT_QUESTION, story

from memagent_cli import readers
from memagent_cli.backend import Generation
from memagent_cli.chunking import make_chunks
from memagent_cli.errors import BudgetError
from memagent_cli.reader import Settings, read
from memagent_cli.readers import pimem
from memagent_cli.scheduler import Job, read_together

# --- the oracles: the authors' files, copied verbatim -------------------------------------
# github.com/JetAstra/PI-Mem at 410f0c10f6831e7154d7666506e8bdccbed8e748 (main, 2026-08-06):
# taskutils/memory_eval/utils/parallel_boxed.py lines 17-111 (the strings) and 175-203
# (_is_no_new_info, _build_merge_memories), and utils/__init__.py's extract_solution,
# last_boxed_only_string and extract_boxed_answer, run here as their module text.

THEIR_STRINGS = r'''TEMPLATE_CHUNK = """You are presented with a problem, a section of an article, and a global memory summarizing previously gathered information. Please read the section carefully and determine whether the section contains new information relevant to answering the problem beyond what is already in the global memory. First, output your judgment in the format <check>yes</check> if there is new information, or <check>no</check> if there is none. Then, if there is new information, extract and list the key details.

<problem>
{prompt}
</problem>

<memory>
{memory}
</memory>

<section>
{chunk}
</section>

Your response:
"""

TEMPLATE_MERGE = """You are presented with a problem and key information extracted from multiple sections of an article. Please consolidate all the information into a single comprehensive memory. Remove redundancies and organize the information clearly, retaining all details relevant to answering the problem.

<problem>
{prompt}
</problem>

<extracted_information>
{memories}
</extracted_information>

Consolidated memory:
"""

TEMPLATE_FINAL_BOXED = """You are presented with a problem and a previous memory. Please answer the problem based on the previous memory and put the answer in \\boxed{{}}.

<problem>
{prompt}
</problem>

<memory>
{memory}
</memory>

Your answer:
"""


TEMPLATE_CHUNK_WITH_ANSWER_PREFIX = """You are presented with a problem, a section of an article, and a global memory summarizing previously gathered information. Please read the section carefully and determine whether the section contains new information relevant to answering the problem beyond what is already in the global memory. First, output your judgment in the format <check>yes</check> if there is new information, or <check>no</check> if there is none. Then, if there is new information, extract and list the key details.

<problem>
{prompt}

{answer_prefix}
</problem>

<memory>
{memory}
</memory>

<section>
{chunk}
</section>

Your response:
"""

TEMPLATE_MERGE_WITH_ANSWER_PREFIX = """You are presented with a problem and key information extracted from multiple sections of an article. Please consolidate all the information into a single comprehensive memory. Remove redundancies and organize the information clearly, retaining all details relevant to answering the problem.

<problem>
{prompt}

{answer_prefix}
</problem>

<extracted_information>
{memories}
</extracted_information>

Consolidated memory:
"""

TEMPLATE_FINAL_BOXED_WITH_ANSWER_PREFIX = """You are presented with a problem and a previous memory. Please answer the problem based on the previous memory and put the answer in \\boxed{{}}.

<problem>
{prompt}
</problem>

<memory>
{memory}
</memory>

{answer_prefix}
"""

NO_MEMORY = "No previous memory"
NO_NEW_INFO_MARKER = "<check>no</check>"
PREVIOUS_MEMORY_LABEL = "[Previous Memory]:"
SECTION_LABEL_TEMPLATE = "[Section {idx}]:"
'''  # noqa: E501

THEIR_HELPERS = r'''def _is_no_new_info(response: str) -> bool:
    """Check if the model's response contains <check>no</check>."""
    return NO_NEW_INFO_MARKER in response.lower()


def _build_merge_memories(previous_memory: str, new_memories: list[str]) -> str:
    """
    Build the <extracted_information> payload for merge:
    - include previous global memory if it exists
    - append all newly extracted chunk memories with section labels
    """
    parts = []

    if (
        previous_memory
        and previous_memory.strip()
        and previous_memory.strip() != NO_MEMORY
    ):
        parts.append(f"{PREVIOUS_MEMORY_LABEL}\n{previous_memory.strip()}")

    for i, mem in enumerate(new_memories, start=1):
        if mem is None:
            continue
        mem = mem.strip()
        if not mem:
            continue
        parts.append(f"{SECTION_LABEL_TEMPLATE.format(idx=i)}\n{mem}")

    return "\n\n".join(parts) if parts else NO_MEMORY
'''

THEIR_ANSWERS = r'''def extract_solution(solution_str):
    """Extracts the final answer from the model's response string.
    
    Args:
        solution_str: Raw response string from the language model
        
    Returns:
        Tuple containing (extracted_answer, processed_string)
    """
  
    # Extract final answer using XML-style tags
    if "</think>" not in solution_str:
        if not os.environ.get("FORCE_THINK"):
            return solution_str, solution_str
        else:
            print("[Error] No valid answer tags found")
            return None, solution_str 
    final_answer = solution_str.split("</think>")[-1].strip()
    return final_answer, solution_str


def last_boxed_only_string(string):
    idx = string.rfind("\\boxed")
    if "\\boxed " in string:
        return "\\boxed " + string.split("\\boxed ")[-1].split("$")[0]
    if idx < 0:
        idx = string.rfind("\\fbox")
        if idx < 0:
            return None

    i = idx
    right_brace_idx = None
    num_left_braces_open = 0
    while i < len(string):
        if string[i] == "{":
            num_left_braces_open += 1
        if string[i] == "}":
            num_left_braces_open -= 1
            if num_left_braces_open == 0:
                right_brace_idx = i
                break
        i += 1

    if right_brace_idx is None:
        retval = None
    else:
        retval = string[idx:right_brace_idx + 1]

    return retval

def extract_boxed_answer(string):
    s = last_boxed_only_string(string)
    if s is None:
        return None
    else:
        if "\\boxed " in s:
            left = "\\boxed "
            assert s[:len(left)] == left
            return s[len(left):]

        left = "\\boxed{"

        assert s[:len(left)] == left
        assert s[-1] == "}"

        return s[len(left):-1]
'''  # noqa: E501

THEIRS: dict = {"os": os}
exec("\n".join([THEIR_STRINGS, THEIR_HELPERS, THEIR_ANSWERS]), THEIRS)


def their_calls(question, chunks, replies):
    """async_query_llm's calls for `question` over `chunks` (texts), each answered by the
    next of `replies` (their client strips each): (the user message, max_tokens) in order,
    a pass's chunk calls in chunk order (their gather keeps it), and the final reply."""
    replies, calls = iter(replies), []

    def query(message, max_tokens):
        calls.append((message, max_tokens))
        return next(replies).strip()

    memory = THEIRS["NO_MEMORY"]
    for _ in range(3):  # PARALLEL_MAX_PASSES
        messages = [
            THEIRS["TEMPLATE_CHUNK"].format(prompt=question, chunk=chunk, memory=memory)
            for chunk in chunks
        ]
        results = [query(message, 1024) for message in messages]
        new = [r for r in results if r is not None and not THEIRS["_is_no_new_info"](r)]
        if not new:
            break
        merged = THEIRS["TEMPLATE_MERGE"].format(
            prompt=question, memories=THEIRS["_build_merge_memories"](memory, new)
        )
        memory = query(merged, 1024)
    calls.append((THEIRS["TEMPLATE_FINAL_BOXED"].format(prompt=question, memory=memory), 1024))
    return calls, next(replies)


def their_answer(reply):
    """ruler_hqa.get_pred's parsing; None where the item is dropped or their assert fires."""
    response = reply.strip()
    if response == "":
        return None
    pred = THEIRS["extract_solution"](response)[0]
    try:
        return THEIRS["extract_boxed_answer"](pred)
    except AssertionError:
        return None


TEXT = "The tower bell rang at noon. " * 4  # 116 bytes: 3 chunks of 40 one-byte tokens
SETTINGS = Settings(chunk_tokens=40, memory_tokens=1024, reader="pi-mem")
NO, YES = "<check>no</check>", "<check>yes</check> the keeper rang it"


def chunks(text=TEXT):
    return make_chunks(list(text.encode()), SETTINGS.chunk_tokens, bytes)


def script(*passes, merges=("merged one", "merged two", "merged three")):
    """Replies for passes of chunk replies, a merge after each pass that found something,
    then the answer."""
    replies = []
    for number, found in enumerate(passes):
        replies += found
        if any(NO not in r.lower() for r in found):
            replies.append(merges[number])
    return [*replies, " The keeper. \\boxed{the keeper} "]


def reading(backend, done=(), settings=SETTINGS):
    reader = readers.get("pi-mem").loop(backend, ())
    return read(backend, "Who rang?", chunks(), settings, done=done, reader=reader)


# --- the strings and the prompts -----------------------------------------------------------


def test_the_templates_are_theirs_byte_for_byte():
    assert THEIRS["TEMPLATE_CHUNK"] == pimem.CHUNK_TEMPLATE
    assert THEIRS["TEMPLATE_MERGE"] == pimem.MERGE_TEMPLATE
    assert THEIRS["TEMPLATE_FINAL_BOXED"] == pimem.FINAL_TEMPLATE
    assert THEIRS["NO_MEMORY"] == pimem.INITIAL_MEMORY
    assert THEIRS["NO_NEW_INFO_MARKER"] == pimem.NO_NEW_INFO
    assert THEIRS["PREVIOUS_MEMORY_LABEL"] == pimem.PREVIOUS_MEMORY_LABEL
    assert THEIRS["SECTION_LABEL_TEMPLATE"] == pimem.SECTION_LABEL


@pytest.mark.parametrize(
    ("memory", "found"),
    [
        ("No previous memory", ["<check>yes</check> a"]),
        ("  No previous memory \n", ["a", "", "  b  "]),  # an empty finding keeps its number
        ("", [""]),  # nothing left: "No previous memory"
        ("   ", ["x"]),
        ("the memory so far\n", ["one", "two", "three"]),
    ],
)
def test_the_merge_input_is_built_as_theirs(memory, found):
    assert pimem.merge_input(memory, found) == THEIRS["_build_merge_memories"](memory, found)
    assert pimem.render_merge("Who?", memory, found) == THEIRS["TEMPLATE_MERGE"].format(
        prompt="Who?", memories=THEIRS["_build_merge_memories"](memory, found)
    )


@pytest.mark.parametrize(
    "reply",
    [
        NO,
        "<CHECK>No</CHECK>",
        f"{YES} but also {NO}",
        YES,
        "no tag at all",
        "",
        "<check> no </check>",
    ],
)
def test_a_chunk_reply_found_nothing_only_as_theirs_says(reply):
    assert pimem.found_nothing(reply) == THEIRS["_is_no_new_info"](reply)


@pytest.mark.parametrize(
    "reply",
    [
        "\\boxed{Paris}",
        "a \\boxed{x} then \\boxed{y}.",
        "\\boxed {no brace}",
        "\\boxed x$ and more",
        "\\boxed{a{b}c}",
        "\\boxed{unclosed",
        "\\fbox{only}",  # their assert fires: no answer
        "\\boxed\\text{x}",  # their assert fires: no answer
        "<think>t</think> \\boxed{after}",
        "no box",
        "   ",
    ],
)
def test_the_answer_is_parsed_as_theirs_parses_it(reply):
    assert pimem.parse_answer(reply) == their_answer(reply)


# --- the loop ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "passes",
    [
        [[NO, NO, NO]],  # nothing found in pass 1: no merge, the answer
        [[YES, NO, "  spaced  "], [NO, NO, NO]],  # converged in pass 2
        [[YES, NO, NO], [NO, "no tag", NO], [YES, YES, YES]],  # three passes, three merges
        [["", NO, NO], [NO, NO, NO]],  # an empty reply counts as new
    ],
)
def test_the_calls_are_theirs_in_their_order_with_their_limits(passes):
    replies = script(*passes)
    backend = ScriptedBackend(list(replies))
    answer = reading(backend)
    theirs, final = their_calls("Who rang?", [c.text for c in chunks()], replies)
    assert backend.messages == theirs
    assert answer.reply == final and answer.answer == "the keeper"


def test_each_pass_is_steps_and_its_merge_is_on_its_last():
    replies = script([YES, NO, NO], [NO, YES, NO], [NO, NO, NO])
    answer = reading(ScriptedBackend(list(replies)))
    n = len(chunks())
    assert len(answer.steps) == 3 * n
    assert [s.chunk.index for s in answer.steps] == [0, 1, 2] * 3
    assert [s.memory for s in answer.steps[:n]] == [YES, NO, NO]  # each chunk's finding
    merges = [None, None, "merged one", None, None, "merged two", None, None, None]
    assert [s.extra.get("merged") for s in answer.steps] == merges
    # The merge's cost is its pass's last step's.
    assert answer.steps[n - 1].generation.completion_tokens == (1 + 2) + (2 + 2)


def test_read_together_equals_read_alone():
    replies = script([YES, NO, NO], [NO, NO, NO])
    alone = ScriptedBackend(list(replies))
    whole = reading(alone)
    together = ScriptedBackend([reply for reply in replies for _ in range(2)])
    reader = readers.get("pi-mem").loop(together, ())
    jobs = [Job("Who rang?", reader=reader), Job("Who rang?", reader=reader)]
    answers = read_together(together, jobs, chunks(), SETTINGS)
    assert [a.reply for a in answers] == [whole.reply] * 2
    assert together.messages[::2] == alone.messages


class Finder(ScriptedBackend):
    """The stand-in PI-Mem model below (`stand_in`) in-process: a reply depends on the
    message alone, so calls answered in any order or together give what they give alone."""

    def generate(self, message: str, *, max_tokens: int, sampling) -> Generation:
        self.messages.append((message, max_tokens))
        text = stand_in(message)
        return Generation(text, len(message), len(text.split()) + 2, 0.1, 0.2, "stop")


VAULT = "The bell rang at noon. The vault opened at dawn. The tower fell. " * 2


@pytest.mark.parametrize(
    ("slots", "rounds"),
    [
        # A pass's chunk calls in one round, each in a sequence of its own: pass 1, its
        # merge, pass 2 (nothing new: no merge), the answer.
        (8, [[0, 1, 2, 3]] + [[0]] + [[0, 1, 2, 3]] + [[0]]),
        (2, [[0, 1], [0, 1], [0], [0, 1], [0, 1], [0]]),  # two at a time
        (1, [[0]] * 4 + [[0]] + [[0]] * 4 + [[0]]),  # one by one, as `read` asks them
    ],
)
def test_a_pass_s_chunk_calls_go_together_and_read_as_one_by_one(slots, rounds):
    one_by_one = Finder([])
    reader = readers.get("pi-mem").loop(one_by_one, ())
    alone = read(one_by_one, "Who?", chunks(VAULT), SETTINGS, reader=reader)
    together = Finder([])
    job = Job("Who?", reader=readers.get("pi-mem").loop(together, ()))
    [answer] = read_together(together, [job], chunks(VAULT), SETTINGS, slots=slots)
    assert together.rounds == rounds
    assert answer.reply == alone.reply and alone.steps[3].extra["merged"]  # pass 1 found something
    assert [s.memory for s in answer.steps] == [s.memory for s in alone.steps]
    assert [s.extra for s in answer.steps] == [s.extra for s in alone.steps]
    assert sorted(together.messages) == sorted(one_by_one.messages)


def test_read_asks_a_pass_one_by_one_in_chunk_order():
    backend = Finder([])
    reader = readers.get("pi-mem").loop(backend, ())
    read(backend, "Who?", chunks(VAULT), SETTINGS, reader=reader)
    sections = [m.split("<section>\n")[1] for m, _ in backend.messages if "<section>" in m]
    assert sections == [f"{c.text}\n</section>\n\nYour response:\n" for c in chunks(VAULT)] * 2


@pytest.mark.parametrize(
    "passes",
    [
        [[YES, NO, NO], [NO, YES, NO], [NO, NO, NO]],
        [[YES, NO, YES], [YES, YES, YES], [NO, YES, NO]],
    ],
)
def test_resumed_after_any_step_it_asks_what_the_whole_reading_asked(passes):
    replies = script(*passes)
    alone = ScriptedBackend(list(replies))
    whole = reading(alone)
    for cut in range(len(whole.steps) + 1):
        kept = whole.steps[:cut]
        asked = cut + sum(1 for s in kept if "merged" in s.extra)
        resumed = ScriptedBackend(replies[asked:])
        again = reading(resumed, done=kept)
        assert resumed.messages == alone.messages[asked:], cut
        assert again.reply == whole.reply
        assert [s.memory for s in again.steps] == [s.memory for s in whole.steps]


def test_a_merge_the_context_cannot_hold_is_refused_in_one_sentence():
    replies = script(["x" * 3000, "y" * 3000, "z" * 3000])
    with pytest.raises(BudgetError, match="PI-Mem's merge after pass 1 shows what 3 chunks found"):
        reading(ScriptedBackend(list(replies), context_limit=8192))


def test_the_context_has_room_for_a_merge_of_every_chunk_as_far_as_the_model_goes():
    spec, settings = readers.get("pi-mem"), Settings(500, 128, reader="pi-mem")
    big = ScriptedBackend([], context_limit=100_000)
    few = spec.context_needed(big, ["Who?"], settings)
    assert spec.context_needed(big, ["Who?"], settings, steps=40) > max(few, 40 * 128)
    small = ScriptedBackend([], context_limit=8192)
    assert spec.context_needed(small, ["Who?"], settings, steps=400) == 8192


def test_inspect_prices_every_pass_and_its_merge_at_most():
    from memagent_cli.readers.spec import CallSize, Templates
    from memagent_cli.run.inspect import reading_calls

    templates = Templates(update=100, final=50, merge=80)
    calls = reading_calls("pi-mem", [5000, 300], templates, 1024, first_memory=4)
    assert calls == [
        CallSize(100 + 4 + 5000, 1024),
        CallSize(100 + 4 + 300, 1024),
        CallSize(80 + 4 + 2 * (1024 + 8), 1024),  # at most a chunk's worth of findings
        *[
            call
            for _ in range(2)
            for call in (
                CallSize(100 + 1024 + 5000, 1024),
                CallSize(100 + 1024 + 300, 1024),
                CallSize(80 + 1024 + 2 * (1024 + 8), 1024),
            )
        ],
        CallSize(50 + 1024, 1024),
    ]
    assert (
        "stops after a pass in which no chunk finds anything new"
        in readers.get("pi-mem").stops_early
    )


# --- the run: its trace, `trace`, and --resume ------------------------------------------------


def stand_in(message: str) -> str:
    """A PI-Mem model for the stand-in server: in the first pass the chunk that tells of
    the vault finds something, every other chunk nothing; a merge keeps the findings' words;
    the answer boxes the memory's last word."""
    if message.startswith("You are presented with a problem, a section of an article, and"):
        section = message.split("<section>\n", 1)[1]
        first = "No previous memory" in message.split("<memory>\n", 1)[1].split("</memory>")[0]
        return f"{YES} {section.split()[0]}" if first and "vault" in section else NO
    if message.startswith("You are presented with a problem and key information"):
        return "memory: " + message.split("<extracted_information>\n", 1)[1].split()[-3]
    memory = message.split("<memory>\n", 1)[1].split("\n</memory>")[0]
    return f"It is \\boxed{{{memory.split()[-1]}}}."


def test_the_command_reads_traces_shows_and_resumes_through_a_server(
    cli, fake_server, tmp_path, monkeypatch
):
    """`ask --reader pi-mem` through a server: chat messages as theirs; `trace` and
    `trace --html` show each pass's merge; a trace cut inside the second pass resumes
    asking what the whole run asked."""
    from support import fake_openai

    monkeypatch.setattr(fake_openai, "reply_to", stand_in)
    book = tmp_path / "village.txt"
    book.write_text(story(60))
    sizes = ["--chunk-tokens", "200", "--memory-tokens", "48", "--temperature", "0"]
    args = [str(book), FACT_QUESTION, *served(fake_server, *sizes), "--reader", "pi-mem"]
    whole = cli("ask", *args, "--json", "--trace", str(tmp_path / "whole.jsonl"))
    assert whole.returncode == 0, whole.stderr
    result = json.loads(whole.stdout)
    n = result["document"]["chunks"]
    assert n >= 2 and fake_server.chat_calls == 2 * n + 2  # two passes, a merge, the answer
    assert result["chunks_read"] == 2 * n
    assert result["steps"][n - 1]["merged"].startswith("memory: ")
    assert result["steps"][n]["chunk"] == 0 and "merged" not in result["steps"][-1]

    shown = cli("trace", str(tmp_path / "whole.jsonl"), "--step", str(n))
    assert shown.returncode == 0, shown.stderr
    assert "Merged into the memory: memory: " in shown.stdout
    page = tmp_path / "whole.html"
    html = cli("trace", str(tmp_path / "whole.jsonl"), "--html", str(page))
    assert html.returncode == 0, html.stderr
    assert "Merged into the memory: memory: " in page.read_text()
    # Steps of two passes over n chunks: step n + 1 of 2n, never of n.
    assert f'Step {n + 1} <span class="sub">of {2 * n}</span>' in page.read_text()

    lines = (tmp_path / "whole.jsonl").read_text().splitlines()
    cut = tmp_path / "cut.jsonl"
    cut.write_text("\n".join(lines[: 1 + n + 1]) + "\n")
    calls = fake_server.chat_calls
    resumed = cli("ask", *args, "--json", "--resume", str(cut))
    assert resumed.returncode == 0, resumed.stderr
    assert fake_server.chat_calls - calls == n - 1 + 1  # the rest of pass 2, the answer
    again = json.loads(resumed.stdout)
    assert again["reply"] == result["reply"]
    assert [s["memory"] for s in again["steps"]] == [s["memory"] for s in result["steps"]]


def test_a_pass_s_chunk_calls_go_to_a_server_at_once_on_parallel_threads(
    cli, fake_server, tmp_path, monkeypatch
):
    """`--parallel 3` with a server: a pass's chunk calls are 3 in flight at once, and the
    reading is the one `--parallel 1` reads, call by call."""
    from support import fake_openai

    monkeypatch.setattr(fake_openai, "reply_to", stand_in)
    book = tmp_path / "village.txt"
    book.write_text(story(60))
    sizes = ["--chunk-tokens", "200", "--memory-tokens", "48", "--temperature", "0"]
    args = [str(book), FACT_QUESTION, *served(fake_server, *sizes), "--reader", "pi-mem"]
    fake_server.delay = 0.05
    runs = {}
    for parallel in ("1", "3"):
        fake_server.most_in_flight, fake_server.messages = 0, []
        result = cli("ask", *args, "--json", "--no-trace", "--parallel", parallel)
        assert result.returncode == 0, result.stderr
        runs[parallel] = json.loads(result.stdout), fake_server.most_in_flight
        runs[parallel][0]["messages"] = sorted(fake_server.messages)
    (one, most_one), (three, most_three) = runs["1"], runs["3"]
    assert one["document"]["chunks"] >= 3
    assert (most_one, most_three) == (1, 3)
    assert three["reply"] == one["reply"] and three["messages"] == one["messages"]
    assert [s["memory"] for s in three["steps"]] == [s["memory"] for s in one["steps"]]


def test_eval_sends_a_pass_s_chunk_calls_at_once_on_parallel_threads(
    cli, fake_server, tmp_path, monkeypatch
):
    """`memagent eval --reader pi-mem --parallel 3` with a server: one case's pass is 3
    calls in flight at once, and it scores what `--parallel 1` scores, call by call."""
    from support import fake_openai

    from memagent_cli.evaluation import results

    monkeypatch.setattr(fake_openai, "reply_to", stand_in)
    data = tmp_path / "eval_50.json"
    case = {"_id": "c1", "input": FACT_QUESTION, "context": story(60), "answers": ["x"]}
    data.write_text(json.dumps([case]))
    sizes = ["--chunk-tokens", "200", "--memory-tokens", "48", "--temperature", "0"]
    fake_server.delay = 0.05
    runs = {}
    for parallel in ("1", "3"):
        fake_server.most_in_flight, fake_server.messages = 0, []
        out = tmp_path / f"results-{parallel}.jsonl"
        args = [*served(fake_server, *sizes), "--reader", "pi-mem", "--no-trace"]
        result = cli("eval", str(data), *args, "--parallel", parallel, "-o", str(out))
        assert result.returncode == 0, result.stderr
        [record] = results.read(out).records
        runs[parallel] = record, sorted(fake_server.messages), fake_server.most_in_flight
    (one, sent_one, most_one), (three, sent_three, most_three) = runs["1"], runs["3"]
    assert len(sent_one) >= 3 + 1
    assert (most_one, most_three) == (1, 3)
    assert sent_three == sent_one and three["reply"] == one["reply"]


def test_the_api_reads_a_pass_s_chunk_calls_together_in_process():
    """`api.ask` in-process: a pass's chunk calls go in one round, a sequence each, as
    `memagent ask` reads them, and give what one by one gives."""
    from memagent_cli import api
    from memagent_cli.documents import Document

    one_by_one = Finder([])
    reader = readers.get("pi-mem").loop(one_by_one, ())
    alone = read(one_by_one, "Who?", chunks(VAULT), SETTINGS, reader=reader)
    together = Finder([])
    document = Document(text=VAULT, path="vault.txt", format="text", sha256="0" * 64)
    result = api.ask(api.Model(together, SETTINGS), document, "Who?")
    assert together.rounds == [[0, 1, 2, 3], [0], [0, 1, 2, 3], [0]]
    assert result.answered.reply == alone.reply
    assert result.memories == [s.memory for s in alone.steps]


def test_the_api_sends_a_pass_s_chunk_calls_at_once_to_a_server(fake_server, tmp_path, monkeypatch):
    """`api.ask(..., parallel=3)` with a server: 3 calls in flight at once, the reading the
    one `parallel=1` reads."""
    from support import fake_openai

    from memagent_cli import api

    monkeypatch.setattr(fake_openai, "reply_to", stand_in)
    book = tmp_path / "village.txt"
    book.write_text(story(60))
    model = api.open_model(
        server=api.ServerOptions(base_url=fake_server.url),
        reader="pi-mem",
        sampling=api.Sampling(temperature=0),
        chunk_tokens=200,
        memory_tokens=48,
    )
    fake_server.delay = 0.05
    runs = {}
    for parallel in (1, 3):
        fake_server.most_in_flight, fake_server.messages = 0, []
        result = api.ask(model, book, FACT_QUESTION, parallel=parallel)
        runs[parallel] = result, sorted(fake_server.messages), fake_server.most_in_flight
    (one, sent_one, most_one), (three, sent_three, most_three) = runs[1], runs[3]
    assert one.chunks >= 3
    assert (most_one, most_three) == (1, 3)
    assert sent_three == sent_one and three.answered.reply == one.answered.reply
    assert three.memories == one.memories


@pytest.mark.parametrize("parallel", ["1", "3"])
def test_the_progress_lines_count_a_pass_s_chunks_answered_as_they_come(
    cli, fake_server, tmp_path, monkeypatch, parallel
):
    """stderr in a log: while a pass's calls run, a line per reply, "pass 2: 3 of 4 chunks
    answered", before the pass's step lines (which come once its merge is done)."""
    from support import fake_openai

    monkeypatch.setattr(fake_openai, "reply_to", stand_in)
    book = tmp_path / "village.txt"
    book.write_text(story(60))
    sizes = ["--chunk-tokens", "200", "--memory-tokens", "48", "--temperature", "0"]
    args = [str(book), FACT_QUESTION, *served(fake_server, *sizes), "--reader", "pi-mem"]
    result = cli("ask", *args, "--json", "--no-trace", "--parallel", parallel)
    assert result.returncode == 0, result.stderr
    n = json.loads(result.stdout)["document"]["chunks"]
    lines = result.stderr.splitlines()
    counted = [line for line in lines if " chunks answered" in line]
    assert counted == [
        f"pass {number}: {k} of {n} chunks answered" for number in (1, 2) for k in range(n + 1)
    ]
    steps = [line.split()[1] for line in lines if line.startswith("step ")]
    assert steps == [f"{i}/{n if i <= n else 2 * n}" for i in range(1, n + 1)] + [
        f"{i}/{2 * n}" for i in range(n + 1, 2 * n + 1)
    ]
    # Pass 1's replies all counted before its first step line, pass 2's after its last.
    assert lines.index(f"pass 1: {n} of {n} chunks answered") < lines.index(
        next(line for line in lines if line.startswith("step 1/"))
    )
    assert lines.index(f"pass 2: 0 of {n} chunks answered") > lines.index(
        next(line for line in lines if line.startswith(f"step {n}/"))
    )


# --- evidence --------------------------------------------------------------------------------


def asked_through_a_run(replies, tmp_path):
    """The reading through the real run (its trace written): the result and the trace."""
    from memagent_cli.documents import Document
    from memagent_cli.run import ask as run
    from memagent_cli.run.engine import Engine
    from memagent_cli.run.session import open_session
    from memagent_cli.trace import read_trace

    document = Document(text=TEXT, path="/books/tower.txt", format="text", sha256="0" * 64)
    session = open_session(document, Engine(ScriptedBackend(list(replies)), SETTINGS, 8192))
    result = asking.ask(session, "Who rang?", run.RunOptions(trace=tmp_path / "t.jsonl"))
    return result, read_trace(tmp_path / "t.jsonl")


@pytest.mark.parametrize(
    ("passes", "merges", "step"),
    [
        # Found by the first chunk of pass 1, kept by its merge: step 1.
        ([["<check>yes</check> the Pelican rang it", NO, NO], [NO, NO, NO]], ["the Pelican"], 1),
        # The bell in pass 1; the Pelican found by the last chunk of pass 2: step 6.
        (
            [[f"{YES} bell", NO, NO], [NO, NO, "<check>yes</check> Pelican"], [NO] * 3],
            ["the bell", "the bell and the Pelican"],
            6,
        ),
    ],
)
def test_the_evidence_is_the_chunk_whose_finding_a_merge_kept(tmp_path, passes, merges, step):
    """A step's memory is one chunk's finding, not the memory: the answer's word came from
    the chunk whose finding held it in the pass whose merge brought it in for good."""
    passes_merged = zip(passes, [*merges, None], strict=True)
    replies = [r for found, merge in passes_merged for r in [*found, merge] if r]
    result, written = asked_through_a_run([*replies, "It is \\boxed{Pelican}."], tmp_path)
    assert [(s.step, s.words) for s in result.evidence] == [(step, ("pelican",))]
    assert [(s.step, s.words) for s in written.final.evidence] == [(step, ("pelican",))]


def test_ctrl_c_while_a_pass_merges_keeps_its_last_chunk_s_reply_for_the_resume(tmp_path):
    """Ctrl-C during pass 2's merge: the trace holds the pass's steps but its last, whose
    record waits on the merge, and keeps that chunk's reply; the resumed run asks the merge
    first, and what the whole run asked after it."""
    from memagent_cli.documents import Document
    from memagent_cli.run import ask as run
    from memagent_cli.run.engine import Engine
    from memagent_cli.run.session import open_session
    from memagent_cli.trace import read_trace

    replies = script([YES, NO, NO], [NO, YES, NO], [NO, NO, NO])
    document = Document(text=TEXT, path="/books/tower.txt", format="text", sha256="0" * 64)

    def session(backend):
        return open_session(document, Engine(backend, SETTINGS, 8192))

    alone = ScriptedBackend(list(replies))
    whole = asking.ask(session(alone), "Who rang?", run.RunOptions())
    n, path = len(chunks()), tmp_path / "t.jsonl"
    asked = n + 1 + n  # pass 1, its merge, pass 2: then Ctrl-C, in pass 2's merge
    with pytest.raises(run.Stopped):
        asking.ask(session(ScriptedBackend(replies[:asked])), "Who rang?", run.RunOptions(path))
    stopped = read_trace(path)
    assert len(stopped.steps) == 2 * n - 1
    [kept] = stopped.interruption.replies
    assert kept.text == replies[asked - 1]
    resumed = ScriptedBackend(replies[asked:])
    again = asking.ask(session(resumed), "Who rang?", run.RunOptions(resume=path))
    assert resumed.messages == alone.messages[asked:]
    assert again.answered.reply == whole.answered.reply
    assert again.memories == whole.memories
    assert [s.extra for s in again.answered.steps] == [s.extra for s in whole.answered.steps]
    assert read_trace(path).finished


@pytest.mark.parametrize("parallel", ["1", "3"])
def test_ctrl_c_in_the_second_pass_keeps_its_replies_and_resumes_asking_only_the_rest(
    memagent, env, fake_server, tmp_path, monkeypatch, parallel
):
    """Ctrl-C to a `memagent ask --reader pi-mem` process once 2 of pass 2's calls are
    answered and the others wait on the server: exit 130, the trace keeps pass 1 and its
    merge, and the 2 replies; `--resume` asks only the rest of pass 2 and the answer, the
    prompts the uninterrupted run asked, and ends where it ends."""
    from support import fake_openai
    from support.command import interrupt_after_steps

    from memagent_cli.trace import read_trace

    monkeypatch.setattr(fake_openai, "reply_to", stand_in)
    book = tmp_path / "village.txt"
    book.write_text(story(60))
    sizes = ["--chunk-tokens", "200", "--memory-tokens", "48", "--temperature", "0"]
    args = [str(book), FACT_QUESTION, *served(fake_server, *sizes), "--reader", "pi-mem"]
    args += ["--no-reuse", "--parallel", parallel]
    whole = memagent("ask", *args, "--json", "--no-trace")
    assert whole.returncode == 0, whole.stderr
    result, asked = json.loads(whole.stdout), fake_server.messages
    n = result["document"]["chunks"]
    assert n >= 4
    # Pass 1 and its merge answered, then 2 calls of pass 2; the rest held at the server.
    fake_server.messages, fake_server.hold_after = [], fake_server.chat_calls + n + 1 + 2
    waiting = min(int(parallel), n - 2)  # in flight once both replies are taken

    def once_both_are_taken(process):
        deadline = time.monotonic() + 30
        while fake_server.held < waiting and time.monotonic() < deadline:
            time.sleep(0.02)
        process.send_signal(signal.SIGINT)

    cut = tmp_path / "cut.jsonl"
    process, stdout, stderr = interrupt_after_steps(
        [*args, "--trace", str(cut)], cut, env, n, interrupt=once_both_are_taken
    )
    assert process.returncode == 130, stderr
    assert stdout == "" and "Traceback" not in stderr and "Interrupted (SIGINT)" in stderr
    stopped, answered = read_trace(cut), list(fake_server.messages)
    assert len(answered) == n + 1 + 2
    assert len(stopped.steps) == n and stopped.steps[-1].extra["merged"]  # pass 1, merged
    assert len(stopped.interruption.replies) == 2  # pass 2's, kept
    fake_server.hold_after, fake_server.messages = None, []  # the held calls stay held
    resumed = memagent("ask", *args, "--json", "--resume", str(cut))
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming {cut} after step {n}" in " ".join(resumed.stderr.split())
    assert len(fake_server.messages) == n - 2 + 1  # the rest of pass 2, the answer
    assert sorted(answered + fake_server.messages) == sorted(asked)
    if parallel == "1":
        assert answered + fake_server.messages == asked  # in the same order too
    again = json.loads(resumed.stdout)
    assert again["reply"] == result["reply"]
    assert [s["memory"] for s in again["steps"]] == [s["memory"] for s in result["steps"]]
    assert [s.get("merged") for s in again["steps"]] == [s.get("merged") for s in result["steps"]]
    assert read_trace(cut).finished
