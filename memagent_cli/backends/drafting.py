"""Where speculative drafts come from and how long they should be: prompt lookup (what
followed the last few tokens where they occurred before), and a policy that picks the
draft length from the measured acceptance and the measured cost of a batch."""

from __future__ import annotations

from collections.abc import Sequence

MAX_DRAFT = 16


class Lookup:
    """Prompt-lookup drafts: where the last n tokens (3, then 2, then 1) occurred before,
    propose what followed. A copy in progress is followed by a pointer, so a long copy
    stays on the occurrence it started from."""

    ORDER = 3

    def __init__(self, tokens: Sequence[int]) -> None:
        self.tokens: list[int] = []
        # n-gram -> position right after its latest occurrence that has a continuation
        self._index: list[dict[tuple[int, ...], int]] = [{} for _ in range(self.ORDER)]
        self._pointer = -1  # where the copy in progress continues
        self._matched = 0  # tokens before the pointer known to equal the reply's last ones
        for token in tokens:
            self.append(token)

    def append(self, token: int) -> None:
        tokens = self.tokens
        if self._pointer >= 0 and tokens[self._pointer] == token:
            self._pointer += 1
            self._matched += 1
        else:
            self._pointer, self._matched = -1, 0
        # Index the n-grams that end just before `token`: their continuation now exists.
        end = len(tokens)
        for n in range(1, self.ORDER + 1):
            if end >= n:
                self._index[n - 1][tuple(tokens[end - n : end])] = end
        tokens.append(token)

    def propose(self, limit: int) -> tuple[list[int], int]:
        """Up to `limit` draft tokens and the length of the match they come from (0: none)."""
        if limit <= 0:
            return [], 0
        tokens = self.tokens
        if self._matched < self.ORDER:
            for n in range(self.ORDER, self._matched, -1):
                if len(tokens) >= n:
                    found = self._index[n - 1].get(tuple(tokens[-n:]))
                    if found is not None:
                        self._pointer, self._matched = found, n
                        break
        if self._pointer < 0:
            return [], 0
        return tokens[self._pointer : self._pointer + limit], min(self._matched, self.ORDER)


class DraftPolicy:
    """How long a draft pays for itself, from measured acceptance and measured batch cost.

    A round that verifies k draft tokens emits (1 - a^(k+1)) / (1 - a) tokens on average
    (acceptance a per token) and costs c(k+1) rounds without a draft; the policy picks the
    k with the best ratio. Batch costs are measured as rounds run, so the same code drafts
    long on a GPU (a batch costs about one token) and little on a compute-bound CPU.
    Probes of other lengths keep the estimates fresh, spaced out further each time.
    `min_rows` is the smallest batch the decoder sends (2 when every decode must run on
    llama.cpp's batched kernels): up to that size a draft costs nothing.
    """

    PROBE_LENGTHS = (2, 4, 8)  # probes take turns, so several batch sizes get measured
    PROBE_MIN, PROBE_MAX = 32, 512
    MARGIN = 1.03  # a draft must promise this much over not drafting
    DECAY = 0.97

    def __init__(
        self, max_draft: int = MAX_DRAFT, fixed: int | None = None, min_rows: int = 1
    ) -> None:
        self.max_draft = max_draft
        self.fixed = fixed  # always draft this many when possible (tests exercise every path)
        self.min_rows = min_rows
        self._hits = {n: [1.0, 1.0] for n in range(1, Lookup.ORDER + 1)}  # accepted, rejected
        self._base: float | None = None  # seconds of a round of min_rows (running mean)
        self._ratio: dict[int, float] = {}  # rows -> cost relative to a round of min_rows
        self._rounds = 0
        self._probe_after = self.PROBE_MIN
        self._probes = 0

    def acceptance(self, source: int) -> float:
        accepted, rejected = self._hits[source]
        return accepted / (accepted + rejected)

    def cost(self, rows: int) -> float:
        """Cost of a round of `rows` tokens, relative to one of `min_rows`."""
        rows = max(rows, self.min_rows)
        if rows == self.min_rows:
            return 1.0
        if rows in self._ratio:
            return self._ratio[rows]
        # Unmeasured sizes: extrapolate the cheapest marginal cost seen; until something
        # is measured assume the worst (each token costs a full round).
        marginal = min(((r - 1) / (n - self.min_rows) for n, r in self._ratio.items()), default=1.0)
        return 1.0 + max(marginal, 0.0) * (rows - self.min_rows)

    def length(self, source: int, available: int) -> int:
        """Draft tokens to verify in the next round, given `available` proposed ones."""
        available = min(available, self.max_draft)
        if source == 0 or available <= 0:
            return 0
        if self.fixed is not None:
            return min(self.fixed, available)
        a = min(self.acceptance(source), 0.999)
        best, best_gain = 0, 1.0
        for k in range(1, available + 1):
            gain = (1 - a ** (k + 1)) / (1 - a) / self.cost(k + 1)
            if gain > best_gain * (self.MARGIN if self.cost(k + 1) > 1 else 1.0):
                best, best_gain = k, gain
        self._rounds += 1
        if self._rounds >= self._probe_after:
            self._rounds = 0
            self._probes += 1
            probe = min(self.PROBE_LENGTHS[self._probes % len(self.PROBE_LENGTHS)], available)
            if probe > best:
                self._probe_after = min(self._probe_after * 2, self.PROBE_MAX)
                return probe
        return best

    def record_draft(self, source: int, drafted: int, accepted: int) -> None:
        """Acceptance is geometric along a draft: `accepted` successes, then one failure."""
        hits = self._hits[source]
        hits[0] = hits[0] * self.DECAY**drafted + accepted
        hits[1] = hits[1] * self.DECAY**drafted + (1 if accepted < drafted else 0)

    def record_batch(self, rows: int, seconds: float) -> None:
        rows = max(rows, self.min_rows)
        if rows == self.min_rows:
            self._base = seconds if self._base is None else 0.9 * self._base + 0.1 * seconds
        elif self._base:
            ratio = seconds / self._base
            old = self._ratio.get(rows)
            self._ratio[rows] = ratio if old is None else 0.8 * old + 0.2 * ratio
