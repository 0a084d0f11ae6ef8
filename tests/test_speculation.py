"""Speculative memory copying changes no output token (real model, real llama.cpp).

Drafting is forced on (a fixed draft length) where the point is to run every verification
path: long accepted copies, early mismatches, rejected drafts cut from the KV cache.
Run under `flock /tmp/memagent-llama.lock`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.models import default_model_path, real_model_path
from support.story import FACT_QUESTION, story

from memagent_cli import protocol
from memagent_cli.backend import Generation, Sampling
from memagent_cli.backends.drafting import DraftPolicy
from memagent_cli.backends.llama_cpp import LlamaCppBackend, LlamaOptions

pytestmark = [pytest.mark.model, pytest.mark.usefixtures("on_tiny_model")]

CONTEXT = 2048
GREEDY = Sampling(temperature=0.0)
SEEDED = Sampling(temperature=0.7, top_p=0.95, seed=1234)


@pytest.fixture(autouse=True)
def _calibrations_kept_apart(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Calibrations measured here go to a data folder of the session's, not the user's."""
    monkeypatch.setenv("MEMAGENT_HOME", str(tmp_path_factory.getbasetemp() / "speculation-home"))


def _backend(
    speculate: bool, draft: int | None = None, exact: bool = True, path: Path | None = None
) -> LlamaCppBackend:
    backend = LlamaCppBackend(
        path or default_model_path(),
        LlamaOptions(threads=2, gpu_layers=0, speculate=speculate, exact=exact, flash_attn="off"),
    )
    backend.prepare(CONTEXT)
    if draft is not None:
        assert backend.decoder is not None
        backend.decoder.policy = DraftPolicy(fixed=draft)
    return backend


@pytest.fixture(scope="module")
def plain(tiny_model: Path) -> LlamaCppBackend:
    return _backend(speculate=False, path=tiny_model)


@pytest.fixture(scope="module")
def drafting(tiny_model: Path) -> LlamaCppBackend:
    return _backend(speculate=True, draft=8, path=tiny_model)


def copying() -> str:
    """An update whose previous memory is long: a memory update mostly rewrites it."""
    memory = story(14, seed=5)
    return protocol.render_update(FACT_QUESTION, memory, story(30, fact=None, seed=6))


def fresh(seed: int = 7) -> str:
    """A first update: nothing to copy but the chunk."""
    return protocol.render_update(FACT_QUESTION, protocol.INITIAL_MEMORY, story(40, seed=seed))


def same(a: Generation, b: Generation) -> None:
    assert a.text == b.text
    assert (a.completion_tokens, a.finish_reason) == (b.completion_tokens, b.finish_reason)
    assert a.prompt_tokens == b.prompt_tokens


@pytest.mark.parametrize("message", [copying, fresh], ids=["copying", "fresh"])
def test_greedy_output_is_plain_decoding(
    plain: LlamaCppBackend, drafting: LlamaCppBackend, message
) -> None:
    expected = plain.generate(message(), max_tokens=256, sampling=GREEDY)
    got = drafting.generate(message(), max_tokens=256, sampling=GREEDY)
    same(got, expected)
    assert expected.drafted == 0
    assert got.drafted > 0 and 0 <= got.accepted <= got.drafted


@pytest.mark.parametrize("message", [copying, fresh], ids=["copying", "fresh"])
def test_seeded_sampling_is_plain_decoding(
    plain: LlamaCppBackend, drafting: LlamaCppBackend, message
) -> None:
    expected = plain.generate(message(), max_tokens=200, sampling=SEEDED)
    got = drafting.generate(message(), max_tokens=200, sampling=SEEDED)
    same(got, expected)
    assert got.drafted > 0
    # The seed matters: another seed samples another reply (guards against greedy sneaking in).
    other = plain.generate(
        message(), max_tokens=200, sampling=Sampling(temperature=0.7, top_p=0.95, seed=99)
    )
    assert other.text != expected.text


def test_many_rejected_drafts_leave_no_trace(
    plain: LlamaCppBackend, drafting: LlamaCppBackend
) -> None:
    """Long drafts on replies that do not copy (sampled at a high temperature, from a nearly
    flat distribution): most are cut; each cut must leave the KV cache exactly as plain
    decoding has it, or later tokens would differ."""
    assert drafting.decoder is not None
    drafting.decoder.policy = DraftPolicy(fixed=16)
    rejected = 0
    try:
        for seed in range(40):
            sampling = Sampling(temperature=4.0, top_p=1.0, seed=seed)
            expected = plain.generate(fresh(seed), max_tokens=96, sampling=sampling)
            got = drafting.generate(fresh(seed), max_tokens=96, sampling=sampling)
            same(got, expected)
            rejected += got.drafted - got.accepted
            if rejected >= 48:
                break
    finally:
        drafting.decoder.policy = DraftPolicy(fixed=8)
    assert rejected >= 48
    # The next call reuses the cached prompt prefix after all those cuts.
    same(
        drafting.generate(copying(), max_tokens=128, sampling=GREEDY),
        plain.generate(copying(), max_tokens=128, sampling=GREEDY),
    )


@pytest.mark.real_model
def test_a_copying_reply_accepts_long_drafts() -> None:
    """What speculation is for: a memory update that copies the old memory accepts most of
    its drafts (SmolLM2-135M: 222 of 261 on 256 tokens), and the reply is plain decoding's."""
    path = real_model_path()
    expected = _backend(speculate=False, path=path).generate(
        copying(), max_tokens=256, sampling=GREEDY
    )
    got = _backend(speculate=True, draft=8, path=path).generate(
        copying(), max_tokens=256, sampling=GREEDY
    )
    same(got, expected)
    assert got.accepted >= got.drafted // 2 and got.accepted >= 64
    assert got.accepted < got.drafted  # and some were rejected: both paths ran


@pytest.mark.slower  # 13 s: make test-real runs it
def test_forced_drafts_change_some_reply_without_exact_and_none_with_it(
    deep_tiny_model: Path,
) -> None:
    """The negative control of the equality tests, on a random model deep enough for
    llama.cpp's single-row and batched kernels to change tokens: without --exact a verified
    draft runs on the batched kernels and a plain token on the single-row ones, and some
    reply differs (5 of 8 on 2 AVX-512 cores); with --exact none does."""
    single = _backend(speculate=False, exact=False, path=deep_tiny_model)
    forced = _backend(speculate=True, draft=8, exact=False, path=deep_tiny_model)
    plain_exact = _backend(speculate=False, exact=True, path=deep_tiny_model)
    forced_exact = _backend(speculate=True, draft=8, exact=True, path=deep_tiny_model)
    differ = []
    # --exact's side on 4 seeds; the control's until a reply changes, up to 16 seeds (another
    # CPU's kernels may change fewer: here 5 of the first 8 change, the first at seed 0).
    for seed in range(16):
        sampling = Sampling(temperature=0.7, top_p=0.95, seed=seed)
        if seed < 4:
            same(
                forced_exact.generate(fresh(seed), max_tokens=64, sampling=sampling),
                plain_exact.generate(fresh(seed), max_tokens=64, sampling=sampling),
            )
        if not any(differ):
            a = single.generate(fresh(seed), max_tokens=64, sampling=sampling)
            b = forced.generate(fresh(seed), max_tokens=64, sampling=sampling)
            assert b.drafted > 0 or a.text == b.text  # a change comes from a verified draft
            differ.append(a.text != b.text)
        elif seed >= 4:
            break
    assert any(differ), "no reply changed: the equality tests could not see a fault"


@pytest.mark.real_model
def test_without_exact_forced_drafts_change_some_reply() -> None:
    """The negative control of the equality tests: without --exact, a verified draft runs on
    llama.cpp's batched kernels and a plain token on its single-row ones, and with the real
    model some replies differ (seeds 0, 1: both, on 2 cores), greedy as the trained model
    decodes: the real model's check of the control above."""
    path = real_model_path()
    single = _backend(speculate=False, exact=False, path=path)
    forced = _backend(speculate=True, draft=8, exact=False, path=path)
    differ = []
    for seed in (0, 1, 2, 7):
        a = single.generate(fresh(seed), max_tokens=64, sampling=GREEDY)
        b = forced.generate(fresh(seed), max_tokens=64, sampling=GREEDY)
        differ.append(a.text != b.text)
    assert any(differ), "no reply changed: the equality tests could not see a fault"


def test_default_speculation_equals_plain(plain: LlamaCppBackend) -> None:
    """The default, adaptive draft length: whatever it decides, the output is plain's."""
    ours = _backend(speculate=True)
    for message in (copying(), fresh()):
        for sampling in (GREEDY, SEEDED):
            same(
                ours.generate(message, max_tokens=64, sampling=sampling),
                plain.generate(message, max_tokens=64, sampling=sampling),
            )
            # The time inside llama_decode lies within the call's (the bench's loop share).
            decoded = ours.decode(message, max_tokens=64, sampling=sampling)
            assert 0 < decoded.engine_seconds <= decoded.seconds


def test_single_row_decoding_equals_create_completion(plain: LlamaCppBackend) -> None:
    """Without the exact mode's padding, the loop is llama-cpp-python's create_completion
    with memagent's sampling (no top-k, min-p or repeat penalty): same tokens, same stops.
    (Exact mode differs from it at near-ties: llama.cpp's 1-row kernels are not its
    batched ones.)"""
    from llama_cpp import Llama

    from memagent_cli.backends.build import placement_for
    from memagent_cli.backends.llama_patches import placed_weights

    ours = _backend(speculate=False, exact=False)
    with placed_weights(placement_for(default_model_path())):  # as memagent loads it
        llm = Llama(
            model_path=str(default_model_path()),
            n_ctx=CONTEXT,
            n_batch=512,
            n_threads=2,
            n_threads_batch=2,
            flash_attn=False,
            verbose=False,
        )
    for message in (copying(), fresh()):
        prompt, stop = plain._chat_prompt(message)
        result = llm.create_completion(
            prompt=prompt,
            max_tokens=128,
            temperature=0.0,
            top_p=0.95,
            top_k=0,
            min_p=0.0,
            repeat_penalty=1.0,
            stop=stop,
        )
        got = ours.generate(message, max_tokens=128, sampling=GREEDY)
        choice = result["choices"][0]
        assert got.text == choice["text"]
        assert got.completion_tokens == result["usage"]["completion_tokens"]
        assert got.finish_reason == choice["finish_reason"]
    llm.close()


def test_quantized_cache_with_flash_attention_runs(capsys) -> None:
    """-fa on -ctk q8_0 -ctv q8_0 take effect (llama.cpp says so in its log) and decode."""
    backend = LlamaCppBackend(
        default_model_path(),
        LlamaOptions(
            threads=2,
            gpu_layers=0,
            flash_attn="on",
            cache_type_k="q8_0",
            cache_type_v="q8_0",
            verbose=True,
        ),
    )
    backend.prepare(1024)
    reply = backend.generate(fresh(), max_tokens=32, sampling=GREEDY)
    log = capsys.readouterr().err
    assert re.search(r"flash_attn += enabled", log)
    assert re.search(r"K \(q8_0\): +[0-9.]+ MiB, V \(q8_0\): +[0-9.]+ MiB", log)
    assert 0 < reply.completion_tokens <= 32 and reply.finish_reason in ("stop", "length")
