"""`make install`'s logic, without installing anything: it checks the Python first, keys
the llama.cpp wheel folder by that Python's machine, and installs OCR in a step of its own
that may fail. Runs make with -n, or with a Python that stops it before any build."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def make(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(cwd), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def fake_python(folder: Path, name: str, setup: str) -> Path:
    """A `python` that runs this one after `setup` (an old version, another machine)."""
    path = folder / name
    path.write_text(
        f'#!/bin/sh\nexec {sys.executable} -c "{setup}; import sys; code = sys.argv[2]; '
        'sys.argv = sys.argv[2:]; exec(code)" "$@"\n'
    )
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("kind", ["false", "python3.9", "32-bit"])
def test_install_stops_at_once_without_a_64_bit_python_3_11(tmp_path, kind):
    python = {
        "false": Path("/bin/false"),
        "python3.9": fake_python(tmp_path, "python3.9", "import sys; sys.version_info = (3, 9, 6)"),
        "32-bit": fake_python(tmp_path, "python32", "import struct; struct.calcsize = lambda f: 4"),
    }[kind]
    venv = tmp_path / "venv"
    started = time.monotonic()
    result = make(f"PYTHON={python}", f"VENV={venv}", "install")
    assert time.monotonic() - started < 10
    assert result.returncode != 0
    assert "64-bit Python 3.11 or newer" in result.stderr and "PYTHON=" in result.stderr
    assert not venv.exists()


def test_the_python_check_comes_before_anything_is_built():
    lines = make("-n", "install").stdout.splitlines()
    check = next(i for i, line in enumerate(lines) if "sys.version_info < (3, 11)" in line)
    venv = next(i for i, line in enumerate(lines) if "-m venv" in line)
    assert check < venv


def test_the_wheel_folder_is_named_after_the_pythons_machine(tmp_path):
    # As a Rosetta (x86-64) Python on an arm64 Mac: the shell and Python disagree.
    shell = os.uname().machine
    other = "arm64" if shell != "arm64" else "x86_64"
    python = fake_python(
        tmp_path, "python3", f"import platform; platform.machine = lambda: '{other}'"
    )
    mine = re.search(r"llama-cpp-python/([^/ ]+)/", make("-n", "install").stdout)
    theirs = re.search(
        r"llama-cpp-python/([^/ ]+)/", make("-n", "install", f"PYTHON={python}").stdout
    )
    assert mine and theirs
    assert mine.group(1).startswith(f"{shell}-") and theirs.group(1).startswith(f"{other}-")


def test_ocr_is_a_step_of_its_own():
    lines = make("-n", "install").stdout.splitlines()
    installs = [line for line in lines if "pip install -e" in line]
    assert any("'.[server]'" in line for line in installs), installs
    assert any("'.[ocr]'" in line for line in installs), installs
    assert not any("server" in line and "ocr" in line for line in installs), installs


def test_an_ocr_step_that_fails_warns_and_the_install_goes_on(tmp_path):
    # tesserocr 2.13+ has no wheel for macOS 14 on Apple silicon: pip fails there (and here,
    # offline, for want of an index: a failure all the same).
    download = (
        f"{sys.executable} -m pip download --quiet --platform macosx_14_0_arm64 --only-binary "
        f":all: --no-deps --retries 0 --timeout 10 -d {tmp_path} 'tesserocr>=2.13'"
    )
    result = make("install-ocr", f"OCR_INSTALL={download}")
    assert result.returncode == 0, result.stderr
    assert "warning: OCR (the ocr extra) could not be installed" in result.stderr
    assert not list(tmp_path.glob("*.whl"))


def test_the_test_material_installs_only_the_wheels_whose_hashes_are_pinned(tmp_path):
    """The test material's packages are no project's own, and a wheel runs code at every
    Python start through a .pth file: pip installs them in hash-checking mode, wheels only,
    from tests/material.txt, and no other step names them."""
    import tomllib

    from support import qwen_material

    lines = make("-n", f"VENV={tmp_path / 'venv'}", f"{tmp_path / 'venv'}/.dev").stdout.splitlines()
    hashed = [line for line in lines if "tests/material.txt" in line]
    assert len(hashed) == 1, lines
    for flag in ("--require-hashes", "--no-deps", "--only-binary :all:"):
        assert flag in hashed[0], hashed[0]
    assert not any("pandas-sns" in line for line in lines)

    text = (ROOT / "tests" / "material.txt").read_text()
    pinned = dict(
        re.findall(r"^([a-z0-9-]+)==([0-9.]+) \\\n\s+--hash=sha256:[0-9a-f]{64}$", text, re.M)
    )
    assert pinned == {name: qwen_material.VERSION for name in qwen_material.PACKAGES}
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = [r for group in extras["optional-dependencies"].values() for r in group]
    assert not [r for r in listed if r.startswith("pandas-sns")]
