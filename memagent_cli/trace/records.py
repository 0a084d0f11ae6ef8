"""The records of a trace file, typed both ways: a finished `Step` becomes a `StepRecord`
and a record becomes a `Step` again. Every record read is checked field by field.

Steps are numbered as people count them, from 1, in every record and view (format 2: a
step record's "step", the evidence's "step"). Format 1 counted from 0 (a step record's
"index", the evidence's "step"); such traces are still read, and resumed in their format.
In Python a step record keeps `index`, counting from 0 as `Chunk.index` does.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from memagent_cli import readers
from memagent_cli.backend import Generation
from memagent_cli.chunking import Chunk
from memagent_cli.errors import UserError
from memagent_cli.progress import SpanOf
from memagent_cli.provenance import PlaceOf, Source, place_of_label, sources
from memagent_cli.reader import Answer, Step, evidence
from memagent_cli.readers.spec import StepField
from memagent_cli.text import json_number

FORMAT_VERSION = 2
FORMATS = (1, 2)  # the formats this memagent reads


class TraceError(UserError):
    """A file that cannot be read as a trace, or written as one."""


# Field checks: a type, a tuple of types, or "pair" (two integers, a token or character range).
_Check = type | tuple[type, ...] | str
_NUMBER = (int, float)
_SCALARS = (str, int, float, bool, type(None))
_SHA256 = re.compile(r"[0-9a-f]{64}")


# No count, offset or duration memagent writes comes near this; past it a float loses whole
# numbers, and past 1e308 an int cannot become one (a view dividing it fails).
def _in_range(value: Any, *, signed: bool = False) -> bool:
    """Whether a number is one a trace can hold (text.json_number); anything that is not a
    number is in range (its type is checked apart)."""
    if isinstance(value, bool) or not isinstance(value, _NUMBER):
        return True
    return json_number(value, signed=signed)


def _valid(value: Any, check: _Check) -> bool:
    if check == "pair":
        return (
            isinstance(value, list)
            and len(value) == 2
            and all(type(v) is int for v in value)  # range: _in_range (bool is no int here)
        )
    assert not isinstance(check, str)
    if isinstance(value, bool) and check in (int, _NUMBER):
        return False
    return isinstance(value, check)


def _fields(
    record: dict[str, Any], checks: dict[str, _Check], where: str, optional: frozenset = frozenset()
) -> dict[str, Any]:
    """The checked fields of `record`; TraceError naming the first missing or mistyped one."""
    out = {}
    for name, check in checks.items():
        if name not in record:
            if name in optional:
                continue
            raise TraceError(f"{where} has no {name!r} field.")
        if not _valid(record[name], check):
            raise TraceError(f"{where} has a {name!r} field of the wrong type.")
        value = record[name]
        if not all(map(_in_range, value if check == "pair" else [value])):
            raise TraceError(f"{where} has a {name!r} field out of range.")
        out[name] = tuple(value) if check == "pair" else value
    return out


def _hashes(value: Any) -> bool:
    """Whether `value` is what a header's templates_sha256 holds: each template's name and
    its sha256 in hex (protocol.templates_sha256)."""
    return (
        isinstance(value, dict)
        and 0 < len(value) <= 16
        and all(
            isinstance(name, str) and isinstance(digest, str) and _SHA256.fullmatch(digest)
            for name, digest in value.items()
        )
    )


# What a record keeps of a call's cost (backend.Generation): a step's, a kept reply's.
_COST: dict[str, _Check] = {
    "prompt_tokens": int,
    "completion_tokens": int,
    "finish_reason": str,
    "prompt_seconds": _NUMBER,
    "seconds": _NUMBER,
    "drafted": int,
    "accepted": int,
}


def _generation(text: str, cost: StepRecord | Reply) -> Generation:
    """The call again, of `text`, as a record keeps its cost (_COST)."""
    return Generation(
        text,
        cost.prompt_tokens,
        cost.completion_tokens,
        cost.prompt_seconds,
        cost.seconds,
        cost.finish_reason,
        drafted=cost.drafted,
        accepted=cost.accepted,
    )


@dataclass(frozen=True)
class Header:
    """What was asked of which document, model and settings: the identity of a run."""

    question: str
    document: dict[str, Any]  # path, sha256, format, characters, tokens, chunks, ...
    model: dict[str, Any]  # path, name, size: the weights
    settings: dict[str, Any]  # chunk and memory tokens, sampling, context, engine
    templates_sha256: dict[str, str]  # "update" and "final": catches prompt drift
    created: str
    memagent: str
    format: int = FORMAT_VERSION

    _DOCUMENT = {"path": str, "sha256": str, "format": str, "tokens": int, "chunks": int}
    _MODEL = {"path": str, "name": str, "size": (int, type(None))}

    @classmethod
    def parse(cls, record: dict[str, Any], where: str, version: int = FORMAT_VERSION) -> Header:
        version = record.get("format")  # type: ignore[assignment]  # the header says its own
        if type(version) is not int or version not in FORMATS:  # not True, which == 1
            which = f"of format {version}" if type(version) is int else "without a format number"
            raise TraceError(
                f"{where} is a trace {which}; this memagent reads formats "
                f"{' and '.join(map(str, FORMATS))}."
            )
        checks: dict[str, _Check] = {
            "question": str,
            "document": dict,
            "model": dict,
            "settings": dict,
            "templates_sha256": dict,
            "created": str,
            "memagent": str,
        }
        if "templates_sha256" in record and not _hashes(record["templates_sha256"]):
            raise TraceError(
                f"{where} has a 'templates_sha256' field that is not the sha256 of each prompt "
                'template ({"update": "<64 hex digits>", "final": ...}).'
            )
        values = _fields(record, checks, where)
        values["format"] = version
        _fields(values["document"], cls._DOCUMENT, f"{where}'s document")
        _fields(values["model"], cls._MODEL, f"{where}'s model")
        for key, value in values["settings"].items():
            if not isinstance(value, _SCALARS) or not _in_range(value, signed=True):
                raise TraceError(f"{where} has a setting {key!r} that is not a plain value.")
        for part in ("document", "model"):
            for key, value in values[part].items():
                if not _in_range(value, signed=True):
                    raise TraceError(f"{where} has a {part} {key!r} out of range.")
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        record = asdict(self)
        return {"type": "header", "format": record.pop("format"), **record}

    @property
    def total_steps(self) -> int:
        return int(self.document["chunks"])


@dataclass(frozen=True)
class StepRecord:
    """One finished memory update: where its chunk was and the memory it left."""

    index: int  # counts from 0; people count steps from 1
    tokens: tuple[int, int]
    chars: tuple[int, int]
    span: str
    chunk_sha256: str
    memory: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    prompt_seconds: float
    seconds: float
    drafted: int = 0  # tokens proposed by speculation, and how many the model kept
    accepted: int = 0
    # The chunk it read (from 0), where that is not the step's own: a reader that skips
    # chunks or reads one again. Records of the others leave it out.
    chunk: int | None = None
    # What the reader's steps carry besides (Spec.fields: Step.extra), each a key of its
    # own in the file; kept to resume, shown by `trace`.
    extra: Mapping[str, Any] = field(default_factory=dict)
    # Units a search found that the update was shown (Step.found): their tokens, their
    # characters and their pages or chapters, as `span` is the chunk's.
    found: tuple[tuple[int, int], ...] = ()
    found_chars: tuple[tuple[int, int], ...] = ()
    found_spans: tuple[str, ...] = ()

    _CHECKS = {
        "step": int,
        "chunk": int,
        "tokens": "pair",
        "chars": "pair",
        "span": str,
        "chunk_sha256": str,
        "memory": str,
        **_COST,
        "found": list,
        "found_chars": list,
        "found_spans": list,
    }
    _UNITS = ("found", "found_chars", "found_spans")

    @classmethod
    def parse(
        cls,
        record: dict[str, Any],
        where: str,
        version: int = FORMAT_VERSION,
        fields: Sequence[StepField] = (),
    ) -> StepRecord:
        """The step `record` holds, with what `fields` (its reader's, Spec.fields) say its
        steps carry besides; other keys are not read."""
        optional = frozenset({"drafted", "accepted", "chunk", *cls._UNITS})
        if version == 1:  # counted from 0, as "index"
            record = {("step" if k == "index" else k): v for k, v in record.items() if k != "step"}
            if _valid(record.get("step"), int):
                record["step"] += 1
        values = _fields(record, cls._CHECKS, where, optional)
        number = values.pop("step")
        if number < 1:
            raise TraceError(f"{where} has a step number below 1.")
        if values.get("chunk", 0) < 0:
            raise TraceError(f"{where} has a chunk number below 0.")
        for name in ("found", "found_chars"):
            if not all(_valid(pair, "pair") for pair in values.get(name, [])):
                raise TraceError(f"{where} has a unit found that is not a range.")
            values[name] = tuple(tuple(pair) for pair in values.get(name, []))
        if not all(isinstance(span, str) for span in values.get("found_spans", [])):
            raise TraceError(f"{where} has a unit found whose place is not text.")
        values["found_spans"] = tuple(values.get("found_spans", []))
        extra = {}
        for step_field in fields:
            if step_field.name not in record:
                continue
            value = step_field.parse(record[step_field.name])
            if value is None:
                raise TraceError(f"{where} has a {step_field.name!r} field of the wrong type.")
            if not _in_range(value):
                raise TraceError(f"{where} has a {step_field.name!r} field out of range.")
            extra[step_field.name] = value
        return cls(index=number - 1, extra=extra, **values)

    @classmethod
    def of(
        cls, step: Step, span: str, span_of: SpanOf | None = None, number: int | None = None
    ) -> StepRecord:
        """The record of `step`, the `number`th of its reading (from 0; by default its
        chunk's), whose chunk `span` labels; `span_of` labels the units it was shown
        (readers/infmem.py), when there are any."""
        chunk, gen = step.chunk, step.generation
        spans = tuple(span_of(*chars) for chars in step.found_chars) if span_of else ()
        index = chunk.index if number is None else number
        return cls(
            index=index,
            chunk=None if chunk.index == index else chunk.index,
            tokens=(chunk.token_start, chunk.token_end),
            chars=(chunk.char_start, chunk.char_end),
            span=span,
            chunk_sha256=chunk_sha256(chunk),
            memory=step.memory,
            prompt_tokens=gen.prompt_tokens,
            completion_tokens=gen.completion_tokens,
            finish_reason=gen.finish_reason,
            prompt_seconds=round(gen.prompt_seconds, 3),
            seconds=round(gen.seconds, 3),
            drafted=gen.drafted,
            accepted=gen.accepted,
            extra=dict(step.extra),
            found=step.found,
            found_chars=step.found_chars,
            found_spans=spans,
        )

    @property
    def chunk_index(self) -> int:
        """The index of the chunk it read."""
        return self.index if self.chunk is None else self.chunk

    def to_step(self, chunk: Chunk) -> Step:
        """The step again, for the chunk it read (the caller checks `chunk_sha256`)."""
        return Step(
            chunk,
            self.memory,
            _generation(self.memory, self),
            dict(self.extra),
            found=self.found,
            found_chars=self.found_chars,
        )

    def to_json(self, version: int = FORMAT_VERSION) -> dict[str, Any]:
        number = {"index": self.index} if version == 1 else {"step": self.index + 1}
        record: dict[str, Any] = {
            "type": "step",
            **number,
            "tokens": list(self.tokens),
            "chars": list(self.chars),
            "span": self.span,
            "chunk_sha256": self.chunk_sha256,
            "memory": self.memory,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "finish_reason": self.finish_reason,
            "prompt_seconds": self.prompt_seconds,
            "seconds": self.seconds,
            "drafted": self.drafted,
            "accepted": self.accepted,
        }
        # What only some readers' steps have: MemAgent's records stay as they always were.
        # A value a step's extra holds is a string, a number or pairs of strings (StepField).
        for name, value in self.extra.items():
            record[name] = [list(v) for v in value] if isinstance(value, tuple) else value
        for name in self._UNITS:
            if units := getattr(self, name):
                record[name] = [list(x) if isinstance(x, tuple) else x for x in units]
        if self.chunk is not None:
            record["chunk"] = self.chunk
        return record


@dataclass(frozen=True)
class FinalRecord:
    """The answer, the reply it was cut from, and where the answer came from."""

    reply: str
    answer: str | None  # the last \boxed{} content; None when the reply has none
    # The steps the answer's words came from (provenance.py); [] when the final memory does
    # not hold the answer's words; None when there is no boxed answer and the reply has no
    # words to trace. Each is {"step" (from 1), "words", "tokens", "chars", and "pages" or
    # "chapters" where the document has them} in the file (`source_json`).
    evidence: list[Source] | None
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    seconds: float
    prompt_seconds: float = 0.0
    stopped: str | None = None  # why the reader answered before the last chunk, if it did

    _CHECKS = {
        "reply": str,
        "answer": (str, type(None)),
        "evidence": (list, dict, type(None)),
        "prompt_tokens": int,
        "completion_tokens": int,
        "finish_reason": str,
        "seconds": _NUMBER,
        "prompt_seconds": _NUMBER,
        "stopped": str,
    }
    _SOURCE = {
        "step": int,
        "words": list,
        "tokens": "pair",
        "chars": "pair",
        "pages": str,
        "chapters": str,
        "retrieved": bool,
    }
    # What traces of memagent 0.1 recorded: the one step (from 0) where the answer's text
    # first appeared in the memory, with its span label.
    _OLD_EVIDENCE = {"step": int, "span": str, "tokens": "pair", "chars": "pair"}

    @classmethod
    def parse(
        cls, record: dict[str, Any], where: str, version: int = FORMAT_VERSION
    ) -> FinalRecord:
        values = _fields(record, cls._CHECKS, where, frozenset({"prompt_seconds", "stopped"}))
        found = values["evidence"]
        if isinstance(found, dict):
            old = _fields(found, cls._OLD_EVIDENCE, f"{where}'s evidence")
            where = place_of_label(old["span"])
            values["evidence"] = [
                Source(
                    old["step"] + 1, (), old["tokens"], old["chars"], where.pages, where.chapters
                )
            ]
        elif found is None:  # 0.1 recorded None when the answer's text was in no memory
            values["evidence"] = None if values["answer"] is None else []
        else:
            values["evidence"] = [_parse_source(item, where) for item in found]
        return cls(**values)

    @classmethod
    def of(cls, answer: Answer, place_of: PlaceOf, reader: str = readers.DEFAULT) -> FinalRecord:
        final = answer.final
        return cls(
            reply=answer.reply,
            answer=answer.answer,
            evidence=evidence_of(answer, place_of, reader),
            prompt_tokens=final.prompt_tokens,
            completion_tokens=final.completion_tokens,
            finish_reason=final.finish_reason,
            seconds=round(final.seconds, 3),
            prompt_seconds=round(final.prompt_seconds, 3),
            stopped=answer.stopped,
        )

    def generation(self) -> Generation:
        return Generation(
            self.reply,
            self.prompt_tokens,
            self.completion_tokens,
            self.prompt_seconds,
            self.seconds,
            self.finish_reason,
        )

    def to_json(self, version: int = FORMAT_VERSION) -> dict[str, Any]:
        # The evidence list counts steps from 1 in either format: format 1 knew only a
        # single dict (counted from 0), which the reader tells apart by its shape.
        record = asdict(self)
        if record["stopped"] is None:  # a reading of every chunk: as records always were
            del record["stopped"]
        record["evidence"] = evidence_json(self.evidence)
        return {"type": "final", **record}


@dataclass(frozen=True)
class Reply:
    """A reply that came before a run stopped, to a prompt asked with others at once (a
    PI-Mem pass's chunk), that no finished step holds yet: a resumed run takes it for that
    prompt (named by scheduler.prompt_sha256) instead of asking again."""

    prompt_sha256: str
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    prompt_seconds: float
    seconds: float
    drafted: int = 0
    accepted: int = 0

    _CHECKS = {
        "prompt_sha256": str,
        "text": str,
        **_COST,
    }

    @classmethod
    def parse(cls, record: Any, where: str) -> Reply:
        if not isinstance(record, dict):
            raise TraceError(f"{where} has a reply that is not an object.")
        values = _fields(record, cls._CHECKS, where, frozenset({"drafted", "accepted"}))
        if not _SHA256.fullmatch(values["prompt_sha256"]):
            raise TraceError(f"{where} has a reply whose prompt_sha256 is not a sha256.")
        return cls(**values)

    @classmethod
    def of(cls, prompt_sha256: str, reply: Generation) -> Reply:
        return cls(
            prompt_sha256,
            reply.text,
            reply.prompt_tokens,
            reply.completion_tokens,
            reply.finish_reason,
            reply.prompt_seconds,
            reply.seconds,
            reply.drafted,
            reply.accepted,
        )

    def generation(self) -> Generation:
        return _generation(self.text, self)


@dataclass(frozen=True)
class Interruption:
    """Where a run stopped before its answer, and why; with the replies that came before
    it that no finished step holds (Reply), where there were any."""

    reason: str
    steps_done: int
    replies: tuple[Reply, ...] = ()

    @classmethod
    def parse(
        cls, record: dict[str, Any], where: str, version: int = FORMAT_VERSION
    ) -> Interruption:
        checks: dict[str, _Check] = {"reason": str, "steps_done": int, "replies": list}
        values = _fields(record, checks, where, frozenset({"replies"}))
        replies = values.get("replies", [])
        values["replies"] = tuple(Reply.parse(r, f"{where}'s replies") for r in replies)
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        record = {"type": "interrupted", "reason": self.reason, "steps_done": self.steps_done}
        if self.replies:  # a run stopped between steps: as records always were
            record["replies"] = [asdict(reply) for reply in self.replies]
        return record


@dataclass(frozen=True)
class Resumed:
    """A later `ask --resume` going on after `steps_done` steps."""

    steps_done: int
    at: str

    @classmethod
    def parse(cls, record: dict[str, Any], where: str, version: int = FORMAT_VERSION) -> Resumed:
        return cls(**_fields(record, {"steps_done": int, "at": str}, where))

    def to_json(self) -> dict[str, Any]:
        return {"type": "resumed", **asdict(self)}


@dataclass(frozen=True)
class Skipped:
    """A line that is not a record: cut short by a crash, or not JSON at all."""

    line: int
    why: str


Record = Header | StepRecord | FinalRecord | Interruption | Resumed
KINDS: dict[str, Any] = {
    "header": Header,
    "step": StepRecord,
    "final": FinalRecord,
    "interrupted": Interruption,
    "resumed": Resumed,
}


def chunk_sha256(chunk: Chunk) -> str:
    return hashlib.sha256(chunk.text.encode()).hexdigest()


def evidence_of(
    answer: Answer, place_of: PlaceOf, reader: str = readers.DEFAULT
) -> list[Source] | None:
    """The steps the answer came from, placed in the document (provenance.sources;
    `place_of`: the document's pages or chapters, `Document.place`), as `reader`'s steps
    hold the memory (Spec.held); [] when the final memory does not hold the answer's
    words, None when a reply without a boxed answer has no words to trace."""
    held = readers.get(reader).held
    found = evidence(answer, None if held is None else held(answer.steps))
    if found is None:  # no words to trace; a boxed answer still gets its (empty) list
        return None if answer.answer is None else []
    shown = [tuple(zip(step.found, step.found_chars, strict=False)) for step in answer.steps]
    return sources(found, [step.chunk for step in answer.steps], place_of, shown)


def evidence_json(found: list[Source] | None) -> list[dict[str, Any]] | None:
    """Evidence as a trace's final record and `--json` write it."""
    return None if found is None else [source_json(source) for source in found]


def source_json(source: Source) -> dict[str, Any]:
    """One evidence entry: "pages" or "chapters" only where the document has them."""
    entry: dict[str, Any] = {
        "step": source.step,
        "words": list(source.words),
        "tokens": list(source.tokens),
        "chars": list(source.chars),
    }
    if source.pages is not None:
        entry["pages"] = source.pages
    if source.chapters is not None:
        entry["chapters"] = source.chapters
    if source.retrieved:  # a unit a search found (provenance.py, rule 7)
        entry["retrieved"] = True
    return entry


def _parse_source(item: Any, where: str) -> Source:
    """One evidence entry of the final record at `where`, checked field by field."""
    if not isinstance(item, dict):
        raise TraceError(f"{where} has an evidence entry that is not an object.")
    optional = frozenset({"words", "pages", "chapters", "retrieved"})
    checked = _fields(item, FinalRecord._SOURCE, f"{where}'s evidence", optional)
    words = checked.get("words", [])
    if not all(isinstance(w, str) for w in words):
        raise TraceError(f"{where}'s evidence has a word that is not text.")
    return Source(
        step=checked["step"],
        words=tuple(words),
        tokens=checked["tokens"],
        chars=checked["chars"],
        pages=checked.get("pages"),
        chapters=checked.get("chapters"),
        retrieved=checked.get("retrieved", False),
    )
