"""The tests' fixtures, each requested by name. Shared helpers are in tests/support/."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from support.command import InProcess, run_memagent
from support.models import BOTH_MODELS, DEEP_TINY_LAYERS, build_tiny, real_model_path

# A suite started as a shell script's background job inherits SIGINT ignored, and so would
# every `memagent` it starts (Python keeps an inherited SIG_IGN, as a shell expects): the
# tests of Ctrl-C would see it ignored. A terminal's foreground process has the default.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session", autouse=True)
def _no_user_data_folder(tmp_path_factory: pytest.TempPathFactory):
    """What the suite does in this process (a backend built in-process keeps its calibration
    in the data folder) lands in folders of its own, never in the user's: XDG's, which
    platformdirs follows here and tests that name folders override. A test's `env` names
    its own for the commands it starts."""
    home = tmp_path_factory.mktemp("user")
    names = ("XDG_DATA_HOME", "XDG_CACHE_HOME")
    saved = {name: os.environ.get(name) for name in names}
    for name in names:
        os.environ[name] = str(home / name.lower())
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model (support/models.py), made once a session by memagent's own converter
    (under a second). $MEMAGENT_TEST_TINY_MODEL names one made already, for a machine
    without the test material that makes it (the GPU machine of docs/development.md)."""
    if made := os.environ.get("MEMAGENT_TEST_TINY_MODEL"):
        return Path(made)
    folder = tmp_path_factory.mktemp("tiny") / "Tiny-Qwen2"
    return build_tiny(folder, folder.parent / "tiny-qwen2.Q4_1.gguf")


@pytest.fixture(scope="session")
def deep_tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's widths and seed, 24 layers deep (28 MB, made in about a second)."""
    folder = tmp_path_factory.mktemp("deep-tiny") / "Deep-Tiny-Qwen2"
    return build_tiny(folder, folder.parent / "deep-tiny-qwen2.Q4_1.gguf", DEEP_TINY_LAYERS)


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


@pytest.fixture
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache folder of the test's own (documents extracted before are not reused)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The environment of a user with no settings of their own and a private data folder."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MEMAGENT_")}
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
    clean["COLUMNS"] = "120"
    return clean


@pytest.fixture
def on_tiny_model(
    tiny_model: Path,
    tiny_calibrations: Path,
    env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> Path:
    """The test reads with the tiny model: $MEMAGENT_MODEL names it in this process and in
    `env`, so the command, the library and default_model_path() all find it. The data
    folder of `env` starts with the tiny model's calibration, as a user's holds it after a
    first reading."""
    from memagent_cli.files import private_folder

    monkeypatch.setenv("MEMAGENT_MODEL", str(tiny_model))
    env["MEMAGENT_MODEL"] = str(tiny_model)
    kept = Path(env["MEMAGENT_HOME"]) / tiny_calibrations.name
    private_folder(kept)  # 0700, as memagent makes it
    for file in tiny_calibrations.iterdir():
        shutil.copy(file, kept / file.name)
    return tiny_model


@pytest.fixture
def memagent(env: dict[str, str]):
    """Run the installed `memagent` command as a user would; returns the finished process."""

    def run(
        *args: str, input: str | None = None, timeout: float = 900, umask: int = -1
    ) -> subprocess.CompletedProcess:
        return run_memagent(env, *args, input=input, timeout=timeout, umask=umask)

    return run


@pytest.fixture
def cli(env: dict[str, str], memagent) -> InProcess:
    """`memagent` in this process: for tests that make many calls that need no process."""
    return InProcess(env, memagent)


@pytest.fixture(scope="module", params=BOTH_MODELS)
def model_file(request: pytest.FixtureRequest) -> Path:
    """The model a module's shared runs read with: tiny, or the real default model."""
    if request.param == "tiny":
        return request.getfixturevalue("tiny_model")
    return real_model_path()


@pytest.fixture
def on_model_file(model_file: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test reads with `model_file` (tiny, or the real default model), named by
    $MEMAGENT_MODEL as `on_tiny_model` names the tiny one."""
    monkeypatch.setenv("MEMAGENT_MODEL", str(model_file))
    env["MEMAGENT_MODEL"] = str(model_file)
    return model_file


@pytest.fixture
def fake_server():
    """An OpenAI-compatible server on 127.0.0.1 with a deterministic stand-in model."""
    from support.fake_openai import FakeServer

    with FakeServer() as server:
        yield server
