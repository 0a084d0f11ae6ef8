"""Progress on every long piece of work, as a log or a pipe shows it (stderr is not a
terminal here): tokenizing a long document through a server, and an evaluation as a whole.
The live bars on a terminal and the time left are tests/test_display.py's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.command import words
from support.fake_openai import FakeServer, served
from support.story import story

STEPS = ["--chunk-tokens", "2000", "--memory-tokens", "64", "--temperature", "0"]


def test_tokenizing_a_long_document_on_a_server_says_how_far_it_got(memagent, tmp_path):
    doc = tmp_path / "long.txt"
    doc.write_text(story(22_000, fact=None))  # 1.2M characters: tokenized a piece at a time
    characters = len(doc.read_text().strip())
    # A server tokenizer is one call per 64K-character piece, each taking a while here.
    with FakeServer(tokenizer=True, tokenize_delay=0.06, fail_after=0, fail_status=400) as server:
        steps = ["--chunk-tokens", "7000", "--memory-tokens", "64"]
        result = memagent("ask", str(doc), "Who?", *served(server, *steps))
        assert server.tokenize_calls > characters // 65_536
    assert result.returncode == 1 and "HTTP 400" in result.stderr  # stopped at the first step
    assert f"tokenizing long.txt: {characters:,}/{characters:,} characters" in words(result.stderr)


def test_an_evaluation_says_how_many_cases_are_done(memagent, tmp_path):
    data = tmp_path / "eval_50.json"
    cases = [
        {"_id": f"c{i}", "input": "Who?", "context": story(40, seed=i), "answers": ["x"]}
        for i in range(3)
    ]
    data.write_text(json.dumps(cases))
    with FakeServer(delay=0.3) as server:  # two calls a case: past the bar's first second
        result = memagent("eval", str(data), *served(server, *STEPS), "-o", str(tmp_path / "r"))
    assert result.returncode == 0, result.stderr
    assert "[3/3] eval_50 c2:" in result.stderr
    assert "evaluating: 3/3 cases" in result.stderr.splitlines()
    assert Path(tmp_path / "r").is_file()


@pytest.mark.model
@pytest.mark.usefixtures("on_tiny_model")
def test_loading_a_model_tells_its_bytes_and_stops_at_ctrl_c():
    from support.models import default_model_path

    from memagent_cli.backends.llama_cpp import LlamaCppBackend, LlamaOptions

    path = default_model_path()
    backend = LlamaCppBackend(path, LlamaOptions(threads=2))
    seen: list[tuple[str, int, int | None]] = []
    backend.prepare(512, progress=lambda *told: seen.append(told))
    size = path.stat().st_size  # told in bytes, so a bar can show MB and the time left
    assert seen[-1] == (f"loading {backend.name}", size, size)
    assert all(total == size for _, _, total in seen)
    assert [done for _, done, _ in seen] == sorted(done for _, done, _ in seen)

    def ctrl_c(*told: object) -> None:  # as Python delivers it: inside the callback
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        backend.prepare(512, progress=ctrl_c)
    backend.prepare(512)  # nothing was left half-loaded
    assert backend.decoder is not None
