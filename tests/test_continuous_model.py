"""Continuous batching with the real model: readings of several documents of different
lengths share one llama.cpp context, two sequences, a freed one taken by the next reading;
with --exact each reading's memories and reply equal the ones it gets alone, byte for
byte. `ask` over several documents and `eval --parallel` alike."""

from __future__ import annotations

import json

import pytest
from conftest import FACT_QUESTION, FACT_VALUE, story

pytestmark = pytest.mark.model

EXACT = [
    *("--chunk-tokens", "200", "--memory-tokens", "32", "--temperature", "0", "--no-cache"),
    "--exact",  # the promise: byte-identical together and alone
]


def kept(step: dict) -> dict:
    """A step record without timings and draft counts (the draft policy learns from
    measured times; the text may not differ)."""
    return {
        k: v
        for k, v in step.items()
        if k not in ("seconds", "prompt_seconds", "drafted", "accepted")
    }


def test_readings_of_several_documents_read_continuously_equal_each_read_alone(memagent, tmp_path):
    paths = []
    for i, sentences in enumerate((45, 15, 30)):  # 3 documents of 3, 1 and 2 chunks of 200
        path = tmp_path / f"book{i}.txt"
        path.write_text(story(sentences, seed=10 + i))
        paths.append(str(path))
    listing = tmp_path / "documents.txt"
    listing.write_text("\n".join(paths[1:]) + "\n")
    both = memagent(
        "ask", paths[0], "--documents", str(listing), FACT_QUESTION, *EXACT,
        "--parallel", "2", "--json",
    )  # fmt: skip
    assert both.returncode == 0, both.stderr
    together = [json.loads(line) for line in both.stdout.splitlines()]
    assert [r["document"]["path"] for r in together] == paths
    assert [len(r["steps"]) for r in together] == [3, 1, 2]
    # Read at once: the second document's first step comes before the first's answer, and
    # the third takes the slot of the second (answered first) before the first is answered.
    lines = both.stderr.splitlines()
    first_answering = lines.index("[d1 q1] answering from the final memory")
    assert lines.index("[d2 q1] answering from the final memory") < first_answering
    assert min(i for i, line in enumerate(lines) if line.startswith("[d3 q1] step")) < (
        first_answering
    )
    for path, joint in zip(paths, together, strict=True):
        alone = memagent("ask", path, FACT_QUESTION, *EXACT, "--json")
        assert alone.returncode == 0, alone.stderr
        single = json.loads(alone.stdout)
        assert [kept(s) for s in joint["steps"]] == [kept(s) for s in single["steps"]]
        assert joint["reply"] == single["reply"]


def test_eval_reads_cases_continuously_in_process_as_one_by_one(memagent, tmp_path):
    cases = [
        {
            "_id": f"c{seed}",
            "input": FACT_QUESTION,
            "context": story(sentences, seed=seed),
            "answers": [FACT_VALUE],
        }
        for seed, sentences in ((1, 20), (2, 35), (3, 12))
    ]
    data = tmp_path / "eval_300.json"
    data.write_text(json.dumps(cases))
    replies = {}
    for parallel in ("1", "2"):
        out = tmp_path / f"p{parallel}.jsonl"
        result = memagent("eval", str(data), *EXACT, "--parallel", parallel, "-o", str(out))
        assert result.returncode == 0, result.stderr
        if parallel == "2":  # c2 is read while c1 still is
            lines = result.stderr.splitlines()
            started = next(i for i, line in enumerate(lines) if "[eval_300 c2] step" in line)
            assert started < lines.index("[eval_300 c1] answering from the final memory")
        records = [json.loads(line) for line in out.read_text().splitlines()]
        replies[parallel] = {r["id"]: r["reply"] for r in records}
    assert sorted(replies["2"]) == ["c1", "c2", "c3"]
    assert replies["2"] == replies["1"]
