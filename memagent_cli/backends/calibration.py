"""What decoding may rely on, measured once per model and machine: which round sizes keep
every row's logits bit for bit, and what a round of W rows costs in single decodes.

`--exact` promises that drafts and questions read together change no token. That holds only
where llama.cpp computes a row the same whatever the round around it, which depends on the
model's shapes and types, the build, the CPU or GPU and the engine's settings (rounds of 8+
rows differ with a hidden size of 256, every size with F16 or F32 weights, 9+ on CUDA:
docs/performance.md). So at a model's first use memagent decodes a few positions both ways in
a small context of its own and keeps the result in the data folder, keyed by everything that
picks llama.cpp's kernels. The draft policy then uses only the round sizes proved equal, and
prices a batch row from the costs measured here (backends/drafting.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import math
import os
import platform
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memagent_cli.backends.drafting import MAX_DRAFT
from memagent_cli.files import private_folder
from memagent_cli.folders import data_dir

VERSION = 1
MOST = MAX_DRAFT + 1  # the largest round of one sequence: its pending token and a full draft
# Every round size is checked where a round crosses the KV cache's 256-cell padding;
# sequences together in a shallow cache, at the smallest and largest size.
DEPTHS = (250,)
TOGETHER_DEPTH = 40
# Several sequences in one round: those counts, at those sizes, with and without logits on
# every row (a sequence without a draft has one logits row and throwaway ones).
TOGETHER = (2, 4)
TOGETHER_WIDTHS = (2, MOST)
CONTENTS = 2  # sequences together hold this many texts, in turns
TIMING_REPEATS = 3  # 1-row decodes timed at each depth
MAX_FILE_BYTES = 64 << 10  # a calibration is under 2 KB: anything far larger is not one
# Readings go together only where a round of them costs under 1/MARGIN of their rounds apart:
# costs are timings on a machine that may be busy (a few percent either way), and a batch
# saves on decoding only, while prefills, most of a step on a CPU, gain nothing and were
# measured slower at once (docs/performance.md, Several documents at once).
MARGIN = 1.1


@dataclass(frozen=True)
class Calibration:
    """One model on one machine and engine settings: what was measured, and when."""

    key: Mapping[str, Any]
    widths: tuple[int, ...]  # rows of one sequence's round equal to 2-row rounds, bit for bit
    together: int  # most sequences proved to share a round exactly (1: none)
    costs: Mapping[int, float]  # rows -> a round's seconds over a 1-row decode's
    seconds: float = 0.0  # how long measuring took
    measured: str = ""  # when, UTC
    assumed: bool = False  # not measured: the negative control's claim

    def price(self, rows: int, sequences: int = 1, min_rows: int = 1) -> float:
        """A round of `rows` per sequence over one of `min_rows`, for `sequences` of them."""
        rows = max(rows, min_rows)
        return self._cost(rows * sequences) / self._cost(min_rows * sequences)

    def _cost(self, rows: int) -> float:
        if rows in self.costs:
            return self.costs[rows]
        most = max(self.costs)
        half = max(1, most // 2)
        marginal = (self.costs[most] - self.costs.get(half, 1.0)) / max(most - half, 1)
        return self.costs[most] + max(marginal, 0.0) * (rows - most)

    def groups(self, sequences: int) -> list[int]:
        """`sequences` in flight cut into rounds of counts proved exact together, largest
        first (2 and 4 proved: 3 are read as 2 and 1)."""
        if self.assumed:
            return [sequences]
        counts = [c for c in TOGETHER if c <= self.together][::-1] + [1]
        sizes = []
        while sequences:
            size = next(c for c in counts if c <= sequences)
            sizes.append(size)
            sequences -= size
        return sizes

    def readings_at_once(
        self, most: int, min_rows: int = 1, max_rows: int = MOST, exact: bool = False
    ) -> int:
        """How many of `most` readings to read together: the count whose rounds cost least
        per sequence, 1 unless that is under 1/MARGIN of each read alone. A sequence's round
        holds from `min_rows` (its pending token; 2 with --exact) to `max_rows` rows (with a
        full draft), as its drafts go, and a round of several holds all their rows; so a
        count is priced at the worst of those sizes, and then pays whatever the drafts.
        With `exact` only counts proved together share a round (groups())."""
        best, best_price = 1, 1.0 / MARGIN
        for count in range(2, most + 1):
            price = max(
                self._per_sequence(count, rows, exact) for rows in range(min_rows, max_rows + 1)
            )
            if price < best_price:
                best, best_price = count, price
        return best

    def _per_sequence(self, count: int, rows: int, exact: bool) -> float:
        """A round of `count` sequences of `rows` each over `count` rounds of one."""
        groups = self.groups(count) if exact else [count]
        return sum(self._cost(g * rows) for g in groups) / (count * self._cost(rows))

    def summary(self) -> str:
        """One line: what `--exact` may use, and what a batch costs."""
        if self.assumed:
            return "assumed, not measured: every round size and sequence count (test switch)"
        exact = _ranges(self.widths) if self.widths else "none"
        together = "alone only" if self.together <= 1 else f"up to {self.together} at once"
        costs = ", ".join(f"{w} rows {self.costs[w]:.2f}" for w in (2, 4, 8, MOST) if w in self)
        return (
            f"exact rounds of {exact} rows; sequences {together}; a round costs "
            f"{costs} decodes (measured in {self.seconds:.1f} s)"
        )

    def __contains__(self, rows: object) -> bool:
        return rows in self.costs

    def to_json(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "key": dict(self.key),
            "widths": list(self.widths),
            "together": self.together,
            "costs": {str(w): round(c, 4) for w, c in sorted(self.costs.items())},
            "seconds": round(self.seconds, 3),
            "measured": self.measured,
            **({"assumed": True} if self.assumed else {}),
        }

    def record(self) -> str:
        """What a trace keeps of it, as one plain value (a header's settings are scalars):
        the round sizes, the sequences together, every cost, and when it was measured."""
        costs = ",".join(f"{w}:{c:.3f}" for w, c in sorted(self.costs.items()))
        exact = _ranges(self.widths) if self.widths else "none"
        when = "assumed" if self.assumed else self.measured
        return f"exact {exact}; together {self.together}; costs {costs}; measured {when}"


def assumed(key: Mapping[str, Any]) -> Calibration:
    """Every round size equal and any count of sequences together: what `--exact` assumed
    before it measured. The tests' negative control puts it in place of a measured one."""
    costs = {w: 1.0 + 0.6 * (w - 1) for w in range(1, MOST + 1)}
    return Calibration(key, tuple(range(2, MOST + 1)), 1 << 16, costs, assumed=True)


def unmeasured(key: Mapping[str, Any]) -> Calibration:
    """Where measuring failed: no round size proved (--exact reads without drafts), no
    sequences together, and the fixed price per row the default had before measuring."""
    costs = {w: 1.0 + 0.6 * (w - 1) for w in range(1, MOST + 1)}
    return Calibration(key, (), 1, costs)


class Damaged(ValueError):
    """A calibration file that is not one this version wrote: measure again."""


def parse(data: bytes) -> Calibration:
    """A calibration from its file; Damaged with the reason unless every field is sound."""
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise Damaged("it is not JSON") from exc
    if not isinstance(raw, dict):
        raise Damaged("it is not a JSON object")
    if raw.get("version") != VERSION:
        raise Damaged(f"it was written by another version ({raw.get('version')!r})")
    key, widths, together = raw.get("key"), raw.get("widths"), raw.get("together")
    costs, seconds = raw.get("costs"), raw.get("seconds", 0.0)
    if not isinstance(key, dict):
        raise Damaged("its key is not an object")
    if not isinstance(widths, list) or not all(_int(w) and 2 <= w <= MOST for w in widths):
        raise Damaged("its round sizes are not sizes")
    if not _int(together) or not 1 <= together <= max(TOGETHER):
        raise Damaged("its count of sequences is not one")
    if not isinstance(costs, dict) or len(costs) > MOST:
        raise Damaged("its costs are not a table")
    table: dict[int, float] = {}
    for rows, cost in costs.items():
        if not (isinstance(rows, str) and rows.isdigit() and 1 <= int(rows) <= MOST):
            raise Damaged("its costs are not by round size")
        if not (isinstance(cost, float | int) and not isinstance(cost, bool)):
            raise Damaged("its costs are not numbers")
        if not (math.isfinite(cost) and 0 < cost < 1e6):
            raise Damaged("its costs are not sound")
        table[int(rows)] = float(cost)
    if 1 not in table or MOST not in table:
        raise Damaged("its costs miss round sizes")
    if not isinstance(seconds, float | int) or isinstance(seconds, bool):
        raise Damaged("its time is not a number")
    measured = raw.get("measured", "")
    return Calibration(
        key,
        tuple(sorted(set(widths))),
        together,
        table,
        float(seconds),
        measured if isinstance(measured, str) else "",
    )


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _ranges(widths: Sequence[int]) -> str:
    """2, 3, 4, 7 -> "2-4, 7"."""
    parts, start = [], None
    for i, w in enumerate(widths):
        if start is None:
            start = w
        if i + 1 == len(widths) or widths[i + 1] != w + 1:
            parts.append(f"{start}" if start == w else f"{start}-{w}")
            start = None
    return ", ".join(parts)


def folder() -> Path:
    return data_dir() / "calibrations"


def path_for(key: Mapping[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return folder() / f"{digest}.json"


def load(key: Mapping[str, Any], note: Any = None) -> Calibration | None:
    """The calibration kept for `key`, or None (not measured, or a file that is not sound:
    `note` hears why, in one line)."""
    path = path_for(key)
    try:
        with path.open("rb") as file:
            if not os.path.isfile(path):
                raise Damaged("it is not a regular file")
            data = file.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise Damaged(f"it is over {MAX_FILE_BYTES:,} bytes")
        found = parse(data)
        if dict(found.key) != dict(key):
            raise Damaged("it is for another model or engine")
        return found
    except FileNotFoundError:
        return None
    except (OSError, Damaged) as exc:
        why = exc.args[0] if isinstance(exc, Damaged) else (exc.strerror or str(exc))
        if note is not None:
            note(f"the calibration {path} cannot be used ({why}): measuring again")
        return None


def store(calibration: Calibration) -> Path | None:
    """Write atomically and privately; None where the data folder cannot be written (the
    calibration still serves this run)."""
    path = path_for(calibration.key)
    temp = None
    try:
        private_folder(path.parent)
        handle, temp = tempfile.mkstemp(dir=path.parent, prefix=".calibration-", suffix=".json")
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            json.dump(calibration.to_json(), file, indent=1)
        os.replace(temp, path)
        temp = None
        return path
    except OSError:
        return None
    finally:
        if temp is not None:
            with contextlib.suppress(OSError):
                os.unlink(temp)


def kept_for(model: Path, most: int = 256) -> list[Calibration]:
    """The sound calibrations kept for the file `model` as it is now, on this machine (one
    per engine setting measured: threads, offload, flash attention, cache types)."""
    path = model.resolve()
    try:
        stat = path.stat()
        files = sorted(folder().glob("*.json"))[:most]
    except OSError:
        return []
    here = machine()
    found = []
    for file in files:
        try:
            if not file.is_file() or file.stat().st_size > MAX_FILE_BYTES:
                continue
            calibration = parse(file.read_bytes())
        except (OSError, Damaged):
            continue
        key = calibration.key
        if key.get("machine") == here and key.get("model") == {
            "path": str(path),
            "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns,
        }:
            found.append(calibration)
    return found


def settings(calibration: Calibration) -> str:
    """The engine settings it was measured with, in llama.cpp's flags."""
    key = calibration.key
    return (
        f"-t {key.get('threads')} -ngl {key.get('gpu_layers')} -fa {key.get('flash_attn')} "
        f"-ctk {key.get('cache_type_k')} -ctv {key.get('cache_type_v')}"
    )


def machine() -> str:
    """The CPU by name (a data folder on a network home is shared by several machines)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or platform.machine()


@dataclass
class Engine:
    """What measuring needs of a loaded model: llama.cpp's pointers and the real context's
    parameters (threads, flash attention, cache types, batch sizes)."""

    model: Any  # llama_model_p
    params: Any  # llama_context_params of the context the reading uses
    tokens: list[int]  # a text's tokens, longer than the deepest depth


def measure(engine: Engine, key: Mapping[str, Any]) -> Calibration:
    """Decode a few positions as exact decoding does without drafts (rounds of the token and
    a throwaway row), then the same positions in one round of W rows as a draft is verified,
    for every W, at each depth of DEPTHS, timing each round against 1-row decodes; then
    sequences together. A few seconds on a small model."""
    import llama_cpp

    began = time.perf_counter()
    need = max(*DEPTHS, TOGETHER_DEPTH) + MOST + 8
    if len(engine.tokens) < need + CONTENTS * 7:
        raise ValueError("the calibration text is too short")
    params = llama_cpp.llama_context_default_params()
    for name in ("n_threads", "n_threads_batch", "flash_attn_type", "type_k", "type_v"):
        setattr(params, name, getattr(engine.params, name))
    per_sequence = 256 * math.ceil((need + 1) / 256)
    params.n_ctx = per_sequence * max(TOGETHER)
    params.n_batch = params.n_ubatch = min(engine.params.n_ubatch, per_sequence)
    params.n_seq_max = max(TOGETHER)
    params.kv_unified = False  # as the reading's context (backends/llama_cpp.py)
    params.no_perf = True
    context = llama_cpp.llama_init_from_model(engine.model, params)
    if not context:
        raise RuntimeError("llama.cpp could not create the calibration's context")
    try:
        probe = _Probe(llama_cpp, context, engine.model, params.n_batch, engine.tokens)
        equal = set(range(2, MOST + 1))
        ratios: dict[int, list[float]] = {}
        for depth in DEPTHS:
            probe.prefill(0, 0, depth)
            single = probe.single(depth)
            reference = probe.reference(0, depth, MOST)
            for width in range(2, MOST + 1):
                got, _ = probe.round([(0, depth, width, width)])
                if got != [reference[:width]]:
                    equal.discard(width)
                # Timed once more: llama.cpp sets up a round of a new size the first time.
                _, seconds = probe.round([(0, depth, width, width)])
                ratios.setdefault(width, []).append(seconds / single)
            probe.forget(0)
        together = 1
        if equal == set(range(2, MOST + 1)):  # a row that changes with W alone: not together
            together = probe.together(TOGETHER_DEPTH)
    finally:
        llama_cpp.llama_free(context)
    return Calibration(
        key,
        tuple(sorted(equal)),
        together,
        # Rounded as the file keeps them: the one measured and the one read back are equal.
        {w: round(c, 4) for w, c in smoothed({w: min(r) for w, r in ratios.items()}).items()},
        round(time.perf_counter() - began, 3),
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )


def smoothed(ratios: Mapping[int, float]) -> dict[int, float]:
    """Costs from one timing per round size: each the median of it and its neighbours (a
    round slowed down by another process on the machine is one outlier), within what a
    round can cost (no less than a smaller round, no more than W single decodes)."""
    costs, last = {1: 1.0}, 1.0
    for width in range(2, MOST + 1):
        near = sorted(ratios[w] for w in (width - 1, width, width + 1) if w in ratios)
        median = near[len(near) // 2]
        last = costs[width] = min(max(last, median), float(width))
    return costs


class _Probe:
    """Rounds decoded in the calibration's context, their logits as bytes."""

    def __init__(self, lib: Any, context: Any, model: Any, n_batch: int, tokens: list[int]):
        from memagent_cli.backends.llama_parts import Batch

        self.lib, self.context, self.tokens = lib, context, tokens
        self.memory = lib.llama_get_memory(context)
        self.n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(model))
        self.n_batch = n_batch
        self.batch = Batch(n_batch, max(TOGETHER))
        self.seconds: dict[int, list[float]] = {}

    def forget(self, seq: int) -> None:
        self.lib.llama_memory_seq_rm(self.memory, seq, -1, -1)

    def prefill(self, seq: int, offset: int, depth: int) -> None:
        """The text from `offset` at positions 0..depth-1 of `seq`, in n_batch pieces."""
        self.forget(seq)
        for start in range(0, depth, self.n_batch):
            self.batch.clear()
            end = min(start + self.n_batch, depth)
            for pos in range(start, end):
                self.batch.add(self.tokens[offset + pos], pos, seq, pos == end - 1)
            self._decode()

    def _decode(self) -> float:
        began = time.perf_counter()
        self.batch.decode(self.context)
        return time.perf_counter() - began

    def _logits(self, row: int) -> bytes:
        pointer = self.lib.llama_get_logits_ith(self.context, row)
        return ctypes.string_at(pointer, 4 * self.n_vocab)

    def reference(self, seq: int, depth: int, count: int, offset: int = 0) -> list[bytes]:
        """Positions depth.. one round each, as exact decoding without drafts: the token
        with logits and a throwaway row, cut after; each round's logits."""
        got = []
        for i in range(count):
            pos = depth + i
            token = self.tokens[offset + pos]
            self.batch.clear()
            self.batch.add(token, pos, seq, True)
            self.batch.add(token, pos + 1, seq, False)
            self._decode()
            got.append(self._logits(0))
            self.lib.llama_memory_seq_rm(self.memory, seq, pos + 1, -1)
        self.lib.llama_memory_seq_rm(self.memory, seq, depth, -1)
        return got

    def round(
        self, shapes: Sequence[tuple[int, int, int, int]], offsets: Sequence[int] = ()
    ) -> tuple[list[list[bytes]], float]:
        """One round: per (sequence, depth, rows, rows with logits), its next `rows`
        positions, the first ones asking for logits, the others throwaway as a sequence
        without a draft pads; returns each sequence's logits rows. The cache is cut back."""
        self.batch.clear()
        rows_of = []
        for n, (seq, depth, rows, with_logits) in enumerate(shapes):
            offset = offsets[n] if offsets else 0
            first = self.batch.size
            for i in range(rows):
                token = self.tokens[offset + depth + min(i, with_logits - 1)]
                self.batch.add(token, depth + i, seq, i < with_logits)
            rows_of.append(range(first, first + with_logits))
        seconds = self._decode()
        got = [[self._logits(row) for row in rows] for rows in rows_of]
        for seq, depth, _, _ in shapes:
            self.lib.llama_memory_seq_rm(self.memory, seq, depth, -1)
        return got, seconds

    def single(self, depth: int) -> float:
        """Seconds of a 1-row decode at `depth`: the fastest of a few (another process on
        the machine only ever slows a try down)."""
        tries = []
        for _ in range(TIMING_REPEATS):
            self.batch.clear()
            self.batch.add(self.tokens[depth], depth, 0, True)
            tries.append(self._decode())
            self.lib.llama_memory_seq_rm(self.memory, 0, depth, -1)
        return min(tries)

    def together(self, depth: int) -> int:
        """The most sequences (of TOGETHER) whose rounds give each sequence's rows as its
        own rounds alone do, at TOGETHER_WIDTHS rows each, with logits on every row of some
        sequences and on the first only of others (a sequence without a draft): 1 where
        even two differ."""
        offsets = [7 * (seq % CONTENTS) for seq in range(max(TOGETHER))]
        references = []
        for seq, offset in enumerate(offsets):
            self.prefill(seq, offset, depth)
            if seq < CONTENTS:  # the others hold the same texts: the same rows alone
                references.append(self.reference(seq, depth, max(TOGETHER_WIDTHS), offset))
            else:
                references.append(references[seq % CONTENTS])
        proved = 1
        for count in TOGETHER:
            for width in TOGETHER_WIDTHS:
                patterns = [[1] * count] if width == 2 else []  # no drafts: 2-row rounds
                patterns += [
                    [width if (seq + flip) % 2 else 1 for seq in range(count)] for flip in (0, 1)
                ]
                for logits in patterns:
                    shapes = [(seq, depth, width, logits[seq]) for seq in range(count)]
                    got, _ = self.round(shapes, offsets[:count])
                    if got != [references[seq][: logits[seq]] for seq in range(count)]:
                        return proved
            proved = count
        return proved
