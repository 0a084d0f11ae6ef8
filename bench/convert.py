"""Conversion cost: `memagent models convert` on a real Hugging Face folder, and Ctrl-C.

Run `python bench/convert.py [FOLDER]`. FOLDER defaults to the test material's rebuilt
Qwen2.5-Coder-0.5B-Instruct (bf16 safetensors, the real 151,643-token vocabulary;
`tests/support/qwen_material.py` builds it once under build/test-material/). Each conversion runs
as the user runs it, one `memagent` process at a time, timed from start to exit, with the
peak RSS of that process and its quantizer child (`wait4`):

1. `--quant F16`: the conversion alone;
2. `--quant Q4_K_M`: the conversion to the intermediate (BF16 for bf16 weights), then
   llama.cpp's quantizer, each phase timed apart (the quantizer starts at the line
   "quantizing to ...");
3. `--quant Q4_K_M` again, stopped with SIGINT to its process group (as Ctrl-C does) a
   second after the quantizer starts: seconds from the signal to the exit, the exit
   status, and whether any file was left in the output folder.

Tables go to stdout, progress to stderr, the numbers to --out as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

MEMAGENT = [sys.executable, "-m", "memagent_cli"]


def note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def cpu_name() -> str:
    """The CPU's model name as Linux reports it (platform.processor() is empty there)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def run(folder: Path, quant: str, out: Path, interrupt_after: float | None = None) -> dict:
    """One `memagent models convert`; with `interrupt_after`, Ctrl-C that long after the
    quantizer's first progress line."""
    command = [*MEMAGENT, "models", "convert", str(folder), "--quant", quant, "--out", str(out)]
    start = time.perf_counter()
    child = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a shell job has
        env=os.environ | {"COLUMNS": "120"},
    )
    assert child.stderr is not None
    stderr, signalled, quantizing = [], None, None
    for line in child.stderr:
        stderr.append(line)
        if quantizing is None and line.startswith("quantizing to"):
            quantizing = time.perf_counter()  # the intermediate is written; llama.cpp starts
        if interrupt_after is not None and quantizing is not None and signalled is None:
            time.sleep(interrupt_after)
            os.killpg(child.pid, signal.SIGINT)
            signalled = time.perf_counter()
    _, status, usage = os.wait4(child.pid, 0)
    end = time.perf_counter()
    child.returncode = os.waitstatus_to_exitcode(status)
    stdout = child.stdout.read() if child.stdout else ""
    result = {
        "quant": quant,
        "seconds": end - start,
        "converting_s": (quantizing or end) - start,
        "quantizing_s": None if quantizing is None else end - quantizing,
        "exit": child.returncode,
        "peak_rss_mb": usage.ru_maxrss / 1024,  # the process or its largest reaped child
        "bytes": out.stat().st_size if out.exists() else None,
        "stdout": stdout.strip(),
        "stderr_tail": "".join(stderr[-3:]).strip(),
    }
    if interrupt_after is not None:
        result["signal_to_exit_s"] = None if signalled is None else end - signalled
        result["left_in_folder"] = sorted(p.name for p in out.parent.iterdir())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", type=Path, help="a Hugging Face model folder")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "bench" / "convert.json")
    args = parser.parse_args()
    if args.folder is None:
        from support import qwen_material

        args.folder = qwen_material.hf_folder()
    if not (args.folder / "config.json").is_file():
        sys.exit(f"bench/convert.py: {args.folder} is not a Hugging Face model folder.")
    weights = sum(p.stat().st_size for p in args.folder.glob("*.safetensors"))
    result: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {cpu_name()}",
        "date": time.strftime("%Y-%m-%d"),
        "folder": args.folder.name,
        "safetensors_bytes": weights,
        "load_average_start": os.getloadavg(),
    }
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for quant in ("F16", "Q4_K_M"):
            note(f"convert {args.folder.name} to {quant}...")
            runs.append(run(args.folder, quant, Path(tmp) / f"model-{quant}.gguf"))
            if runs[-1]["exit"] != 0:
                sys.exit(f"memagent models convert failed: {runs[-1]['stderr_tail']}")
            Path(tmp, f"model-{quant}.gguf").unlink(missing_ok=True)
        stopped = Path(tmp) / "stopped"
        stopped.mkdir()
        note("convert to Q4_K_M, Ctrl-C a second into quantizing...")
        runs.append(run(args.folder, "Q4_K_M", stopped / "model.gguf", interrupt_after=1.0))
        for item in runs:  # kept in bench/results/: no path of this machine
            for key in ("stdout", "stderr_tail"):
                item[key] = item[key].replace(tmp, "$TMPDIR")
    result["runs"] = runs
    result["load_average"] = os.getloadavg()

    print(f"{args.folder.name}: {weights / 1e9:.2f} GB of safetensors")
    print(f"{result['date']}, {result['machine']}")
    print(
        f"{'run':<16} {'seconds':>8} {'converting':>11} {'quantizing':>11} "
        f"{'peak RSS MB':>12} {'exit':>5} {'GGUF MB':>8}"
    )
    for name, item in zip(("F16", "Q4_K_M", "Q4_K_M, Ctrl-C"), runs, strict=True):
        size = f"{item['bytes'] / 1e6:.0f}" if item["bytes"] else "-"
        quantizing = "-" if item["quantizing_s"] is None else f"{item['quantizing_s']:.1f}"
        print(
            f"{name:<16} {item['seconds']:>8.1f} {item['converting_s']:>11.1f} {quantizing:>11} "
            f"{item['peak_rss_mb']:>12.0f} {item['exit']:>5} {size:>8}"
        )
    stop = runs[-1]
    if stop["signal_to_exit_s"] is None:
        print("Ctrl-C: the quantizer's progress line never came; no signal was sent")
    else:
        print(
            f"Ctrl-C: exit {stop['exit']} {stop['signal_to_exit_s']:.2f} s after the signal; "
            f"left in the output folder: {stop['left_in_folder'] or 'nothing'}"
        )
        print(f"  its last words: {stop['stderr_tail']!r}")
    print(f"load average {result['load_average_start'][0]:.2f} -> {result['load_average'][0]:.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    note(f"wrote {args.out}")


if __name__ == "__main__":
    main()
