"""`--exact` keeps its word on models where llama.cpp's rows change with the round's size
(real llama.cpp, tiny models built by memagent's converter): F16 and F32 weights, and a
hidden size of 256, where rounds of 2+ rows were measured to differ (docs/performance.md).
With the calibration (backends/calibration.py), drafts and questions read together change no
reply; with a calibration that claims every round size, as `--exact` assumed before it
measured, some reply changes: the negative control of the same checks.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
from pathlib import Path

import pytest
from support.models import DEEP_TINY_LAYERS, TINY_EOS_SCALE, TINY_SEED, TINY_SIZES
from support.story import FACT_QUESTION, story

from memagent_cli import protocol
from memagent_cli.backend import Call, Sampling
from memagent_cli.backends import calibration, calibration_store
from memagent_cli.backends.drafting import DraftPolicy, Lookup
from memagent_cli.backends.llama_cpp import LlamaCppBackend, LlamaOptions
from memagent_cli.trace import read_trace

pytestmark = pytest.mark.model

CONTEXT = 1024
# name -> (shape, dtype of the Hugging Face weights, GGUF type). 24 layers deep, as the
# negative control of tests/test_speculation.py: on 2 layers a changed logit rarely grows
# enough to change a token, so a fault could pass unseen.
DEEP = {"num_hidden_layers": DEEP_TINY_LAYERS}
VARIANTS = {
    "f16": (DEEP, "F16", "F16"),
    "f32": (DEEP, "F32", "F32"),
    "hidden256": (DEEP | {"hidden_size": 256, "intermediate_size": 512}, "BF16", "Q4_1"),
}
SEEDS = range(2)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("calibrated")


@pytest.fixture(autouse=True)
def _calibrations_here(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Calibrations kept in this module's data folder, measured once per model here."""
    monkeypatch.setenv("MEMAGENT_HOME", str(home))


# F16 proves what F32 does (no round size equal): `make test-real` runs it.
@pytest.fixture(
    scope="module",
    params=[pytest.param(v, marks=pytest.mark.slower) if v == "f16" else v for v in VARIANTS],
)
def variant(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from support import hf_model

    from memagent_cli.models.conversion import convert

    sizes, dtype, quant = VARIANTS[request.param]
    folder = tmp_path_factory.mktemp(request.param) / f"Tiny-{request.param}"
    eos = {("model.embed_tokens.weight", hf_model.EOS): TINY_EOS_SCALE}
    hf_model.build(folder, sizes=TINY_SIZES | sizes, seed=TINY_SEED, scale_rows=eos, dtype=dtype)
    return convert.convert(folder, folder.parent / f"{request.param}.gguf", quant)


def message(seed: int) -> str:
    return protocol.render_update(FACT_QUESTION, protocol.INITIAL_MEMORY, story(30, seed=seed))


def opened(path: Path, speculate: bool, sequences: int = 1) -> LlamaCppBackend:
    options = LlamaOptions(threads=2, gpu_layers=0, speculate=speculate, exact=True)
    backend = LlamaCppBackend(path, options)
    backend.prepare(CONTEXT, sequences)
    if speculate:  # drafts in every round they can go in: every round size is used
        assert backend.decoder is not None
        backend.decoder.policy = DraftPolicy(min_rows=2, fixed=16)
    return backend


class Draws:
    """The logits behind every sampler draw, by sampler (one per reply, in the order their
    first draws came): a draw per emitted token with or without drafts, so exact decoding
    gives the same list draw for draw. Far finer than the replies, which a changed logit
    alters only where it moves a draw."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import llama_cpp

        from memagent_cli.backends.llama_parts import Sampler

        self.seen: dict[object, list[bytes]] = {}
        sample = Sampler.sample

        def recorded(sampler, context, index):
            vocab = llama_cpp.llama_model_get_vocab(llama_cpp.llama_get_model(context))
            n = llama_cpp.llama_vocab_n_tokens(vocab)
            logits = ctypes.string_at(llama_cpp.llama_get_logits_ith(context, index), 4 * n)
            self.seen.setdefault(sampler, []).append(hashlib.sha256(logits).digest())
            return sample(sampler, context, index)

        monkeypatch.setattr(Sampler, "sample", recorded)

    def take(self) -> list[list[bytes]]:
        taken, self.seen = list(self.seen.values()), {}
        return taken


class Oracle:
    """Drafts that are the reply plain decoding gave (a random model's reply seldom repeats
    its prompt, so prompt lookup would draft little): every draft is accepted while the
    logits are unchanged, and rounds of every size verify it, every row drawn from."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.replies: dict[tuple[int, ...], list[int]] = {}
        start = Lookup.__init__

        def init(lookup: Lookup, tokens) -> None:
            start(lookup, tokens)
            lookup.prompt = tuple(tokens)  # type: ignore[attr-defined]

        def propose(lookup: Lookup, limit: int) -> tuple[list[int], int]:
            reply = self.replies.get(lookup.prompt, [])  # type: ignore[attr-defined]
            done = len(lookup.tokens) - len(lookup.prompt)  # type: ignore[attr-defined]
            return reply[done : done + max(limit, 0)], Lookup.ORDER

        monkeypatch.setattr(Lookup, "__init__", init)
        monkeypatch.setattr(Lookup, "propose", propose)


def changed_replies(path: Path, draws: Draws, oracle: Oracle) -> list[str]:
    """What `--exact` changed: replies with drafts against `--exact --no-speculate`, and
    two questions read together against each read alone, down to the logits of each draw."""
    plain, drafting = opened(path, False), opened(path, True)
    together = opened(path, True, sequences=2)
    changed = []
    for seed in SEEDS:
        sampling = Sampling(temperature=1.0, top_p=1.0, seed=seed)
        draws.take()
        alone = []
        for k in (0, 1):
            decoded = plain.decode(message(seed + k), max_tokens=32, sampling=sampling)
            oracle.replies[tuple(plain._chat_prompt(message(seed + k))[0])] = decoded.tokens
            alone.append(decoded)
        seen_alone = draws.take()
        drafted = drafting.decode(message(seed), max_tokens=32, sampling=sampling)
        if drafted.text != alone[0].text or draws.take() != seen_alone[:1]:
            changed.append(f"seed {seed}: drafts")
        calls = [Call(message(seed + k), 32, sequence=k, fresh=True) for k in (0, 1)]
        replies = together.decode_many(calls, sampling=sampling)
        seen_together = draws.take()
        for k, got in enumerate(replies):
            if got.text != alone[k].text or seen_together[k] != seen_alone[k]:
                changed.append(f"seed {seed}: question {k} together")
    return changed


def test_exact_replies_equal_plain_decoding_and_reading_alone(
    variant: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert changed_replies(variant, Draws(monkeypatch), Oracle(monkeypatch)) == []
    assert calibration_store.kept_for(variant)  # measured at the first use, kept for the next


def test_without_the_calibration_some_reply_changes(
    variant: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The negative control: the same checks, with a calibration that claims every round
    size and any count of sequences together."""
    monkeypatch.setattr(
        LlamaCppBackend, "calibrate", lambda self, *_: calibration.assumed(self.calibration_key())
    )
    changed = changed_replies(variant, Draws(monkeypatch), Oracle(monkeypatch))
    assert changed, "nothing changed: the check above could not fail here"


@pytest.mark.usefixtures("on_tiny_model")
def test_a_damaged_calibration_is_measured_again_and_the_trace_names_it(cli, env, tmp_path):
    """As a user meets it: a calibration file cut short is measured again with a one-line
    note, --recalibrate measures again, and the trace records the one each reading used."""
    (kept,) = (Path(env["MEMAGENT_HOME"]) / "calibrations").glob("*.json")  # the seeded one
    kept.write_text(kept.read_text()[:40])
    book = tmp_path / "book.txt"
    book.write_text(story(20, seed=3))
    steps = ["--chunk-tokens", "200", "--memory-tokens", "24", "--temperature", "0", "--json"]
    first = cli("ask", str(book), FACT_QUESTION, *steps)
    assert first.returncode == 0, first.stderr
    (note,) = [line for line in first.stderr.splitlines() if "cannot be used" in line]
    assert f"the calibration {kept} cannot be used (it is not JSON): measuring again" in note
    measured = calibration.parse(kept.read_bytes())
    assert json.loads(first.stdout)["settings"]["calibration"] == measured.record()
    marked = json.loads(kept.read_text()) | {"measured": "2000-01-01T00:00:00Z"}
    kept.write_text(json.dumps(marked))  # still sound: only --recalibrate replaces it
    again = cli("ask", str(book), FACT_QUESTION, *steps, "--recalibrate", "--no-reuse")
    assert again.returncode == 0 and "cannot be used" not in again.stderr
    remeasured = calibration.parse(kept.read_bytes())
    assert json.loads(again.stdout)["settings"]["calibration"] == remeasured.record()
    assert remeasured.measured != "2000-01-01T00:00:00Z"  # measured again, not read back
    # A trace header is written before the weights load: it names the calibration kept.
    third = json.loads(cli("ask", str(book), FACT_QUESTION, *steps, "--no-reuse").stdout)
    header = read_trace(Path(third["trace"])).header
    assert header.settings["calibration"] == remeasured.record()
