"""memagent's own decoding loop on llama.cpp's low-level API, with exact speculative copying.

Most of a new MemAgent memory copies the previous one, so the loop drafts tokens by prompt
lookup (where the last few tokens occurred before in the prompt or the reply, propose what
followed there), verifies a whole draft in one `llama_decode` batch, and keeps draft tokens
while the target's own sampled token equals them. Exactly one sampler draw per emitted
token, as without drafts: greedy and fixed-seed outputs are those of plain decoding.

The loop works on sequences (`Stream`) so that several share one batch per round, and a
sequence whose reply ends takes its next request while the others go on decoding
(continuous batching: `start` and `step`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import llama_cpp

from memagent_cli.backend import Sampling
from memagent_cli.backends.drafting import MAX_DRAFT, DraftPolicy, Lookup
from memagent_cli.backends.llama_parts import Batch, Pieces, Sampler

if TYPE_CHECKING:
    from memagent_cli.backends.calibration import Calibration


@dataclass
class Decoded:
    """One reply: its tokens, why it ended, and what decoding it cost."""

    tokens: list[int]  # emitted tokens, the end-of-generation token excluded
    text: str
    finish_reason: str  # "stop" or "length"
    prompt_tokens: int
    reused_tokens: int  # prompt prefix already in the KV cache, not decoded again
    prompt_seconds: float  # prefill and first token
    seconds: float
    drafted: int = 0
    accepted: int = 0
    engine_seconds: float = 0.0  # inside llama_decode during the call (shared by a batch)
    # After the prompt, per llama_decode: (tokens in the batch, tokens it emitted)
    rounds: list[tuple[int, int]] = field(default_factory=list)


@dataclass(frozen=True)
class Request:
    """One reply to decode: rendered chat tokens, limits, sampling, and its sequence."""

    prompt: list[int]
    max_tokens: int
    sampling: Sampling
    stops: Sequence[str] = ()
    seq_id: int = 0
    fresh: bool = False  # the sequence held another reading: clear it before the prompt


@dataclass
class Stream:
    """One sequence being decoded: its sampler, drafts, emitted tokens and position."""

    seq_id: int
    prompt: list[int]
    max_tokens: int
    sampler: Sampler
    lookup: Lookup | None
    stops: list[bytes]
    tokens: list[int] = field(default_factory=list)
    text: bytearray = field(default_factory=bytearray)
    finish: str | None = None
    pending: int = -1  # sampled, not yet in the KV cache
    pos: int = 0  # position of `pending`
    row: int = 0  # batch row of `pending` in the current round
    draft: list[int] = field(default_factory=list)
    source: int = 0
    drafted: int = 0
    accepted: int = 0
    cut: int = -1  # where a stop string starts in `text`
    began: float = 0.0  # when its prefill began
    prompt_seconds: float = 0.0  # prefill and first token
    reused: int = 0  # prompt tokens already in the cache
    engine_before: float = 0.0  # the decoder's engine_seconds when it began
    rounds: list[tuple[int, int]] = field(default_factory=list)  # as Decoded.rounds


class Decoder:
    """Decodes replies in one llama.cpp context; remembers what its KV cache holds."""

    def __init__(
        self,
        context: llama_cpp.llama_context_p,
        model: llama_cpp.llama_model_p,
        *,
        n_batch: int,
        speculate: bool = True,
        exact: bool = True,
        sequences: int = 1,
        calibration: Calibration | None = None,
    ) -> None:
        self.context = context
        self.vocab = llama_cpp.llama_model_get_vocab(model)
        self.memory = llama_cpp.llama_get_memory(context)
        self.n_batch = n_batch
        # Rejected drafts must be cut from the cache; recurrent state cannot be cut back.
        self.speculate = speculate and not (
            llama_cpp.llama_model_is_recurrent(model) or llama_cpp.llama_model_is_hybrid(model)
        )
        # llama.cpp's CPU kernels for a 1-row decode differ from its batched ones (logits
        # differ by up to ~0.7 with a Q4 model, enough to flip near-ties), and batches of
        # some sizes differ from others with some models and devices. Exact decoding never
        # sends a 1-row batch, and only the round sizes, and counts of sequences in a
        # round, that the calibration proved to give the rows of 2-row rounds bit for bit
        # (backends/calibration.py): then drafts and questions read together leave every
        # output token unchanged. No size proved: no drafts.
        self.exact = exact
        self.calibration = calibration
        self.widths: frozenset[int] | None = None  # round sizes allowed (None: any)
        if exact and calibration is not None:
            self.widths = frozenset(calibration.widths)
            self.speculate = self.speculate and bool(self.widths)
        prices = calibration.price if calibration is not None else None
        self.policy = DraftPolicy(
            max_draft=min(MAX_DRAFT, n_batch - 2),
            min_rows=1 + exact,
            widths=self.widths,
            prices=prices,
        )
        self._batch = Batch(n_batch, sequences)
        self.engine_seconds = 0.0  # inside llama_decode, all calls together
        self._cached: dict[int, list[int]] = {}  # seq -> tokens at positions 0.. in the cache
        self._pieces = Pieces(self.vocab)
        self._live: list[Stream] = []  # replies in flight, in the order they started

    def close(self) -> None:
        self.cancel()
        self._batch.close()

    def forget(self, seq: int) -> None:
        """Empty one sequence's cache: a slot taken by another reading starts as it would
        in a fresh context (no prefix of the last reading's prompt is reused)."""
        llama_cpp.llama_memory_seq_rm(self.memory, seq, -1, -1)
        self._cached.pop(seq, None)

    def generate_many(self, requests: Sequence[Request]) -> list[Decoded]:
        """Reply to each request in its own sequence, all decoded together; the replies in
        the order of the requests."""
        if self._live:
            raise ValueError("replies are in flight already")
        ended: dict[int, Decoded] = {}
        try:
            for request in requests:
                self.start(request)
            while self._live:
                ended.update(self.step())
        except BaseException:
            self.cancel()
            raise
        return [ended[request.seq_id] for request in requests]

    @property
    def in_flight(self) -> int:
        """Replies started and not yet returned by `step()`."""
        return len(self._live)

    def start(self, request: Request) -> None:
        """Put `request`'s prompt in the cache of its sequence and sample the first token:
        from the next `step()` on, its reply is decoded along with every other in flight.

        Each prompt is prefilled on its own, in the pieces a lone reply would use, so every
        reply equals the one it gets alone (exact mode), whenever it joins the others."""
        if any(stream.seq_id == request.seq_id for stream in self._live):
            raise ValueError(f"sequence {request.seq_id} has a reply in flight already")
        if (len(self._live) + 1) * (1 + self.exact) > self.n_batch:  # a round fits one batch
            count = len(self._live) + 1
            raise ValueError(f"{count} sequences do not fit in a batch of {self.n_batch}")
        began, engine_before = time.perf_counter(), self.engine_seconds
        if request.fresh:
            self.forget(request.seq_id)
        stream = Stream(
            request.seq_id,
            list(request.prompt),
            request.max_tokens,
            Sampler(request.sampling),
            Lookup(request.prompt) if self.speculate else None,
            [s.encode("utf-8") for s in request.stops if s],
            began=began,
            engine_before=engine_before,
        )
        self._live.append(stream)  # from here on, cancel() closes its sampler
        stream.reused, row = self._prefill(stream)
        self._emit(stream, stream.sampler.sample(self.context, row))
        stream.prompt_seconds = time.perf_counter() - began

    def step(self) -> list[tuple[int, Decoded]]:
        """Decode one round of every reply in flight (none while a reply has just ended);
        returns the replies that ended, by sequence: those sequences take new requests."""
        if self._live and all(stream.finish is None for stream in self._live):
            live = list(self._live)
            before = [len(stream.tokens) for stream in live]
            size = self._round(live)
            for stream, count in zip(live, before, strict=True):
                stream.rounds.append((size, len(stream.tokens) - count))
        ended = [stream for stream in self._live if stream.finish is not None]
        self._live = [stream for stream in self._live if stream.finish is None]
        now = time.perf_counter()
        return [(stream.seq_id, self._end(stream, now)) for stream in ended]

    def cancel(self) -> None:
        """Drop every reply in flight (after Ctrl-C or a failure). Whatever their caches
        hold beyond the prompt's prefix already counted as cached, the next prefill in that
        sequence cuts."""
        for stream in self._live:
            stream.sampler.close()
        self._live = []

    def _end(self, stream: Stream, now: float) -> Decoded:
        """The reply of a finished stream; its sequence keeps the prompt only (the next
        call there may share its prefix)."""
        llama_cpp.llama_memory_seq_rm(self.memory, stream.seq_id, len(stream.prompt), -1)
        stream.sampler.close()
        text = bytes(stream.text if stream.cut < 0 else stream.text[: stream.cut])
        return Decoded(
            tokens=stream.tokens,
            text=text.decode("utf-8", errors="ignore"),
            finish_reason=stream.finish or "stop",
            prompt_tokens=len(stream.prompt),
            reused_tokens=stream.reused,
            prompt_seconds=stream.prompt_seconds,
            seconds=now - stream.began,
            drafted=stream.drafted,
            accepted=stream.accepted,
            engine_seconds=self.engine_seconds - stream.engine_before,
            rounds=stream.rounds,
        )

    def _prefill(self, stream: Stream) -> tuple[int, int]:
        """Put the prompt in the cache, reusing the prefix already there; returns the
        tokens reused and the batch row holding the last prompt token's logits."""
        seq, prompt = stream.seq_id, stream.prompt
        cached = self._cached.get(seq, [])
        keep = 0
        for a, b in zip(cached, prompt, strict=False):
            if a != b:
                break
            keep += 1
        keep = min(keep, len(prompt) - 1)  # the last prompt token must be decoded for logits
        if not llama_cpp.llama_memory_seq_rm(self.memory, seq, keep, -1):
            llama_cpp.llama_memory_seq_rm(self.memory, seq, -1, -1)
            keep = 0
        self._cached[seq] = prompt[:keep]
        batch, row = self._batch, 0
        for start in range(keep, len(prompt), self.n_batch):
            batch.clear()
            end = min(start + self.n_batch, len(prompt))
            for pos in range(start, end):
                row = batch.add(prompt[pos], pos, seq, pos == len(prompt) - 1)
            self._decode()
        self._cached[seq] = list(prompt)
        stream.pos = len(prompt)
        return keep, row

    def _decode(self) -> float:
        """Decode the batch; returns its seconds. In exact mode a lone row gets a throwaway
        second row (cut right after), to run on the batched kernels like every draft."""
        batch = self._batch
        pad = self.exact and batch.size == 1
        if pad:
            token, pos, seq = batch.first()
            batch.add(token, pos + 1, seq, False)
        began = time.perf_counter()
        batch.decode(self.context)
        seconds = time.perf_counter() - began
        self.engine_seconds += seconds
        if pad:
            llama_cpp.llama_memory_seq_rm(self.memory, seq, pos + 1, -1)
        return seconds

    def _emit(self, stream: Stream, token: int) -> bool:
        """Take one sampled token; False once the reply is finished."""
        if llama_cpp.llama_vocab_is_eog(self.vocab, token):
            stream.finish = "stop"
            return False
        stream.tokens.append(token)
        piece = self._pieces(token)
        stream.text += piece
        if stream.lookup is not None:
            stream.lookup.append(token)
        if stream.stops:
            window = len(piece) + max(len(s) for s in stream.stops)
            tail = bytes(stream.text[-window:])
            if any(s in tail for s in stream.stops):
                text = bytes(stream.text)
                stream.cut = next(text.index(s) for s in stream.stops if s in text)
                stream.finish = "stop"
                return False
        if len(stream.tokens) >= stream.max_tokens:
            stream.finish = "length"
            return False
        stream.pending = token
        return True

    def _round(self, streams: Sequence[Stream]) -> int:
        """Decode every unfinished stream's pending token and draft, in one batch (or one
        per group of sequences the calibration allows together), then keep what the target
        model agrees with. Returns the rows decoded."""
        policy = self.policy
        live = [s for s in streams if s.finish is None]
        room = self.n_batch // len(live) - 1  # draft rows per sequence (all get as many)
        proposals = []
        for stream in live:
            stream.draft, stream.source = [], 0
            proposal: list[int] = []
            if stream.lookup is not None and room > 0:
                # Never draft past the reply's token limit: the last token needs no decode.
                limit = min(stream.max_tokens - len(stream.tokens) - 1, room, policy.max_draft)
                proposal, stream.source = stream.lookup.propose(limit)
            proposals.append(proposal)
        rows = policy.rows([(s.source, len(p)) for s, p in zip(live, proposals, strict=True)])
        for stream, proposal in zip(live, proposals, strict=True):
            stream.draft = proposal[: rows - 1]
        sizes = [len(live)]
        if self.exact and self.calibration is not None:
            sizes = self.calibration.groups(len(live))
        size, start = 0, 0
        for count in sizes:
            size += self._group(live[start : start + count], rows)
            start += count
        return size

    def _group(self, live: Sequence[Stream], rows: int) -> int:
        """One llama_decode of `live`'s sequences, `rows` each; then verify each."""
        # Several sequences (each in its own KV stream): llama.cpp splits a batch into equal
        # parts per sequence, so all get as many rows, filled with their own drafts where
        # they have them, and in exact mode at least two, as a lone reply gets (one query
        # row per sequence runs other attention kernels and changes near-tie tokens).
        batch = self._batch
        batch.clear()
        if len(live) == 1:
            (stream,) = live
            if self.widths is not None:  # only a round size proved exact
                rows = max((w for w in self.widths if w <= 1 + len(stream.draft)), default=1)
                stream.draft = stream.draft[: rows - 1]
            rows = 1 + len(stream.draft)  # no padding rows: _decode pads a lone row itself
        elif self.exact:
            rows = max(rows, 2)
        pads = []
        for stream in live:
            stream.row = batch.add(stream.pending, stream.pos, stream.seq_id, True)
            for i, token in enumerate(stream.draft):
                batch.add(token, stream.pos + 1 + i, stream.seq_id, True)
            used = 1 + len(stream.draft)
            for i in range(used, rows):
                batch.add(stream.pending, stream.pos + i, stream.seq_id, False)
            if rows > used:
                pads.append((stream.seq_id, stream.pos + used))
        size = batch.size
        self.policy.record_batch(size // len(live), self._decode(), len(live))
        for seq, pos in pads:
            llama_cpp.llama_memory_seq_rm(self.memory, seq, pos, -1)
        for stream in live:
            self._verify(stream)
        return size

    def _verify(self, stream: Stream) -> None:
        """Sample at each drafted position while the samples equal the draft."""
        draft, base = stream.draft, stream.pos
        taken = 0
        for i in range(len(draft) + 1):
            token = stream.sampler.sample(self.context, stream.row + i)
            if not self._emit(stream, token):
                break
            if i < len(draft) and token == draft[i]:
                taken += 1
                continue
            # `token` is the next pending one; drafts after the mismatch leave the cache.
            stream.pos = base + i + 1
            if i < len(draft):
                llama_cpp.llama_memory_seq_rm(self.memory, stream.seq_id, stream.pos, -1)
            break
        if draft:
            stream.drafted += len(draft)
            stream.accepted += taken
            self.policy.record_draft(stream.source, len(draft), taken)
