"""What decoding may rely on, measured once per model and machine: which round sizes keep
every row's logits bit for bit, and what a round of W rows costs in single decodes.

`--exact` promises that drafts and questions read together change no token. That holds only
where llama.cpp computes a row the same whatever the round around it, which depends on the
model's shapes and types, the build, the CPU or GPU and the engine's settings (rounds of 8+
rows differ with a hidden size of 256, every size with F16 or F32 weights, 9+ on CUDA:
docs/performance.md). So at a model's first use memagent decodes a few positions both ways in
a small context of its own (backends/probe.py) and keeps the result in the data folder
(backends/calibration_store.py), keyed by everything that picks llama.cpp's kernels. The
draft policy then uses only the round sizes proved equal, and prices a batch row from the
costs measured (backends/drafting.py). This module is the value: what it says, what a sound
one holds, and when the readings that follow say it was measured wrong.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from memagent_cli.backends.drafting import MAX_DRAFT

# 2: costs timed in several passes and checked against what a round can cost; the GPU and
# its driver in the key; a calibration the readings disputed is measured again. 3: a 1-row
# decode's seconds kept, which the readings that follow check too.
VERSION = 3
MOST = MAX_DRAFT + 1  # the largest round of one sequence: its pending token and a full draft
# Several sequences in one round: those counts (backends/probe.py proves them).
TOGETHER = (2, 4)
MAX_FILE_BYTES = 64 << 10  # a calibration is under 2 KB: anything far larger is not one
# Readings go together only where a round of them costs under 1/MARGIN of their rounds apart:
# costs are timings on a machine that may be busy (a few percent either way), and a batch
# saves on decoding only, while prefills, most of a step on a CPU, gain nothing and were
# measured slower at once (docs/performance.md, Several documents at once).
MARGIN = 1.1
# The readings that follow dispute a calibration where rounds of one size, DISPUTE_ROWS or
# more rows beyond the smallest and timed at least DISPUTE_AFTER times, cost under
# 1/DISPUTE_MARGIN of its price (each size's fastest over the fastest smallest round, as
# measuring times them): it was measured while something else ran, and measured so, rounds
# are priced about as dear as their rows. Rounds of a row or two more run other kernels than
# a 1-row decode, whose cost shifts with the context (the tiny test model's 2-row rounds
# timed 0.8-1.3 of a decode); rounds that cost more than the price say nothing: deeper in a
# reading's context than the calibration's, attention makes every row dearer. A calibration
# measured again MOST_REMEASURED times in a row is kept (`--recalibrate` measures anyway),
# so a machine whose readings always differ does not measure each time.
DISPUTE_ROWS = 3
DISPUTE_AFTER = 3
# Only where a round without a draft takes this long: shorter ones are mostly llama.cpp's
# fixed costs of a decode (waking its threads, building the graph), which vary more than
# rows do (the tiny test model decodes in under a millisecond).
DISPUTE_SECONDS = 0.002
DISPUTE_MARGIN = 1.5
MOST_REMEASURED = 3
# What a round's cost may be, in decodes of one row: a round holds that row, so no less (the
# measured costs are kept there), and its rows cost no more than as many decodes.
ROUNDING = 1e-3  # the file keeps 4 decimals


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
    # Why the readings that followed disagree ("" where they did not): measured again then.
    disputed: str = ""
    remeasured: int = 0  # measured again after a dispute, so many times in a row
    # A 1-row decode's seconds at the depth measured (the fastest; 0: not measured).
    decode_seconds: float = 0.0

    def disputed_by(
        self, observed: Mapping[int, tuple[float, int]], min_rows: int, decode: float = 0.0
    ) -> str:
        """Why a reading says this calibration priced its rounds too dear, in words; ""
        where it does not (see DISPUTE_MARGIN), or it was measured again often enough, or
        not measured at all (assumed, or the fixed price where measuring failed).
        `observed`: rounds timed in the reading (rows -> (cost over a round of `min_rows`,
        rounds timed), of one sequence); `decode`: the reading's fastest round of
        `min_rows`, in seconds. A calibration measured while something else ran took longer
        for its decodes than a quiet reading's, deeper in a longer context, takes: that
        says so even where it priced drafts so dear that the reading never drafted."""
        if self.assumed or not self.measured or self.remeasured >= MOST_REMEASURED:
            return ""
        if self.decode_seconds and decode:
            measured = self.decode_seconds * self._cost(min_rows)
            if decode * DISPUTE_MARGIN < measured:
                return (
                    f"a decode at {measured * 1000:.1f} ms, and this reading's took "
                    f"{decode * 1000:.1f} ms"
                )
        for rows, (cost, count) in sorted(observed.items()):
            price = self.price(rows, 1, min_rows)
            enough = rows >= min_rows + DISPUTE_ROWS and count >= DISPUTE_AFTER
            if enough and cost * DISPUTE_MARGIN < price:
                return (
                    f"a round of {rows} rows at {price:.2f} times a round of {min_rows}, and "
                    f"{count} such rounds of this reading cost {cost:.2f}"
                )
        return ""

    def disputed_as(self, why: str) -> Calibration:
        return replace(self, disputed=why)

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
        disputed = "; disputed by a reading: measured again at the next" if self.disputed else ""
        return (
            f"exact rounds of {exact} rows; sequences {together}; a round costs "
            f"{costs} decodes (measured in {self.seconds:.1f} s){disputed}"
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
            **({"disputed": self.disputed} if self.disputed else {}),
            **({"remeasured": self.remeasured} if self.remeasured else {}),
            **({"decode_seconds": self.decode_seconds} if self.decode_seconds else {}),
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
    disputed, remeasured = raw.get("disputed", ""), raw.get("remeasured", 0)
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
    if set(table) != set(range(1, MOST + 1)):
        raise Damaged("its costs miss round sizes")
    if not costs_possible(table):
        raise Damaged("its costs are not what a round can cost")
    if not isinstance(seconds, float | int) or isinstance(seconds, bool):
        raise Damaged("its time is not a number")
    if not isinstance(disputed, str) or not _int(remeasured) or remeasured < 0:
        raise Damaged("its record of disputes is not one")
    decode = raw.get("decode_seconds", 0.0)
    if not (isinstance(decode, float | int) and not isinstance(decode, bool)):
        raise Damaged("its decode time is not a number")
    if not (math.isfinite(decode) and 0 <= decode < 60):
        raise Damaged("its decode time is not sound")
    measured = raw.get("measured", "")
    return Calibration(
        key,
        tuple(sorted(set(widths))),
        together,
        table,
        float(seconds),
        measured if isinstance(measured, str) else "",
        disputed=disputed[:500],
        remeasured=min(remeasured, MOST_REMEASURED),
        decode_seconds=float(decode),
    )


def costs_possible(costs: Mapping[int, float]) -> bool:
    """Whether `costs` (rows -> a round's seconds over a 1-row decode's) are what rounds can
    cost: 1 for one row, then never less than a smaller round, nor more than a decode a row.
    A hostile file's costs of 1e-9 would make every draft look free."""
    if abs(costs.get(1, 0.0) - 1.0) > ROUNDING:
        return False
    last = 1.0
    for rows in sorted(costs):
        cost = costs[rows]
        if not last - ROUNDING <= cost <= rows + ROUNDING:
            return False
        last = cost
    return True


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


def settings(calibration: Calibration) -> str:
    """The engine settings it was measured with, in llama.cpp's flags."""
    key = calibration.key
    return (
        f"-t {key.get('threads')} -ngl {key.get('gpu_layers')} -fa {key.get('flash_attn')} "
        f"-ctk {key.get('cache_type_k')} -ctv {key.get('cache_type_v')}"
    )
