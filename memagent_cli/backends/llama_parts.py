"""Thin owners of llama.cpp's C objects for the decoding loop: the sampler chain, a reusable
batch, and token pieces. Each wraps one ctypes API of llama-cpp-python and nothing more."""

from __future__ import annotations

import ctypes
import math
from collections.abc import Iterable, Sequence

import llama_cpp

from memagent_cli.backend import Sampling

# The sampler chain, in order, as the trace header records it (backends/llama_cpp.py
# `describe`): vLLM's and SGLang's (which ran MemAgent and ReMemR1) divide the logits by the
# temperature first, then take the nucleus of that sharpened distribution, then draw. Their
# top-k and min-p are off by default, as here. llama.cpp's common chain (and llama-cpp-python's
# create_completion) puts top-p before the temperature, which keeps more candidates.
CHAIN = "temperature, top-p, dist (greedy at temperature 0)"


class Sampler:
    """llama.cpp's sampler chain as memagent configures it (CHAIN): temperature, top-p,
    seeded draw; greedy at temperature 0. Drafts are verified by the same chain."""

    def __init__(self, sampling: Sampling) -> None:
        params = llama_cpp.llama_sampler_chain_default_params()
        params.no_perf = True
        self._chain = llama_cpp.llama_sampler_chain_init(params)
        if sampling.temperature <= 0:
            self._add(llama_cpp.llama_sampler_init_greedy())
        else:
            seed = llama_cpp.LLAMA_DEFAULT_SEED if sampling.seed is None else sampling.seed
            self._add(llama_cpp.llama_sampler_init_temp(sampling.temperature))
            self._add(llama_cpp.llama_sampler_init_top_p(sampling.top_p, 1))
            self._add(llama_cpp.llama_sampler_init_dist(seed & 0xFFFFFFFF))

    def _add(self, sampler: llama_cpp.llama_sampler_p) -> None:
        llama_cpp.llama_sampler_chain_add(self._chain, sampler)

    def candidates(self, logits: Sequence[float]) -> dict[int, float]:
        """What the chain keeps of `logits` (one per token id) before its draw, each token
        with the probability the draw gives it; greedy keeps the best token alone."""
        size = len(logits)
        data = (llama_cpp.llama_token_data * size)()
        for token, logit in enumerate(logits):
            data[token].id, data[token].logit, data[token].p = token, float(logit), 0.0
        array = llama_cpp.llama_token_data_array(data, size, -1, False)
        steps = llama_cpp.llama_sampler_chain_n(self._chain)
        for step in range(steps):
            sampler = llama_cpp.llama_sampler_chain_get(self._chain, step)
            if step == steps - 1 and llama_cpp.llama_sampler_name(sampler) != b"greedy":
                break  # the draw
            llama_cpp.llama_sampler_apply(sampler, ctypes.byref(array))
        if array.selected >= 0:
            return {int(array.data[array.selected].id): 1.0}
        kept = {int(array.data[i].id): float(array.data[i].logit) for i in range(array.size)}
        top = max(kept.values())
        weights = {token: math.exp(logit - top) for token, logit in kept.items()}
        total = math.fsum(weights.values())
        return {token: weight / total for token, weight in weights.items()}

    def sample(self, context: llama_cpp.llama_context_p, index: int) -> int:
        """One draw from the logits of batch row `index` of the last decode."""
        return int(llama_cpp.llama_sampler_sample(self._chain, context, index))

    def close(self) -> None:
        llama_cpp.llama_sampler_free(self._chain)


class Batch:
    """A reusable llama_batch: tokens at positions in sequences, and which rows need logits."""

    def __init__(self, capacity: int, sequences: int = 1) -> None:
        self.capacity = capacity
        self._batch = llama_cpp.llama_batch_init(capacity, 0, sequences)
        self.size = 0

    def clear(self) -> None:
        self.size = 0
        self._batch.n_tokens = 0

    def add(self, token: int, pos: int, seq_id: int, logits: bool) -> int:
        """Append one token; returns its row, the index of its logits after decoding."""
        batch, row = self._batch, self.size
        batch.token[row] = token
        batch.pos[row] = pos
        batch.n_seq_id[row] = 1
        batch.seq_id[row][0] = seq_id
        batch.logits[row] = logits
        self.size += 1
        batch.n_tokens = self.size
        return row

    def first(self) -> tuple[int, int, int]:
        """Token, position and sequence of the first row."""
        batch = self._batch
        return int(batch.token[0]), int(batch.pos[0]), int(batch.seq_id[0][0])

    def decode(self, context: llama_cpp.llama_context_p) -> None:
        status = llama_cpp.llama_decode(context, self._batch)
        if status != 0:
            raise RuntimeError(f"llama_decode failed with status {status} ({self.size} tokens)")
        llama_cpp.llama_synchronize(context)

    def close(self) -> None:
        llama_cpp.llama_batch_free(self._batch)


def piece(vocab: llama_cpp.llama_vocab_p, token: int, special: bool = False) -> bytes:
    """The bytes of one token, however long: a piece that does not fit the buffer is asked
    for again at the length llama.cpp gives back (its negative return). llama-cpp-python's
    own detokenize uses a 32-byte buffer and drops every longer piece (runs of 33 or more
    spaces, `=`, `-`: hundreds of tokens of Qwen2's vocabulary)."""
    buffer = ctypes.create_string_buffer(64)
    n = llama_cpp.llama_token_to_piece(vocab, token, buffer, 64, 0, special)
    if n < 0:
        buffer = ctypes.create_string_buffer(-n)
        n = llama_cpp.llama_token_to_piece(vocab, token, buffer, -n, 0, special)
    if n < 0:
        raise RuntimeError(f"llama.cpp gave no piece for token {token} ({n})")
    return buffer.raw[:n]


class Pieces:
    """The bytes of each token, looked up once (a reply's text is the join of its pieces);
    with `special`, control tokens' text too."""

    def __init__(self, vocab: llama_cpp.llama_vocab_p, special: bool = False) -> None:
        self.vocab, self.special = vocab, special
        self._pieces: dict[int, bytes] = {}

    def __call__(self, token: int) -> bytes:
        found = self._pieces.get(token)
        if found is None:
            found = self._pieces[token] = piece(self.vocab, token, self.special)
        return found

    def join(self, tokens: Iterable[int]) -> bytes:
        """The bytes of `tokens`, every piece whole."""
        return b"".join(map(self, tokens))
