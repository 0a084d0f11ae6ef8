"""A reader from outside memagent: a package on the path that declares a `Spec` under the
entry point group `memagent.readers` (docs/development.md, Adding a reader). This one reads
every other chunk with MemAgent's prompts under a name of its own. It goes through `ask`,
`--json`, `trace`, `trace --html`, resume after Ctrl-C and `eval` as the built-in readers
do, and nothing in memagent but the registry knows of it."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import textwrap
from pathlib import Path

import pytest
from support.command import interrupt_after_steps
from support.fake_openai import served
from support.story import FACT_QUESTION, story

from memagent_cli.trace import read_trace

PLUGIN = textwrap.dedent(
    '''
    """A reader that reads every other chunk: the toy of tests/test_reader_plugin.py."""

    from memagent_cli import protocol
    from memagent_cli.reader import (
        Answer, Answering, Finished, Prompt, Step, StepFinished, StepStarted,
    )
    from memagent_cli.readers.spec import Spec, StepField

    UPDATE = "Every other section. " + protocol.UPDATE_TEMPLATE
    # What its steps carry: the chunk each left out. A resumed reading counts them again.
    SKIPPED = StepField("skipped", int, "left out", lambda index: (f"chunk {index + 1}",))


    def _loop(tokenizer, tokens):
        def every_other(question, chunks, settings, listener=lambda event: None, done=()):
            steps = list(done)
            memory = steps[-1].memory if steps else protocol.INITIAL_MEMORY
            skipped = sum(1 for step in steps if "skipped" in step.extra)
            read = chunks[::2]
            for chunk in read[len(steps):]:
                listener(StepStarted(chunk, len(read)))
                message = UPDATE.format(prompt=question, memory=memory, chunk=chunk.text)
                message += f" ({skipped} left out so far)"
                reply = yield Prompt(message, settings.memory_tokens)
                memory = protocol.strip_think(reply.text)
                left_out = chunk.index + 1
                extra = {"skipped": left_out} if left_out < len(chunks) else {}
                skipped += len(extra)
                steps.append(Step(chunk, memory, reply, extra))
                listener(StepFinished(steps[-1], len(read)))
            listener(Answering(memory, "it reads every other chunk"))
            message = protocol.render_final(question, memory)
            reply = yield Prompt(message, protocol.FINAL_MAX_TOKENS)
            said = protocol.extract_boxed(reply.text)
            answer = Answer(question, said, reply.text, steps, reply, "it reads every other chunk")
            listener(Finished(answer))
            return answer

        return every_other


    SPEC = Spec(
        name="every-other",
        summary="every other chunk",
        loop=_loop,
        templates={"update": UPDATE, "final": protocol.FINAL_TEMPLATE},
        bare=(UPDATE.format(prompt="", memory="", chunk=""), protocol.BARE_TEMPLATES[1]),
        stops_early="it reads every other chunk",
        fields=(SKIPPED,),
    )
    '''
)
STEPS = ["--chunk-tokens", "200", "--memory-tokens", "48", "--temperature", "0"]


@pytest.fixture
def plugged(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """`env` with the toy reader installed: its module and its distribution's entry point
    on the path, as `pip install` would leave them."""
    site = tmp_path / "site"
    dist = site / "every_other-1.0.dist-info"
    dist.mkdir(parents=True)
    (site / "every_other.py").write_text(PLUGIN)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: every-other\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[memagent.readers]\nevery-other = every_other:SPEC\n")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    return env


def test_a_reader_from_a_plugin_reads_traces_shows_and_resumes(
    memagent, plugged, fake_server, tmp_path
):
    book = tmp_path / "village.txt"
    book.write_text(story(120))
    args = [str(book), FACT_QUESTION, *served(fake_server, *STEPS), "--reader", "every-other"]
    whole = memagent("ask", *args, "--json", "--trace", str(tmp_path / "whole.jsonl"))
    assert whole.returncode == 0, whole.stderr
    result, asked = json.loads(whole.stdout), list(fake_server.messages)
    chunks = result["document"]["chunks"]
    assert chunks >= 5 and result["chunks_read"] == (chunks + 1) // 2
    assert all(m.startswith("Every other section.") for m in asked[:-1])
    assert len(asked) == result["chunks_read"] + 1

    # The trace names the reader and its templates' hashes, and reads back.
    trace = read_trace(tmp_path / "whole.jsonl")
    assert trace.header.settings["reader"] == "every-other"
    final = "You are presented with a problem and a previous memory."
    assert (
        trace.header.templates_sha256["update"]
        == hashlib.sha256(b"Every other section. " + _memagent_update().encode()).hexdigest()
    )
    assert [s.chunk_index for s in trace.steps] == list(range(0, chunks, 2))
    assert asked[-1].startswith(final)
    # What its steps carry (its Spec.fields) is kept in the trace, in --json, in the views.
    records = [json.loads(line) for line in (tmp_path / "whole.jsonl").read_text().splitlines()]
    assert records[2]["type"] == "step" and records[2]["skipped"] == 3
    assert [s.get("skipped") for s in result["steps"]] == [
        i + 1 if i + 1 < chunks else None for i in range(0, chunks, 2)
    ]
    assert asked[2].endswith("(2 left out so far)")

    shown = memagent("trace", str(tmp_path / "whole.jsonl"))
    assert shown.returncode == 0, shown.stderr
    assert "every other chunk" in shown.stdout
    step = memagent("trace", str(tmp_path / "whole.jsonl"), "--step", "2")
    assert step.returncode == 0, step.stderr
    assert "Left out: chunk 4" in step.stdout
    page = tmp_path / "whole.html"
    html = memagent("trace", str(tmp_path / "whole.jsonl"), "--html", str(page))
    assert html.returncode == 0, html.stderr
    assert "every other chunk" in page.read_text()
    assert "<li>Left out: chunk 4</li>" in page.read_text()

    # Ctrl-C during the second step; the same command with --resume asks the rest.
    fake_server.messages.clear()
    fake_server.hold_after = fake_server.chat_calls + 1  # the second step waits
    cut = tmp_path / "cut.jsonl"
    process, _, err = interrupt_after_steps(
        [*args, "--trace", str(cut)],
        cut,
        plugged,
        1,
        interrupt=lambda p: (p.send_signal(signal.SIGINT), fake_server.release()),
    )
    assert process.returncode == 130, err
    assert len(read_trace(cut).steps) == 1 and not read_trace(cut).finished
    fake_server.hold_after = None
    fake_server.messages.clear()
    resumed = memagent("ask", *args, "--json", "--resume", str(cut))
    assert resumed.returncode == 0, resumed.stderr
    assert fake_server.messages == asked[1:]
    assert json.loads(resumed.stdout)["reply"] == result["reply"]


def test_eval_reads_with_a_plugin_s_reader(memagent, plugged, fake_server, tmp_path):
    data = tmp_path / "eval_50.json"
    cases = [{"_id": "c1", "input": FACT_QUESTION, "context": story(60), "answers": ["x"]}]
    data.write_text(json.dumps(cases))
    out = tmp_path / "run.jsonl"
    how = [*served(fake_server, *STEPS), "--reader", "every-other", "-o", str(out)]
    result = memagent("eval", "run", str(data), *how)
    assert result.returncode == 0, result.stderr
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    trace = read_trace(Path(record["trace"]))
    assert trace.header.settings["reader"] == "every-other"
    assert fake_server.messages[0].startswith("Every other section.")


def test_a_reader_no_one_installed_is_one_sentence(memagent, env, tmp_path):
    book = tmp_path / "village.txt"
    book.write_text(story(10))
    result = memagent("ask", str(book), "q?", "--reader", "every-other")
    assert result.returncode == 2
    assert "every-other" in result.stderr and "memagent, infmem, rememr1" in result.stderr
    assert "Traceback" not in result.stderr


def _memagent_update() -> str:
    from memagent_cli import protocol

    return protocol.UPDATE_TEMPLATE
