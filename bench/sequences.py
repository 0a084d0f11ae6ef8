"""Several sequences in one batch: what the engine charges, and what reading together gains.

1. `sequence_costs`: the cost of Q sequences decoding in one batch relative to one
   sequence (Q = 1..8), with 1 row per sequence and with 2 (exact decoding's pending token
   and its throwaway pad row), at a few depths. Sequence 0 is prefilled once and its cache
   copied to the others (llama_memory_seq_cp across the KV streams, checked by comparing
   each sequence's logits with sequence 0's).
2. `alone_vs_together`: the same questions read one after another (reader.read) and
   together (scheduler.read_together), with --exact: equal answers and memories (checked),
   seconds, and the gain the measured Q-sequence cost allows on the decode-bound part;
   then together with speculation, which must give the same answers and memories as well.
   Each reading opens its own backend with LlamaOptions, as the CLI's flags do.
"""

from __future__ import annotations

import argparse
import bisect
import ctypes
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import llama_cpp
from village import story

from memagent_cli import reader, scheduler
from memagent_cli.backend import Call, Generation, Sampling
from memagent_cli.backends.decoding import Decoded
from memagent_cli.backends.llama_cpp import LlamaCppBackend, LlamaOptions
from memagent_cli.backends.llama_cpp import _generation as generation
from memagent_cli.backends.llama_parts import Batch
from memagent_cli.chunking import make_chunks

MAX_SEQUENCES = 8
ROWS = (1, 2)
QUESTIONS = (
    "What is the secret password for the vault?",
    "Who repaired the wooden fence?",
    "Where did the village baker walk on Sunday?",
    "What did the tired farmer count?",
)


def note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _logits(context: Any, row: int, n_vocab: int) -> bytes:
    return ctypes.string_at(llama_cpp.llama_get_logits_ith(context, row), 4 * n_vocab)


def sequence_costs(
    backend: LlamaCppBackend, tokens: list[int], depths: list[int], passes: int = 4
) -> dict[str, Any]:
    """Seconds of one decode round with Q sequences of r rows each, at each depth; the
    minimum over `passes` turns through every (Q, r), so a burst of other work on the
    machine does not hit one size only. cost[r][Q] = seconds(Q, r) / seconds(1, r)."""
    backend.prepare(max(depths) + 2 * max(ROWS), sequences=MAX_SEQUENCES)
    decoder = backend.decoder
    assert decoder is not None
    context, memory = decoder.context, decoder.memory
    n_vocab = llama_cpp.llama_vocab_n_tokens(decoder.vocab)
    batch = Batch(decoder.n_batch)
    result: dict[str, Any] = {"depths": {}, "copy_checked": True}
    pos = 0
    try:
        for depth in sorted(depths):
            began = time.perf_counter()
            while pos < depth:  # sequence 0 only, in n_batch pieces
                batch.clear()
                n = min(decoder.n_batch, depth - pos)
                for i in range(n):
                    batch.add(tokens[pos + i], pos + i, 0, i == n - 1)
                batch.decode(context)
                pos += n
            for seq in range(1, MAX_SEQUENCES):
                llama_cpp.llama_memory_seq_cp(memory, 0, seq, -1, -1)
            note(f"  depth {depth}: sequence 0 filled in {time.perf_counter() - began:.1f} s")
            checked = _check_copies(batch, context, memory, tokens[depth], depth, n_vocab)
            result["copy_checked"] = result["copy_checked"] and checked
            seconds = {r: {q: float("inf") for q in range(1, MAX_SEQUENCES + 1)} for r in ROWS}
            for _ in range(passes):
                for q in range(1, MAX_SEQUENCES + 1):
                    for r in ROWS:
                        took = _round(batch, context, memory, tokens[depth], depth, q, r)
                        seconds[r][q] = min(seconds[r][q], took)
            cost = {r: {q: seconds[r][q] / seconds[r][1] for q in seconds[r]} for r in ROWS}
            result["depths"][depth] = {"seconds": seconds, "cost": cost}
            for r in ROWS:
                note(
                    f"  depth {depth}, {r} row(s) per sequence: cost "
                    + " ".join(f"{cost[r][q]:.2f}" for q in cost[r])
                )
    finally:
        batch.close()
    return result


def _round(
    batch: Batch, context: Any, memory: Any, token: int, depth: int, q: int, r: int
) -> float:
    """One decode round as the reader's loop makes it: per sequence the pending token (with
    logits) and r - 1 pad rows (without); then the cache is cut back to `depth`."""
    batch.clear()
    for seq in range(q):
        for i in range(r):
            batch.add(token, depth + i, seq, i == 0)
    began = time.perf_counter()
    batch.decode(context)
    took = time.perf_counter() - began
    for seq in range(q):
        llama_cpp.llama_memory_seq_rm(memory, seq, depth, -1)
    return took


def _check_copies(
    batch: Batch, context: Any, memory: Any, token: int, depth: int, n_vocab: int
) -> bool:
    """Each copied sequence holds sequence 0's cache: the same positions, and the same next
    token gives the same logits, bit for bit (a sequence with an empty or other cache
    would not)."""
    reference = b""
    for seq in range(MAX_SEQUENCES):
        if llama_cpp.llama_memory_seq_pos_max(memory, seq) != depth - 1:
            note(f"  sequence {seq} does not reach depth {depth} after the copy")
            return False
        batch.clear()
        batch.add(token, depth, seq, True)
        batch.add(token, depth + 1, seq, False)
        batch.decode(context)
        logits = _logits(context, 0, n_vocab)
        llama_cpp.llama_memory_seq_rm(memory, seq, depth, -1)
        if seq == 0:
            reference = logits
        elif logits != reference:
            note(f"  sequence {seq}'s logits differ from sequence 0's after the copy")
            return False
    return True


class Costs:
    """cost(q, depth) for 2 rows per sequence (exact decoding), linear between depths and
    held flat outside them."""

    def __init__(self, measured: dict[str, Any], rows: int = 2) -> None:
        self.depths = sorted(measured["depths"])
        self.tables = [measured["depths"][d]["cost"][rows] for d in self.depths]

    def __call__(self, q: int, depth: float) -> float:
        ds, i = self.depths, bisect.bisect_left(self.depths, depth)
        if i == 0 or len(ds) == 1:
            return self.tables[0][q]
        if i == len(ds):
            return self.tables[-1][q]
        w = (depth - ds[i - 1]) / (ds[i] - ds[i - 1])
        return (1 - w) * self.tables[i - 1][q] + w * self.tables[i][q]


class Recording(LlamaCppBackend):
    """The backend, keeping the decoding record (rounds per reply) of every reply in
    `calls`: the k-th group holds each sequence's k-th reply. The reader's calls go through
    next_replies (continuous batching), so a group is the step the questions read together,
    though its replies need not start or end in the same round."""

    def __init__(self, path: Path, options: LlamaOptions) -> None:
        super().__init__(path, options)
        self.calls: list[list[Decoded]] = []
        self._replies: dict[int, int] = {}  # replies so far, by sequence

    def decode_many(self, calls: Sequence[Call], *, sampling: Sampling) -> list[Decoded]:
        replies = super().decode_many(calls, sampling=sampling)
        self.calls.append(replies)
        return replies

    def next_replies(
        self, calls: Sequence[Call], *, sampling: Sampling
    ) -> list[tuple[int, Generation]]:
        decoder = self._decoder()
        for call in calls:
            decoder.start(self._request(call, sampling))
        while decoder.in_flight:
            if ended := decoder.step():
                for sequence, decoded in ended:
                    k = self._replies.get(sequence, 0)
                    self._replies[sequence] = k + 1
                    if k == len(self.calls):
                        self.calls.append([])
                    self.calls[k].append(decoded)
                return [(sequence, generation(decoded)) for sequence, decoded in ended]
        return []


def _open(
    backend: LlamaCppBackend, context: int, sequences: int, speculate: bool = False
) -> Recording:
    """Another backend on `backend`'s model and engine settings, with --exact (each
    question's reply is then the one it gets alone, checked below; without drafts each
    round has 2 rows per sequence, as costed)."""
    options = replace(backend.options, exact=True, speculate=speculate)
    recording = Recording(backend.path, options)
    recording.prepare(context, sequences=sequences)
    return recording


def alone_vs_together(
    backend: LlamaCppBackend,
    text: str,
    settings: reader.Settings,
    costs: dict[str, Any],
    questions: list[str],
) -> dict[str, Any]:
    """Read `questions` alone, one after another (a 1-sequence context, as `ask` had), then
    together (a context of a sequence each); check the answers and memories are equal."""
    chunks = make_chunks(backend.tokenize(text), settings.chunk_tokens, backend.detokenize)
    needed = reader.context_needed(backend, questions, settings)
    lone = _open(backend, needed, 1)
    began = time.perf_counter()
    alone = []
    for question in questions:
        alone.append(reader.read(lone, question, chunks, settings))
        note(f"  alone: {question!r} read in {time.perf_counter() - began:.1f} s so far")
    alone_seconds = time.perf_counter() - began
    alone_calls = lone.calls
    del lone  # its context is freed before the next is made
    joint = _open(backend, needed, len(questions))
    readings = [scheduler.Job(q) for q in questions]
    began = time.perf_counter()
    together = scheduler.read_together(joint, readings, chunks, settings)
    together_seconds = time.perf_counter() - began
    together_calls = joint.calls
    del joint
    note(f"  together: {together_seconds:.1f} s")
    # Speculation composes: the same pass with drafts, one length chosen per round for all.
    drafting = _open(backend, needed, len(questions), speculate=True)
    began = time.perf_counter()
    drafted = scheduler.read_together(
        drafting, [scheduler.Job(q) for q in questions], chunks, settings
    )
    drafted_seconds = time.perf_counter() - began
    del drafting
    note(f"  together, speculative: {drafted_seconds:.1f} s")

    same = [
        a.answer == t.answer == d.answer
        and a.reply == t.reply == d.reply
        and [s.memory for s in a.steps] == [s.memory for s in t.steps]
        and [s.memory for s in a.steps] == [s.memory for s in d.steps]
        for a, t, d in zip(alone, together, drafted, strict=True)
    ]
    flat = [d for call in alone_calls for d in call]
    prefill = sum(d.prompt_seconds for d in flat)
    decode = sum(d.seconds - d.prompt_seconds for d in flat)
    rounds = sum(len(d.rounds) for d in flat)
    per_round = decode / max(rounds, 1)  # one sequence's 2-row round, as measured alone
    # Together, round j of a call holds the replies still going at j: it may cost what
    # the engine charges for that many sequences, c(q), instead of q rounds alone.
    cost = Costs(costs)
    allowed_decode = 0.0
    for call in together_calls:
        depth = sum(d.prompt_tokens for d in call) / len(call)
        longest = max(len(d.rounds) for d in call)
        for j in range(longest):
            live = sum(1 for d in call if len(d.rounds) > j)
            allowed_decode += per_round * cost(live, depth + j)
    together_prefill = sum(d.prompt_seconds for call in together_calls for d in call)
    together_decode = sum(
        max(d.seconds - d.prompt_seconds for d in call) for call in together_calls
    )
    allowed_gain = (prefill + decode) / (prefill + allowed_decode)
    measured_gain = alone_seconds / together_seconds
    steps = len(chunks) + 1
    return {
        "questions": questions,
        "chunks": len(chunks),
        "context_tokens_per_sequence": needed,
        "same_answers_and_memories": all(same),
        "same_per_question": same,
        "answers": [a.answer for a in alone],
        "alone_seconds": alone_seconds,
        "together_seconds": together_seconds,
        "together_speculative_seconds": drafted_seconds,
        "alone": {"prefill_seconds": prefill, "decode_seconds": decode, "rounds": rounds},
        "together": {"prefill_seconds": together_prefill, "decode_seconds": together_decode},
        "allowed_decode_seconds": allowed_decode,
        "cost_together_at_depth": {  # a round of a sequence per question, 2 rows each
            d: costs["depths"][d]["cost"][2][len(questions)] for d in costs["depths"]
        },
        "allowed_gain": allowed_gain,
        "measured_gain": measured_gain,
        "decode_gain": decode / max(together_decode, 1e-9),
        "fraction_of_allowed": measured_gain / allowed_gain,
        # Per call (the steps, then the answer): all questions' seconds alone, summed, and
        # the one call together (prefills one after another, then the shared rounds).
        "step_seconds_alone": [
            sum(alone_calls[q * steps + k][0].seconds for q in range(len(questions)))
            for k in range(steps)
        ],
        "step_seconds_together": [
            sum(d.prompt_seconds for d in call) + max(d.seconds - d.prompt_seconds for d in call)
            for call in together_calls
        ],
    }


def print_tables(costs: dict[str, Any] | None, together: dict[str, Any] | None) -> None:
    if costs is not None:
        print("cost of Q sequences in one decode round, relative to one sequence:")
        print(f"{'depth':>6}  {'rows':>4}  " + " ".join(f"{q:>5}" for q in range(1, 9)))
        for depth, table in costs["depths"].items():
            for r in ROWS:
                cells = " ".join(f"{table['cost'][r][q]:>5.2f}" for q in range(1, 9))
                print(f"{depth:>6}  {r:>4}  {cells}")
            one, two = table["seconds"][1][1], table["seconds"][2][1]
            print(f"{'':>6}  one sequence: 1 row {one * 1000:.1f} ms, 2 rows {two * 1000:.1f} ms")
        print(f"cache copied across sequences (seq_cp), logits checked: {costs['copy_checked']}")
    if together is not None:
        t = together
        print(f"{len(t['questions'])} questions, {t['chunks']} chunks, read alone vs together:")
        print(
            f"  alone {t['alone_seconds']:.1f} s (prefill {t['alone']['prefill_seconds']:.1f}, "
            f"decode {t['alone']['decode_seconds']:.1f}); together {t['together_seconds']:.1f} s "
            f"(prefill {t['together']['prefill_seconds']:.1f}, "
            f"decode {t['together']['decode_seconds']:.1f})"
        )
        q, c = len(t["questions"]), t["cost_together_at_depth"]
        cq = ", ".join(f"{x:.2f}x at depth {d}" for d, x in c.items())
        print(f"  a round of {q} sequences (2 rows each) costs {cq} one sequence's round")
        print(
            f"  gain measured {t['measured_gain']:.3f} (decode part {t['decode_gain']:.3f}), "
            f"allowed by the engine's Q-sequence cost {t['allowed_gain']:.3f}; "
            f"measured / allowed {t['fraction_of_allowed']:.3f} (target >= 0.9)"
        )
        print(
            "  seconds per call alone (summed over questions): "
            + " ".join(f"{x:.1f}" for x in t["step_seconds_alone"])
        )
        print(
            "  seconds per call together: "
            + " ".join(f"{x:.1f}" for x in t["step_seconds_together"])
        )
        print(
            f"  together with speculation: {t['together_speculative_seconds']:.1f} s, "
            f"{t['alone_seconds'] / t['together_speculative_seconds']:.3f}x alone, "
            f"{t['together_seconds'] / t['together_speculative_seconds']:.3f}x together plain"
        )
        print(
            f"  same answers and memories (alone, together, together speculative): "
            f"{t['same_answers_and_memories']}"
        )


def read_questions(
    backend: LlamaCppBackend,
    args: argparse.Namespace,
    long_tokens: list[int],
    result: dict,
    failures: list[str],
) -> None:
    """Part 3: Q-sequence costs, then questions read alone and together."""
    note(f"Q sequences in one batch, at depths {args.seq_depths}...")
    costs = result["sequence_costs"] = sequence_costs(backend, long_tokens, args.seq_depths)
    if not costs["copy_checked"]:
        failures.append("a sequence copied with llama_memory_seq_cp differs from sequence 0")
    together = None
    if not args.engine_only:
        note("questions read alone, then together...")
        settings = reader.Settings(args.chunk_tokens, args.memory_tokens, Sampling(0.0))
        questions = list(QUESTIONS[: args.questions])
        together = result["together"] = alone_vs_together(
            backend, story(args.sentences, seed=3), settings, costs, questions
        )
        if not together["same_answers_and_memories"]:
            failures.append("questions read together differ from the same read alone")
    print_tables(costs, together)
