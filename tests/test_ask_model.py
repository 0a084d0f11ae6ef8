"""End to end: the real `memagent ask` with the real default model in llama.cpp, greedy."""

from __future__ import annotations

import hashlib
import json
import signal
from pathlib import Path

import pytest
from support.command import interrupt_after_steps
from support.models import BOTH_MODELS
from support.story import FACT_QUESTION, story

from memagent_cli import protocol
from memagent_cli.trace import read_trace

pytestmark = pytest.mark.model

# Small enough to keep the suite short, large enough for several steps per reading.
CHUNK, MEMORY = 400, 64
SMALL_STEPS = ["--chunk-tokens", str(CHUNK), "--memory-tokens", str(MEMORY), "--temperature", "0"]


@pytest.fixture(params=BOTH_MODELS)
def model(request: pytest.FixtureRequest) -> str:
    """ "tiny" (the tiny model set as $MEMAGENT_MODEL, as `on_tiny_model` does) or "real" (the
    default model, found by its registry name: nothing set)."""
    if request.param == "tiny":
        request.getfixturevalue("on_tiny_model")
    return request.param


def test_a_model_reads_deterministically_and_traces_every_chunk(memagent, tmp_path, model):
    """What any model must keep, whatever it writes: greedy runs repeat exactly, the trace
    has one record per chunk and the windows tile the document, --json is the trace, and
    llama.cpp's own log stays off stderr. On the tiny model, and on the real default model
    (named by its registry name) in `make test-real`."""
    doc = tmp_path / "village.txt"
    doc.write_text(story(130))  # about 1,460 tokens: 4 chunks
    runs = []
    for name in ("first", "second"):
        path = tmp_path / f"{name}.jsonl"
        result = memagent(
            "ask",
            str(doc),
            FACT_QUESTION,
            *SMALL_STEPS,
            "--json",
            "--no-reuse",
            "--trace",
            str(path),
        )
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr
        assert "llama" not in result.stderr and "ggml" not in result.stderr
        runs.append((json.loads(result.stdout), read_trace(path), result.stderr))
    (out, trace, stderr), (again, trace_again, _) = runs

    assert [s.memory for s in trace.steps] == [s.memory for s in trace_again.steps]
    assert trace.final.reply == trace_again.final.reply and out["reply"] == again["reply"]
    assert out["answer"] == protocol.extract_boxed(out["reply"])
    if model == "real":
        assert out["model"]["name"] == "smollm2-135m"  # the registry's name for the default
        # A real question asked of the install check says what it is, once, on stderr.
        assert " ".join(stderr.split()).count("only checks the install") == 1
    else:
        assert "only checks the install" not in stderr

    document = trace.header.document
    assert document["chunks"] == -(-document["tokens"] // CHUNK) >= 3
    assert [s.index for s in trace.steps] == list(range(document["chunks"]))
    assert trace.steps[0].tokens[0] == 0 and trace.steps[-1].tokens[1] == document["tokens"]
    for before, after in zip(trace.steps, trace.steps[1:], strict=False):
        assert before.tokens[1] == after.tokens[0] and before.chars[1] == after.chars[0]
    assert all(s.completion_tokens <= MEMORY for s in trace.steps)
    assert all(s.finish_reason in ("stop", "length") for s in trace.steps)
    assert trace.header.settings["context_tokens"] <= 8192  # sized from the budget

    records = [{k: v for k, v in s.to_json().items() if k != "type"} for s in trace.steps]
    assert out["steps"] == records
    assert out["document"] == document and out["model"] == trace.header.model
    # stderr is not a terminal here: one plain line per step, then where the trace went.
    n = document["chunks"]
    assert f"step {n}/{n}" in stderr and str(tmp_path / "first.jsonl") in stderr

    # The real trace, read back the way a user would.
    shown = memagent("trace", str(tmp_path / "first.jsonl"), "--step", "1")
    assert shown.returncode == 0, shown.stderr
    first_line, _, memory = shown.stdout.partition("\n")
    assert first_line.startswith(f"memory after step 1, tokens 0–{CHUNK}")
    assert memory.split() == trace.steps[0].memory.split()


@pytest.mark.usefixtures("on_tiny_model")
def test_json_answers_every_question_from_stdin(memagent, env):
    text = story(80)  # about 900 tokens: 3 chunks
    result = memagent(
        "ask",
        "-",
        FACT_QUESTION,
        "Who painted the red barn?",
        *SMALL_STEPS,
        "--json",
        input=text,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert [first["question"], second["question"]] == [FACT_QUESTION, "Who painted the red barn?"]
    doc = first["document"]
    assert doc["path"] == "<stdin>"
    assert doc["sha256"] == hashlib.sha256(text.encode()).hexdigest()
    assert doc["chunks"] == len(first["steps"]) == len(second["steps"]) >= 2
    assert first["model"]["name"] == Path(env["MEMAGENT_MODEL"]).stem  # a path: its stem
    assert first["settings"]["chunk_tokens"] == CHUNK and first["settings"]["backend"] == "llama"
    # The sampler chain's order, vLLM's and SGLang's: the temperature before top-p.
    assert first["settings"]["sampler"] == "temperature, top-p, dist (greedy at temperature 0)"
    assert first["tokens_per_second"]["prompt"] > 0 and first["tokens_per_second"]["generation"] > 0
    assert first["seconds"] > 0
    traces = {first["trace"], second["trace"]}
    assert len(traces) == 2
    for path in traces:
        assert path.startswith(env["XDG_DATA_HOME"])
        assert read_trace(Path(path)).finished


@pytest.mark.usefixtures("on_tiny_model")
def test_resume_finishes_like_an_uninterrupted_run(memagent, cli, env, tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text(story(400))  # about 4,500 tokens: 12 chunks, so that a cut falls mid-run
    ask = [str(doc), FACT_QUESTION, *SMALL_STEPS]

    whole = memagent("ask", *ask, "--json", "--quiet")
    assert whole.returncode == 0, whole.stderr
    expected = json.loads(whole.stdout)
    assert expected["cached"] is False
    assert len(expected["steps"]) == expected["document"]["chunks"] >= 4

    # The same greedy run again comes from its trace, without reading (so, in-process).
    again = cli("ask", *ask, "--json")
    assert again.returncode == 0, again.stderr
    cached = json.loads(again.stdout)
    assert cached["cached"] is True and cached["reply"] == expected["reply"]
    assert (
        cached["trace"] == expected["trace"] and "answered from the finished trace" in again.stderr
    )

    cut = tmp_path / "cut.jsonl"
    process, _, _ = interrupt_after_steps([*ask, "--no-reuse", "--trace", str(cut)], cut, env, 2)
    assert process.returncode == 130
    before = read_trace(cut)
    chunks = expected["document"]["chunks"]
    assert not before.finished and 2 <= len(before.steps) < chunks

    other = tmp_path / "other.txt"
    other.write_text(story(170, seed=3))
    # Refused before reading: in-process, as `again`.
    refused = cli("ask", str(other), FACT_QUESTION, *SMALL_STEPS, "--resume", str(cut))
    assert refused.returncode == 1 and "the document differs" in refused.stderr
    refused = cli("ask", *ask, "--memory-tokens", "32", "--resume", str(cut))
    assert (
        refused.returncode == 1
        and f"--memory-tokens differs ({MEMORY} there, 32 here)" in " ".join(refused.stderr.split())
    )

    resumed = memagent("ask", *ask, "--json", "--resume", str(cut))
    assert resumed.returncode == 0, resumed.stderr
    result = json.loads(resumed.stdout)
    assert "resuming" in resumed.stderr
    # The finished steps were not computed again: no progress line for them, and their
    # records (timings included) are the ones written before the interruption.
    done = len(before.steps)
    lines = [line for line in resumed.stderr.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in lines] == [
        f"{i}/{chunks}" for i in range(done + 1, chunks + 1)
    ]
    assert [s.to_json() for s in read_trace(cut).steps[:done]] == [
        s.to_json() for s in before.steps
    ]
    assert result["reply"] == expected["reply"] and result["answer"] == expected["answer"]
    trace = read_trace(cut)
    assert trace.finished and trace.interruption is None
    reference = read_trace(Path(expected["trace"]))
    assert [s.memory for s in trace.steps] == [s.memory for s in reference.steps]


@pytest.mark.usefixtures("on_tiny_model")
@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["SIGINT", "SIGTERM", "SIGKILL"]
)
def test_an_interrupted_run_keeps_its_finished_steps(env, tmp_path, sig):
    doc = tmp_path / "doc.txt"
    doc.write_text(story(900))  # about 25 chunks: a fast model is stopped well before the end
    trace_path = tmp_path / "run.jsonl"
    args = [str(doc), FACT_QUESTION, *SMALL_STEPS, "--trace", str(trace_path)]
    process, stdout, stderr = interrupt_after_steps(args, trace_path, env, 1, sig)

    assert stdout == ""
    trace = read_trace(trace_path)
    assert not trace.finished and 1 <= len(trace.steps) < trace.header.document["chunks"]
    if sig == signal.SIGKILL:  # no chance to say anything: the trace alone must hold
        assert process.returncode == -signal.SIGKILL
        assert trace.interruption is None
        assert all("cut short" in problem for problem in trace.problems)  # killed mid-write
        return
    assert not trace.problems
    assert process.returncode == 128 + sig, stderr  # 130 for SIGINT, 143 for SIGTERM
    assert "Traceback" not in stderr
    assert "Interrupted" in stderr and str(trace_path) in stderr
    assert f"resume with: memagent ask {doc}" in " ".join(stderr.split())
    assert trace.interruption is not None
    assert trace.interruption.steps_done == len(trace.steps)


@pytest.mark.usefixtures("on_tiny_model")
def test_a_folder_of_documents_skips_the_unreadable_one(memagent, tmp_path):
    library = tmp_path / "library"
    (library / "sub").mkdir(parents=True)
    (library / "a.txt").write_text(story(40))
    (library / "sub" / "b.md").write_text(story(40, seed=2))
    (library / "broken.pdf").write_bytes(b"%PDF-1.7\n" + bytes(range(256)) * 4)
    (library / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n")  # not a supported suffix
    listed = tmp_path / "more.txt"
    listed.write_text(f"{library}\n{library / 'a.txt'}\n")  # a folder, then a file

    result = memagent(
        "ask",
        FACT_QUESTION,  # with --documents, every argument is a question
        "--documents",
        str(listed),
        "--json",
        "--chunk-tokens",
        "2000",
        "--memory-tokens",
        "64",
        "--temperature",
        "0",
    )
    assert result.returncode == 1  # one document could not be read
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [Path(line["document"]["path"]).name for line in lines] == ["a.txt", "b.md", "a.txt"]
    assert all(line["question"] == FACT_QUESTION for line in lines)
    assert "broken.pdf" in result.stderr and "Skipped; the other documents go on" in result.stderr
    assert "Traceback" not in result.stderr

    none = memagent("ask", str(library), FACT_QUESTION, "--glob", "*.epub")
    assert none.returncode == 1 and "holds no supported documents matching *.epub" in none.stderr


@pytest.mark.usefixtures("on_tiny_model")
def test_the_time_left_falls_as_a_real_reading_goes_and_ends_at_nothing(memagent, tmp_path):
    """Followed through a real reading's events: the time left never grows much (the speeds
    of a shared machine vary a little), ends below where it began, and is nothing once the
    answer is in; the plain lines show it on every step."""
    from memagent_cli import api
    from memagent_cli.backend import Sampling
    from memagent_cli.reader import Answering, Finished, StepFinished
    from memagent_cli.run.time_left import TimeLeft

    doc = tmp_path / "village.txt"
    doc.write_text(story(130))
    model = api.open_model(chunk_tokens=CHUNK, memory_tokens=MEMORY, sampling=Sampling(0.0))
    events: list[object] = []
    api.ask(model, doc, FACT_QUESTION, progress=events.append)
    total = max(e.step.chunk.token_end for e in events if isinstance(e, StepFinished))
    left, told = TimeLeft(total), []
    for event in events:
        left.add(event)  # type: ignore[arg-type]
        if isinstance(event, StepFinished | Answering | Finished):
            told.append(left.seconds())
    assert len(told) >= 5 and told[-1] == 0.0
    assert all(later <= 1.5 * earlier for earlier, later in zip(told, told[1:], strict=False))
    assert told[-2] < told[0]
    shown = memagent("ask", str(doc), FACT_QUESTION, *SMALL_STEPS)
    assert shown.returncode == 0, shown.stderr
    steps = [line for line in shown.stderr.splitlines() if line.startswith("step ")]
    assert len(steps) >= 4 and all(line.endswith("left") for line in steps)


@pytest.mark.usefixtures("on_tiny_model")
def test_ask_says_before_a_long_reading_what_it_expects_and_the_faster_routes(
    memagent, env, tmp_path, tiny_model, monkeypatch
):
    """With a speed kept for this model here (as `inspect` keeps it), `ask` says what the
    reading will take before its first step; one of more than an hour names faster routes.
    A kept speed far slower than the tiny model's stands in for a large model's."""
    from memagent_cli.backends import speeds_store
    from memagent_cli.backends.llama_cpp import LlamaCppBackend
    from memagent_cli.backends.speed import Speed

    doc = tmp_path / "village.txt"
    doc.write_text(story(130))
    quick = memagent("ask", str(doc), FACT_QUESTION, *SMALL_STEPS, "--no-trace")
    assert quick.returncode == 0 and "expect about" not in quick.stderr  # nothing kept yet
    monkeypatch.setenv("MEMAGENT_HOME", env["MEMAGENT_HOME"])
    key = speeds_store.backend_key(LlamaCppBackend(tiny_model))  # the command's engine
    speeds_store.store(key, Speed(0.5, 0.0, 10.0, 0.0, measured_to=2000), asked_to=2000)
    slow = memagent("ask", str(doc), FACT_QUESTION, *SMALL_STEPS, "--no-reuse")
    assert slow.returncode == 0, slow.stderr
    lines = slow.stderr.splitlines()
    (said,) = [i for i, line in enumerate(lines) if "reading village.txt: expect about" in line]
    first_step = next(i for i, line in enumerate(lines) if line.startswith("step 1/"))
    assert said < first_step
    assert "more than an hour; faster: a smaller model (-m qwen2.5-coder-1.5b)" in lines[said]
    assert "a reader that stops once it has the answer" in lines[said]
    assert "by how long the model's replies run" in lines[said]  # no reading to learn from
    assert lines[first_step].endswith("left")


def ruled_text() -> str:
    """Sections under rules of 80 `=` and 66 `-`, as books and READMEs draw them."""
    sections = [
        f"Section {i}\n{'=' * 80}\nThe keeper of light {i} counted {i * 7} boats.\n{'-' * 66}\n"
        for i in range(1, 9)
    ]
    return "\n".join(sections)


def spaced_pdf(path: Path) -> Path:
    """A PDF whose table keeps runs of 40 and 60 spaces in its extracted text."""
    from support import builders

    rows = "\n".join(f"Item {i}{' ' * 40}{i * 7} boats{' ' * 60}kept" for i in range(12))
    return builders.pdf(path, [rows, f"Totals{' ' * 40}84 boats"])


@pytest.mark.usefixtures("on_tiny_model")
@pytest.mark.parametrize("kind", ["rules", "pdf"])
def test_every_character_of_rules_and_spaced_tables_is_read(memagent, tmp_path, kind):
    """Runs of `=` and of spaces are tokens longer than 32 bytes: each reaches the model, and
    the chunks' character ranges in --json tile the document."""
    if kind == "rules":
        doc = tmp_path / "ruled.txt"
        doc.write_text(ruled_text())
    else:
        doc = spaced_pdf(tmp_path / "table.pdf")
    result = memagent(
        "ask", str(doc), "How many boats?", "--chunk-tokens", "64", "--memory-tokens", "8",
        "--temperature", "0", "--json", "--no-reuse",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    ranges = [step["chars"] for step in out["steps"]]
    assert len(ranges) == out["document"]["chunks"] >= 3
    assert ranges[0][0] == 0 and ranges[-1][1] == out["document"]["characters"]
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))


@pytest.mark.usefixtures("on_tiny_model")
def test_a_decomposed_text_is_read_as_qwens_tokenizer_reads_it(memagent, tmp_path, tiny_model):
    """NFD text (a Mac's, a PDF's) reaches the model composed, as the authors' tokenizer
    gives it; the chunks' ranges are the document's characters as extracted."""
    import unicodedata

    from memagent_cli.backends.llama_cpp import LlamaCppBackend, LlamaOptions

    composed = "Le café était déjà fermé. Tiếng Việt: người được. 한국어 문장, 한글.\n" * 12
    doc = tmp_path / "nfd.txt"
    doc.write_text(unicodedata.normalize("NFD", composed))
    result = memagent(
        "ask", str(doc), "Where?", "--chunk-tokens", "64", "--memory-tokens", "8",
        "--temperature", "0", "--json", "--no-reuse",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    backend = LlamaCppBackend(tiny_model, LlamaOptions(threads=1, gpu_layers=0))
    assert out["document"]["tokens"] == len(backend.tokenize(composed.strip()))
    characters = len(doc.read_text().strip())
    assert out["document"]["characters"] == characters > len(composed.strip())
    ranges = [step["chars"] for step in out["steps"]]
    assert ranges[0][0] == 0 and ranges[-1][1] == characters
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
