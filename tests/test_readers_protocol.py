"""The readers after MemAgent (docs/readers.md): every prompt byte for byte against the
authors' own strings, their reply parsing on malformed replies, BM25 and TF-IDF against
their formulas, and the state each reader carries from step to step. No model."""

from __future__ import annotations

import math
import random
import re

import pytest
from support.deadline import deadline

from memagent_cli.readers import infmem, rememr1

# --- the oracles: the authors' literals, copied verbatim from their files ----------------
# UCMP13753/InfMem, commit 4f4de32311bfff8e8847664705301076b6d61453 (identical at
# 26f17666), taskutils/memory_eval/utils/infmem.py.

INFMEM_TEMPLATE_CALL_OR_ANSWER = """
You are a Retrieval Planner.  

Your ONLY task is to decide whether to perform another retrieval using `retrievesearch`, or STOP retrieving.

You MUST NOT answer the QUESTION.  
Another model will use MEMORY to answer later.

Guidelines:
- Retrieval is cheap. Unless MEMORY clearly contains all essential information, you are encouraged to retrieve.
- You may retrieve multiple times. At each step, refine your search direction.
- Avoid repeating any previous queries in RETRIEVAL_HISTORY (unless meaningfully refined).

When deciding whether to retrieve again:
1. Break the QUESTION into specific sub-questions or information needs.
2. Compare these needs with what MEMORY already contains.
3. Identify which facts are still missing, uncertain, or incomplete.
4. If something important is missing, design a NEW search query focused only on that missing information.
   - You may explore related clues hinted in MEMORY.
   - Queries should be concise, specific, and actionable.
5. If MEMORY already contains all necessary information, choose to STOP.

If you choose retrieval, you MUST output a function call to `retrievesearch` with:
- a new `query` (different from RETRIEVAL_HISTORY unless refined),
- and a `top_k` suited to your confidence (small: focused; large: broad exploration).
- In early retrieval steps, you may exlore more documents.
- In later steps, focus on refining MEMORY.


ORIGINAL QUESTION:
{prompt}

<retrieval_history>
{retrieval_history}
</retrieval_history>



CURRENT MEMORY:
{memory}

"""  # noqa: E501

INFMEM_TEMPLATE_RETREIVE_RECURRENT = """You are presented with a problem, a section of an article that may contain the answer to the problem, and a previous memory. Please read the provided section carefully and update the memory with the new information that helps to answer the problem.

the given section have two parts. One is reetrieved chunk, which are retrieved by given question. another is the recurrent chunk which are given recurrently. Both chunks might contain useful information, the retrieved chunk might have higher chance.



<problem>
{prompt}
</problem>

<retrieved_chunk>
{retrieve}
</retrieved_chunk>

<recurrent_chunk>
{chunk}
</recurrent_chunk>

<memory>
{memory}
</memory>


Updated memory:
"""  # noqa: E501

INFMEM_TEMPLATE_FINAL = """You are presented with a problem and a previous memory. Please answer the problem based on the previous memory and format your response as follows "Therefore, the answer is (insert answer here)".

<problem> 
{prompt}
</problem>

<memory>
{memory}
</memory>

Your answer:
"""  # noqa: E501

# syr-cn/ReMemR1, commit 43e69f38b97f7899cccadb4176b0fed003262ce3,
# taskutils/memory_eval/utils/rememr1.py.

REMEMR1_TEMPLATE = """You are presented with a problem, a section of an article that may contain the answer to the problem, and a previous memory. You should generate response in the following format:
- Output your thinking process in <thinking>your_thinking_process</thinking>.
- Read the provided section carefully and update the memory with the new information that helps to answer the problem in only one <update>the_updated_memory</update> action. Be sure to retain all relevant details from the previous memory while adding any new, useful information.
- If you notice partial key evidence that is not enough to answer the problem, also output only one `<recall>query</recall>` (e.g. `<recall>who's the president of the United States?</recall>`) to retrieve information in previous memories.

<problem> 
{prompt}
</problem>

<recalled_memory>
{recalled_memory}
</recalled_memory>

<memory>
{memory}
</memory>

<section>
{chunk}
</section>

Updated memory:
"""  # noqa: E501

REMEMR1_TEMPLATE_FINAL_BOXED = """You are presented with a problem and a previous memory. Please answer the problem based on the previous memory and put the answer in \\boxed{{}}.

<problem> 
{prompt}
</problem>

<recalled_memory>
{recalled_memory}
</recalled_memory>

<memory>
{memory}
</memory>

Your answer:
"""  # noqa: E501

# Qwen-Agent's system message for their one tool: the output of QwenFnCallPrompt's own
# template and get_function_description (QwenLM/Qwen-Agent at 31a4d36d, the file last
# changed in 11ee6aa) run on InfMem's get_bm25search_tool_schema() with lang 'en',
# parallel_function_calls=True.
QWEN_AGENT_TOOL_SYSTEM = '# Tools\n\n## You have access to the following tools:\n\n### retrievesearch\n\nretrievesearch: Search over pre-indexed context chunks using BM25. Parameters: {"type": "object", "properties": {"query": {"type": "string", "description": "Concise search query focusing on key entities / concepts."}, "top_k": {"type": "integer", "description": "Number of chunks to retrieve (3-20).", "minimum": 3, "maximum": 20, "default": 8}}, "required": ["query"]} Format the arguments as a JSON object.\n\n## Insert the following command in your reply when you need to call N tools in parallel:\n\n✿FUNCTION✿: The name of tool 1, should be one of [retrievesearch]\n✿ARGS✿: The input of tool 1\n✿FUNCTION✿: The name of tool 2\n✿ARGS✿: The input of tool 2\n...\n✿FUNCTION✿: The name of tool N\n✿ARGS✿: The input of tool N\n✿RESULT✿: The result of tool 1\n✿RESULT✿: The result of tool 2\n...\n✿RESULT✿: The result of tool N\n✿RETURN✿: Reply based on tool results. Images need to be rendered as ![](url)'  # noqa: E501


def qwen3_chat(user: str, system: str | None = None) -> str:
    """Qwen/Qwen3-4B's chat template, rendered by hand for a system and a user message with
    add_generation_prompt=True, enable_thinking=True."""
    head = "" if system is None else "<|im_start|>system\n" + system + "<|im_end|>\n"
    return head + "<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n"


# --- InfMem: prompts --------------------------------------------------------------------


def test_infmem_templates_are_the_authors():
    assert infmem.PLANNER_TEMPLATE == INFMEM_TEMPLATE_CALL_OR_ANSWER
    assert infmem.UPDATE_TEMPLATE == INFMEM_TEMPLATE_RETREIVE_RECURRENT
    assert infmem.FINAL_TEMPLATE == INFMEM_TEMPLATE_FINAL
    assert infmem.INITIAL_MEMORY == "No previous memory"
    assert infmem.TOOL_SYSTEM == QWEN_AGENT_TOOL_SYSTEM


def test_infmem_planner_prompt_is_the_text_their_client_sends():
    searches = (infmem.Search("Who wrote it?", "5"), infmem.Search("it's {x}", "8"))
    state = infmem.State(step=2, memory="Alice {met} Bob.", searches=searches, stops=1)
    history = (
        "Current retrieval step: 3  Maximum allowed retrieval steps: 7\n"
        "Step 1: query='Who wrote it?', top_k=5\n"
        'Step 2: query="it\'s {x}", top_k=8'
    )
    user = INFMEM_TEMPLATE_CALL_OR_ANSWER.format(
        prompt="Who?", memory="Alice {met} Bob.", retrieval_history=history
    )
    assert infmem.chat(
        infmem.render_planner("Who?", state.memory, state.step, 7, state.searches),
        infmem.TOOL_SYSTEM,
    ) == qwen3_chat(user, QWEN_AGENT_TOOL_SYSTEM)


def test_infmem_first_planner_prompt_has_an_empty_history_line():
    prompt = infmem.render_planner("Who?", infmem.INITIAL_MEMORY, 0, 1, ())
    assert (
        "<retrieval_history>\nCurrent retrieval step: 1  Maximum allowed retrieval steps: 1\n"
        "\n</retrieval_history>" in prompt
    )
    assert "None yet." not in prompt


def test_infmem_update_prompt_shows_the_units_ranked_then_the_chunk():
    units = ["first unit", "second {unit}"]
    expected_user = INFMEM_TEMPLATE_RETREIVE_RECURRENT.format(
        prompt="Who?",
        retrieve="[Retrieved #1] first unit\n\n[Retrieved #2] second {unit}",
        chunk="the chunk",
        memory="old memory",
    )
    assert infmem.chat(
        infmem.render_update("Who?", "old memory", units, "the chunk")
    ) == qwen3_chat(expected_user)
    without = infmem.render_update("Who?", "m", [], "c")
    assert "<retrieved_chunk>\n\n</retrieved_chunk>" in without


def test_infmem_final_prompt():
    expected = qwen3_chat(INFMEM_TEMPLATE_FINAL.format(prompt="Who?", memory="Bob did."))
    assert infmem.chat(infmem.render_final("Who?", "Bob did.")) == expected
    assert '"Therefore, the answer is (insert answer here)"' in expected


def test_infmem_thinking_stages():
    prompt = infmem.chat(infmem.render_final("Who?", "m"))
    unclosed = "<think>\nLet me see.  \n"
    closing = "\n\nConsidering the limited time, I must stop thinking now.\n</think>\n\n"
    assert infmem.second_stage_prompt(prompt, unclosed) == prompt + "<think>\nLet me see." + closing
    assert infmem.joined_reply(unclosed, "  STOP \n") == "<think>\nLet me see." + closing + "STOP"
    closed = "<think>\nok\n</think>\n\nSTOP"
    assert infmem.second_stage_prompt(prompt, closed) == prompt + closed
    assert infmem.joined_reply(closed, "") == closed


# --- InfMem: replies --------------------------------------------------------------------

CALL = '<think>\nNeed the author.\n</think>\n\n✿FUNCTION✿: retrievesearch\n✿ARGS✿: {"query": "author of X", "top_k": 5}'  # noqa: E501


def test_infmem_a_call_is_a_search():
    plan = infmem.parse_plan(CALL, "Who?")
    assert plan == infmem.Plan(
        stop=False,
        calls=(infmem.Call("retrievesearch", '{"query": "author of X", "top_k": 5}'),),
        searches=(infmem.Search("author of X", "5"),),
    )
    assert not plan.counts_as_stop


def test_infmem_stop_anywhere_wins_even_in_the_thinking():
    assert infmem.parse_plan("<think>Should I STOP? No.</think>\n" + CALL, "Q").stop
    assert infmem.parse_plan("STOPPED", "Q") == infmem.Plan(stop=True)
    assert not infmem.parse_plan("stop", "Q").stop  # case-sensitive


def test_infmem_no_stop_and_no_call_counts_as_a_stop():
    plan = infmem.parse_plan("<think>hmm</think>\nI think the memory is enough.", "Q")
    assert plan == infmem.Plan(stop=False) and plan.counts_as_stop


def test_infmem_bad_json_searches_the_question_with_top_k_8():
    plan = infmem.parse_plan("✿FUNCTION✿: retrievesearch\n✿ARGS✿: {query: oops", "Who?")
    assert plan.searches == (infmem.Search("Who?", "8"),)
    not_an_object = infmem.parse_plan("✿FUNCTION✿: retrievesearch\n✿ARGS✿: [1, 2]", "Who?")
    assert not_an_object.searches == (infmem.Search("Who?", "8"),)
    # A query that is not a string crashed their search; here it is bad arguments too.
    number = infmem.parse_plan('✿FUNCTION✿: retrievesearch\n✿ARGS✿: {"query": 5}', "Who?")
    assert number.searches == (infmem.Search("Who?", "8"),)


def test_infmem_missing_fields_and_odd_top_k_show_as_python_prints_them():
    plan = infmem.parse_plan('✿FUNCTION✿: retrievesearch\n✿ARGS✿: {"top_k": "many"}', "Who?")
    assert plan.searches == (infmem.Search("Who?", "many"),)
    plan = infmem.parse_plan('✿FUNCTION✿: retrievesearch\n✿ARGS✿: {"query": "a"}', "Who?")
    assert plan.searches == (infmem.Search("a", "8"),)
    plan = infmem.parse_plan(
        '✿FUNCTION✿: retrievesearch\n✿ARGS✿: {"query": "a", "top_k": true}', "Q"
    )
    assert plan.searches == (infmem.Search("a", "True"),)


def test_infmem_several_calls_all_join_the_history_and_the_last_is_shown():
    reply = (
        '✿FUNCTION✿: retrievesearch\n✿ARGS✿: {"query": "one"} <!-- a comment -->\n'
        "✿FUNCTION✿: other_tool\n✿ARGS✿: {}\n"
        '✿FUNCTION✿: retrievesearch\n✿ARGS✿: {"query": "two", "top_k": 3}\n✿RESULT✿: made up'
    )
    plan = infmem.parse_plan(reply, "Q")
    assert [c.name for c in plan.calls] == ["retrievesearch", "other_tool", "retrievesearch"]
    assert plan.calls[0].arguments == '{"query": "one"}'
    assert plan.searches == (infmem.Search("one", "8"), infmem.Search("two", "3"))
    state = infmem.after_plan(infmem.State(), plan)
    assert state.searches == plan.searches and state.query == "two"


def test_infmem_a_call_to_another_tool_is_not_a_stop_and_searches_nothing():
    plan = infmem.parse_plan("✿FUNCTION✿: calculator\n✿ARGS✿: {}", "Q")
    assert not plan.counts_as_stop and plan.searches == ()
    assert infmem.after_plan(infmem.State(stops=2), plan) == infmem.State(stops=0)


def test_infmem_a_call_without_arguments_is_no_call():
    assert infmem.parse_plan("✿FUNCTION✿: retrievesearch\n", "Q").calls == ()


def test_infmem_three_stops_in_a_row_answer_and_a_call_resets_the_count():
    stop, call = infmem.parse_plan("STOP", "Q"), infmem.parse_plan(CALL, "Q")
    nothing = infmem.parse_plan("no decision", "Q")
    state = infmem.State()
    counts = []
    for plan in (stop, stop, call, stop, nothing, stop, stop):
        state = infmem.after_plan(state, plan)
        counts.append(state.stops)
        if not state.answering:
            state = infmem.after_update(state, f"memory {len(counts)}")
    # A reply with neither STOP nor a call resets the run and counts 1, as their loop does.
    assert counts == [1, 2, 0, 1, 1, 2, 3]
    assert state.answering and state.step == 6 and state.memory == "memory 6"
    assert [s.query for s in state.searches] == ["author of X"]


def test_infmem_memory_and_answer():
    assert infmem.parse_memory("<think>a</think>\n\n new memory \n") == "new memory"
    assert infmem.parse_memory(" no thinking ") == " no thinking "
    final = "<think>x</think>\nTherefore, the answer is **Paris**.\n"
    assert infmem.parse_answer(final) == "Paris"
    assert infmem.parse_answer("the answer is 1. Therefore, the answer is 2.") == "2"
    assert infmem.parse_answer("The answer is Paris.") is None  # case-sensitive
    assert infmem.parse_answer("<think>the answer is hidden</think>\nNo idea.") is None


# Their `_parse_function_calls_from_text` (taskutils/memory_eval/utils/infmem.py), which
# parse_plan must agree with on every reply; quadratic in re, so only run on short ones.
THEIR_CALL = re.compile(
    r"✿FUNCTION✿:\s*([^\n]+)\s*✿ARGS✿:\s*([^✿]+?)(?=✿RESULT✿|✿RETURN✿|✿FUNCTION✿|$)", re.DOTALL
)


def their_calls(reply: str) -> tuple[infmem.Call, ...]:
    return tuple(
        infmem.Call(m.group(1).strip(), m.group(2).strip()) for m in THEIR_CALL.finditer(reply)
    )


def shuffled_replies(pieces: list[str], count: int, most: int, seed: int) -> list[str]:
    """`count` replies of up to `most` pieces drawn at random (the same each run)."""
    rng = random.Random(seed)
    return ["".join(rng.choices(pieces, k=rng.randint(0, most))) for _ in range(count)]


def test_infmem_calls_are_found_where_their_expression_finds_them():
    pieces = ["✿FUNCTION✿:", "✿ARGS✿:", "✿RESULT✿", "✿RETURN✿", "✿FUNCTION✿", "✿", " ", "\n"]
    pieces += ["\t", "\u3000", "name", "a b"]
    for reply in shuffled_replies(pieces, 20_000, 14, seed=47):
        assert infmem.parse_plan(reply, "Q").calls == their_calls(reply), repr(reply)


HUGE = int(1.25 * 2**20)  # bytes: the most memagent reads of a server's reply


def huge(unit: str) -> str:
    return unit * (HUGE // len(unit.encode()))


@pytest.mark.parametrize(
    "unit",
    ["✿FUNCTION✿:", "✿FUNCTION✿: x ✿ARGS✿: ✿", "✿FUNCTION✿:\n\n✿ARGS✿:", "✿ARGS✿:", " "],
    ids=["names", "names-and-args", "lines", "args", "spaces"],
)
def test_infmem_a_hostile_plan_is_parsed_in_linear_time(unit):
    reply = huge(unit) if unit != " " else "✿FUNCTION✿:" + huge(unit)
    with deadline(1.0):
        plan = infmem.parse_plan(reply, "Q")
    assert not plan.stop


# --- InfMem: retrieval ------------------------------------------------------------------


def test_infmem_units_are_500_token_windows_inside_each_chunk():
    assert infmem.units([(0, 5000), (5000, 6200)]) == [
        *(infmem.Unit(0, s, s + 500) for s in range(0, 5000, 500)),
        infmem.Unit(1, 5000, 5500),
        infmem.Unit(1, 5500, 6000),
        infmem.Unit(1, 6000, 6200),
    ]
    # A chunk size that is no multiple of 500 restarts the units at each chunk.
    assert infmem.units([(0, 700), (700, 900)]) == [
        infmem.Unit(0, 0, 500),
        infmem.Unit(0, 500, 700),
        infmem.Unit(1, 700, 900),
    ]


def okapi(corpus: list[list[str]], query: list[str], k1=1.5, b=0.75, epsilon=0.25):
    """BM25Okapi as rank_bm25 0.2.2 documents it, written out term by term."""
    n = len(corpus)
    avgdl = sum(len(d) for d in corpus) / n
    vocabulary = {w for d in corpus for w in d}
    raw = {
        w: math.log((n - sum(w in d for d in corpus) + 0.5) / (sum(w in d for d in corpus) + 0.5))
        for w in vocabulary
    }  # noqa: E501
    floor = epsilon * sum(raw.values()) / len(raw)
    idf = {w: floor if v < 0 else v for w, v in raw.items()}
    return [
        sum(
            idf.get(q, 0) * d.count(q) * (k1 + 1) / (d.count(q) + k1 * (1 - b + b * len(d) / avgdl))
            for q in query
        )
        for d in corpus
    ]


UNITS = [
    "The cat sat on the mat.",
    "the dog and the cat the end",
    "A BIRD sang; the bird flew",
    "the",
    "Unrelated words entirely here the",
]


def test_bm25_equals_the_okapi_formula_with_its_idf_floor():
    index = infmem.BM25.build(UNITS)
    corpus = [text.lower().split() for text in UNITS]
    # "the" is in every unit: its idf is negative, so it takes the floor.
    assert index.idf["the"] == pytest.approx(
        0.25
        * sum(
            math.log((5 - df + 0.5) / (df + 0.5))
            for df in (sum(w in d for d in corpus) for w in {w for d in corpus for w in d})
        )
        / len({w for d in corpus for w in d})
    )
    for query in ("the cat", "bird bird", "The CAT sat", "nothing matches", "the"):
        expected = okapi(corpus, query.lower().split())
        assert index.scores(query.lower().split()) == pytest.approx(expected, rel=1e-12)


def test_bm25_returns_four_units_whatever_the_query_ties_in_document_order():
    index = infmem.BM25.build(UNITS)
    assert index.search("bird") == [2, 0, 1, 3]  # one match, then ties in document order
    assert index.search("zebra") == [0, 1, 2, 3]
    assert infmem.BM25.build(["only one"]).search("one") == [0]
    best = index.search("cat")
    assert best[:2] == sorted(best[:2], key=lambda i: -index.scores(["cat"])[i])
    assert set(best[:2]) == {0, 1}


def test_bm25_terms_are_lowercased_whitespace_words():
    assert infmem.words("Hello,  World\nAGAIN\u00a0x") == ["hello,", "world", "again", "x"]
    assert infmem.BM25.build(["Hello, world"]).idf.keys() == {"hello,", "world"}


# --- ReMemR1: prompts -------------------------------------------------------------------


def test_rememr1_templates_are_the_authors():
    assert rememr1.UPDATE_TEMPLATE == REMEMR1_TEMPLATE
    assert rememr1.FINAL_TEMPLATE == REMEMR1_TEMPLATE_FINAL_BOXED
    assert rememr1.INITIAL_MEMORY == "No previous memory"
    assert rememr1.NO_RECALL == "No memory was recalled."


def test_rememr1_prompts():
    expected = REMEMR1_TEMPLATE.format(
        prompt="Who?",
        chunk="a {chunk}",
        memory="No previous memory",
        recalled_memory="No memory was recalled.",
    )
    state = rememr1.State()
    assert rememr1.render_update("Who?", state.memory, state.recalled, "a {chunk}") == expected
    final = rememr1.render_final("Who?", "mem", "old mem")
    assert final == REMEMR1_TEMPLATE_FINAL_BOXED.format(
        prompt="Who?", memory="mem", recalled_memory="old mem"
    )
    assert "put the answer in \\boxed{}." in final


# --- ReMemR1: replies -------------------------------------------------------------------


def test_rememr1_memory_is_the_reply_minus_its_recall_tags():
    reply = (
        "<thinking>Need the year.</thinking>\n<update>Alice met Bob.</update>\n"
        "<recall>when did Alice move?</recall>\n"
    )
    assert rememr1.parse_update(reply) == rememr1.Update(
        "<thinking>Need the year.</thinking>\n<update>Alice met Bob.</update>",
        "when did Alice move?",
    )


def test_rememr1_malformed_recalls():
    unclosed = rememr1.parse_update("<update>m</update> <recall>who is")
    assert unclosed == rememr1.Update("<update>m</update> <recall>who is", None)
    two = rememr1.parse_update("a <recall>x</recall> b <recall>y</recall> c")
    assert two == rememr1.Update("a  b  c", "x</recall> b <recall>y")
    across = rememr1.parse_update("m <recall>first\nsecond</recall>")
    assert across == rememr1.Update("m", None)
    assert rememr1.parse_update("<recall></recall>m") == rememr1.Update("m", None)
    assert rememr1.parse_update("no tags") == rememr1.Update("no tags", None)


def test_rememr1_answer():
    assert rememr1.parse_answer("so \\boxed{\\frac{1}{2}} and \\boxed{Paris}") == "Paris"
    assert rememr1.parse_answer("<think>\\boxed{no}</think> \\boxed{yes}") == "yes"
    assert rememr1.parse_answer("<think>\\boxed{kept}</think>") == "kept"
    assert rememr1.parse_answer("\\boxed Paris$ and more") == "Paris"
    assert rememr1.parse_answer("\\boxed{open") is None
    assert rememr1.parse_answer("\\fbox{x}") is None
    assert rememr1.parse_answer("nothing") is None


THEIR_RECALL = re.compile(r"<recall>(.+)</recall>")
THEIR_RECALL_TAGS = re.compile(r"<recall>.*?</recall>", re.DOTALL)


def test_rememr1_recalls_are_found_where_their_expressions_find_them():
    pieces = ["<recall>", "</recall>", "<recall", "recall>", "\n", " ", "q", "who?"]
    for reply in shuffled_replies(pieces, 20_000, 12, seed=47):
        query = THEIR_RECALL.search(reply)
        memory = THEIR_RECALL_TAGS.sub("", reply).strip()
        assert rememr1.parse_update(reply) == rememr1.Update(
            memory, query.group(1) if query else None
        ), repr(reply)


@pytest.mark.parametrize(
    "unit",
    ["<recall>", "<recall>x", "<recall>\n", "<recall></recall>"],
    ids=["open", "open-text", "lines", "closed"],
)
def test_rememr1_a_hostile_update_is_parsed_in_linear_time(unit):
    reply = huge(unit)
    with deadline(1.0):
        rememr1.parse_update(reply)


@pytest.mark.parametrize(
    "unit", ["\\boxed{", "{", "\\boxed{}}", "\\boxed "], ids=["open", "nested", "closed", "spaced"]
)
def test_rememr1_a_hostile_answer_is_parsed_in_linear_time(unit):
    reply = huge(unit) if unit != "{" else "\\boxed{" + huge(unit)
    with deadline(1.0):
        rememr1.parse_answer(reply)


# --- ReMemR1: retrieval -----------------------------------------------------------------


def pieces(text: str) -> list[bytes]:
    """A stand-in tokenizer: words with their leading space, and runs of other spaces."""
    return [m.encode() for m in re.findall(r" ?\w+| ?[^\w\s]+|\s+", text)]


def test_rememr1_terms_drop_the_spaces_of_byte_level_tokens():
    assert rememr1.terms("Hello World!\n", pieces) == ["hello", "world", "!", "Ċ"]
    assert rememr1.terms("Café", lambda text: [text.encode()]) == ["cafÃ©"]
    assert rememr1.terms("a  b", pieces) == ["a", "", "b"]


def tfidf(query: list[str], documents: list[list[str]]) -> list[float]:
    """scikit-learn's TfidfVectorizer defaults and cosine_similarity, written out."""
    n = len(documents)
    vocabulary = sorted({t for d in documents for t in d})
    idf = {t: math.log((1 + n) / (1 + sum(t in d for d in documents))) + 1 for t in vocabulary}

    def vector(tokens: list[str]) -> list[float]:
        raw = [tokens.count(t) * idf[t] for t in vocabulary]
        norm = math.sqrt(sum(x * x for x in raw))
        return [x / norm for x in raw] if norm else raw

    q = vector(query)
    return [sum(a * b for a, b in zip(q, vector(d), strict=True)) for d in documents]


MEMORIES = [
    "Alice was born in Paris.",
    "Bob moved to Rome in 1990.",
    "Alice met Bob in Rome.",
    "Nothing about anyone.",
]


def test_tfidf_equals_the_formula():
    documents = [rememr1.terms(m, pieces) for m in MEMORIES]
    for query in ("where was Alice born?", "Bob Rome", "zebra", "in in in"):
        expected = tfidf(rememr1.terms(query, pieces), documents)
        got = rememr1.tfidf_scores(query, MEMORIES, pieces)
        assert got == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert rememr1.top1("where was Alice born?", MEMORIES, pieces) == 0
    assert rememr1.top1("Bob moved", MEMORIES, pieces) == 1


def test_tfidf_ties_go_to_the_memory_written_last():
    same = ["Alice left.", "Bob stayed.", "Alice left."[::-1], "Bob stayed."]
    assert rememr1.top1("zebra", MEMORIES, pieces) == 3  # all zero: the last
    twins = ["Carol sang.", "Dave sang.", "Erin sang."]
    scores = rememr1.tfidf_scores("sang", twins, pieces)
    assert scores[0] == scores[1] == scores[2] > 0
    assert rememr1.top1("sang", twins, pieces) == 2
    assert rememr1.top1("stayed", same, pieces) == 3


def test_rememr1_state_recalls_from_memories_including_the_new_one():
    state, held = rememr1.State(), rememr1.Memories(pieces)
    state = rememr1.after_update(state, rememr1.Update("Alice was born in Paris.", None), held)
    assert state == rememr1.State("Alice was born in Paris.", rememr1.NO_RECALL, (MEMORIES[0],))
    state = rememr1.after_update(state, rememr1.Update("Bob went to Rome.", "Bob Rome"), held)
    assert state.recalled == "Bob went to Rome."  # the memory just written
    state = rememr1.after_update(state, rememr1.Update("Carol.", "born in Paris"), held)
    assert state.recalled == "Alice was born in Paris."
    state = rememr1.after_update(state, rememr1.Update("Carol.", None), held)
    assert state.past == ("Alice was born in Paris.", "Bob went to Rome.", "Carol.")
    assert state.recalled == rememr1.NO_RECALL


def test_rememr1_a_recall_with_no_terms_anywhere_shows_none():
    held = rememr1.Memories(pieces)
    state = rememr1.after_update(rememr1.State(), rememr1.Update("", "anything"), held)
    assert state == rememr1.State("", "None", ("",))
    assert "<recalled_memory>\nNone\n</recalled_memory>" in rememr1.render_update(
        "Q", state.memory, state.recalled, "c"
    )
