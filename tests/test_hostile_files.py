"""Hand-edited or hostile files memagent reads back: traces, results files, GGUF and
safetensors headers with wrong types, huge numbers or bad offsets. Each is one sentence on
stderr and exit 1, in bounded time, from every command that reads it; `models list` still
lists the other models."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
from support.command import assert_clean_failure
from support.fake_openai import served
from support.hf_model import build
from support.story import FACT_QUESTION, story

SECONDS = 5  # every refusal here takes well under a second


def refused(result, *phrases: str) -> None:
    """Exit 1 with one sentence on stderr, no traceback."""
    assert_clean_failure(result, 1, *phrases)
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def timed(cli, *args: str, limit: float = SECONDS):
    started = time.monotonic()
    result = cli(*args)
    assert time.monotonic() - started < limit
    return result


# -- traces -----------------------------------------------------------------------------------

STEPS = ["--chunk-tokens", "300", "--memory-tokens", "64", "--temperature", "0"]


@pytest.fixture
def interrupted(cli, fake_server, tmp_path) -> tuple[Path, Path]:
    """(document, trace) of a run the server stopped answering after two steps."""
    doc = tmp_path / "village.txt"
    doc.write_text(story(120))
    trace = tmp_path / "run.jsonl"
    fake_server.fail_after, fake_server.fail_status = 2, 400
    ask = cli("ask", str(doc), FACT_QUESTION, *served(fake_server, *STEPS, "--trace", str(trace)))
    assert ask.returncode == 1
    fake_server.fail_after = None
    return doc, trace


# Numbers JSON can spell that no trace holds: past 1e308 an int is no float (a view that
# divides it raised OverflowError), NaN and infinity, negative counts.
HUGE = "1" + "0" * 400
TEMPLATES = "'templates_sha256' field that is not the sha256 of each prompt template"
TRACE_EDITS = {
    "a 400-digit token offset": (2, "tokens", f"[0, {HUGE}]", "'tokens' field out of range"),
    "a 400-digit memory budget": (1, "settings", None, "setting 'memory_tokens'"),
    "a 400-digit model size": (1, "model", None, "model has a 'size' field out of range"),
    "NaN seconds": (2, "seconds", "NaN", "'seconds' field out of range"),
    "infinite seconds": (3, "prompt_seconds", "Infinity", "'prompt_seconds' field out of range"),
    "2**70 prompt tokens": (2, "prompt_tokens", str(2**70), "'prompt_tokens' field out of range"),
    "negative tokens": (3, "completion_tokens", "-5", "'completion_tokens' field out of range"),
    "a list for the memory": (2, "memory", '["a"]', "'memory' field of the wrong type"),
    "an object for the step": (3, "step", '{"n": 2}', "'step' field of the wrong type"),
    "text for the templates' hashes": (1, "templates_sha256", '"abc"', TEMPLATES),
    "a template's hash that is not one": (
        1,
        "templates_sha256",
        '{"update": "not a hash", "final": 7}',
        TEMPLATES,
    ),
}


def edit_trace(trace: Path, line: int, field: str, raw: str | None) -> None:
    """Line `line` of `trace` with `field` spelled `raw` (JSON that json.dumps cannot write)."""
    lines = trace.read_text().splitlines()
    record = json.loads(lines[line - 1])
    if field == "settings":
        record["settings"]["memory_tokens"], raw = "@", None
    elif field == "model":
        record["model"]["size"], raw = "@", None
    else:
        record[field] = "@"
    lines[line - 1] = json.dumps(record).replace('"@"', raw or HUGE)
    trace.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("case", TRACE_EDITS)
def test_a_hostile_trace_is_one_sentence_for_every_command_that_reads_it(
    cli, fake_server, interrupted, tmp_path, case
) -> None:
    doc, trace = interrupted
    line, field, raw, phrase = TRACE_EDITS[case]
    edit_trace(trace, line, field, raw)
    where = f"{trace}, line {line}"

    refused(timed(cli, "trace", str(trace)), where, phrase)
    refused(timed(cli, "trace", str(trace), "--html", str(tmp_path / "r.html")), where, phrase)
    refused(timed(cli, "trace", str(trace), "--json"), where, phrase)
    resume = served(fake_server, *STEPS, "--resume", str(trace))
    refused(timed(cli, "ask", str(doc), FACT_QUESTION, *resume), where, phrase)
    assert not (tmp_path / "r.html").exists()


def test_the_word_diff_of_a_huge_memory_is_bounded(cli, interrupted, tmp_path) -> None:
    """A memory of a million words, few of them distinct, against another: difflib's
    matcher would take hours; above the limit the memory is shown replaced whole."""
    _, trace = interrupted
    lines = trace.read_text().splitlines()
    for line, shift in ((1, 1), (2, 7)):
        record = json.loads(lines[line])
        record["memory"] = " ".join(f"w{(i * shift) % 50}" for i in range(1_000_000))
        lines[line] = json.dumps(record)
    trace.write_text("\n".join(lines) + "\n")
    html = tmp_path / "r.html"

    for args in (["--diff", "2"], ["--html", str(html)], []):
        result = timed(cli, "trace", str(trace), *args, limit=20)  # 1.5 s here, hours unbounded
        assert result.returncode == 0, result.stderr
    assert html.stat().st_size > 2 * 3_000_000  # both memories, whole


# -- results files ----------------------------------------------------------------------------


def result(n: int, **changed) -> dict:
    record = {"id": f"q{n}", "group": "eval_50", "sub_em": 1.0, "em": 1.0, "f1": 1.0}
    return record | {"prediction": "x", "seconds": 2.0, "tokens": 7000} | changed


RESULT_EDITS = {
    "a string score": ({"sub_em": "1.0"}, "'sub_em'"),
    "a 400-digit token count": ({"tokens": "@"}, "'tokens'"),
    "NaN seconds": ({"seconds": "NaN"}, "'seconds'"),
    "infinite f1": ({"f1": "Infinity"}, "'f1'"),
    "a list for the group": ({"group": ["eval_50"]}, "'group'"),
    "an object for the id": ({"id": {"n": 1}}, "'id'"),
}


@pytest.mark.parametrize("case", RESULT_EDITS)
def test_a_hostile_results_file_is_one_sentence(cli, tmp_path, case) -> None:
    changed, phrase = RESULT_EDITS[case]
    line = json.dumps(result(2, **changed))
    for raw in ("NaN", "Infinity"):
        line = line.replace(f'"{raw}"', raw)
    path = tmp_path / "run.jsonl"
    path.write_text(json.dumps(result(1)) + "\n" + line.replace('"@"', HUGE) + "\n")
    where = f"{path}, line 2 has a {phrase} field"

    refused(timed(cli, "eval", "report", str(path)), where)
    refused(timed(cli, "eval", "report", str(path), "--json"), where)
    refused(timed(cli, "eval", "report", str(path), "--html", str(tmp_path / "r.html")), where)


def test_absurd_json_in_a_results_file_is_a_skipped_line(cli, tmp_path) -> None:
    path = tmp_path / "run.jsonl"
    junk = ["[" * 200_000 + "]" * 200_000, '{"id": ' + "9" * 5000 + "}"]
    path.write_text("".join(line + "\n" for line in [json.dumps(result(1)), *junk]))

    report = json.loads(timed(cli, "eval", "report", str(path), "--json").stdout)

    assert report["runs"][0]["cases"] == 1 and report["runs"][0]["skipped_lines"] == 2


# -- evaluation data --------------------------------------------------------------------------

CASE = '"input": "q", "context": "c", "answers": ["a"]'
ABSURD_DATA = {  # JSON that Python's parser refuses with RecursionError or ValueError
    "deep nesting in a list": "[" + "[" * 200_000 + "]" * 200_000 + "]",
    "deep nesting in JSON Lines": '{"a": ' * 200_000 + "1" + "}" * 200_000 + "\n",
    "a 5000-digit id": "[{" + CASE + ', "_id": ' + "9" * 5000 + "}]",
    "a 5000-digit answer in JSON Lines": '{"input": "q", "context": "c", "answers": ['
    + "9" * 5000
    + "]}\n",
}


@pytest.mark.parametrize("case", ABSURD_DATA)
def test_absurd_json_in_evaluation_data_is_one_sentence(cli, tmp_path, case) -> None:
    path = tmp_path / "eval_50.json"
    path.write_text(ABSURD_DATA[case])
    missing_model = ["--model", str(tmp_path / "none.gguf")]  # refused before any model

    refused(timed(cli, "eval", "run", str(path), *missing_model), f"{path}: case 1")


# -- GGUF headers -----------------------------------------------------------------------------

T = gguf.GGUFValueType


def write_gguf(path: Path, *extra: tuple[str, object, gguf.GGUFValueType]) -> Path:
    """A small GGUF (qwen2, one tensor) with `extra` key-value pairs of any type."""
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    for key, value, kind in extra:
        writer.add_key_value(key, value, kind)
    writer.add_tensor("token_embd.weight", np.ones((4, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def header_bytes(n_tensors: int, pairs: bytes = b"", n_kv: int = 0) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + pairs


def key(name: str) -> bytes:
    return struct.pack("<Q", len(name)) + name.encode()


GGUF_CASES = {
    "a string context length": (
        lambda p: write_gguf(p, ("qwen2.context_length", "long", T.STRING)),
        "its qwen2.context_length is not a count",
    ),
    "an infinite layer count": (
        lambda p: write_gguf(p, ("qwen2.block_count", float("inf"), T.FLOAT64)),
        "its qwen2.block_count is not a count",
    ),
    "a NaN file type": (
        lambda p: write_gguf(p, ("general.file_type", float("nan"), T.FLOAT32)),
        "its general.file_type is not a count",
    ),
    "a string split count": (
        lambda p: write_gguf(p, ("split.count", "two", T.STRING)),
        "its split.count is not a count",
    ),
    "a string for the tokens": (
        lambda p: write_gguf(p, ("tokenizer.ggml.tokens", "abc", T.STRING)),
        "its tokenizer.ggml.tokens is not a list",
    ),
    "a key named like the tensor count": (
        lambda p: write_gguf(p, ("GGUF.tensor_count", "many", T.STRING), ("x.y", 0, T.UINT8)),
        None,  # read, with the count the header gives
    ),
    "an alignment of 3": (
        lambda p: write_gguf(p, ("general.alignment", 3, T.UINT32)),
        "its header is cut short or malformed",
    ),
    "a tensor past the end": (
        lambda p: p.write_bytes(write_gguf(p).read_bytes()[:-200]) and p,
        "tensor token_embd.weight would end at byte 1,248, and the file has 1,048",
    ),
    "10**12 tensors": (
        lambda p: p.write_bytes(header_bytes(10**12) + bytes(64)) and p,
        "its header is cut short or malformed",
    ),
    "an array of 2**62 strings": (
        lambda p: (
            p.write_bytes(
                header_bytes(0, key("k") + struct.pack("<IIQ", 9, 8, 2**62), 1) + bytes(64)
            )
            and p
        ),
        "its header is cut short or malformed",
    ),
    "a string past the end": (
        lambda p: p.write_bytes(header_bytes(0, key("k") + struct.pack("<IQ", 8, 4096), 1)) and p,
        "its header is cut short or malformed",
    ),
    "a tensor 2**70 bytes long": (
        lambda p: (
            p.write_bytes(
                header_bytes(1, key("t") + struct.pack("<IQQIQ", 2, 2**35, 2**35, 0, 0)) + bytes(64)
            )
            and p
        ),
        "tensor t would end at byte",
    ),
}


@pytest.mark.parametrize("case", GGUF_CASES)
def test_a_hostile_gguf_is_one_sentence_and_listed_as_broken(cli, env, tmp_path, case) -> None:
    make, phrase = GGUF_CASES[case]
    folder = Path(env["XDG_DATA_HOME"]) / "memagent" / "models"
    folder.mkdir(parents=True)
    path = make(folder / "hostile.gguf")

    info = timed(cli, "models", "info", str(path))
    listed = json.loads(timed(cli, "models", "list", "--json").stdout)

    rows = {Path(r["path"]).name: r for r in listed if r["path"]}
    assert "smollm2-135m" in {r["name"] for r in listed if not r.get("error")}
    if phrase is None:
        assert info.returncode == 0, info.stderr
        assert "tensors        1" in info.stdout and not rows["hostile.gguf"].get("error")
        return
    refused(info, f"{path} is a damaged GGUF file", phrase)
    assert phrase in rows["hostile.gguf"]["error"]


@pytest.mark.parametrize("case", ["a string context length", "a tensor past the end"])
def test_ask_refuses_a_hostile_gguf_before_llama_cpp_reads_it(cli, tmp_path, case) -> None:
    make, phrase = GGUF_CASES[case]
    path = make(tmp_path / "hostile.gguf")
    doc = tmp_path / "doc.txt"
    doc.write_text("The tower is kept by Ann.")

    result = timed(cli, "ask", str(doc), "Who keeps the tower?", "-m", str(path), "--no-trace")

    refused(result, f"{path} is a damaged GGUF file", phrase)


# -- safetensors headers ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("hf") / "Tiny-Qwen2"
    build(folder, tied=True, dtype="BF16")
    return folder


def header_of(path: Path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + length]), data[8 + length :]


def with_header(path: Path, header: dict | str, body: bytes) -> None:
    raw = (header if isinstance(header, str) else json.dumps(header)).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + body)


def first_tensor(header: dict) -> str:
    return next(name for name in header if name != "__metadata__")


SAFETENSORS_EDITS = {
    "a string offset": lambda entry: entry.update(data_offsets=["0", "8"]),
    "a negative offset": lambda entry: entry.update(
        data_offsets=[entry["data_offsets"][0] - 64, entry["data_offsets"][1] - 64]
    ),
    "2**70 as an offset": lambda entry: entry.update(data_offsets=[2**70, 2**70 + 8]),
    "a string dimension": lambda entry: entry.update(shape=[10**9, "ab"]),
    "a dimension of 2**62": lambda entry: entry.update(shape=[2**62, 2**62]),
    "a thousand dimensions": lambda entry: entry.update(shape=[1] * 1000),
    "a list as the dtype": lambda entry: entry.update(dtype=["BF16"]),
    "a list for the entry": None,
    # No bytes: a weight with no elements, which no model has (the converter divided by it).
    "a last dimension of 0": lambda entry: entry.update(
        shape=[entry["shape"][0], 0], data_offsets=[entry["data_offsets"][0]] * 2
    ),
    "a first dimension of 0": lambda entry: entry.update(
        shape=[0, *entry["shape"][1:]], data_offsets=[entry["data_offsets"][0]] * 2
    ),
}


@pytest.mark.parametrize("case", SAFETENSORS_EDITS)
def test_a_hostile_safetensors_header_is_one_sentence(cli, hf_folder, tmp_path, case) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    for file in hf_folder.iterdir():
        (folder / file.name).write_bytes(file.read_bytes())
    shard = sorted(folder.glob("*.safetensors"))[0]
    header, body = header_of(shard)
    name = first_tensor(header)
    if SAFETENSORS_EDITS[case] is None:
        header[name] = [header[name]]
    else:
        SAFETENSORS_EDITS[case](header[name])
    with_header(shard, header, body)

    result = timed(cli, "models", "convert", str(folder), "--out", str(tmp_path / "m.gguf"))

    refused(result, f"{shard.name} is not a complete safetensors file")
    assert not (tmp_path / "m.gguf").exists()


@pytest.mark.parametrize(
    ("header", "phrase"),
    [
        ("[" * 200_000 + "]" * 200_000, "its header is not JSON"),
        ('{"a": ' + "9" * 5000 + "}", "its header is not JSON"),
    ],
    ids=["200000-deep nesting", "5000-digit number"],
)
def test_absurd_json_in_a_safetensors_header_is_one_sentence(
    cli, hf_folder, tmp_path, header, phrase
) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    for file in hf_folder.iterdir():
        (folder / file.name).write_bytes(file.read_bytes())
    shard = sorted(folder.glob("*.safetensors"))[0]
    with_header(shard, header, b"")

    result = timed(cli, "models", "convert", str(folder), "--out", str(tmp_path / "m.gguf"))

    refused(result, f"{shard.name} is not a complete safetensors file", phrase)


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json"])
@pytest.mark.parametrize(
    "content",
    ["[" * 200_000 + "]" * 200_000, '{"a": ' + "9" * 5000 + "}"],
    ids=["200000-deep nesting", "5000-digit number"],
)
def test_absurd_json_in_a_model_folder_s_files_is_one_sentence(
    cli, hf_folder, tmp_path, name, content
) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    for file in hf_folder.iterdir():
        (folder / file.name).write_bytes(file.read_bytes())
    (folder / name).write_text(content)

    result = timed(cli, "models", "convert", str(folder), "--out", str(tmp_path / "m.gguf"))

    refused(result, str(folder / name))
    assert not (tmp_path / "m.gguf").exists()


def test_an_index_naming_a_file_outside_the_folder_is_refused(cli, hf_folder, tmp_path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    for file in hf_folder.iterdir():
        (folder / file.name).write_bytes(file.read_bytes())
    index = folder / "model.safetensors.index.json"
    elsewhere = tmp_path / "elsewhere.safetensors"
    elsewhere.write_bytes(sorted(folder.glob("*.safetensors"))[0].read_bytes())
    mapped = json.loads(index.read_text())
    mapped["weight_map"] = {k: str(elsewhere) for k in mapped["weight_map"]}
    index.write_text(json.dumps(mapped))

    result = timed(cli, "models", "convert", str(folder), "--out", str(tmp_path / "m.gguf"))

    refused(result, f"{index} names a weights file outside {folder}")
