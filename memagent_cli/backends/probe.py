"""Rounds decoded and timed in a llama.cpp context: what the calibration measures (which
round sizes keep a row's logits bit for bit, and what a round costs against a 1-row decode:
backends/calibration.py) and what a time estimate's rates are timed with (backends/speed.py).

Another process on the machine only ever slows a decode down, never speeds one up: so a
time is the best of several tries, and the calibration times every round size in several
passes apart, keeping each size's best, so that a busy moment slows one pass, not the
result.
"""

from __future__ import annotations

import ctypes
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memagent_cli.backends.calibration import MOST, TOGETHER, Calibration

# Every round size is checked where a round crosses the KV cache's 256-cell padding;
# sequences together in a shallow cache, at the smallest and largest size.
DEPTHS = (250,)
TOGETHER_DEPTH = 40
# Sequences together: at those sizes, with and without logits on every row (a sequence
# without a draft has one logits row and throwaway ones).
TOGETHER_WIDTHS = (2, MOST)
CONTENTS = 2  # sequences together hold this many texts, in turns
TIMING_PASSES = 3  # passes over every round size, each size's best kept
TIMING_REPEATS = 3  # 1-row decodes timed at the start of each pass, the best kept


class Probe:
    """Rounds of a batch decoded in `context`, each timed; with `model` and `tokens` (a
    text), the calibration's rounds of that text and their logits as bytes."""

    def __init__(
        self,
        context: Any,
        n_batch: int,
        *,
        sequences: int = 1,
        model: Any = None,
        tokens: Sequence[int] = (),
    ) -> None:
        import llama_cpp

        from memagent_cli.backends.llama_parts import Batch

        self.lib, self.context, self.tokens = llama_cpp, context, tokens
        self.memory = llama_cpp.llama_get_memory(context)
        self.n_vocab = 0
        if model is not None:
            self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
        self.n_batch = n_batch
        self.batch = Batch(n_batch, sequences)

    def close(self) -> None:
        self.batch.close()

    def decode(self) -> float:
        """Decode the batch as it is; its seconds."""
        began = time.perf_counter()
        self.batch.decode(self.context)
        return time.perf_counter() - began

    def forget(self, seq: int, start: int = -1) -> None:
        """Cut `seq`'s cache from `start` on (all of it by default)."""
        self.lib.llama_memory_seq_rm(self.memory, seq, start, -1)

    def singles(
        self,
        token_at: Any,
        pos: int,
        count: int,
        *,
        rows: int = 1,
        advance: bool = False,
        seq: int = 0,
    ) -> list[float]:
        """Seconds of `count` rounds of one token with logits (`token_at(position)`), and
        throwaway rows up to `rows` (exact decoding's padding), at `pos`, or one position
        further each (`advance`: as a reply decodes, its cache growing); the cache is cut
        back to `pos` after."""
        times = []
        for i in range(count):
            at = pos + i if advance else pos
            self.batch.clear()
            for row in range(rows):
                self.batch.add(token_at(at + row), at + row, seq, row == 0)
            times.append(self.decode())
            self.forget(seq, at + 1 if advance else at)
        self.forget(seq, pos)
        return times

    # The calibration's rounds, of `tokens` ---------------------------------------------

    def prefill(self, seq: int, offset: int, depth: int) -> None:
        """The text from `offset` at positions 0..depth-1 of `seq`, in n_batch pieces."""
        self.forget(seq)
        for start in range(0, depth, self.n_batch):
            self.batch.clear()
            end = min(start + self.n_batch, depth)
            for pos in range(start, end):
                self.batch.add(self.tokens[offset + pos], pos, seq, pos == end - 1)
            self.decode()

    def single(self, depth: int) -> float:
        """Seconds of a 1-row decode at `depth`: the best of TIMING_REPEATS."""
        return min(self.singles(lambda pos: self.tokens[pos], depth, TIMING_REPEATS))

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
            self.decode()
            got.append(self._logits(0))
            self.forget(seq, pos + 1)
        self.forget(seq, depth)
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
        seconds = self.decode()
        got = [[self._logits(row) for row in rows] for rows in rows_of]
        for seq, depth, _, _ in shapes:
            self.forget(seq, depth)
        return got, seconds

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


@dataclass
class Engine:
    """What measuring needs of a loaded model: llama.cpp's pointers and the real context's
    parameters (threads, flash attention, cache types, batch sizes)."""

    model: Any  # llama_model_p
    params: Any  # llama_context_params of the context the reading uses
    tokens: list[int]  # a text's tokens, longer than the deepest depth


def measure(engine: Engine, key: Mapping[str, Any], remeasured: int = 0) -> Calibration:
    """Decode a few positions as exact decoding does without drafts (rounds of the token and
    a throwaway row), then the same positions in one round of W rows as a draft is verified,
    for every W, at each depth of DEPTHS; then time each W against 1-row decodes in
    TIMING_PASSES passes, keeping each W's best; then sequences together. A few seconds on a
    small model. `remeasured`: measured again after so many disputes in a row."""
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
    probe = None
    try:
        probe = Probe(
            context,
            params.n_batch,
            sequences=max(TOGETHER),
            model=engine.model,
            tokens=engine.tokens,
        )
        equal = set(range(2, MOST + 1))
        ratios: dict[int, list[float]] = {}
        fastest = math.inf  # a 1-row decode's seconds, the best at any depth
        for depth in DEPTHS:
            probe.prefill(0, 0, depth)
            reference = probe.reference(0, depth, MOST)
            for width in range(2, MOST + 1):  # also sets up a round of each size, untimed
                got, _ = probe.round([(0, depth, width, width)])
                if got != [reference[:width]]:
                    equal.discard(width)
            for _ in range(TIMING_PASSES):
                single = probe.single(depth)
                fastest = min(fastest, single)
                for width in range(2, MOST + 1):
                    _, seconds = probe.round([(0, depth, width, width)])
                    ratios.setdefault(width, []).append(seconds / single)
            probe.forget(0)
        together = 1
        if equal == set(range(2, MOST + 1)):  # a row that changes with W alone: not together
            together = probe.together(TOGETHER_DEPTH)
    finally:
        if probe is not None:
            probe.close()
        llama_cpp.llama_free(context)
    return Calibration(
        key,
        tuple(sorted(equal)),
        together,
        # Rounded as the file keeps them: the one measured and the one read back are equal.
        {w: round(c, 4) for w, c in smoothed({w: min(r) for w, r in ratios.items()}).items()},
        round(time.perf_counter() - began, 3),
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        remeasured=remeasured,
        decode_seconds=round(fastest, 6),
    )


def smoothed(ratios: Mapping[int, float]) -> dict[int, float]:
    """Costs from each round size's best timing: each the median of it and its neighbours'
    (a round slowed down in every pass is still one outlier), within what a round can cost
    (no less than a smaller round, no more than W single decodes: calibration.py)."""
    costs, last = {1: 1.0}, 1.0
    for width in range(2, MOST + 1):
        near = sorted(ratios[w] for w in (width - 1, width, width + 1) if w in ratios)
        median = near[len(near) // 2]
        last = costs[width] = min(max(last, median), float(width))
    return costs
