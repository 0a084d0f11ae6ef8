"""Where speculative drafts come from and how long they should be: prompt lookup (what
followed the last few tokens where they occurred before), and a policy that picks the
draft length from the acceptance seen so far and the cost of a batch: measured, or a fixed
price where timings must not change the output."""

from __future__ import annotations

from collections.abc import Callable, Sequence

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

    With several sequences in a round every sequence gets as many rows as the longest
    draft, so one length is chosen for all of them: the one whose summed expected tokens
    per unit of that round's cost is best. Costs are kept per number of sequences, since
    Q sequences of r rows cost neither Q nor r times one sequence's row.

    Where one row is allowed (`min_rows` 1), the draft length picks llama.cpp's kernels for
    the tokens it covers (a 1-row decode runs other ones than a batch, and they differ in
    near-ties), and it shapes every later round. So there the length comes from counts
    alone: the acceptance seen so far, priced with the calibration's costs of a round
    (`prices`, measured once per model and machine: backends/calibration.py) or else a fixed
    `price` per batch row, and probes counted in rounds. A greedy rerun with the same
    calibration then repeats itself token for token, whatever this run's timings. Measured
    costs choose only where every round is a batch anyway (`min_rows` 2), since there no
    length changes a token, and only among the round sizes in `widths`.
    """

    PROBE_LENGTHS = (2, 4, 8)  # probes take turns, so several batch sizes get measured
    PROBE_MIN, PROBE_MAX = 32, 512
    MARGIN = 1.03  # a draft must promise this much over not drafting
    DECAY = 0.97

    # A batch row's cost relative to a 1-row round where one row is allowed: about what it
    # costs on a 2-core CPU (docs/performance.md). A GPU running a small model measured more
    # (2-8 rows cost 2.3-3.7 rounds on an H100 with the default model), a 7B on a GPU less.
    PRICE = 0.6

    def __init__(
        self,
        max_draft: int = MAX_DRAFT,
        fixed: int | None = None,
        min_rows: int = 1,
        price: float = PRICE,
        *,
        widths: Sequence[int] | None = None,
        prices: Callable[[int, int, int], float] | None = None,
    ) -> None:
        self.max_draft = max_draft
        self.fixed = fixed  # always draft this many when possible (tests exercise every path)
        self.min_rows = min_rows
        self.price = price
        # Rows a round may have beyond one (None: any): the sizes the calibration proved
        # to keep every row's logits, where that matters (--exact).
        self.widths = None if widths is None else frozenset(widths)
        # A round's cost from the calibration, (rows, sequences, min_rows) -> decodes;
        # None: the fixed `price` per row.
        self.prices = prices
        self._hits = {n: [1.0, 1.0] for n in range(1, Lookup.ORDER + 1)}  # accepted, rejected
        # Per number of sequences: seconds of a round of min_rows each (running mean), and
        # rows each -> cost relative to that round.
        self._base: dict[int, float] = {}
        self._ratio: dict[int, dict[int, float]] = {}
        # Rounds of one sequence by rows: the fastest's seconds, and how many were timed.
        self._fastest: dict[int, float] = {}
        self._timed: dict[int, int] = {}
        self._rounds = 0
        self._probe_after = self.PROBE_MIN
        self._probes = 0

    def acceptance(self, source: int) -> float:
        accepted, rejected = self._hits[source]
        return accepted / (accepted + rejected)

    def cost(self, rows: int, sequences: int = 1) -> float:
        """Cost of a round of `rows` tokens per sequence, relative to one of `min_rows`."""
        rows = max(rows, self.min_rows)
        if rows == self.min_rows:
            return 1.0
        ratios = self._ratio.get(sequences, {})
        if rows in ratios:
            return ratios[rows]
        if not ratios and self.prices is not None:  # nothing measured yet: the calibration's
            return self.prices(rows, sequences, self.min_rows)
        # Unmeasured sizes: extrapolate the cheapest marginal cost seen; until something
        # is measured assume the worst (each token costs a full round).
        marginal = min(((r - 1) / (n - self.min_rows) for n, r in ratios.items()), default=1.0)
        return 1.0 + max(marginal, 0.0) * (rows - self.min_rows)

    def length(self, source: int, available: int) -> int:
        """Draft tokens to verify in the next round, given `available` proposed ones."""
        return self.rows([(source, available)]) - 1

    def rows(self, drafts: Sequence[tuple[int, int]]) -> int:
        """Rows per sequence in the next round, one sequence per (source of its proposal,
        tokens proposed) in `drafts`: 1 + the draft length that pays best over them all."""
        proposed = [(s, min(n, self.max_draft)) for s, n in drafts if s and n > 0]
        longest = max((n for _, n in proposed), default=0)
        if not longest:
            return 1
        if self.fixed is not None:
            return self.fit(1 + min(self.fixed, longest))
        rates = [(min(self.acceptance(s), 0.999), n) for s, n in proposed]
        sequences = len(drafts)
        # Every round a batch: the length changes no token, and timings may choose it.
        cost = self.cost if self.min_rows > 1 else self._priced
        best = self._best(rates, sequences, longest, cost)
        self._rounds += 1
        if self._rounds >= self._probe_after:
            self._rounds = 0
            self._probes += 1
            lengths = self.PROBE_LENGTHS
            probe = self.fit(1 + min(lengths[self._probes % len(lengths)], longest)) - 1
            if probe > best:
                self._probe_after = min(self._probe_after * 2, self.PROBE_MAX)
                return 1 + probe
        return 1 + best

    def _best(
        self,
        rates: Sequence[tuple[float, int]],
        sequences: int,
        longest: int,
        cost: Callable[[int, int], float],
    ) -> int:
        """The draft length up to `longest` that emits the most tokens per unit of
        `cost(rows, sequences)`, for sequences drafting with (acceptance, tokens) `rates`."""
        best, best_gain = 0, float(sequences)  # no draft: one token per sequence
        for k in range(1, longest + 1):
            if self.widths is not None and k + 1 not in self.widths:
                continue
            emitted = sequences - len(rates)
            emitted += sum((1 - a ** (min(k, n) + 1)) / (1 - a) for a, n in rates)
            price = cost(k + 1, sequences)
            if emitted / price > best_gain * (self.MARGIN if price > 1 else 1.0):
                best, best_gain = k, emitted / price
        return best

    def fit(self, rows: int) -> int:
        """The largest round size allowed up to `rows` (1 where none is)."""
        if self.widths is None:
            return rows
        return max((w for w in self.widths if w <= rows), default=1)

    def _priced(self, rows: int, sequences: int = 1) -> float:
        """A round's cost from the calibration's table, else at the fixed price per row
        beyond `min_rows`: no timing of this run in it either way."""
        if self.prices is not None:
            return self.prices(rows, sequences, self.min_rows)
        return 1.0 + self.price * (max(rows, self.min_rows) - self.min_rows)

    def record_draft(self, source: int, drafted: int, accepted: int) -> None:
        """Acceptance is geometric along a draft: `accepted` successes, then one failure."""
        hits = self._hits[source]
        hits[0] = hits[0] * self.DECAY**drafted + accepted
        hits[1] = hits[1] * self.DECAY**drafted + (1 if accepted < drafted else 0)

    def record_batch(self, rows: int, seconds: float, sequences: int = 1) -> None:
        """A round of `sequences` sequences, `rows` tokens each, took `seconds`."""
        rows = max(rows, self.min_rows)
        if sequences == 1:
            self._fastest[rows] = min(seconds, self._fastest.get(rows, seconds))
            self._timed[rows] = self._timed.get(rows, 0) + 1
        base = self._base.get(sequences)
        if rows == self.min_rows:
            self._base[sequences] = seconds if base is None else 0.9 * base + 0.1 * seconds
        elif base:
            ratios = self._ratio.setdefault(sequences, {})
            old = ratios.get(rows)
            ratios[rows] = seconds / base if old is None else 0.8 * old + 0.2 * seconds / base

    def fastest(self, rows: int) -> float | None:
        """Seconds of the fastest round of one sequence of `rows` rows so far."""
        return self._fastest.get(rows)

    def observed(self) -> dict[int, tuple[float, int]]:
        """What rounds of one sequence cost in this run, whatever chose their lengths, as
        the calibration measures it (another process only slows a round down: the fastest
        of each size): rows -> (the fastest over the fastest round of `min_rows`, rounds
        timed). The calibration is checked against it (Calibration.disputed_by)."""
        base = self._fastest.get(self.min_rows)
        if not base:
            return {}
        return {
            rows: (seconds / base, self._timed[rows])
            for rows, seconds in self._fastest.items()
            if rows != self.min_rows
        }
