"""Peak RSS of a real `memagent ask` as the document grows (the target: flat within 5%).

Each text (plain story sentences, about 11 model tokens each) is written to a temporary
file and read by `memagent ask` in a child process, which is stopped with SIGINT once its
trace holds `steps` finished steps; its peak RSS is the kernel's ru_maxrss for the child
(os.wait4), so the benchmark's own memory never counts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from village import story

TOKENS_PER_SENTENCE = 11
QUESTION = "What is the secret password for the vault?"
TARGET = 0.05  # the largest text's peak RSS at most 5% above the smallest's


def note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _trace_state(path: Path) -> tuple[int, dict[str, Any] | None]:
    """Finished steps in the trace so far, and its header once written."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return 0, None
    steps, header = 0, None
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line being written
            continue
        if record.get("type") == "header":
            header = record
        elif record.get("type") == "step":
            steps += 1
    return steps, header


def ask_peak_rss(
    memagent: Path, document: Path, trace: Path, steps: int, timeout: float
) -> dict[str, Any]:
    """Run `memagent ask` on `document` until its trace holds `steps` steps, then SIGINT."""
    command = [
        str(memagent), "ask", str(document), QUESTION, "--no-reuse", "--memory-tokens", "128",
        "--temperature", "0", "-q", "--trace", str(trace),
    ]  # fmt: skip
    began = time.perf_counter()
    with tempfile.TemporaryFile() as stderr:
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
        pid = 0
        while time.perf_counter() - began < timeout:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:  # ended on its own: an error, or a text shorter than `steps` chunks
                break
            if _trace_state(trace)[0] >= steps:
                child.send_signal(signal.SIGINT)
                break
            time.sleep(0.2)
        else:
            child.kill()
        if not pid:
            _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        stderr.seek(0)
        errors = stderr.read().decode("utf-8", errors="replace").strip()
    done, header = _trace_state(trace)
    document_record = (header or {}).get("document", {})
    return {
        "file_bytes": document.stat().st_size,
        "tokens": document_record.get("tokens"),
        "chunks": document_record.get("chunks"),
        "steps": done,
        "exit_code": child.returncode,
        "seconds": time.perf_counter() - began,
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "stderr": errors[-2000:],
    }


def peak_rss(targets: list[int], steps: int = 2, timeout: float = 1200) -> dict[str, Any]:
    """Peak RSS of `memagent ask` for a text of about each number of tokens in `targets`."""
    memagent = Path(sys.executable).with_name("memagent")
    runs = []
    with tempfile.TemporaryDirectory(prefix="memagent-rss-") as folder:
        for target in targets:
            document = Path(folder) / f"story-{target}.txt"
            document.write_text(story(max(1, target // TOKENS_PER_SENTENCE), seed=5))
            note(f"  memagent ask on ~{target:,} tokens ({document.stat().st_size:,} bytes)...")
            run = ask_peak_rss(memagent, document, Path(folder) / f"{target}.jsonl", steps, timeout)
            run["target_tokens"] = target
            note(
                f"  {run['tokens']} tokens, {run['steps']} steps, exit {run['exit_code']}, "
                f"{run['seconds']:.0f} s: peak RSS {run['peak_rss_mb']:.1f} MB"
            )
            if run["steps"] < steps:
                note(f"  it stopped before {steps} steps: {run['stderr'][-500:]}")
            runs.append(run)
            document.unlink()
    small, large = runs[0]["peak_rss_mb"], runs[-1]["peak_rss_mb"]
    growth = large / small - 1
    return {"runs": runs, "growth": growth, "flat": growth <= TARGET, "steps": steps}


def print_table(result: dict[str, Any]) -> None:
    print(f"peak RSS of `memagent ask` (stopped after {result['steps']} steps):")
    print(f"{'tokens':>10}  {'chunks':>6}  {'file MB':>8}  {'peak RSS MB':>11}")
    for run in result["runs"]:
        tokens = f"{run['tokens']:,}" if run["tokens"] is not None else "?"
        print(
            f"{tokens:>10}  {run['chunks'] or '?':>6}  {run['file_bytes'] / 1e6:>8.1f}  "
            f"{run['peak_rss_mb']:>11.1f}"
        )
    print(
        f"largest vs smallest: {result['growth'] * 100:+.1f}% "
        f"(target within {TARGET * 100:.0f}%: {'met' if result['flat'] else 'not met'})"
    )
