"""The authors' evaluation files: read, checked, and streamed one case at a time.

`eval_50.json` ... `eval_6400.json` are JSON lists of `{"_id", "input", "context",
"answers"}`; RULER's needle files are JSON Lines of `{"index", "input", "context",
"outputs"}`. Either shape, either container, is accepted. The largest file holds 128
documents of 3.5M tokens (about 2 GB), so files are streamed: only the case being run is
held in memory, and a single case is bounded.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from memagent_cli.errors import UserError
from memagent_cli.files import open_regular

MAX_CASE_BYTES = 256 << 20  # a 3.5M-token case is about 15 MB of JSON
_READ_BYTES = 1 << 20
_SUFFIXES = (".json", ".jsonl")
_SHAPE = "expected objects with context, input, answers and _id, as in the authors' eval_*.json"


class DataError(UserError):
    """An evaluation file that is missing, unreadable or not in the authors' format."""


@dataclass(frozen=True)
class Case:
    """One question about one document, with what a correct answer must contain."""

    id: str
    group: str  # the length group: the data file's name, or the niah length label
    question: str
    context: str
    answers: tuple[str, ...]
    kind: str  # "qa": scored against answers[0]; "needle": every value is expected
    depth: float | None = None  # niah: where the needle asked for sits, in percent

    @property
    def key(self) -> tuple[str, str]:
        """What identifies a case across runs of the same data."""
        return (self.group, self.id)


@dataclass(frozen=True)
class DataFile:
    """One checked evaluation file: a length group."""

    path: Path
    group: str
    ids: tuple[str, ...]  # of the cases that will run (after --limit)
    questions: tuple[str, ...]  # theirs, to size the model's context before any run


def data_files(paths: Sequence[str | Path]) -> list[Path]:
    """The evaluation files named by `paths`, folders expanded (their .json and .jsonl
    files, eval_50 before eval_100)."""
    found: list[Path] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            inside = sorted(
                (p for p in path.iterdir() if p.suffix.lower() in _SUFFIXES and p.is_file()),
                key=_natural,
            )
            if not inside:
                raise DataError(f"{path} holds no .json or .jsonl files.")
            found += inside
        elif path.exists():
            found.append(path)
        else:
            raise DataError(f"Evaluation data not found: {path}")
    groups: dict[str, Path] = {}
    for path in found:
        if path.stem in groups and groups[path.stem] != path:
            raise DataError(
                f"{groups[path.stem]} and {path} share the name {path.stem}; results are "
                "grouped by file name, so give files with different names."
            )
        groups[path.stem] = path
    return list(groups.values())


def check(path: Path, limit: int | None = None) -> DataFile:
    """Read `path` once through, checking every case (the first `limit`) before any runs."""
    ids, questions = [], []
    for case in read_cases(path, limit):
        ids.append(case.id)
        questions.append(case.question)
    if not ids:
        raise DataError(f"{path} holds no cases.")
    return DataFile(path=path, group=path.stem, ids=tuple(ids), questions=tuple(questions))


def read_cases(path: Path, limit: int | None = None) -> Iterator[Case]:
    """The cases of `path` in file order, at most `limit`, each checked as it is read."""
    seen: set[str] = set()
    for number, item in enumerate(_objects(path), start=1):
        if limit is not None and number > limit:
            return
        case = _case(item, number, path)
        if case.id in seen:
            raise DataError(f"{path}: case {number} repeats the id {case.id}.")
        seen.add(case.id)
        yield case


def _case(item: Any, number: int, path: Path) -> Case:
    where = f"{path}: case {number}"
    if not isinstance(item, dict):
        raise DataError(f"{where} is not a JSON object; {_SHAPE}.")
    for name in ("context", "input"):
        if name not in item:
            raise DataError(f'{where} has no "{name}" field; {_SHAPE}.')
    if "answers" in item:
        kind, field = "qa", "answers"
    elif "outputs" in item:
        # RULER's files: as the authors' ruler_general.py, a "qa" split is scored as QA
        # against its first output, the others by the share of outputs recalled.
        kind, field = ("qa" if "qa" in path.stem else "needle"), "outputs"
    else:
        raise DataError(f'{where} has no "answers" field (nor RULER\'s "outputs"); {_SHAPE}.')
    context, question, answers = item["context"], item["input"], item[field]
    if isinstance(context, list):
        raise DataError(
            f'{where}: "context" is a list of document indices (RULER\'s qa files); give '
            "the file with its documents joined as text."
        )
    for name, value in (("context", context), ("input", question)):
        if not isinstance(value, str):
            raise DataError(f'{where}: "{name}" must be text, not {_json_type(value)}.')
        if not value.strip():
            raise DataError(f'{where} has an empty "{name}".')
    if not isinstance(answers, list) or not all(
        isinstance(a, str | int | float) and not isinstance(a, bool) for a in answers
    ):
        raise DataError(f'{where}: "{field}" must be a list of answers as text.')
    if not answers:
        raise DataError(f'{where} has an empty "{field}" list, so it cannot be scored.')
    raw_id = item.get("_id", item.get("index", number - 1))
    return Case(
        id=str(raw_id),
        group=path.stem,
        question=question,
        context=context,
        answers=tuple(str(a) for a in answers),
        kind=kind,
    )


def _objects(path: Path) -> Iterator[Any]:
    """The top-level values of a JSON list or of JSON Lines, streamed."""
    with open_regular(path, "evaluation data", error=DataError) as file:
        reader = _Reader(file, path)
        first = reader.skip_space()
        if first is None:
            return
        array = first == "["
        if array:
            reader.pos += 1
        elif first != "{":
            raise DataError(f"{path} is not a JSON list or JSON Lines of objects; {_SHAPE}.")
        number = 0
        while True:
            char = reader.skip_space()
            if array and number and char == ",":
                reader.pos += 1
                char = reader.skip_space()
            if char is None:
                if array:
                    raise DataError(f"{path} ends before its closing ]; the file is cut short.")
                return
            if array and char == "]":
                return
            number += 1
            yield reader.value(number)


class _Reader:
    """A window onto a file's decoded text, refilled as values are decoded from it."""

    def __init__(self, file: IO[bytes], path: Path) -> None:
        self.file, self.path = file, path
        self.text, self.pos, self.eof = "", 0, False
        self._decoder = codecs.getincrementaldecoder("utf-8-sig")()
        self._json = json.JSONDecoder()

    def fill(self) -> bool:
        """Read more (at least as much as is pending, so a big value decodes in linear time)."""
        if self.eof:
            return False
        pending = len(self.text) - self.pos
        data = self.file.read(max(_READ_BYTES, pending))
        try:
            more = self._decoder.decode(data, final=not data)
        except UnicodeDecodeError:
            raise DataError(f"{self.path} is not UTF-8 text.") from None
        self.eof = not data
        self.text = self.text[self.pos :] + more
        self.pos = 0
        return True

    def skip_space(self) -> str | None:
        """The next non-space character (not consumed), or None at the end of the file."""
        while True:
            match = _SPACE.match(self.text, self.pos)
            self.pos = match.end()
            if self.pos < len(self.text):
                return self.text[self.pos]
            if not self.fill():
                return None

    def value(self, number: int) -> Any:
        while True:
            try:
                value, self.pos = self._json.raw_decode(self.text, self.pos)
                return value
            except json.JSONDecodeError as exc:
                if len(self.text) - self.pos > MAX_CASE_BYTES:
                    raise DataError(
                        f"{self.path}: case {number} is not valid JSON or is larger than "
                        f"{MAX_CASE_BYTES >> 20} MB ({exc.msg})."
                    ) from None
                if not self.fill():
                    raise DataError(
                        f"{self.path}: case {number} is not valid JSON ({exc.msg})."
                    ) from None
            except (ValueError, RecursionError):
                # Nesting too deep for the parser, or an integer past Python's 4,300 digits:
                # more of the file cannot make it valid, so no refill.
                raise DataError(
                    f"{self.path}: case {number} is nested too deep or holds a number too long "
                    "to read as JSON."
                ) from None


_SPACE = re.compile(r"\s*")


def _natural(path: Path) -> list[Any]:
    """Sort key: numbers in names compare as numbers (eval_50 < eval_100)."""
    return [int(part) if part.isdigit() else part.lower() for part in re.split(r"(\d+)", path.name)]


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", bool: "true/false", type(None): "null"}
    return names.get(type(value), "a number")
