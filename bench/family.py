"""What a server's slots and `--parallel` are worth to each reader: the same 100-chunk
document read by MemAgent and by PI-Mem through a stand-in server on 127.0.0.1 that takes a
fixed time per call and answers at most `--slots` calls at once, at `--parallel` 1, 8 and
64, in one run. No model: a MemAgent reading is as many calls in a row as there are chunks,
whatever the server; a PI-Mem reading is a few passes whose chunk calls all go at once.

Printed per row: the reader, --parallel, the calls the server answered, the most in flight
at once, the command's wall time (a real `memagent ask` subprocess, its start included) and
the least the calls could take on that server (`floor`: each round of calls that must wait
for the one before, at the delay each).

    python bench/family.py [--delay 0.1] [--slots 32] [--parallel 1,8,64] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "examples"))

from support import fake_openai  # noqa: E402
from support.fake_openai import FakeServer  # noqa: E402
from village import story  # noqa: E402

from memagent_cli.backends.tokenizers import TiktokenTokenizer  # noqa: E402
from memagent_cli.readers import pimem  # noqa: E402

MEMAGENT = Path(sys.executable).with_name("memagent")
memagent_reply = fake_openai.reply_to  # the stand-in's MemAgent
QUESTION = "What is the secret password for the vault?"
CHUNKS, CHUNK_TOKENS = 100, 200


def reply_to(message: str) -> str:
    """The stand-in model: MemAgent's as tests/support/fake_openai.py has it; for PI-Mem, a
    chunk that tells of the vault finds it in the first pass and every other chunk nothing
    (so a second pass finds nothing and the reading answers), a merge keeps what was found."""
    if message.startswith(pimem.CHUNK_TEMPLATE[:60]):
        section = message.split("<section>\n", 1)[1]
        first = pimem.INITIAL_MEMORY in message.split("<memory>\n", 1)[1].split("</memory>")[0]
        return (
            f"<check>yes</check> {section.split('vault', 1)[1][:60]}"
            if first and ("vault" in section)
            else pimem.NO_NEW_INFO
        )
    if message.startswith(pimem.MERGE_TEMPLATE[:60]):
        found = message.split("<extracted_information>\n", 1)[1].split("</extracted_information>")[
            0
        ]
        return "The vault: " + " ".join(found.split()[-12:])
    return memagent_reply(message)


def document(folder: Path) -> Path:
    """A story of exactly CHUNKS chunks of CHUNK_TOKENS tiktoken tokens (the stand-in has
    no tokenizer: memagent counts with tiktoken), the fact in its middle."""
    tokenizer = TiktokenTokenizer()
    tokens = tokenizer.tokenize(story(4000, seed=1))[: CHUNKS * CHUNK_TOKENS - 60]
    path = folder / "village.txt"
    path.write_text(tokenizer.detokenize(tokens).decode("utf-8", errors="ignore"))
    return path


def floor(reader: str, calls: int, parallel: int, slots: int, delay: float) -> float:
    """The least time the calls take: MemAgent's in a row; PI-Mem's passes of CHUNKS
    calls, each pass in rounds of as many as go at once, then its merge (if any), then the
    answer."""
    if reader == "memagent":
        return calls * delay
    at_once = min(parallel, slots, CHUNKS)
    passes = calls // CHUNKS
    merges_and_answer = calls - passes * CHUNKS
    return (passes * -(-CHUNKS // at_once) + merges_and_answer) * delay


def read(path: Path, server: FakeServer, reader: str, parallel: int, home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMAGENT_")}
    env["XDG_DATA_HOME"], env["XDG_CACHE_HOME"] = str(home / "data"), str(home / "cache")
    env["MEMAGENT_HOME"] = str(home / "data" / "memagent")
    before, server.most_in_flight = server.chat_calls, 0
    command = [
        str(MEMAGENT), "ask", str(path), QUESTION, "--backend", "openai",
        "--base-url", server.url, "--reader", reader, "--parallel", str(parallel),
        "--chunk-tokens", str(CHUNK_TOKENS), "--memory-tokens", "48", "--temperature", "0",
        "--no-trace", "--no-reuse", "--json", "--quiet",
    ]  # fmt: skip
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"memagent failed ({result.returncode}): {result.stderr[-2000:]}")
    answer = json.loads(result.stdout)
    if answer["document"]["chunks"] != CHUNKS:
        raise SystemExit(f"the document is {answer['document']['chunks']} chunks, not {CHUNKS}")
    return {
        "reader": reader,
        "parallel": parallel,
        "calls": server.chat_calls - before,
        "most_in_flight": server.most_in_flight,
        "seconds": round(seconds, 2),
        "reading_seconds": answer["seconds"],
        "steps": answer["chunks_read"],
        "answer": answer["answer"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delay", type=float, default=0.1, help="seconds a call takes")
    parser.add_argument("--slots", type=int, default=32, help="calls the server answers at once")
    parser.add_argument("--parallel", default="1,8,64")
    parser.add_argument("--out", type=Path, default=ROOT / "build/bench/family-latency.json")
    args = parser.parse_args()
    fake_openai.reply_to = reply_to  # the server's handler looks it up at each call
    rows = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        FakeServer(delay=args.delay, slots=args.slots, keep_messages=False) as server,
    ):
        path = document(Path(tmp))
        for reader in ("memagent", "pi-mem"):
            for parallel in map(int, args.parallel.split(",")):
                row = read(path, server, reader, parallel, Path(tmp))
                row["floor_seconds"] = round(
                    floor(reader, row["calls"], parallel, args.slots, args.delay), 2
                )
                rows.append(row)
                print(
                    f"{reader} --parallel {parallel}: {row['calls']} calls, at most "
                    f"{row['most_in_flight']} in flight, {row['seconds']:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(f"{when} · {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs")
    print(
        f"A {CHUNKS}-chunk document ({CHUNK_TOKENS} tokens a chunk), a stand-in server on "
        f"127.0.0.1: {args.delay} s a call, {args.slots} slots."
    )
    print()
    print("| reader   | --parallel | calls | most in flight | wall s | floor s |")
    print("|----------|-----------:|------:|---------------:|-------:|--------:|")
    for row in rows:
        print(
            f"| {row['reader']:<8} | {row['parallel']:>10} | {row['calls']:>5} | "
            f"{row['most_in_flight']:>14} | {row['seconds']:>6.1f} | {row['floor_seconds']:>7.1f} |"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"delay": args.delay, "slots": args.slots, "rows": rows}, indent=2) + "\n"
    )


if __name__ == "__main__":
    main()
