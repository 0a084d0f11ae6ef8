"""The engine's own speed, measured apart from any reading: prefill and decode rates at
depths, the cost of k tokens in one batch, and the ideal time of a call priced from them."""

from __future__ import annotations

import bisect
import statistics
import sys
import time
from typing import Any

from memagent_cli.backends.decoding import Decoded
from memagent_cli.backends.llama_cpp import LlamaCppBackend
from memagent_cli.backends.llama_parts import Batch

DEPTHS = (512, 1024, 2048, 4096, 7168)
COST_DEPTHS = (512, 2048, 6144)
KS = tuple(range(1, 17))


def note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def timed_decode(batch: Batch, context: Any) -> float:
    start = time.perf_counter()
    batch.decode(context)
    return time.perf_counter() - start


def engine_profile(
    backend: LlamaCppBackend,
    tokens: list[int],
    depths: tuple[int, ...] = DEPTHS,
    cost_depths: tuple[int, ...] = COST_DEPTHS,
) -> dict[str, Any]:
    """Prefill to the deepest depth in n_batch pieces; at each depth time single decodes
    and k-token batches."""
    import llama_cpp

    decoder = backend.decoder
    assert decoder is not None
    # Sequence 0 is all the profile uses: emptied, and the decoder told so, before and after.
    decoder.forget(0)
    context, memory = decoder.context, decoder.memory
    batch = Batch(decoder.n_batch)
    segments: list[tuple[int, int, float]] = []  # start, tokens, seconds
    rates, costs = [], {}
    pos = 0

    def fill(start: int, count: int) -> None:
        batch.clear()
        for i in range(count):
            batch.add(tokens[start + i], start + i, 0, True)

    def batch_seconds(k: int, repeats: int) -> float:
        """Seconds to decode k tokens at the current depth, each with logits (as a
        verification does); the cache is cut back after each. The minimum of a few tries:
        on a shared 2-core machine any other process stalls llama.cpp's threads."""
        times = []
        for _ in range(repeats):
            fill(pos, k)
            times.append(timed_decode(batch, context))
            llama_cpp.llama_memory_seq_rm(memory, 0, pos, -1)
        return min(times)

    for depth in sorted(set(depths) | set(cost_depths)):
        while pos < depth:
            n = min(decoder.n_batch, depth - pos)
            batch.clear()
            for i in range(n):
                batch.add(tokens[pos + i], pos + i, 0, i == n - 1)
            segments.append((pos, n, timed_decode(batch, context)))
            pos += n
        # Single decodes one after another, as generating does.
        singles = []
        for i in range(16):
            fill(pos + i, 1)
            singles.append(timed_decode(batch, context))
        llama_cpp.llama_memory_seq_rm(memory, 0, pos, -1)
        single = statistics.median(sorted(singles)[:8])  # the faster half: see batch_seconds
        if depth in depths:
            start, n, seconds = segments[-1]
            rates.append({"depth": depth, "prefill_tps": n / seconds, "decode_tps": 1 / single})
            note(f"  depth {depth}: prefill {n / seconds:.0f} tok/s, decode {1 / single:.1f} tok/s")
        if depth in cost_depths:
            # Sizes take turns, so that a burst of other work does not hit one size only.
            best = {k: min(batch_seconds(k, 1) for _ in range(2)) for k in KS}
            for _ in range(3):
                for k in KS:
                    best[k] = min(best[k], batch_seconds(k, 1))
            costs[depth] = {k: best[k] / best[1] for k in KS}
            note(f"  depth {depth}: batch cost " + " ".join(f"{costs[depth][k]:.2f}" for k in KS))
    decoder.forget(0)
    return {"rates": rates, "batch_cost": costs, "prefill_segments": segments}


def single_decode_seconds(decoder: Any, depth: int, tokens: int = 16) -> float:
    """Seconds of a one-token decode right after the `depth` tokens sequence 0 holds (cut
    back after), estimated as the profile does (the median of the faster half): the
    engine's speed this minute, to set against its profile's."""
    import llama_cpp

    batch = Batch(1)
    times = []
    for i in range(tokens):
        batch.clear()
        batch.add(1, depth + i, 0, True)
        times.append(timed_decode(batch, decoder.context))
    llama_cpp.llama_memory_seq_rm(decoder.memory, 0, depth, -1)
    batch.close()
    return statistics.median(sorted(times)[: tokens // 2])


class Ideal:
    """The engine's own time for a call, from the measured rates (linear in depth)."""

    def __init__(self, profile: dict[str, Any]) -> None:
        self.ends, self.cumulative = [0], [0.0]
        for start, n, seconds in profile["prefill_segments"]:
            self.ends.append(start + n)
            self.cumulative.append(self.cumulative[-1] + seconds)
        self.depths = [r["depth"] for r in profile["rates"]]
        self.single = [1 / r["decode_tps"] for r in profile["rates"]]
        self.costs = {  # int keys also when the profile comes back from JSON
            int(d): {int(k): c for k, c in table.items()}
            for d, table in profile["batch_cost"].items()
        }

    @staticmethod
    def _interpolate(xs: list, ys: list, x: float) -> float:
        i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)

    def prefill(self, start: int, end: int) -> float:
        ends, cumulative = self.ends, self.cumulative
        return self._interpolate(ends, cumulative, end) - self._interpolate(ends, cumulative, start)

    def decode(self, depth: int) -> float:
        return self._interpolate(self.depths, self.single, depth)

    def cost(self, depth: int, size: int) -> float:
        nearest = min(self.costs, key=lambda d: abs(d - depth))
        return self.costs[nearest][min(size, max(KS))]

    def call(self, decoded: Decoded, min_rows: int) -> float:
        """Prefill what the call prefilled, then each round at its batch cost and depth."""
        seconds = self.prefill(decoded.reused_tokens, decoded.prompt_tokens)
        depth = decoded.prompt_tokens
        for rows, emitted in decoded.rounds:
            seconds += self.decode(depth) * self.cost(depth, max(rows, min_rows))
            depth += emitted
        return seconds


def print_engine(engine: dict[str, Any]) -> None:
    print(f"{'depth':>6}  {'prefill tok/s':>13}  {'decode tok/s':>12}")
    for r in engine["rates"]:
        print(f"{r['depth']:>6}  {r['prefill_tps']:>13.0f}  {r['decode_tps']:>12.1f}")
    print("cost of k tokens in one batch, in single decodes:")
    print(f"{'depth':>6}  " + " ".join(f"{k:>5}" for k in KS))
    for depth, table in engine["batch_cost"].items():
        print(f"{depth:>6}  " + " ".join(f"{table[k]:>5.2f}" for k in KS))
