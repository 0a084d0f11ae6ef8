"""`memagent inspect`'s time estimate against a real reading of the same document: runs
`inspect --json`, then `ask --json` on the same document with the same settings, as a user
would, and prints the estimate, the reading's time and their ratio.

    python bench/estimate.py [--model GGUF] [--sentences 1100] [--learn-from 600] [--out DIR]
                             [-- ASK/INSPECT FLAGS]

The document is examples/village.py's story (about 11 model tokens a sentence). The commands
see a data folder of their own: the user's models and calibrations, and none of the user's
traces, so that the estimate learns from nothing but what this run reads. With
--learn-from, a first `ask` reads another story of that many sentences (another seed) and
keeps its trace: the estimate then learns from that one reading how long this model's
replies run and what its drafts save (run/history.py), as it would after a user's first
question; without, it is the first-use guess (run/inspect.py's FIRST_GUESS, within
LEAST_GUESS and the bound). Raw outputs (stdout and stderr of each command)
and a summary go to --out, with this machine's paths replaced by `.` (the repository), `~`
and `<python>`. Run it alone on the machine (under `flock /tmp/llama.lock` where others
share it): two llama.cpp processes at once make every timing lie.
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT))
from village import story  # noqa: E402

from memagent_cli.backends.speed import Speed  # noqa: E402
from memagent_cli.folders import HOME_VARIABLE, data_dir  # noqa: E402
from memagent_cli.run.inspect import CallSize, call_seconds  # noqa: E402

QUESTION = "What is the secret password for the vault?"


# The private data folder of a run, named as DATA in what is kept (a temporary folder).
PRIVATE: list[tuple[str, str]] = []


def scrubbed(text: str) -> str:
    """`text` without this machine's paths."""
    for path, name in (
        *PRIVATE,
        (str(Path(sys.prefix)), "<python>"),
        (str(ROOT), "."),
        (str(Path.home()), "~"),
    ):
        text = text.replace(path, name)
    return text


def run(
    command: list[str], cwd: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], float]:
    print("$ " + " ".join(command), file=sys.stderr, flush=True)
    began = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        sys.exit(f"{command[1]} failed ({done.returncode}):\n{done.stderr}")
    return done, seconds


def private_home(folder: Path) -> dict[str, str]:
    """The environment of commands whose data folder is `folder`: the user's models,
    calibrations and the rest linked in, their traces left out."""
    folder.mkdir(mode=0o700)
    user = data_dir()
    if user.is_dir():
        for entry in user.iterdir():
            if entry.name != "traces":
                (folder / entry.name).symlink_to(entry)
    return {**os.environ, HOME_VARIABLE: str(folder)}


def learned(est: dict[str, Any]) -> str:
    """What the estimate learned from past readings, in a line."""
    found = est.get("learned")
    if "learned" not in est:
        return "learned: (an estimate from before it learned from past readings)"
    if not found:
        return "learned: nothing (no past reading): the estimate is the first-use guess"
    return (
        f"learned from {found['readings']} reading(s), {found['calls']} calls: memories "
        f"{found['memory_fraction']:.3f} of the budget, answers {found['answer_fraction']:.3f}, "
        f"decoding at {found['decode_factor']:.3f}x single decodes"
    )


def first_reading(asked: dict[str, Any]) -> str:
    """The reading the estimate learned from, in a line."""
    calls = [*asked["steps"], asked["final"]]
    replies = ", ".join(str(c["completion_tokens"]) for c in calls)
    return (
        f"first reading, of another story: {asked['seconds']:.1f} s for {len(calls)} calls "
        f"(replies {replies})"
    )


def summary(
    inspected: dict[str, Any],
    asked: dict[str, Any],
    times: dict[str, float],
    first: dict[str, Any] | None = None,
) -> str:
    est = inspected["estimate"]
    steps = asked["steps"]
    replies = [s["completion_tokens"] for s in steps] + [asked["final"]["completion_tokens"]]
    prompts = [s["prompt_tokens"] for s in steps] + [asked["final"]["prompt_tokens"]]
    reading = asked["seconds"]
    calls = [s for s in steps] + [asked["final"]]
    # The estimate's own pricing of the calls the reading made: what its rates get right
    # apart from the reply sizes it assumes.
    speed = Speed(**est["speed"])
    priced = [
        call_seconds(CallSize(c["prompt_tokens"], c["completion_tokens"]), speed) for c in calls
    ]
    factor = (est.get("learned") or {}).get("decode_factor")
    factored = [
        call_seconds(CallSize(c["prompt_tokens"], c["completion_tokens"]), speed, factor)
        for c in calls
    ] if factor else []  # fmt: skip
    most = est.get("seconds_at_most")  # estimates from before it learned have no bound apart
    drafted = sum(c.get("drafted") or 0 for c in calls)
    accepted = sum(c.get("accepted") or 0 for c in calls)
    lines = [
        f"model: {inspected['tokenizer']['model']}",
        f"document: {inspected['tokens']:,} tokens, {len(inspected['chunks'])} chunks of "
        f"{inspected['chunk_tokens']:,}",
        f"inspect: {times['inspect']:.1f} s in all, of which measuring the speed "
        f"{est['measure_seconds']:.1f} s (to depth {est['measured_depth']:,} of "
        f"{est['depth']:,})",
        *([first_reading(first)] if first else []),
        learned(est),
        f"estimate: {est['seconds_per_question']:.1f} s"
        + (f" (at most {most:.1f} s)" if most is not None else "")
        + f" for {len(est['calls'])} calls, at most "
        f"{est['prompt_tokens']:,} prompt and {est['reply_tokens']:,} reply tokens "
        f"(prefill {est['prompt_tokens_per_second']:.1f} tok/s, decode "
        f"{est['generation_tokens_per_second']:.1f} tok/s at a step's depth)",
        f"reading: {reading:.1f} s for {len(prompts)} calls, {sum(prompts):,} prompt and "
        f"{sum(replies):,} reply tokens (replies {', '.join(map(str, replies))}); "
        f"`ask` took {times['ask']:.1f} s in all, model loading included",
        f"ratio estimate / reading: {est['seconds_per_question'] / reading:.3f}",
        *([f"ratio at most / reading: {most / reading:.3f}"] if most is not None else []),
        f"the estimate's rates on the reading's own calls: {sum(priced):.1f} s, ratio "
        f"{sum(priced) / reading:.3f}; per call priced / took: "
        + ", ".join(f"{p:.1f}/{c['seconds']:.1f}" for p, c in zip(priced, calls, strict=True))
        + f"; drafts accepted {accepted} of {drafted}"
        + (
            f"; with the learned decoding factor {sum(factored):.1f} s, ratio "
            f"{sum(factored) / reading:.3f}"
            if factored
            else ""
        ),
        f"ratio estimate / whole ask: {est['seconds_per_question'] / times['ask']:.3f}",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a GGUF or registry name (default: the default model)")
    parser.add_argument("--sentences", type=int, default=1100, help="length of the document")
    parser.add_argument(
        "--learn-from",
        type=int,
        metavar="SENTENCES",
        help="first read another story of this many sentences, for the estimate to learn from",
    )
    parser.add_argument("--out", type=Path, help="folder for the raw outputs and the summary")
    parser.add_argument("--name", default="estimate", help="prefix of the files in --out")
    parser.add_argument(
        "--limit", type=float, help="skip the reading when the estimate is over this many seconds"
    )
    parser.add_argument(
        "--summarize", action="store_true", help="only summarize NAME's kept files in --out"
    )
    parser.add_argument("flags", nargs="*", help="more flags for both commands")
    args = parser.parse_args()
    if args.summarize:
        kept = {
            s: (args.out / f"{args.name}-{s}").read_text() for s in ("inspect.json", "ask.json")
        }
        learning = args.out / f"{args.name}-learn-ask.json"
        first = json.loads(learning.read_text()) if learning.exists() else None
        head = (args.out / f"{args.name}-summary.txt").read_text().splitlines()[0] + "\n"
        text = head + summary(
            json.loads(kept["inspect.json"]),
            json.loads(kept["ask.json"]),
            _kept_times(args),
            first,
        )
        print(text, end="")
        keep(args, "summary.txt", text)
        return
    memagent = str(Path(sys.executable).with_name("memagent"))
    model = ["--model", str(Path(args.model).resolve())] if args.model else []
    if args.model and not Path(args.model).exists():
        model = ["--model", args.model]
    first = None
    with tempfile.TemporaryDirectory() as folder:
        here = Path(folder)
        env = private_home(here / "home")
        PRIVATE.append((str(here / "home"), "DATA"))
        (here / "village.txt").write_text(story(args.sentences))
        if args.learn_from:
            (here / "another.txt").write_text(story(args.learn_from, seed=2))
            learn, _ = run(
                [memagent, "ask", "another.txt", QUESTION, "--json", "--no-reuse",
                 *model, *args.flags],
                here,
                env,
            )  # fmt: skip
            keep(args, "learn-ask.json", learn.stdout)
            keep(args, "learn-ask.stderr", learn.stderr)
            first = json.loads(learn.stdout)
        inspect, inspect_seconds = run(
            [memagent, "inspect", "village.txt", "--json", *model, *args.flags], here, env
        )
        keep(args, "inspect.json", inspect.stdout)
        keep(args, "inspect.stderr", inspect.stderr)
        estimated = json.loads(inspect.stdout)["estimate"]["seconds_per_question"]
        print(f"estimate: {estimated:.0f} s", file=sys.stderr, flush=True)
        if args.limit is not None and estimated > args.limit:
            sys.exit(f"the estimate is over --limit {args.limit:.0f} s: no reading")
        ask, ask_seconds = run(
            [memagent, "ask", "village.txt", QUESTION, "--json", "--no-reuse", "--no-trace",
             *model, *args.flags],
            here,
            env,
        )  # fmt: skip
    inspected, asked = json.loads(inspect.stdout), json.loads(ask.stdout)
    times = {"inspect": inspect_seconds, "ask": ask_seconds}
    head = (
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.machine()}, "
        f"{len(os.sched_getaffinity(0))} cores, load average {os.getloadavg()[0]:.2f} at the "
        "end (other work on the machine slows the runs)\n"
    )
    text = head + summary(inspected, asked, times, first)
    print(scrubbed(text), end="")
    for suffix, content in (("ask.json", ask.stdout), ("ask.stderr", ask.stderr)):
        keep(args, suffix, content)
    keep(args, "summary.txt", text)


def _kept_times(args: argparse.Namespace) -> dict[str, float]:
    """The commands' wall-clock seconds as a kept summary says them."""
    import re

    text = (args.out / f"{args.name}-summary.txt").read_text()
    return {
        "inspect": float(re.search(r"inspect: ([\d.]+) s in all", text)[1]),
        "ask": float(re.search(r"`ask` took ([\d.]+) s in all", text)[1]),
    }


def keep(args: argparse.Namespace, suffix: str, content: str) -> None:
    """Write `content` to --out as NAME-SUFFIX, without this machine's paths."""
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.name}-{suffix}").write_text(scrubbed(content))


if __name__ == "__main__":
    main()
