"""memagent as the client of a serving engine: how close to the server's own pace it keeps
many readings in flight, and what it costs itself.

    python bench/serving.py stand-in [--readings 1000 --parallel 64 --latency 1.0]
    python bench/serving.py llama [--slots 1,2,4] [--llama-server PATH] [--gpu-layers 99]

`stand-in`: the deterministic stand-in server of tests/support/fake_openai.py on 127.0.0.1, every
call taking a fixed `--latency`, and `memagent ask` over `--readings` (document, question)
readings with `--parallel N` (a real subprocess, traces and journal on). A server that
answers any number of calls at once in `latency` seconds lets N calls in flight finish
readings x calls x latency / N after the first call at best: the bench prints the elapsed
time against that ideal, and memagent's own CPU seconds and peak RSS.

`llama`: llama-cpp-python's server (`python -m llama_cpp.server`) with the default model,
greedy, and `memagent ask --parallel N` for each N: readings per minute. That server
answers one call at a time (a lock around its one model), so N calls in flight only queue
there; llama.cpp's own `llama-server -np N` decodes N at once: `--llama-server PATH` starts
that one instead, with N slots for each N. Run it alone, under the
machine's model lock: it loads a model, and the cores are the server's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "examples"))

from support.fake_openai import FakeServer  # noqa: E402
from village import story  # noqa: E402

MEMAGENT = Path(sys.executable).with_name("memagent")
QUESTIONS = ("Who keeps the tower?", "What fell at dawn?", "Where did the baker walk?")


def note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def library(folder: Path, documents: int, sentences: int) -> list[str]:
    """`ask` arguments for `documents` documents: --documents FILE, which lists them all
    (every positional argument is then a question)."""
    paths = []
    for i in range(documents):
        path = folder / f"doc{i:05d}.txt"
        path.write_text(story(sentences, fact=None, seed=i))
        paths.append(str(path))
    listing = folder / "documents.txt"
    listing.write_text("\n".join(paths) + "\n")
    return ["--documents", str(listing)]


def run_memagent(args: list[str], home: Path) -> dict[str, float]:
    """Run `memagent ARGS` to the end; its wall seconds, CPU seconds, peak RSS and output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMAGENT_")}
    env["XDG_DATA_HOME"] = str(home / "data")
    env["XDG_CACHE_HOME"] = str(home / "cache")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    result = subprocess.run(
        [str(MEMAGENT), *args], capture_output=True, text=True, env=env, check=False
    )
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise SystemExit(f"memagent failed ({result.returncode}): {result.stderr[-2000:]}")
    return {
        "seconds": seconds,
        "cpu_seconds": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "peak_rss_mb": after.ru_maxrss / 1024,  # kilobytes on Linux; the largest child so far
        "answers": len(result.stdout.splitlines()),
    }


def stand_in(args: argparse.Namespace) -> dict[str, object]:
    questions = list(QUESTIONS[: args.questions])
    documents = -(-args.readings // len(questions))
    with (
        tempfile.TemporaryDirectory() as tmp,
        FakeServer(delay=args.latency, keep_messages=False) as server,
    ):
        home = Path(tmp)
        (home / "docs").mkdir()
        documents_args = library(home / "docs", documents, args.sentences)
        readings = documents * len(questions)
        command = [
            "ask", *documents_args, *questions,
            "--backend", "openai", "--base-url", server.url,
            "--parallel", str(args.parallel), "--chunk-tokens", str(args.chunk_tokens),
            "--memory-tokens", "64", "--temperature", str(args.temperature), "--quiet",
        ]  # fmt: skip
        note(f"{readings} readings, --parallel {args.parallel}, {args.latency} s a call")
        measured = run_memagent(command, home)
        calls = server.chat_calls
        span = max(server.answered) - min(server.answered) + args.latency
        most = server.most_in_flight
    assert measured["answers"] == readings, measured
    ideal = calls * args.latency / args.parallel
    result = {
        "readings": readings,
        "calls": calls,
        "calls_per_reading": calls / readings,
        "parallel": args.parallel,
        "latency": args.latency,
        "ideal_seconds": round(ideal, 2),
        "elapsed_seconds": round(measured["seconds"], 2),
        "elapsed_over_ideal": round(measured["seconds"] / ideal, 3),
        "calls_span_seconds": round(span, 2),  # first call in to last call out
        "span_over_ideal": round(span / ideal, 3),
        "most_calls_in_flight": most,
        "memagent_cpu_seconds": round(measured["cpu_seconds"], 2),
        "memagent_cpu_ms_per_call": round(1000 * measured["cpu_seconds"] / calls, 2),
        "memagent_peak_rss_mb": round(measured["peak_rss_mb"], 1),
    }
    note(
        f"{readings} readings ({calls} calls) in {measured['seconds']:.1f} s; ideal "
        f"{ideal:.1f} s ({calls} x {args.latency} s / {args.parallel}): "
        f"{measured['seconds'] / ideal:.3f} of it (calls alone: {span / ideal:.3f}); "
        f"at most {most} calls in flight; memagent used {measured['cpu_seconds']:.1f} CPU s "
        f"and {measured['peak_rss_mb']:.0f} MB at its peak"
    )
    return result


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def server_command(args: argparse.Namespace, port: int, slots: int) -> list[str]:
    """llama-cpp-python's server, or llama.cpp's own (--llama-server) with `slots` slots."""
    from memagent_cli.models import resolve

    model, host, ctx, threads = str(resolve(None).path), "127.0.0.1", args.n_ctx, args.threads
    layers = [] if args.gpu_layers is None else [str(args.gpu_layers)]
    if args.llama_server:
        return [
            args.llama_server, "--model", model, "--host", host, "--port", str(port),
            "--ctx-size", str(ctx * slots), "--parallel", str(slots), "--threads", str(threads),
            *(["--n-gpu-layers", *layers] if layers else []),
        ]  # fmt: skip
    return [
        sys.executable, "-m", "memagent_cli.backends.llama_server", "--model", model,
        "--host", host, "--port", str(port), "--n_ctx", str(ctx), "--n_threads", str(threads),
        "--n_threads_batch", str(threads), "--verbose", "false",
        *(["--n_gpu_layers", *layers] if layers else []),
    ]  # fmt: skip


def llama_server(args: argparse.Namespace) -> dict[str, object]:
    """Readings per minute through llama-cpp-python's server with the default model, for
    each --parallel N; with --llama-server, llama.cpp's own started with N slots for each N."""
    sys.path.insert(0, str(ROOT))
    slots = [int(x) for x in args.slots.split(",")]
    if not args.llama_server:
        return {"server": "llama_cpp.server", "rows": measure(args, slots, max(slots))}
    rows = [row for n in slots for row in measure(args, [n], n)]
    return {"server": "llama-server -np N", "rows": rows}


def measure(args: argparse.Namespace, parallel: list[int], slots: int) -> list[dict]:
    """Start the server, and time `memagent ask --parallel N` through it for each N."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    server = subprocess.Popen(
        server_command(args, port, slots), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    rows = []
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{url}/models", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("the server did not start") from None
                time.sleep(0.5)
        questions = list(QUESTIONS[: args.questions])
        for n in parallel:
            with tempfile.TemporaryDirectory() as tmp:
                home = Path(tmp)
                (home / "docs").mkdir()
                documents_args = library(home / "docs", args.documents, args.sentences)
                command = [
                    "ask", *documents_args, *questions, "--backend", "openai",
                    "--base-url", url, "--parallel", str(n),
                    "--chunk-tokens", str(args.chunk_tokens), "--memory-tokens", "64",
                    "--temperature", "0", "--quiet",
                ]  # fmt: skip
                measured = run_memagent(command, home)
            readings = args.documents * len(questions)
            per_minute = 60 * readings / measured["seconds"]
            rows.append(
                {
                    "parallel": n,
                    "readings": readings,
                    "seconds": round(measured["seconds"], 1),
                    "readings_per_minute": round(per_minute, 2),
                }  # fmt: skip
            )
            note(f"--parallel {n}: {readings} readings in {measured['seconds']:.1f} s, "
                 f"{per_minute:.2f} readings/min")  # fmt: skip
    finally:
        server.kill()
        server.wait(timeout=30)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    s = sub.add_parser("stand-in", help="the stand-in server with a fixed latency")
    s.add_argument("--readings", type=int, default=1000)
    s.add_argument("--questions", type=int, default=2, help="questions per document")
    s.add_argument("--parallel", type=int, default=64)
    s.add_argument("--latency", type=float, default=1.0, help="seconds per call")
    s.add_argument("--sentences", type=int, default=45, help="per document (~11 tokens each)")
    s.add_argument("--chunk-tokens", type=int, default=300)
    s.add_argument("--temperature", type=float, default=0.0)
    s.set_defaults(run=stand_in)
    s = sub.add_parser("llama", help="llama-cpp-python's server with the default model")
    s.add_argument("--slots", default="1,2,4", help="--parallel values to measure")
    s.add_argument("--documents", type=int, default=2)
    s.add_argument("--questions", type=int, default=2, help="questions per document")
    s.add_argument("--sentences", type=int, default=50, help="per document (~11 tokens each)")
    s.add_argument("--chunk-tokens", type=int, default=300)
    s.add_argument("--n-ctx", type=int, default=2048)
    s.add_argument("--threads", type=int, default=2)
    s.add_argument("--gpu-layers", type=int, help="layers offloaded to the GPU (99: all)")
    s.add_argument("--llama-server", help="a llama-server binary instead, with N slots per N")
    s.set_defaults(run=llama_server)
    args = parser.parse_args()
    result = args.run(args)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
