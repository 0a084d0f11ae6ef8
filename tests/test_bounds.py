"""Limits in memory and in work that hold for any input: a GGUF header costs no more memory
than its size, and is parsed once per run."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

# -- GGUF headers -----------------------------------------------------------------------------


def many_tensors_gguf(path: Path, count: int) -> Path:
    """A valid GGUF whose header lists `count` one-float tensors, all sharing the same four
    bytes of data: 32 bytes of header each, the most tensors a file of its size can list."""
    arch = b"general.architecture"
    pairs = struct.pack("<Q", len(arch)) + arch + struct.pack("<IQ", 8, 5) + b"llama"
    tensor = struct.pack("<QIQIQ", 0, 1, 1, 0, 0)  # no name, 1 dim of 1, F32, at offset 0
    header = b"GGUF" + struct.pack("<IQQ", 3, count, 1) + pairs + tensor * count
    path.write_bytes(header + bytes(-len(header) % 32 + 32))
    return path


MEASURE = """
import json, resource, sys, tracemalloc
from pathlib import Path
import gguf  # noqa: F401  (numpy, imported by any read: not the header's cost)
from memagent_cli.models import gguf
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
tracemalloc.start()
info = gguf.read(Path(sys.argv[1]))
traced = tracemalloc.get_traced_memory()[1]
tracemalloc.stop()
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"tensors": info.tensors, "traced": traced, "rss": after - before}))
"""


def test_a_gguf_header_costs_no_more_memory_than_its_size(tmp_path: Path) -> None:
    """docs/reliability.md: Python objects for a header's tensor list took 11x the file."""
    path = many_tensors_gguf(tmp_path / "many.gguf", 100_000)
    size = path.stat().st_size
    run = subprocess.run(
        [sys.executable, "-c", MEASURE, str(path)], capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr
    measured = json.loads(run.stdout)
    print(f"{size / 2**20:.1f} MiB header: {measured}")
    assert measured["tensors"] == 100_000
    # The header's pages are mapped, not copied: the Python objects stay a few of them.
    assert measured["traced"] < 2**20
    assert measured["rss"] < size


def test_a_model_header_is_parsed_once_per_version_of_the_file(tmp_path, monkeypatch) -> None:
    """A run checks the model (run/engine.py), may list or describe it, and on a CPU with
    AMX reads its tensor list (backends/build.py): one parse for all, a new one once the
    file changes."""
    from conftest import default_model_path

    from memagent_cli import gguf_header
    from memagent_cli.backends import build
    from memagent_cli.models import gguf, local

    path = tmp_path / "model.gguf"
    path.write_bytes(default_model_path().read_bytes())
    parsed = []
    parse = gguf_header.parse
    monkeypatch.setattr(gguf_header, "parse", lambda data: parsed.append(1) or parse(data))

    first = gguf.read(path)
    assert gguf.read(path) == first
    assert local.describe(str(path)).info == first
    assert len(list(build.gguf_tensors(path))) == first.tensors
    assert len(parsed) == 1

    path.write_bytes(path.read_bytes())  # the same bytes, written again: a new version
    os.utime(path, ns=(0, 0))
    assert gguf.read(path) == first and len(parsed) == 2
