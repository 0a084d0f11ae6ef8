"""Reading the authors' evaluation files: both shapes, folders, and every bad input."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from memagent_cli.evaluation import data
from memagent_cli.evaluation.data import Case, DataError


def authors_case(i: int, context: str = "Document 1:\nParis is in France.") -> dict:
    return {"_id": f"q{i}", "input": f"Question {i}?", "context": context, "answers": ["Paris"]}


def write_list(path: Path, items: list) -> Path:
    path.write_text(json.dumps(items, ensure_ascii=False, indent=1))
    return path


def write_lines(path: Path, items: list) -> Path:
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    return path


def test_a_json_list_in_the_authors_shape(tmp_path):
    path = write_list(tmp_path / "eval_50.json", [authors_case(1), authors_case(2)])
    cases = list(data.read_cases(path))
    assert cases[0] == Case(
        id="q1",
        group="eval_50",
        question="Question 1?",
        context="Document 1:\nParis is in France.",
        answers=("Paris",),
        kind="qa",
    )
    assert [c.id for c in cases] == ["q1", "q2"]
    assert data.check(path).ids == ("q1", "q2")


def test_json_lines_and_ruler_needle_files(tmp_path):
    needle = {"index": 7, "input": "What are the numbers?", "context": "x", "outputs": ["1", 2]}
    path = write_lines(tmp_path / "niah_single_2_8192.jsonl", [needle])
    (case,) = data.read_cases(path)
    assert (case.id, case.kind, case.answers) == ("7", "needle", ("1", "2"))
    # RULER's qa splits are QA, scored against the first output (ruler_general.py).
    qa = write_lines(tmp_path / "eval_qa_1_8192.jsonl", [needle])
    assert next(data.read_cases(qa)).kind == "qa"


def test_missing_ids_are_positions_and_limit_takes_the_first_cases(tmp_path):
    items = [{k: v for k, v in authors_case(i).items() if k != "_id"} for i in range(5)]
    path = write_lines(tmp_path / "plain.jsonl", items)
    assert data.check(path, limit=3).ids == ("0", "1", "2")


def test_a_case_larger_than_one_read_streams_across_reads(tmp_path):
    big = "Word " * 600_000  # 3 MB, three times the read size
    path = write_list(tmp_path / "big.json", [authors_case(1, big), authors_case(2)])
    cases = list(data.read_cases(path))
    assert len(cases[0].context) == len(big) and cases[1].id == "q2"


def test_a_byte_order_mark_and_unicode_are_read(tmp_path):
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps([authors_case(1, "Café – naïve")]).encode())
    (case,) = data.read_cases(path)
    assert case.context == "Café – naïve"


def test_a_folder_is_its_files_in_natural_order(tmp_path):
    for n in (800, 50, 100):
        write_list(tmp_path / f"eval_{n}.json", [authors_case(n)])
    (tmp_path / "notes.txt").write_text("not data")
    files = data.data_files([tmp_path])
    assert [f.name for f in files] == ["eval_50.json", "eval_100.json", "eval_800.json"]


def error_of(path: Path, limit: int | None = None) -> str:
    with pytest.raises(DataError) as caught:
        data.check(path, limit)
    message = caught.value.message
    assert "\n" not in message and message.endswith(".")  # one sentence
    return message


def test_a_file_not_in_the_format_names_the_missing_field(tmp_path):
    item = authors_case(1)
    del item["answers"]
    message = error_of(write_list(tmp_path / "a.json", [authors_case(0), item]))
    assert 'case 2 has no "answers" field' in message
    assert "context, input, answers and _id" in message

    no_context = {"question": "Who?", "answers": ["x"]}
    assert 'no "context" field' in error_of(write_lines(tmp_path / "b.jsonl", [no_context]))


def test_an_empty_list_and_an_empty_file(tmp_path):
    assert "holds no cases" in error_of(write_list(tmp_path / "empty.json", []))
    (tmp_path / "blank.jsonl").write_text("\n\n")
    assert "holds no cases" in error_of(tmp_path / "blank.jsonl")


def test_a_case_with_no_answers(tmp_path):
    item = authors_case(1)
    item["answers"] = []
    message = error_of(write_list(tmp_path / "a.json", [item]))
    assert 'empty "answers" list' in message and "cannot be scored" in message


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"data": [1, 2]}', 'no "context" field'),
        ("[1, 2]", "is not a JSON object"),
        ('"text"', "is not a JSON list or JSON Lines"),
        ("[" + json.dumps(authors_case(1)), "ends before its closing ]"),
        ('[{"_id": 1, "input": "q", "context": "c", "answers": ["a"]', "is not valid JSON"),
        ('[{"input": "q", "context": [0, 3], "answers": ["a"]}]', "document indices"),
        ('[{"input": 5, "context": "c", "answers": ["a"]}]', '"input" must be text'),
        ('[{"input": "q", "context": "  ", "answers": ["a"]}]', 'empty "context"'),
        ('[{"input": "q", "context": "c", "answers": "a"}]', "must be a list of answers"),
    ],
)
def test_bad_shapes_are_one_sentence(tmp_path, content, expected):
    path = tmp_path / "bad.json"
    path.write_text(content)
    assert expected in error_of(path)


def test_repeated_ids_and_bytes_that_are_not_utf8(tmp_path):
    path = write_list(tmp_path / "dup.json", [authors_case(1), authors_case(1)])
    assert "repeats the id q1" in error_of(path)
    (tmp_path / "latin.json").write_bytes(b'[{"input": "caf\xe9"}]')
    assert "not UTF-8" in error_of(tmp_path / "latin.json")


def test_non_regular_files_missing_paths_and_empty_folders_are_refused(tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    assert "not a regular file" in error_of(fifo)
    with pytest.raises(DataError, match="not found"):
        data.data_files([tmp_path / "nope.json"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"holds no \.json or \.jsonl files"):
        data.data_files([tmp_path / "empty"])


def test_two_files_with_one_name_are_refused(tmp_path):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        write_list(tmp_path / folder / "eval_50.json", [authors_case(1)])
    with pytest.raises(DataError, match="share the name eval_50"):
        data.data_files([tmp_path / "a", tmp_path / "b"])
