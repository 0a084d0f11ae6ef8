"""Limits in memory and in work that hold for any input: a GGUF header costs no more memory
than its size, and is parsed once per run."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

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

import pytest
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
    from support.models import default_model_path

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


# -- word diffs -------------------------------------------------------------------------------

# Memories of 1,000 words, few of them distinct: difflib's matcher, autojunk off, took 5 to
# 15 s for each pair (a 6-step trace: 32 s in `trace`, 63 s in `trace --html`).
FEW_WORDS = [
    " ".join(["a"] * 1000),
    " ".join(["a", "b"] * 500),
    " ".join(["a", "b", "c"] * 333),
    " ".join(["a", "c", "b"] * 333),
    " ".join(["a", "a", "b"] * 333),
    "\n".join(" ".join(["a", "b", "a"] * 10) for _ in range(33)),
]
WORK = 40_000_000  # for the 32 diffs below (14 million here); unbounded, 1.5 billion


@pytest.fixture
def few_words_trace(cli, fake_server, tmp_path) -> Path:
    """A 6-step trace whose memories are FEW_WORDS."""
    from support.fake_openai import served
    from support.story import FACT_QUESTION, story

    doc = tmp_path / "village.txt"
    doc.write_text(story(200))
    trace = tmp_path / "run.jsonl"
    args = ["--chunk-tokens", "300", "--memory-tokens", "64", "--temperature", "0"]
    ask = cli("ask", str(doc), FACT_QUESTION, *served(fake_server, *args, "--trace", str(trace)))
    assert ask.returncode == 0, ask.stderr
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    steps = [r for r in lines if r.get("type") == "step"]
    assert len(steps) >= 6
    for record, memory in zip(steps, FEW_WORDS, strict=False):
        record["memory"] = memory
    trace.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return trace


def test_word_diffs_of_a_trace_are_bounded_in_work(cli, few_words_trace, monkeypatch) -> None:
    """Work counted as difflib's matcher does it (each word of one side, and each place its
    word occurs in the other, at every search), across all the diffs a view makes."""
    import difflib

    work = 0
    find = difflib.SequenceMatcher.find_longest_match

    def counted(self, alo=0, ahi=None, blo=0, bhi=None):
        nonlocal work
        ahi = len(self.a) if ahi is None else ahi
        work += ahi - alo + sum(len(self.b2j.get(self.a[i], ())) for i in range(alo, ahi))
        assert work < WORK, "unbounded"  # fails at once, not after minutes
        return find(self, alo, ahi, blo, len(self.b) if bhi is None else bhi)

    monkeypatch.setattr(difflib.SequenceMatcher, "find_longest_match", counted)
    html = few_words_trace.with_suffix(".html")
    for args in ([], ["--diff", "2"], ["--diff", "6"], ["--html", str(html)]):
        result = cli("trace", str(few_words_trace), *args)
        assert result.returncode == 0, result.stderr
    print(f"matcher work: {work:,}")
    # The diff is still a diff: step 2 adds the b's and keeps the a's.
    shown = cli("trace", str(few_words_trace), "--diff", "2").stdout
    assert "b" in shown and "a" in shown


def test_a_trace_of_a_million_bad_lines_is_said_in_a_few_lines(cli, few_words_trace) -> None:
    """Each line that is no record was one warning: a million of them took minutes to print
    (an 8 MB file), and each was kept in memory. The first few are said, the rest counted."""
    lines = few_words_trace.read_text().splitlines(keepends=True)
    few_words_trace.write_text(lines[0] + "garbage\n" * 1_000_000 + "".join(lines[1:]))

    for args in ([], ["--json"]):
        result = cli("trace", str(few_words_trace), *args, timeout=60)  # 130 s before
        assert result.returncode == 0, result.stderr
        assert len(result.stderr.splitlines()) < 30, result.stderr[-500:]
        assert "999,980 more problems like these are not listed" in result.stderr
    problems = json.loads(result.stdout)["problems"]
    assert len(problems) == 21 and problems[0] == "line 2 is not a trace record and was skipped"


# -- the machine's share ----------------------------------------------------------------------


@pytest.fixture
def one_cpu():
    """This process pinned to one CPU (as `taskset -c 0` or a container's cpuset would)."""
    if not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2:
        pytest.skip("needs a system with CPU affinity and two CPUs")
    before = os.sched_getaffinity(0)  # a test worker's share under make test: one CPU already
    os.sched_setaffinity(0, {min(before)})
    yield
    os.sched_setaffinity(0, before)


def test_ocr_and_llama_cpp_use_the_cpus_this_process_may_use(one_cpu, monkeypatch) -> None:
    """Not the host's cores: a 2-CPU container on a 64-core host started 64 Tesseracts."""
    import concurrent.futures

    from support import builders

    from memagent_cli.backends.llama_cpp import physical_cores
    from memagent_cli.documents import ocr
    from memagent_cli.run.inspect import ocr_estimate

    started = []
    pool = concurrent.futures.ThreadPoolExecutor
    monkeypatch.setattr(
        concurrent.futures,
        "ThreadPoolExecutor",
        lambda workers, **kw: started.append(workers) or pool(workers, **kw),
    )
    from PIL import Image

    scan = builders.image_pdf([Image.new("L", (200, 200), 255)], 100)
    engine = ocr.open_engine(ocr.OcrOptions(), "scan.pdf")
    assert [p.index for p in ocr.recognize(scan, None, [0], engine)] == [0]
    assert started == [1]
    assert ocr_estimate(10)["cores"] == 1
    assert physical_cores() == 1


CGROUP_V2 = "0::/user.slice/run.scope\n"
CGROUP_V1 = "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n"


@pytest.mark.parametrize(
    "cgroup, files, cpus",
    [
        (CGROUP_V2, {"cpu.max": "max 100000\n"}, None),
        (CGROUP_V2, {"user.slice/run.scope/cpu.max": "200000 100000\n"}, 2),
        (CGROUP_V2, {"user.slice/run.scope/cpu.max": "150000 100000\n"}, 1),  # 1.5: one
        (CGROUP_V2, {"user.slice/run.scope/cpu.max": "50000 100000\n"}, 1),  # half: one
        # The tightest quota on the way up counts: a container in a slice of 3 CPUs.
        (CGROUP_V2, {"user.slice/cpu.max": "300000 100000", "cpu.max": "max 100000"}, 3),
        ("0::/\n", {"cpu.max": "400000 100000\n"}, 4),  # a container's own namespace
        (
            CGROUP_V1,
            {
                "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "200000\n",
                "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
            },
            2,
        ),  # fmt: skip
        (
            CGROUP_V1,
            {
                "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "-1\n",
                "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
            },
            None,
        ),  # fmt: skip
        ("1:cpu:/\n", {"cpu/cpu.cfs_quota_us": "300000", "cpu/cpu.cfs_period_us": "100000"}, 3),
        (CGROUP_V2, {"user.slice/run.scope/cpu.max": "garbage"}, None),
        # A quota past what a float holds is no limit, not an OverflowError.
        (CGROUP_V2, {"user.slice/run.scope/cpu.max": f"{10**400} 100000"}, None),
        ("1:cpu:/\n", {"cpu/cpu.cfs_quota_us": str(10**400), "cpu/cpu.cfs_period_us": "1"}, None),
        ("", {}, None),
    ],
)
def test_a_cgroup_quota_limits_the_cpus(tmp_path: Path, cgroup: str, files: dict, cpus) -> None:
    from memagent_cli.cpus import cgroup_cpus

    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cgroup_cpus(cgroup, tmp_path) == cpus
