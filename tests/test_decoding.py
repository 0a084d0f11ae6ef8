"""The decoding loop's pure parts: prompt-lookup drafts, the adaptive draft length, and
engine settings llama.cpp would refuse or cannot keep. No model's weights are loaded."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from memagent_cli.backend import Sampling
from memagent_cli.backends import llama_cpp as llama_cpp_backend
from memagent_cli.backends.drafting import DraftPolicy, Lookup
from memagent_cli.backends.llama_cpp import LlamaCppBackend, LlamaOptions
from memagent_cli.errors import ModelError
from memagent_cli.run import engine


def test_lookup_proposes_what_followed_the_longest_match() -> None:
    # "1 2 3" was followed by 4 5 6; "3" alone was last followed by 9.
    lookup = Lookup([7, 1, 2, 3, 4, 5, 6, 3, 9, 8])
    for token in (1, 2, 3):
        lookup.append(token)
    assert lookup.propose(3) == ([4, 5, 6], 3)
    assert lookup.propose(10)[0] == [4, 5, 6, 3, 9, 8, 1, 2, 3]


def test_lookup_follows_a_copy_and_drops_it_on_a_mismatch() -> None:
    lookup = Lookup([5, 1, 2, 3, 4, 5, 6, 7])
    for token in (1, 2, 3):
        lookup.append(token)
    assert lookup.propose(2) == ([4, 5], 3)
    lookup.append(4)
    assert lookup.propose(2) == ([5, 6], 3)
    lookup.append(99)  # the reply leaves the copy; 99 occurs nowhere before
    assert lookup.propose(4) == ([], 0)


def test_lookup_without_any_match_proposes_nothing() -> None:
    lookup = Lookup([1, 2, 3])
    lookup.append(42)
    assert lookup.propose(4) == ([], 0)
    assert lookup.propose(0) == ([], 0)


def policy_with(
    single: float, batch: dict[int, float], acceptance: float, min_rows: int = 2
) -> DraftPolicy:
    """A policy that measured these batch costs and drafts accepted at this rate: by
    default an exact decoder's (every round a batch), where measured costs choose."""
    policy = DraftPolicy(min_rows=min_rows)
    for _ in range(20):
        policy.record_batch(1, single)
        for size, seconds in batch.items():
            policy.record_batch(size, seconds)
    accepted = round(acceptance / (1 - acceptance))  # then one rejection: rate `acceptance`
    for _ in range(30):
        policy.record_draft(3, accepted + 1, accepted)
    return policy


def test_cheap_batches_and_good_drafts_draft_long() -> None:
    # A GPU-like engine: 9 tokens cost 1.1 of one.
    policy = policy_with(0.01, {9: 0.011}, acceptance=0.9)
    assert policy.length(3, 16) >= 8


def test_compute_bound_batches_switch_drafting_off() -> None:
    # Each drafted token beyond the free second row costs a full decode: nothing longer pays.
    policy = policy_with(0.01, {3: 0.03, 9: 0.09}, acceptance=0.5)
    lengths = [policy.length(3, 8) for _ in range(2000)]
    probes = [n for n in lengths if n > 1]
    assert lengths.count(1) > 1900  # the row sent anyway
    assert probes and all(n in DraftPolicy.PROBE_LENGTHS for n in probes)
    # Probes back off: far fewer than one per 32 rounds.
    assert len(probes) < len(lengths) / 100


def test_poor_drafts_on_a_cpu_are_not_sent_but_for_probes() -> None:
    """Where one row is allowed, a CPU's price per row (about 0.6 of a round) makes drafts
    accepted half the time cost more than they give."""
    policy = policy_with(0.01, {}, acceptance=0.5, min_rows=1)
    lengths = [policy.length(3, 8) for _ in range(2000)]
    probes = [n for n in lengths if n]
    assert probes and all(n in DraftPolicy.PROBE_LENGTHS for n in probes)
    assert len(probes) < len(lengths) / 100


def test_unmeasured_costs_are_assumed_expensive() -> None:
    policy = DraftPolicy(min_rows=2)
    assert policy.cost(5) == 4.0  # each row beyond the two a full round
    assert policy.length(3, 8) == 1  # the second row is sent anyway


def test_where_one_row_is_allowed_draft_lengths_follow_counts_never_timings() -> None:
    """A 1-row decode runs other kernels than a batch in llama.cpp, so lengths that followed
    timings could make a greedy rerun differ from its first run: two machines' timings, the
    same acceptance, the same lengths, probes included."""
    gpu_like = policy_with(0.01, {2: 0.0101, 9: 0.011}, acceptance=0.8, min_rows=1)
    cpu_like = policy_with(0.01, {2: 0.03, 9: 0.09}, acceptance=0.8, min_rows=1)
    lengths = []
    for i in range(3000):
        source, available = 1 + i % 3, i % 11
        a, b = gpu_like.length(source, available), cpu_like.length(source, available)
        assert a == b, i
        lengths.append(a)
        accepted = min(a, i % 4)
        for policy in (gpu_like, cpu_like):
            policy.record_batch(a + 1, 0.01 * (1 + a) * (1 + i % 2))
            if a:
                policy.record_draft(source, a, accepted)
    assert 0 in lengths and max(lengths) > 1  # some rounds draft, some do not
    # The price decides: the same drafts, accepted half the time, pay only where rows are cheap.
    cheap = DraftPolicy(price=0.05)
    for _ in range(30):
        cheap.record_draft(3, 2, 1)
    assert cheap.length(3, 8) > DraftPolicy().length(3, 8) == 0


def test_fixed_draft_length_is_capped_by_the_proposal() -> None:
    policy = DraftPolicy(fixed=8)
    assert policy.length(1, 3) == 3
    assert policy.length(0, 3) == 0


def test_several_sequences_share_one_draft_length_priced_for_their_round() -> None:
    """Every sequence of a round gets as many rows as the longest draft, so the length is
    chosen once, from costs measured for that many sequences (not for one)."""
    policy = DraftPolicy(min_rows=2)
    for _ in range(20):
        policy.record_batch(2, 0.010)  # one sequence: 9 rows cost 1.1x 2 rows (GPU-like)
        policy.record_batch(9, 0.011)
        policy.record_batch(2, 0.030, sequences=4)  # four: 9 rows each cost 4.5x 2 each
        policy.record_batch(9, 0.135, sequences=4)
    for _ in range(30):
        policy.record_draft(3, 9, 8)  # acceptance about 0.9
    alone = policy.length(3, 8)
    together = policy.rows([(3, 8), (0, 0), (0, 0), (0, 0)])
    assert alone == 8 and together == 2  # the second row, sent anyway, is free
    # Cheap for four as well, and every sequence has a good draft: all draft long.
    for _ in range(20):
        policy.record_batch(9, 0.033, sequences=4)
    assert policy.rows([(3, 8)] * 4) == 9
    # The rows come from the longest proposal; a sequence without one adds one token.
    assert policy.rows([(3, 5), (0, 0), (0, 0), (0, 0)]) <= 6


def test_unmeasured_sequence_counts_are_assumed_expensive() -> None:
    policy = DraftPolicy(min_rows=2)
    for _ in range(20):
        policy.record_batch(2, 0.010)
        policy.record_batch(9, 0.011)
    for _ in range(30):
        policy.record_draft(3, 9, 8)
    assert policy.cost(9, sequences=3) == 8.0  # each row a full round, until measured
    assert policy.rows([(3, 8)] * 3) == 2


def test_quantized_v_cache_needs_flash_attention(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="quantized V cache"):
        LlamaCppBackend(
            tmp_path / "none.gguf",
            LlamaOptions(threads=1, gpu_layers=0, flash_attn="off", cache_type_v="q8_0"),
        )
    with pytest.raises(ModelError, match="cache type"):
        LlamaCppBackend(
            tmp_path / "none.gguf", LlamaOptions(threads=1, gpu_layers=0, cache_type_k="q3")
        )


@pytest.mark.parametrize(
    "exact, gpu_layers, warned",
    [(True, None, True), (True, 0, False), (False, None, False)],
)
def test_exact_with_layers_on_a_gpu_says_it_is_exact_on_the_cpu_only(
    monkeypatch, tiny_model, exact: bool, gpu_layers: int | None, warned: bool
) -> None:
    # As a CUDA or Metal build of llama.cpp would answer: its vocabulary loads as on a CPU.
    monkeypatch.setattr(llama_cpp_backend, "can_offload", lambda: True)
    monkeypatch.setattr(engine, "can_offload", lambda: True)
    notes: list[str] = []
    # The tiny model of tests/conftest.py: this test needs no installed model.
    llama = LlamaOptions(exact=exact, gpu_layers=gpu_layers)
    options = engine.BackendOptions(model=str(tiny_model), llama=llama)
    backend = engine.open_backend(options, note=notes.append)
    assert backend.gpu_layers == (-1 if gpu_layers is None else gpu_layers)  # all layers
    said = [n for n in notes if "--exact is byte-exact on the CPU only" in n]
    assert len(said) == warned


# --- sampling, as the authors' engines sample ---------------------------------------------


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max())
    return shifted / shifted.sum()


def vllm_candidates(logits: list[float], temperature: float, top_p: float) -> dict[int, float]:
    """vLLM's sampler (v1/sample/sampler.py, ops/topk_topp_sampler.py `apply_top_k_top_p`),
    which ran MemAgent, in numpy: the logits divided by the temperature, sorted ascending,
    every token whose cumulative probability from the bottom is at most 1 - top_p masked
    (never the best), then the probabilities of what is left. SGLang, which ran ReMemR1,
    keeps the same set: the temperature first, then top-p of the sharpened distribution."""
    scaled = np.asarray(logits, dtype=np.float32) / np.float32(temperature)
    order = np.argsort(scaled, kind="stable")
    ranked = scaled[order]
    masked = np.cumsum(softmax(ranked.astype(np.float64))) <= 1 - top_p
    masked[-1] = False
    ranked[masked] = -np.inf
    kept = np.empty_like(scaled)
    kept[order] = ranked
    probabilities = softmax(kept.astype(np.float64))
    return {int(token): float(p) for token, p in enumerate(probabilities) if p > 0}


def held_against_vllm(logits: list[float], temperature: float, top_p: float) -> None:
    from memagent_cli.backends.llama_parts import Sampler

    sampler = Sampler(Sampling(temperature, top_p, seed=1))
    try:
        ours = sampler.candidates(logits)
    finally:
        sampler.close()
    theirs = vllm_candidates(logits, temperature, top_p)
    assert sorted(ours) == sorted(theirs)
    for token, p in theirs.items():
        assert ours[token] == pytest.approx(p, rel=1e-4, abs=1e-7)


def test_the_sampler_keeps_what_vllm_keeps_one_token_at_090_and_ten_at_001():
    """The issue's case: vLLM sharpens first (0.7), so the nucleus (0.95) is the first token
    alone; top-p on the raw distribution kept six and drew another 0.8% of the time."""
    logits = [math.log(0.90)] + [math.log(0.01)] * 10
    held_against_vllm(logits, 0.7, 0.95)
    from memagent_cli.backends.llama_parts import Sampler

    assert Sampler(Sampling(0.7, 0.95)).candidates(logits) == {0: 1.0}


@pytest.mark.parametrize(
    ("temperature", "top_p"), [(0.7, 0.95), (1.0, 0.9), (0.5, 0.5), (1.3, 0.99), (0.7, 1.0)]
)
def test_the_sampler_keeps_what_vllm_keeps_on_random_logits(temperature, top_p):
    rng = np.random.default_rng(47)
    for _ in range(5):
        logits = (rng.standard_normal(2000) * 3).tolist()
        held_against_vllm(logits, temperature, top_p)


def test_a_greedy_sampler_keeps_the_best_token_alone():
    from memagent_cli.backends.llama_parts import Sampler

    assert Sampler(Sampling(0.0, 0.95)).candidates([0.5, 2.0, 1.0]) == {1: 1.0}
