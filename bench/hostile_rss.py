"""Peak RSS of `memagent ask` against a server whose replies are made to cost memory: the
figures of docs/reliability.md's "What a server reply can cost".

    python bench/hostile_rss.py [--repeats 3]

The stand-in server of tests/support/fake_openai.py on 127.0.0.1 answers one path with a
reply written byte for byte (its `Raw`), made of `{},{},...`, the JSON that makes the most
Python objects of each byte: a model list or a completion far over its bound (60 MiB), or
just within it (memagent_cli/backends/openai/client.py). `memagent ask` reads a 2,400-word
text with `--chunk-tokens 300 --memory-tokens 64` in a child process, and its peak RSS is
the kernel's ru_maxrss for that child (os.wait4). A child's ru_maxrss is at least what its
parent held when it was started (Linux keeps the larger across exec), so the server, which
holds its reply, runs in a process of its own, and the process that starts `memagent`
stays small: its RSS is printed too. Each case runs `--repeats` times; a run that ends
otherwise than its case says (refused unread, or read and parsed) is marked NO. No model
loads: the stand-in answers at once.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

from village import story  # noqa: E402

MEMAGENT = Path(sys.executable).with_name("memagent")
QUESTION = "What is the secret password for the vault?"
SENTENCES = 238  # about 2,400 words
MEMORY_TOKENS = 64  # an update's max_tokens (reader.py), so what a completion may hold
STEPS = ["--chunk-tokens", "300", "--memory-tokens", str(MEMORY_TOKENS), "--temperature", "0"]
HUGE = 60 << 20
# (what the server sends, the path it sends it at, how big, whether memagent must refuse it
# unread); sizes by name, known only in the server's process (`replies`).
CASES = [
    ("nothing hostile (the run answers)", None, None, False),
    ("a 60 MiB model list", "/v1/models", "huge", True),
    ("a 60 MiB completion", "/v1/chat/completions", "huge", True),
    ("a model list just within its bound", "/v1/models", "bound", False),
    (f"a completion just within its bound ({MEMORY_TOKENS} tokens)", "/v1/chat/completions",
     "bound", False),
]  # fmt: skip
REFUSED = "sent more than"  # what memagent says of a reply over its bound


def note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def rss_mib() -> float:
    """This process's resident memory now."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGESIZE") / 2**20


def empty_objects(before: bytes, size: int, after: bytes) -> bytes:
    """JSON of at most `size` bytes, nearly all `{},{},...` between `before` and `after`:
    json.loads makes about 25 bytes of Python objects of each byte, the most any JSON makes."""
    count = (size - len(before) - len(after) + 1) // 3
    return before + b"{}," * (count - 1) + b"{}" + after


def serve(index: int) -> None:
    """Run the stand-in server with case `index`'s reply: print its URL and the reply's
    size as one JSON line, and serve until stdin closes."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests"))
    from support.fake_openai import FakeServer, Raw

    from memagent_cli.backends.openai.backend import _BYTES_PER_TOKEN
    from memagent_cli.backends.openai.client import MOST_REPLY_BYTES, SHORT_REPLY_BYTES

    _, path, size, _ = CASES[index]
    bound = MOST_REPLY_BYTES if path == "/v1/models" else (
        SHORT_REPLY_BYTES + _BYTES_PER_TOKEN * MEMORY_TOKENS
    )  # fmt: skip
    raw = {}
    if path is not None:
        before = b'{"data": [' if path == "/v1/models" else b'{"choices": ['
        raw[path] = Raw(empty_objects(before, HUGE if size == "huge" else bound, b"]}"))
    with FakeServer(raw=raw) as server:
        sent = len(raw[path].body) if path is not None else 0
        print(json.dumps({"url": server.url, "bytes": sent, "bound": bound}), flush=True)
        sys.stdin.read()


def run_ask(document: Path, index: int, home: Path) -> dict[str, Any]:
    """`memagent ask` on `document` against a stand-in answering as case `index` says: its
    exit status, what it said on stderr, its peak RSS, and this process's RSS then."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMAGENT_")}
    env["MEMAGENT_HOME"] = str(home)  # nothing of the user's data folder read or kept
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(index)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    assert server.stdin is not None and server.stdout is not None
    try:
        served = json.loads(server.stdout.readline())
        command = [
            str(MEMAGENT), "ask", str(document), QUESTION, "--backend", "openai",
            "--base-url", served["url"], *STEPS, "-q",
        ]  # fmt: skip
        spawner = rss_mib()
        began = time.perf_counter()
        with tempfile.TemporaryFile() as stderr:
            child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, env=env)
            _, status, usage = os.wait4(child.pid, 0)
            child.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
            seconds = time.perf_counter() - began
            stderr.seek(0)
            lines = stderr.read().decode("utf-8", errors="replace").strip().splitlines()
    finally:
        server.stdin.close()
        server.wait(timeout=30)
    errors = [line for line in lines if line.startswith("error:")]
    said = (errors or lines or [""])[0]
    return {
        "exit": child.returncode,
        "said": said.replace(str(document.parent), "$TMPDIR"),
        "seconds": seconds,
        "peak_rss_mib": usage.ru_maxrss / 1024,  # KiB on Linux
        "spawner_rss_mib": spawner,
        **served,
    }


def as_expected(index: int, run: dict[str, Any]) -> bool:
    """Answered where nothing is hostile; else an error, which names the bound exactly
    where the reply was over it (refused unread), and not where it was read and parsed."""
    _, path, _, refused = CASES[index]
    if path is None:
        return run["exit"] == 0
    return run["exit"] != 0 and (REFUSED in run["said"]) == refused


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each case")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the server's process
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve)
        return
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average {load}")
    text = story(SENTENCES)
    print(
        f"memagent ask on {len(text.split()):,} words, {' '.join(STEPS)}, against "
        "tests/support/fake_openai.py on 127.0.0.1 (in a process of its own); replies of "
        f"{{}},{{}},...; peak RSS (ru_maxrss of the child) of {args.repeats} runs each"
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="memagent-hostile-") as folder:
        document = Path(folder) / "village.txt"
        document.write_text(text)
        for index, (label, *_) in enumerate(CASES):
            runs = []
            for n in range(args.repeats):
                run = run_ask(document, index, Path(folder) / f"home-{index}-{n}")
                note(
                    f"  {label}: exit {run['exit']}, {run['peak_rss_mib']:.1f} MiB, "
                    f"{run['seconds']:.1f} s: {run['said'][:160]}"
                )
                runs.append(run)
            rows.append((index, runs))
    spawner = max(run["spawner_rss_mib"] for _, runs in rows for run in runs)
    print(f"the process that started each run held at most {spawner:.0f} MiB then")
    print()
    print(f"| the server sends | reply bytes (bound) | peak RSS MiB, median ({args.repeats} "
          "runs) | as the case says |")  # fmt: skip
    print("|---|---:|---:|---|")
    for index, runs in rows:
        label, path, _, refused = CASES[index]
        peaks = [r["peak_rss_mib"] for r in runs]
        each = ", ".join(f"{p:.0f}" for p in peaks)
        ok = "yes" if all(as_expected(index, r) for r in runs) else "NO"
        size = f"{runs[0]['bytes']:,} ({runs[0]['bound']:,})" if path else "-"
        how = "answered" if path is None else "refused unread" if refused else "read, parsed"
        print(f"| {label} | {size} | {statistics.median(peaks):.0f} ({each}) | {ok}: {how} |")
    print()
    print("what each case's last run said first on stderr (its error):")
    for index, runs in rows:
        print(f"  {CASES[index][0]}: exit {runs[-1]['exit']}: {runs[-1]['said'][:300]}")


if __name__ == "__main__":
    main()
