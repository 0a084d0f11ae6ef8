"""Continuous batching with the real model: readings of several documents of different
lengths share one llama.cpp context, two sequences, a freed one taken by the next reading;
with --exact each reading's memories and reply equal the ones it gets alone, byte for
byte. `ask` over several documents and `eval --parallel` alike, and a call that joins
another one mid-reply."""

from __future__ import annotations

import json

import pytest
from support.story import FACT_QUESTION, FACT_VALUE, story

from memagent_cli import protocol
from memagent_cli.backend import Call, Sampling
from memagent_cli.backends.llama_cpp import LlamaCppBackend, LlamaOptions

pytestmark = [pytest.mark.model, pytest.mark.usefixtures("on_tiny_model")]

EXACT = [
    *("--chunk-tokens", "200", "--memory-tokens", "32", "--temperature", "0", "--no-reuse"),
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
    listing.write_text("\n".join(paths) + "\n")
    both = memagent(
        "ask", "--documents", str(listing), FACT_QUESTION, *EXACT,
        "--parallel", "2", "--json",
    )  # fmt: skip
    assert both.returncode == 0, both.stderr
    together = [json.loads(line) for line in both.stdout.splitlines()]
    assert [r["document"]["path"] for r in together] == paths
    assert [len(r["steps"]) for r in together] == [3, 1, 2]
    # Read at once: the second document is answered before the first, and the third takes
    # the slot of the second (its trace opens) before the first is answered.
    lines = both.stderr.splitlines()
    first_answering = lines.index("[d1 q1] answering from the final memory")
    assert lines.index("[d2 q1] answering from the final memory") < first_answering
    third_opens = next(i for i, line in enumerate(lines) if line.endswith("-book2-q1.jsonl"))
    assert lines[third_opens].startswith("trace: ")
    assert third_opens < first_answering
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


GREEDY = Sampling(temperature=0.0)
FIRST = protocol.render_update(FACT_QUESTION, protocol.INITIAL_MEMORY, story(25, seed=3))
JOINING = protocol.render_update(FACT_QUESTION, protocol.INITIAL_MEMORY, story(20, seed=4))


@pytest.fixture(scope="module")
def engine(tiny_model):
    """The tiny model with --exact, two sequences, and each reply it gives alone."""
    backend = LlamaCppBackend(tiny_model, LlamaOptions(threads=2, gpu_layers=0, exact=True))
    backend.prepare(1024, sequences=2)
    alone = {
        name: backend.generate(message, max_tokens=n, sampling=GREEDY)
        for name, message, n in (("long", FIRST, 48), ("short", FIRST, 4), ("joining", JOINING, 24))
    }
    return backend, alone


def same(replies, alone) -> None:
    for name, generation in replies.items():
        assert generation.text == alone[name].text, name
        assert generation.completion_tokens == alone[name].completion_tokens, name


def test_a_call_started_while_another_is_decoded_joins_it_and_both_reply_as_alone(engine):
    backend, alone = engine
    decoder = backend.decoder
    members: list[list[int]] = []  # the sequences in each decode round
    decode_round = decoder._round

    def counted(streams):
        members.append(sorted(stream.seq_id for stream in streams))
        return decode_round(streams)

    decoder._round = counted
    try:
        calls = [Call(FIRST, 48, 0, fresh=True), Call(FIRST, 4, 1, fresh=True)]
        ended = backend.next_replies(calls, sampling=GREEDY)
        # The same prompt: the short reply is the long one's first 4 tokens, and ends first.
        assert [sequence for sequence, _ in ended] == [1]
        assert decoder.in_flight == 1
        replies = {"short": ended[0][1]}
        split = len(members)
        got = dict(backend.next_replies([Call(JOINING, 24, 1, fresh=True)], sampling=GREEDY))
        while decoder.in_flight:
            got.update(backend.next_replies([], sampling=GREEDY))
    finally:
        del decoder._round
    replies |= {"long": got[0], "joining": got[1]}
    assert members[split] == [0, 1]  # it joined the long reply's rounds at once
    same(replies, alone)


def test_calls_dropped_mid_reply_and_made_again_reply_as_alone(engine):
    backend, alone = engine
    calls = [Call(FIRST, 48, 0, fresh=True), Call(JOINING, 24, 1, fresh=True)]
    assert len(backend.next_replies(calls, sampling=GREEDY)) == 1  # the other is mid-reply
    backend.cancel()  # as Ctrl-C does
    assert backend.decoder.in_flight == 0
    # Made again in the same sequences, their caches holding what the dropped replies left.
    got = dict(backend.next_replies([Call(FIRST, 48, 0), Call(JOINING, 24, 1)], sampling=GREEDY))
    while backend.decoder.in_flight:
        got.update(backend.next_replies([], sampling=GREEDY))
    same({"long": got[0], "joining": got[1]}, alone)
