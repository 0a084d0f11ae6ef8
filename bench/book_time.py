"""How long one question about a book takes: pages -> tokens -> steps -> time, for every model
of the registry, on 2 to 16 CPU cores, one NVIDIA GPU and Apple silicon.

    python bench/book_time.py              # the tables of docs/choosing-a-model.md
    python bench/book_time.py --pages 500  # the same for a book of 500 pages

Nothing is run: the figures come from the kept runs under bench/results/ and from the rules
written beside each constant below. Measured here: the default model's steps, read at the
defaults; a 7B-shaped engine's prefill and decode rates (random weights, so no real 7B
reading); the 1.5B's rates in bench/choice.sh's needle cases; a 0.5B model's conversion; the
tokens of a 1,000-page PDF. Everything else is computed from those, and the table says which.
Every reply is taken at its longest (each memory written to its 1,024 tokens, no draft
accepted, every chunk read): what `memagent inspect` assumes before a model has read on a
machine. tests/test_docs.py checks that docs/choosing-a-model.md holds these tables as
printed here.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
DAY1 = RESULTS / "2026-11-26-xeon-amx"  # make bench and make bench-cheap, quiet
DAY2 = RESULTS / "2026-11-27-xeon-amx"

# The protocol at its defaults (memagent_cli/protocol.py): a step's prompt is the chunk, the
# memory and about 145 tokens of template and question (5,145 in the first step of the kept
# reading, whose memory was "No previous memory"; 6,166 with a full memory); the answer's
# prompt is the memory and the template (1,120 in the kept reading).
CHUNK = 5000
MEMORY = 1024
TEMPLATE = 145
ANSWER_PROMPT = 1120

# Assumed where nothing was measured. A CPU's prefill is compute-bound, so it scales with the
# cores; so does decoding, until the memory bandwidth runs out: every decoded token reads the
# whole file. 50 GB/s is a desktop's or a laptop's dual-channel memory; a server's is higher.
BANDWIDTH = 50e9
# The 7B-shaped engine was timed at depths to 1K; a step reads to 6K, where attention is a
# larger share of a 7B's work, and the real Q4_K_M file is 20% larger than the shaped Q4_0.
# The high end of each 7B-class range allows that much more time.
DEPTH_7B = (1.10, 1.20)  # (prefill, decode)
# The 1.5B was timed at depths to 2.5K, with short replies; at a small model's shapes the
# attention's share grows faster with depth.
DEPTH_SMALL = (1.20, 1.30)


@dataclass(frozen=True)
class Rates:
    """Prefill and decode tokens a second, each a (fast, slow) pair."""

    prefill: tuple[float, float]
    decode: tuple[float, float]

    def scaled(self, prefill: float, decode: float) -> Rates:
        return Rates(
            (self.prefill[0] * prefill, self.prefill[1] * prefill),
            (self.decode[0] * decode, self.decode[1] * decode),
        )

    def slowed(self, depth: tuple[float, float]) -> Rates:
        """The fast end as measured; the slow end divided by the depth allowance."""
        return Rates(
            (max(self.prefill), min(self.prefill) / depth[0]),
            (max(self.decode), min(self.decode) / depth[1]),
        )


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def tokens_per_page() -> float:
    """bench/extraction.py's 1,000-page PDF, in the default model's tokens."""
    log = (DAY1 / "make-bench.log").read_text()
    pages = int(re.search(r"^\s+PDF\s+(\d+)\s", log, re.M)[1])
    tokens = int(re.search(r"^\s+PDF\s+[\d.]+\s+(\d+)\s+\d+\s", log, re.M)[1])
    return tokens / pages


def smollm2_calls() -> list[tuple[int, float]]:
    """(prompt tokens, seconds) of each call of the kept reading at the defaults: every reply
    1,024 tokens, drafts as the model copied (2026-11-27, quiet)."""
    run = _json(DAY2 / "estimate-smollm2-learned-ask.json")
    calls = [(s["prompt_tokens"], s["seconds"]) for s in run["steps"]]
    calls.append((run["final"]["prompt_tokens"], run["final"]["seconds"]))
    return sorted(calls)


def shaped_7b() -> Rates:
    """The 7B-shaped engine (Qwen2.5-7B's shapes, random Q4_0 weights) on 2 cores: its rates in
    make bench-cheap (2026-11-26) and in the calls of its reading (2026-11-27, quiet)."""
    engine = _json(DAY1 / "shaped-7b.json")["engine"]["rates"]
    prefill = [r["prefill_tps"] for r in engine]
    decode = [r["decode_tps"] for r in engine]
    run = _json(DAY2 / "estimate-shaped-7b-quiet-ask.json")
    for call in [*run["steps"], run["final"]]:
        prefill.append(call["prompt_tokens"] / call["prompt_seconds"])
        decode.append(call["completion_tokens"] / (call["seconds"] - call["prompt_seconds"]))
    return Rates((max(prefill), min(prefill)), (max(decode), min(decode)))


def qwen_1_5b() -> Rates:
    """The 1.5B's step lines in bench/choice.sh's needle cases (2026-11-27, quiet): full steps
    of 2,000 tokens, prompts of about 2.5K, memories of about 20 tokens."""
    log = (DAY2 / "choice-qwen1.5b.log").read_text()
    found = re.findall(r"tokens (\d+)-(\d+) .*?prompt (\d+) tok/s · gen (\d+) tok/s", log)
    full = [(int(p), int(g)) for a, b, p, g in found if int(b) - int(a) == 2000]
    prefill, decode = [p for p, _ in full], [g for _, g in full]
    return Rates((max(prefill), min(prefill)), (max(decode), min(decode)))


def conversion_per_gb() -> tuple[float, float]:
    """Seconds a GB of safetensors takes to become a Q4_K_M GGUF on 2 cores, (fast, slow): the
    0.5B of the test material, converting and quantizing (bench/convert.py, two runs)."""
    seconds = []
    for name in ("convert-1.log", "convert-2.log"):
        text = (DAY2 / name).read_text()
        size = float(re.search(r"([\d.]+) GB of safetensors", text)[1])
        row = re.search(r"^Q4_K_M\s+[\d.]+\s+([\d.]+)\s+([\d.]+)\s", text, re.M)
        seconds.append((float(row[1]) + float(row[2])) / size)
    return min(seconds), max(seconds)


# Published llama.cpp rates for a Llama 3 8B Q4_K_M (4.58 GB), the class of memagent-7b
# (7.6B, 4.7 GB): llama-bench, May 2024, XiongjieDai/GPU-Benchmarks-on-LLM-Inference's
# README. (fast, slow) = (pp 4096, pp 8192) for prefill and (tg 1024, tg 8192) for decode; the
# M1's largest sizes ran out of memory, so its slow end is pp 1024 and tg 1024, its fast end
# pp 4096 and tg 4096.
GPU_8B = Rates((3169.91, 2527.40), (111.74, 87.49))  # NVIDIA RTX 3090 24GB
M3_MAX_8B = Rates((573.09, 505.32), (50.74, 36.12))  # Apple M3 Max, 40-core GPU
M1_8B = Rates((96.53, 87.26), (11.77, 9.72))  # Apple M1, 7-core GPU, 8 GB


@dataclass(frozen=True)
class Model:
    name: str
    file_gb: float  # the GGUF memagent reads: every decoded token reads it whole
    download_gb: float
    converted: bool  # safetensors converted and quantized by `models pull`
    reply: int = MEMORY  # tokens each call may write
    calls_per_step: int = 1  # generations a step makes at most
    extra_prompt: int = 0  # prompt tokens a step reads besides the chunk, memory and template
    params_vs_7b: float = 0.0  # the 7B-class rates are divided by this; 0 for the small models


# Sizes: the registry's downloads; GGUF sizes from Qwen's files and the Q4_K_M of each
# parameter count (about 4.9 bits a weight).
MODELS = [
    Model("smollm2-135m", 0.098, 0.098, converted=False),
    Model("qwen2.5-coder-1.5b", 1.12, 1.12, converted=False),
    Model("qwen3-1.7b", 1.83, 1.83, converted=False),
    Model("memagent-7b", 4.68, 15.23, converted=True, params_vs_7b=1.0),
    Model("memagent-14b", 8.99, 29.54, converted=True, params_vs_7b=1.95),
    # ReMemR1 writes replies of up to 2,048 tokens (its authors' RECURRENT_MAX_NEW).
    Model("rememr1-7b", 4.68, 15.23, converted=True, reply=2048, params_vs_7b=1.0),
    # InfMem: a planner and an update each step, each thinking (up to 1,024) and then
    # answering (up to 1,024); the update also reads the 4 units of 500 tokens a search found
    # and the planner its prompt of about 3,000. It may stop early; this reads every chunk.
    Model("infmem-4b", 2.50, 8.05, True, calls_per_step=4, extra_prompt=5000, params_vs_7b=0.53),
]


def small_cpu(model: Model) -> Rates:
    """The two small models' 2-core rates: the 1.5B's own, and the 1.7B's from them (its Q8_0
    file reads 1.6x the bytes a decoded token; 8% more weights to prefill)."""
    rates = qwen_1_5b().slowed(DEPTH_SMALL)
    if model.name == "qwen3-1.7b":
        return rates.scaled(1 / 1.08, 1.12 / 1.83)
    return rates


def cpu_rates(model: Model, cores: int) -> Rates | None:
    if model.name == "smollm2-135m":
        return None  # its calls were measured whole: scaled in call_seconds
    if model.params_vs_7b:
        base = shaped_7b().slowed(DEPTH_7B).scaled(1 / model.params_vs_7b, 1 / model.params_vs_7b)
    else:
        base = small_cpu(model)
    cap = BANDWIDTH / (model.file_gb * 1e9)
    grow = cores / 2
    return Rates(
        (base.prefill[0] * grow, base.prefill[1] * grow),
        (min(base.decode[0] * grow, cap), min(base.decode[1] * grow, cap)),
    )


def published_rates(model: Model, rates: Rates) -> Rates | None:
    if not model.params_vs_7b:
        return None  # a small model on a GPU is bound by kernel launches: not computed
    return rates.scaled(1 / model.params_vs_7b, 1 / model.params_vs_7b)


def book_calls(tokens: int, model: Model) -> list[tuple[int, int]]:
    """(prompt, reply) tokens of every call of one question, replies at their longest."""
    steps = math.ceil(tokens / CHUNK)
    calls = []
    for i in range(steps):
        chunk = min(CHUNK, tokens - i * CHUNK)
        memory = MEMORY if i else 0
        prompt = chunk + memory + TEMPLATE + model.extra_prompt
        calls.append((prompt, model.reply * model.calls_per_step))
    calls.append((ANSWER_PROMPT, model.reply))
    return calls


def interpolate(x: float, points: list[tuple[int, float]]) -> float:
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x <= x1 or (x1, y1) == points[-1]:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    raise ValueError(x)


def call_seconds(
    calls: list[tuple[int, int]], model: Model, rates: Rates | None, cores: int = 2
) -> tuple[float, float] | None:
    """(fast, slow) seconds for these calls."""
    if model.name == "smollm2-135m":
        if cores == 0:
            return None  # on a GPU: not computed
        measured = smollm2_calls()
        total = sum(interpolate(prompt, measured) for prompt, _ in calls) * 2 / cores
        return total, total
    if rates is None:
        return None
    fast = sum(p / rates.prefill[0] + r / rates.decode[0] for p, r in calls)
    slow = sum(p / rates.prefill[1] + r / rates.decode[1] for p, r in calls)
    return fast, slow


def _unit(seconds: float) -> tuple[float, str]:
    if seconds < 90:
        return 1, "s"
    if seconds < 90 * 60:
        return 60, "min"
    return 3600, "h"


def _amount(seconds: float, per: float) -> str:
    value = seconds / per
    return f"{round(value, 1):g}" if per == 3600 else f"{max(round(value), 1)}"


def span(times: tuple[float, float] | None) -> str:
    """`12-15 min`, `5.1-6.4 h`: both ends in the unit of the longer."""
    if times is None:
        return "not computed"
    per, unit = _unit(max(times))
    lo, hi = (_amount(t, per) for t in sorted(times))
    return f"{lo} {unit}" if lo == hi else f"{lo}-{hi} {unit}"


MACHINES = [
    ("2 cores", 2),
    ("4 cores", 4),
    ("8 cores", 8),
    ("16 cores", 16),
    ("one NVIDIA GPU", GPU_8B),
    ("Apple M3 Max", M3_MAX_8B),
    ("Apple M1, 8 GB", M1_8B),
]


# Of an 8 GB Mac's memory, Metal gives the GPU about 70% (the same README): 5.6 GB.
M1_ROOM_GB = 5.6


def times(calls_of, model: Model) -> list[str]:
    row = []
    for _, machine in MACHINES:
        calls = calls_of(model)
        if isinstance(machine, int):
            found = span(call_seconds(calls, model, cpu_rates(model, machine), machine))
            measured = model.name == "smollm2-135m" and machine == 2
            row.append(f"**{found}**" if measured else found)  # bold: measured here
        elif machine is M1_8B and model.file_gb > M1_ROOM_GB:
            row.append("does not fit")
        else:
            row.append(span(call_seconds(calls, model, published_rates(model, machine), 0)))
    return row


def table(calls_of) -> list[str]:
    head = ["model", *(name for name, _ in MACHINES)]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for model in MODELS:
        lines.append("| " + " | ".join([f"`{model.name}`", *times(calls_of, model)]) + " |")
    return lines


def step_table() -> list[str]:
    """One full step: a chunk of 5,000 tokens and a full memory read, a memory written."""
    return table(
        lambda m: [(CHUNK + MEMORY + TEMPLATE + m.extra_prompt, m.reply * m.calls_per_step)]
    )


def book_table(pages: int) -> list[str]:
    tokens = round(pages * tokens_per_page())
    return table(lambda m: book_calls(tokens, m))


def before_table() -> list[str]:
    """Download at 100 Mbit/s and 1 Gbit/s, and the conversion on 2 cores."""
    fast, slow = conversion_per_gb()
    lines = [
        "| model | download | at 100 Mbit/s | at 1 Gbit/s | conversion on 2 cores |",
        "|---|---:|---|---|---|",
    ]
    for model in MODELS:
        if model.name == "smollm2-135m":
            continue  # comes with make install
        gb = model.download_gb
        convert = span((gb * fast, gb * slow)) if model.converted else "none: a GGUF"
        lines.append(
            f"| `{model.name}` | {gb:.1f} GB | {span((gb * 8e9 / 100e6,) * 2)} "
            f"| {span((gb * 8e9 / 1e9,) * 2)} | {convert} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=300, help="the book's pages")
    args = parser.parse_args()
    per_page = tokens_per_page()
    tokens = round(args.pages * per_page)
    print(f"{args.pages} pages x {per_page:.0f} tokens = {tokens:,} tokens:")
    print(f"{math.ceil(tokens / CHUNK)} steps of {CHUNK:,} tokens, then the answer\n")
    print("\n".join(book_table(args.pages)), end="\n\n")
    print("One step:\n")
    print("\n".join(step_table()), end="\n\n")
    print("Before the first question:\n")
    print("\n".join(before_table()))


if __name__ == "__main__":
    main()
