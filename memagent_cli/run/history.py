"""What this model's past readings on this machine say about the next one: how long its
replies run, and what decoding them cost against one token per decode. An estimate
(run/inspect.py) prices a reading's calls at the rates measured now; these are what the
rates cannot know, and the traces every `ask` writes hold them.

Measured on the default model (bench/results/2026-11-27-xeon-amx/estimate-smollm2-summary.txt):
the rates priced the reading's own calls within 11%, while its memories ran to 533 and 884
of the 1,024 tokens allowed, its answer to 10, and drafts decoded a reply at about half the
price of single decodes. Those are properties of the model, not of one document."""

from __future__ import annotations

import io
import json
import math
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from memagent_cli import readers
from memagent_cli.backends.drafting import MAX_DRAFT
from memagent_cli.backends.speed import Speed
from memagent_cli.files import open_regular
from memagent_cli.trace.file import Trace, read_records, start
from memagent_cli.trace.folder import default_dir, recent_traces
from memagent_cli.trace.records import Header, TraceError

# Bounds on what one estimate reads, whatever the traces hold: the newest READINGS traces of
# this model, among the newest LOOKED_AT files of the folder; of each the header (at most
# HEADER_BYTES) and its last TAIL_BYTES, and only of one whose header is this model's on
# this machine and whose last record is an answer, the rest; none over MAX_BYTES (a reading
# of 3.5M tokens writes a few MB) or MAX_RECORDS lines, blank ones too; TOTAL_BYTES in all.
# Parsing a trace's records takes about 0.45 s a MB: a folder of thousands of traces, or
# hundreds of huge or endless ones, costs an estimate a few seconds at most.
READINGS = 20
LOOKED_AT = 200
MAX_BYTES = 8 << 20
MAX_RECORDS = 20_000
HEADER_BYTES = 1 << 20
TAIL_BYTES = 256 << 10
TOTAL_BYTES = 8 << 20
# Replies shorter than this say more about a call's fixed costs than about decoding.
MIN_DECODED = 16
# What a machine can do: drafts emit at most MAX_DRAFT + 1 tokens a round that costs at
# least a decode, and a round costs at most a decode a row (backends/calibration.py), so a
# reply decodes at MIN_FACTOR to MAX_FACTOR times the price of one token a decode. Beyond
# that a trace was damaged, or written to mislead (a call of 1e16 times the price).
MIN_FACTOR = 1 / (MAX_DRAFT + 1)
MAX_FACTOR = float(MAX_DRAFT + 1)
# What the engine records of how llama.cpp ran (backends/llama_cpp.py describe()): a past
# call's seconds compare with the rates measured now only where these are the same, and
# `machine` names this machine as a calibration's key does (its CPU, GPUs, driver and
# llama.cpp: backends/calibration_store.py), so a shared home's other machines teach none.
ENGINE_KEYS = (
    "backend",
    "threads",
    "gpu_layers",
    "speculate",
    "exact",
    "flash_attn",
    "cache_type_k",
    "cache_type_v",
    "machine",
)


@dataclass(frozen=True)
class PastCall:
    """One call of a past reading as its trace recorded it."""

    final: bool  # the answer; else a memory update
    fraction: float  # of the reply the protocol allowed it
    prompt_tokens: int
    completion_tokens: int
    decode_seconds: float  # the whole call less its prompt and first token
    stages: int = 1  # generations the record joins (InfMem: 4 a step, 2 the answer)

    def decode_price(self, speed: Speed) -> float:
        """What `speed` gives for its reply decoded one token a time after its prompt, each
        stage (the mean of them) with its first token coming with its prompt."""
        tokens, depth = self.completion_tokens / self.stages, self.prompt_tokens / self.stages
        return self.stages * speed.decode_seconds(max(round(tokens) - 1, 0), round(depth) + 1)


@dataclass(frozen=True)
class History:
    """The calls of past readings of one model with one reader on this machine."""

    readings: int = 0
    calls: tuple[PastCall, ...] = ()

    def written(self) -> float | None:
        """How long a memory update's reply runs: the median fraction of the allowed."""
        return _median([c.fraction for c in self.calls if not c.final])

    def answered(self) -> float | None:
        """How long the answer runs: the median fraction of the allowed."""
        return _median([c.fraction for c in self.calls if c.final])

    def decode_factor(self, speed: Speed) -> float | None:
        """What decoding a reply cost against one token per decode at `speed`'s rates: the
        median over past calls of their decoding seconds over that price. Below 1 where
        drafts copied the document or the memory; above where they cost more than they
        saved, or the machine was busier then than now. Calls whose factor no machine
        gives (MIN_FACTOR, MAX_FACTOR) are left out (ignored() counts them)."""
        factors = self._factors(speed)
        return _median([f for f in factors if MIN_FACTOR <= f <= MAX_FACTOR])

    def ignored(self, speed: Speed) -> int:
        """The calls decode_factor() leaves out: values outside what a machine can do."""
        return sum(not MIN_FACTOR <= f <= MAX_FACTOR for f in self._factors(speed))

    def _factors(self, speed: Speed) -> list[float]:
        factors = []
        for call in self.calls:
            price = call.decode_price(speed)
            if call.completion_tokens - call.stages >= MIN_DECODED and price > 0:
                factor = call.decode_seconds / price
                factors.append(factor if math.isfinite(factor) else math.inf)
        return factors


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def past_readings(
    model: dict[str, Any],
    engine: dict[str, Any],
    reader: str = readers.DEFAULT,
    folder: Path | None = None,
) -> History:
    """The finished readings with `reader` of the model file `model` (a Description's
    model: its path and size) run by llama.cpp in this process on this machine as `engine`
    says (a Description's engine), newest first, from the traces in `folder` (default: the
    data folder's), within the bounds above. Traces that are damaged, unfinished, too large
    or of another model, reader, engine, machine or server are passed over."""
    if engine.get("backend") != "llama":
        return History()
    readings, calls, budget = 0, [], TOTAL_BYTES
    for path in recent_traces(folder or default_dir())[:LOOKED_AT]:
        if readings >= READINGS or budget <= 0:
            break
        trace, spent = _read(path, lambda header: _same(header, model, engine, reader), budget)
        budget -= spent
        if trace is None:
            continue
        found = _calls(trace, reader)
        if found:
            readings += 1
            calls += found
    return History(readings, tuple(calls))


def _read(path: Path, wanted: Callable[[Header], bool], budget: int) -> tuple[Trace | None, int]:
    """The trace at `path` when its header is `wanted` and it is whole: finished, every line
    a record, within bounds (at most `budget` bytes read whole); and the bytes read whole. Of
    another run only the header is read; of an unfinished one the header and its end."""
    try:
        with open_regular(path, "trace", limit=MAX_BYTES, error=TraceError) as file:
            size = os.fstat(file.fileno()).st_size
            head = file.readline(HEADER_BYTES)
            if not head.endswith(b"\n"):
                return None, 0
            trace = start(path, next(read_records(io.BytesIO(head), str(path)), None))
            if not wanted(trace.header) or size > budget or not _answered(file, size):
                return None, 0
            file.seek(len(head))
            rest = file.read(min(size, budget) - len(head) + 1)
    except (TraceError, OSError):
        return None, 0
    spent = len(head) + len(rest)
    if spent > min(size, budget) or rest.count(b"\n") >= MAX_RECORDS:
        return None, spent  # grown since (a run writing it), or more lines than records
    items = read_records(io.BytesIO(head + rest), str(path))  # the header says the format
    next(items)
    for item in items:
        if item is not None:
            trace.add(item)
    return (trace if trace.finished and not trace.problems else None), spent


def _answered(file: BinaryIO, size: int) -> bool:
    """Whether the last line of the trace open in `file` (of `size` bytes) is an answer's
    record: a reading that has none is unfinished, and reading it whole would teach nothing."""
    file.seek(max(size - TAIL_BYTES, 0))
    tail = file.read(TAIL_BYTES).rstrip(b"\n")
    if b"\n" not in tail:
        return False  # the header's line, or a last line longer than TAIL_BYTES
    try:
        record = json.loads(tail.rpartition(b"\n")[2])
    except (ValueError, RecursionError):
        return False
    return isinstance(record, dict) and record.get("type") == "final"


def _same(header: Header, model: dict[str, Any], engine: dict[str, Any], reader: str) -> bool:
    """Whether `header` names a reading of this model file, by this reader, run as now."""
    settings = header.settings
    return (
        header.model.get("path") == model.get("path")
        and header.model.get("size") == model.get("size")
        and readers.named_in(settings) == reader
        and all(settings.get(key) == engine.get(key) for key in ENGINE_KEYS)
    )


def _calls(trace: Trace, reader: str) -> list[PastCall]:
    """Every call of a finished reading, as far as its records tell them apart."""
    memory = trace.header.settings.get("memory_tokens")
    if not isinstance(memory, int) or isinstance(memory, bool) or memory < 1:
        return []
    spec = readers.get(reader)
    limits = spec.replies(memory)
    update, answer = limits.update, limits.answer
    # What one record joins (readers/infmem.py _joined): a step's calls and their stages;
    # the answer is one call.
    step_calls, stages = spec.step_calls, spec.stages
    found = [
        _call(False, s.completion_tokens, update * step_calls, s, step_calls * stages)
        for s in trace.steps
    ]
    final = trace.final
    assert final is not None
    return [*found, _call(True, final.completion_tokens, answer, final, stages)]


def _call(final: bool, tokens: int, allowed: int, record: Any, stages: int) -> PastCall:
    return PastCall(
        final=final,
        fraction=min(tokens / allowed, 1.0),
        prompt_tokens=record.prompt_tokens,
        completion_tokens=tokens,
        decode_seconds=max(record.seconds - record.prompt_seconds, 0.0),
        stages=stages,
    )
