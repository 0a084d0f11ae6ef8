"""Shared helpers: run the real `memagent` command, and build real documents."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

MEMAGENT = Path(sys.executable).with_name("memagent")

# A suite started as a shell script's background job inherits SIGINT ignored, and so would
# every `memagent` it starts (Python keeps an inherited SIG_IGN, as a shell expects): the
# tests of Ctrl-C would see it ignored. A terminal's foreground process has the default.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
# The README's example document; tests import FACT and story from here.
from village import FACT, story  # noqa: E402, F401

from memagent_cli.backend import InTurn  # noqa: E402

FACT_QUESTION = "What is the secret password for the vault?"
FACT_VALUE = "PELICAN"


# The property tests' model: Qwen2's shape and real tokenizer and chat template, random
# weights, Q4_1 as the default model, a head size of 32 (llama.cpp's q8_0 KV cache needs a
# multiple of 32). Properties hold for any model, so none of them needs trained weights.
TINY_SIZES = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
TINY_SEED = 7
# A random model rarely ends a reply, so every final answer would run to the protocol's 1,024
# tokens. A longer <|im_end|> row in the (tied) embeddings makes it end most replies after
# 10-60 tokens (measured on a few MemAgent prompts): short calls, and both finish reasons.
TINY_EOS_SCALE = 2.6


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model, made once a session by memagent's own converter (under a second).
    $MEMAGENT_TEST_TINY_MODEL names one made already, for a machine without the test
    material that makes it (the GPU machine of docs/development.md)."""
    if made := os.environ.get("MEMAGENT_TEST_TINY_MODEL"):
        return Path(made)
    import hf_model

    from memagent_cli.models.conversion import convert

    folder = tmp_path_factory.mktemp("tiny") / "Tiny-Qwen2"
    eos = {("model.embed_tokens.weight", hf_model.EOS): TINY_EOS_SCALE}
    hf_model.build(folder, sizes=TINY_SIZES, seed=TINY_SEED, scale_rows=eos)
    return convert.convert(folder, folder.parent / "tiny-qwen2.Q4_1.gguf", "Q4_1")


# The tiny model with 24 layers for the negative control (tests/test_speculation.py): on 2
# layers llama.cpp's single-row and batched kernels give the same logits (bench/widths.py),
# on 24 the small differences grow until some tokens change, as they do in a trained model.
DEEP_TINY_LAYERS = 24


@pytest.fixture(scope="session")
def deep_tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's widths and seed, 24 layers deep (28 MB, made in about a second)."""
    import hf_model

    from memagent_cli.models.conversion import convert

    folder = tmp_path_factory.mktemp("deep-tiny") / "Deep-Tiny-Qwen2"
    eos = {("model.embed_tokens.weight", hf_model.EOS): TINY_EOS_SCALE}
    sizes = TINY_SIZES | {"num_hidden_layers": DEEP_TINY_LAYERS}
    hf_model.build(folder, sizes=sizes, seed=TINY_SEED, scale_rows=eos)
    return convert.convert(folder, folder.parent / "deep-tiny-qwen2.Q4_1.gguf", "Q4_1")


@pytest.fixture(scope="session")
def tiny_calibrations(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's calibration with the engine's defaults (backends/calibration.py),
    measured once a session: every model test's data folder starts with it, as a user's
    holds it after a first reading, so that only the tests of the calibration measure."""
    from memagent_cli.backends.llama_cpp import LlamaCppBackend

    home = tmp_path_factory.mktemp("tiny-calibrated")
    saved = os.environ.get("MEMAGENT_HOME")
    os.environ["MEMAGENT_HOME"] = str(home)
    try:
        LlamaCppBackend(tiny_model).prepare(256)  # measures, and keeps it under `home`
    finally:
        if saved is None:
            del os.environ["MEMAGENT_HOME"]
        else:
            os.environ["MEMAGENT_HOME"] = saved
    return home / "calibrations"


def _tiny_for(request: pytest.FixtureRequest) -> str | None:
    """The tiny model's path where the test is a model test not marked real_model."""
    node = request.node
    if node.get_closest_marker("model") and not node.get_closest_marker("real_model"):
        return str(request.getfixturevalue("tiny_model"))
    return None


@pytest.fixture(autouse=True)
def _model_under_test(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model test reads with the tiny model unless it is marked real_model: through
    $MEMAGENT_MODEL, so the command, the library and default_model_path() all find it."""
    if tiny := _tiny_for(request):
        monkeypatch.setenv("MEMAGENT_MODEL", tiny)


@pytest.fixture
def env(tmp_path: Path, request: pytest.FixtureRequest) -> dict[str, str]:
    """The environment of a user with no settings of their own and a private data folder
    (in a model test, $MEMAGENT_MODEL names the model under test)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MEMAGENT_")}
    if tiny := _tiny_for(request):
        clean["MEMAGENT_MODEL"] = tiny
    # Settings memagent also reads: the OpenAI SDK's, and one that tests counting tokens in
    # this process set.
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "TIKTOKEN_CACHE_DIR"):
        clean.pop(name, None)
    # $MEMAGENT_HOME moves all of memagent's folders: platformdirs ignores XDG_* on Windows
    # (and older releases on macOS). Data lands where XDG_DATA_HOME would put it;
    # the cache is $MEMAGENT_HOME/cache. XDG_* still keep other libraries' files here.
    clean["XDG_DATA_HOME"] = str(tmp_path / "data")
    clean["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    clean["MEMAGENT_HOME"] = str(tmp_path / "data" / "memagent")
    if tiny:
        from memagent_cli.files import private_folder

        kept = request.getfixturevalue("tiny_calibrations")
        private_folder(Path(clean["MEMAGENT_HOME"]) / kept.name)  # 0700, as memagent makes it
        for file in kept.iterdir():
            shutil.copy(file, Path(clean["MEMAGENT_HOME"]) / kept.name / file.name)
    clean["COLUMNS"] = "120"
    return clean


@pytest.fixture
def memagent(env: dict[str, str]):
    """Run the installed `memagent` command as a user would; returns the finished process."""

    def run(
        *args: str, input: str | None = None, timeout: float = 900, umask: int = -1
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(MEMAGENT), *args],
            input=input if input is not None else "",
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            umask=umask,  # -1: this process's
        )

    return run


class _InProcess:
    """`memagent` run inside the test's process through Typer's test runner: the same
    commands, options and exit codes as the installed command, without starting Python and
    importing memagent again for each call (0.6 s each, most of the time of tests that make
    dozens of calls). What only a process has stays with `memagent`: the console script,
    `crash.install()`, signals, and a time limit (a call given `timeout` runs as a process)."""

    def __init__(self, env: dict[str, str], process) -> None:
        self.env = env
        self.process = process

    def __call__(
        self, *args: str, input: str | None = None, timeout: float | None = None
    ) -> subprocess.CompletedProcess:
        if timeout is not None:
            return self.process(*args, input=input, timeout=timeout)
        from typer.testing import CliRunner

        from memagent_cli.cli import app

        saved, argv = dict(os.environ), sys.argv
        sigterm = signal.getsignal(signal.SIGTERM)
        os.environ.clear()
        os.environ.update(self.env)
        sys.argv = [str(MEMAGENT), *args]  # the "resume with:" hint repeats the command line
        try:
            result = CliRunner().invoke(app, list(args), input=input or "", prog_name="memagent")
        finally:
            os.environ.clear()
            os.environ.update(saved)
            sys.argv = argv
            signal.signal(signal.SIGTERM, sigterm)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception  # a traceback the installed command would have printed
        return subprocess.CompletedProcess(
            ["memagent", *args], result.exit_code, result.stdout, result.stderr
        )


@pytest.fixture
def cli(env: dict[str, str], memagent) -> _InProcess:
    """`memagent` in this process: for tests that make many calls that need no process."""
    return _InProcess(env, memagent)


def default_model_path() -> Path:
    """The model under test: the tiny one in a model test, else the default model."""
    from memagent_cli import models

    return models.resolve(None).path


def real_model_path() -> Path:
    """The real default model (SmolLM2-135M), whatever $MEMAGENT_MODEL says."""
    from memagent_cli.models import registry

    found = registry.find_file(registry.default_name() or "")
    assert found is not None, "the default model is not installed: make install"
    return found


# A test (or module fixture) parametrized by this runs on the tiny model in `make test` and
# on the real default model in `make test-real`.
BOTH_MODELS = ["tiny", pytest.param("real", marks=pytest.mark.real_model)]


@pytest.fixture(scope="module", params=BOTH_MODELS)
def model_file(request: pytest.FixtureRequest) -> Path:
    """The model a module's shared runs read with: tiny, or the real default model."""
    if request.param == "tiny":
        return request.getfixturevalue("tiny_model")
    return real_model_path()


def words(text: str) -> str:
    """`text` with its whitespace collapsed, as a check of what a user reads."""
    return " ".join(text.split())


def assert_clean_failure(result: subprocess.CompletedProcess, code: int, *phrases: str) -> None:
    """One clear message on stderr, nothing on stdout, no traceback."""
    assert result.returncode == code, result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    for phrase in phrases:
        assert phrase in words(result.stderr), result.stderr


class ScriptedBackend(InTurn):
    """A backend that replies from a script, one token per byte: for unit tests of the loop
    and the run, with no model. `replies` run out: KeyboardInterrupt, as Ctrl-C would."""

    name = "scripted"

    def __init__(self, replies: list[str], context_limit: int = 8192) -> None:
        self.replies = list(replies)
        self.messages: list[tuple[str, int]] = []
        self.context_limit = context_limit
        self.prepared = 0
        self.sequences = 1
        self.fits = 8  # sequences one prepare() could hold
        self.rounds: list[list[int]] = []  # the sequences of each next_replies() call

    def tokenize(self, text: str) -> list[int]:
        return list(text.encode())

    def detokenize(self, tokens) -> bytes:
        return bytes(tokens)

    def chat_overhead(self) -> int:
        return 10

    def describe(self):
        from memagent_cli.backend import Description

        model = {"path": "/models/scripted.gguf", "name": "scripted", "size": 1234}
        return Description(model=model, engine={"backend": "scripted"})

    def sequences_that_fit(self, context_tokens: int) -> int:
        return self.fits

    def prepare(self, context_tokens: int, sequences: int = 1, progress=None) -> None:
        self.prepared += 1
        self.sequences = sequences

    def generate(self, message: str, *, max_tokens: int, sampling):
        from memagent_cli.backend import Generation

        if not self.replies:
            raise KeyboardInterrupt
        self.messages.append((message, max_tokens))
        text = self.replies.pop(0)
        return Generation(text, len(message), len(text.split()) + 2, 0.1, 0.2, "stop")

    def next_replies(self, calls, *, sampling):
        self.rounds.append(sorted(call.sequence for call in calls))
        return super().next_replies(calls, sampling=sampling)


@pytest.fixture
def fake_server():
    """An OpenAI-compatible server on 127.0.0.1 with a deterministic stand-in model."""
    from fake_openai import FakeServer

    with FakeServer() as server:
        yield server


def served(server, *args: str) -> list[str]:
    """`ask` options that read through `server` (the fake one) instead of a GGUF."""
    return ["--backend", "openai", "--base-url", server.url, *args]


def interrupt_after_steps(
    args: list[str],
    trace_path: Path,
    env: dict[str, str],
    steps: int,
    sig: int = signal.SIGINT,
    interrupt=None,
) -> tuple[subprocess.Popen, str, str]:
    """Start `memagent ask ARGS`, send `sig` (or call `interrupt(process)`) once `steps` steps
    are in its trace (as a terminal delivers Ctrl-C: to a process started from Python), and
    let it end."""
    process = subprocess.Popen(
        [str(MEMAGENT), "ask", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        try:  # memagent probes that it can write the trace: the file may come and go once
            if trace_path.read_text().count('"type": "step"') >= steps:
                break
        except FileNotFoundError:
            pass
        time.sleep(0.05)
    if interrupt is None:
        process.send_signal(sig)
    else:
        interrupt(process)
    stdout, stderr = process.communicate(timeout=180)
    return process, stdout, stderr


def use_hub(env: dict[str, str], server, hf_home: Path) -> None:
    """Point `env`'s user at a fake Hugging Face Hub, with no token, proxy or offline mode."""
    env.update(
        HF_ENDPOINT=server.url,
        HF_HOME=str(hf_home),
        HF_HUB_DISABLE_TELEMETRY="1",
        NO_PROXY="127.0.0.1,localhost",
    )
    for name in ("HF_TOKEN", "HF_HUB_OFFLINE", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env.pop(name, None)
        env.pop(name.lower(), None)
