"""How fast a loaded model prefills and decodes at each depth of its context (tokens already
in it): what a time estimate prices a reading's calls with (run/inspect.py), timed as the
calibration times its rounds (backends/probe.py).

Per token, attention grows with the depth and the weights' cost does not, so the seconds
per token lie on a line in the depth: the default model's rates at depths 512 to 7168 in
bench/results/2026-11-27-xeon-amx/reading-predict.log do, within a few percent."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

from memagent_cli.backends.llama_cpp import LlamaCppBackend


@dataclass(frozen=True)
class Speed:
    """Seconds per token as lines in the depth: `base + slope * depth`, for a prompt read in
    batches (prefill) and for a reply decoded one token per llama_decode (no draft taken)."""

    prefill_base: float
    prefill_slope: float
    decode_base: float
    decode_slope: float
    measured_to: int = 0  # the deepest depth measured; deeper is the line carried on
    seconds: float = 0.0  # what measuring took

    def prefill_seconds(self, tokens: int, depth: int = 0) -> float:
        """Seconds to read `tokens` prompt tokens after `depth` tokens already there."""
        middle = depth + tokens / 2  # the line's mean over the tokens read
        return tokens * (self.prefill_base + self.prefill_slope * middle)

    def decode_seconds(self, tokens: int, depth: int) -> float:
        """Seconds to decode `tokens` tokens one by one, the first after `depth` tokens."""
        middle = depth + (tokens - 1) / 2
        return tokens * (self.decode_base + self.decode_slope * middle)

    def prefill_rate(self, depth: int) -> float:
        """Prompt tokens a second at `depth`."""
        return 1 / (self.prefill_base + self.prefill_slope * depth)

    def decode_rate(self, depth: int) -> float:
        """Reply tokens a second at `depth`."""
        return 1 / (self.decode_base + self.decode_slope * depth)


def measure(
    backend: LlamaCppBackend,
    tokens: Sequence[int],
    depth: int,
    *,
    budget: float = 60.0,
    decodes: int = 12,
) -> Speed:
    """Prefill `tokens` (repeated as needed) up to `depth` in the engine's batches, timing
    each batch, and time `decodes` single decodes half way and at the end; fit the lines.
    Past `budget` seconds the prefill stops early (after two batches at least): the lines
    then carry on beyond what was measured, flat when it stopped short of half the depth.
    Sequence 0 is emptied before and after."""
    from memagent_cli.backends.probe import Probe

    decoder = backend.decoder
    if decoder is None:
        raise RuntimeError("prepare() must be called before measure()")
    began = time.perf_counter()
    decoder.forget(0)
    size = decoder.n_batch
    probe = Probe(decoder.context, size)
    batch = probe.batch
    # A lone row in exact mode runs with a throwaway second row (backends/decoding.py).
    rows = 2 if decoder.exact else 1

    def at(pos: int) -> int:
        return tokens[pos % len(tokens)]

    def single(pos: int) -> float:
        """Seconds of one decode at `pos`, as a reply takes them one after another (the
        faster half's median: on a shared machine another process stalls some)."""
        times = probe.singles(at, pos, decodes, rows=rows, advance=True)
        return statistics.median(sorted(times)[: max(decodes // 2, 1)])

    try:
        batch.clear()
        batch.add(at(0), 0, 0, True)
        probe.decode()  # the first decode sets up buffers: not a rate
        probe.forget(0)
        segments: list[tuple[float, float]] = []  # (middle depth, seconds per token)
        singles: list[tuple[int, float]] = []
        pos = 0
        while pos < depth:
            n = min(size, depth - pos)
            batch.clear()
            for i in range(n):
                batch.add(at(pos + i), pos + i, 0, i == n - 1)
            segments.append((pos + n / 2, probe.decode() / n))
            pos += n
            spent = time.perf_counter() - began
            if not singles and (pos >= depth / 2 or spent > budget / 2):
                singles.append((pos, single(pos)))
            if len(segments) >= 2 and singles and spent > budget:
                break
        if not singles or singles[-1][0] != pos:
            singles.append((pos, single(pos)))
    finally:
        decoder.forget(0)
        probe.close()
    # A slope measured over less than half the depth would be carried on twice as far or
    # more: the noise of two batches on a loaded machine once priced a 7B's prefill at a
    # fifth of its rate that way. Short of half the depth, the lines are flat.
    flat = pos < depth / 2
    prefill_base, prefill_slope = _line(segments, flat=flat)
    decode_base, decode_slope = _line([(float(d), s) for d, s in singles], flat=flat)
    return Speed(
        prefill_base,
        prefill_slope,
        decode_base,
        decode_slope,
        measured_to=pos,
        seconds=time.perf_counter() - began,
    )


def _line(points: Sequence[tuple[float, float]], *, flat: bool = False) -> tuple[float, float]:
    """(base, slope) of seconds per token against depth, through two points robust to a
    shared machine: the shallower and the deeper half of `points`, each as the medians of
    its faster half. The line is kept to what the hardware allows: never falling with the depth,
    and at depth 0 at least half what the shallower half measured (the weights' cost
    stays; noise must not push it below zero). `flat`: no slope, the faster half's median."""
    ordered = sorted(points)
    if flat or len(ordered) < 2:
        return (_typical(ordered)[1], 0.0) if ordered else (0.0, 0.0)
    half = len(ordered) // 2
    (x1, y1), (x2, y2) = _typical(ordered[:half]), _typical(ordered[half:])
    # Each half as its faster half: another process stalls some batches, never speeds one.
    if y2 <= y1 or x2 <= x1:
        return (y1 + y2) / 2, 0.0
    slope = (y2 - y1) / (x2 - x1)
    base = y1 - slope * x1
    if base < y1 / 2:
        base = y1 / 2
        slope = (y2 - base) / x2
    return base, slope


def _typical(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """The median depth and seconds of the faster half of `points`."""
    faster = sorted(points, key=lambda point: point[1])[: max(len(points) // 2, 1)]
    return statistics.median(x for x, _ in faster), statistics.median(y for _, y in faster)
