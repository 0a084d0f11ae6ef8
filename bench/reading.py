"""Reading speed and memory: engine rates, the ways to decode side by side, questions, RSS.

    flock /tmp/llama.lock .venv/bin/python bench/reading.py           (make bench)
    flock /tmp/llama.lock .venv/bin/python bench/reading.py --quick   (a smoke run, minutes)

One run, default model:
1. the engine: prefill and decode rates at depths 512 to 7K tokens, and the cost of
   decoding k tokens in one batch relative to one (k = 2..16) at three depths;
2. the same calls decoded five ways, side by side, each way a backend opened as the CLI's
   flags open it (LlamaOptions), every call from an empty cache, the order rotating:
   llama.cpp's single-row path (the default with --no-speculate), the default (drafts
   verified in a batch, single-row kernels otherwise, a batch row priced from this
   machine's calibration), the default with a row at the fixed price the calibration
   replaced (0.6 of a decode: fixed-price), --exact --no-speculate and --exact.
   Two cases: a reply that copies (one document read greedily, the memory carried on the
   exact reference's) and replies that do not (first updates sampled at temperature 1,
   where drafts are mostly rejected). Per case and way: seconds, decode tokens/s,
   acceptance, and floor_ratio = seconds / the engine's floor for the same calls (every
   prompt token prefilled once, one single-token decode per reply token no draft
   predicted, at the profile's rates; the goal is 1.1 or less); whether the default is
   the fastest way or within 3% of it in each case (on seconds with each way's decode
   time scaled to the reference's reply length, where near ties or sampling made its
   replies differ); --exact's output with drafts equal to without (checked). For the
   copying read also efficiency = ideal time of each way's own rounds (from the rates) /
   actual, split into the loop's share (time inside llama_decode / actual) and the
   profile's (ideal / that time): on a shared VM the engine's speed drifts between the
   profile and the read, and only the first share is the loop's doing. The _now figures
   scale each call's ideal and floor by single decodes timed right after the call;
3. the cost of Q sequences decoding in one batch relative to one (Q = 1..8, 1 and 2 rows
   per sequence, depths 2048 and 6144), and 4 questions read alone one after another
   versus together with --exact: equal answers and memories (checked), seconds, and the
   measured gain against the gain those costs allow (bench/sequences.py);
4. first of all, before this process loads the model: the peak RSS of a real
   `memagent ask` on a 20K-token and a 2M-token text (bench/rss.py).
The calibration the ways read with (which round sizes --exact may use, what the default
prices a row at: backends/calibration.py) is printed above their table and kept in the JSON.
Tables go to stdout, progress to stderr, the numbers to --out as JSON, and a PNG beside it
if matplotlib is installed (bench/plots.py). --engine-only, --reading-only,
--questions-only, --rss-only and --skip-rss run parts of it, --quick all but RSS on small
sizes; exit status 1 when an output check fails.

Where a batch is cheaper, the same run with another model (`--model`), for instance the
default model dequantized to F32 (bench/shaped.py f32), and the engine part for a
7B-shaped model (bench/shaped.py 7b; `--engine-only --depths 512,1024`): `--predict-with`
that run's JSON prices this run's own rounds and acceptance with its engine costs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

import plots  # noqa: E402
import rss  # noqa: E402
import sequences  # noqa: E402
from engine import (  # noqa: E402
    COST_DEPTHS,
    DEPTHS,
    Ideal,
    engine_profile,
    print_engine,
    single_decode_seconds,
)
from village import story  # noqa: E402

from memagent_cli import models, protocol, reader  # noqa: E402
from memagent_cli.backend import Call, Sampling  # noqa: E402
from memagent_cli.backends import calibration  # noqa: E402
from memagent_cli.backends.decoding import Decoded  # noqa: E402
from memagent_cli.backends.llama_cpp import LlamaCppBackend, LlamaOptions  # noqa: E402
from memagent_cli.chunking import make_chunks  # noqa: E402
from memagent_cli.errors import ModelError  # noqa: E402

QUESTION = "What is the secret password for the vault?"
# --quick: every part but RSS on small sizes, to see that the bench runs (a few minutes).
QUICK = {
    "sentences": 60, "chunk_tokens": 300, "memory_tokens": 64,
    "depths": [512, 1024], "cost_depths": [512], "seq_depths": [512],
    "skip_rss": True, "sampled_chunks": 2, "sampled_sentences": 25, "questions": 2,
}  # fmt: skip


def note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


VARIANTS = {  # name: (exact, speculate), as LlamaOptions and the CLI's flags take them
    # llama.cpp's own path (its server, create_completion): the default with --no-speculate
    "single-row": (False, False),
    "default": (False, True),  # drafts verified in a batch, single-row kernels otherwise
    # The default as it was before the calibration priced its rows: 0.6 of a decode a row
    # (backends/drafting.py DraftPolicy.PRICE). The calibration must be no slower.
    "fixed-price": (False, True),
    "exact-plain": (True, False),  # --exact --no-speculate: the reference
    "exact": (True, True),  # --exact: the reference's output, byte for byte (checked)
}
PAIRS = (("default", "single-row"), ("exact", "exact-plain"))  # with drafts, without
WITHIN = 1.03  # the default must be the fastest way, or this close to it (issue 20)


def open_variants(path: Path, options: LlamaOptions, context: int) -> dict[str, LlamaCppBackend]:
    """One backend per way of decoding, opened as the CLI's flags open it: each with its
    own draft policy, learning from scratch."""
    backends = {}
    for name, (exact, speculate) in VARIANTS.items():
        backend = LlamaCppBackend(path, replace(options, exact=exact, speculate=speculate))
        backend.prepare(context)
        if name == "fixed-price":
            assert backend.decoder is not None
            backend.decoder.policy.prices = None  # DraftPolicy.PRICE a row, not the costs
        backends[name] = backend
    return backends


def each_way(
    backends: dict[str, LlamaCppBackend],
    message: str,
    max_tokens: int,
    sampling: Sampling,
    turn: int,
) -> tuple[dict[str, Decoded], tuple[int, float]]:
    """One call decoded by every backend from an empty cache, the order rotating with
    `turn` so that all see the same machine load; then a single decode's seconds at the
    prompt's depth (the engine's speed this minute, against its profile's)."""
    names = list(backends)
    order = names[turn % len(names) :] + names[: turn % len(names)]
    replies = {}
    for name in order:
        call = Call(message, max_tokens, fresh=True)
        replies[name] = backends[name].decode_many([call], sampling=sampling)[0]
    last = backends[order[-1]]
    assert last.decoder is not None
    depth = replies[order[-1]].prompt_tokens  # the prompt stays cached after the call
    note(f"  call {turn + 1}: " + ", ".join(f"{n} {replies[n].seconds:.1f} s" for n in names))
    return {n: replies[n] for n in names}, (depth, single_decode_seconds(last.decoder, depth))


Calls = dict[str, list[Decoded]]
EngineNow = list[tuple[int, float]]  # per call: depth, a single decode's seconds there


def read_copying(
    backends: dict[str, LlamaCppBackend], text: str, settings: reader.Settings
) -> tuple[Calls, EngineNow]:
    """Read `text` as reader.read does, each call decoded every way; the memory carried on
    is the reference's (exact-plain), so that every way sees the same prompts."""
    first = next(iter(backends.values()))
    chunks = make_chunks(first.tokenize(text), settings.chunk_tokens, first.detokenize)
    calls: Calls = {name: [] for name in backends}
    now: EngineNow = []
    memory = protocol.INITIAL_MEMORY
    for index in range(len(chunks) + 1):
        if index < len(chunks):
            message = protocol.render_update(QUESTION, memory, chunks[index].text)
            max_tokens = settings.memory_tokens
        else:
            message, max_tokens = protocol.render_final(QUESTION, memory), protocol.FINAL_MAX_TOKENS
        replies, engine_now = each_way(backends, message, max_tokens, settings.sampling, index)
        for name, decoded in replies.items():
            calls[name].append(decoded)
        now.append(engine_now)
        memory = protocol.strip_think(replies["exact-plain"].text)
    return calls, now


def sampled_messages(args: argparse.Namespace) -> list[str]:
    """First updates over short stories: a reply has nothing of its own to copy yet."""
    chunks = [story(args.sampled_sentences, seed=21 + i) for i in range(args.sampled_chunks)]
    return [protocol.render_update(QUESTION, protocol.INITIAL_MEMORY, c) for c in chunks]


def read_sampled(
    backends: dict[str, LlamaCppBackend], args: argparse.Namespace
) -> tuple[Calls, EngineNow]:
    """Replies that do not copy: sampled at temperature 1 (top-p 1), where drafts are
    mostly rejected; one seed per message, the same for every way."""
    calls: Calls = {name: [] for name in backends}
    now: EngineNow = []
    for index, message in enumerate(sampled_messages(args)):
        sampling = Sampling(temperature=1.0, top_p=1.0, seed=index)
        replies, engine_now = each_way(backends, message, args.memory_tokens, sampling, index)
        for name, decoded in replies.items():
            calls[name].append(decoded)
        now.append(engine_now)
    return calls, now


def floor_seconds(decoded: Decoded, ideal: Ideal) -> float:
    """The engine's floor for one call: every prompt token prefilled once, and one
    single-token decode per reply token that no draft predicted (the first comes with the
    prefill, the end of the reply needs one), at the profile's rates."""
    undrafted = len(decoded.tokens) - decoded.accepted
    middle = decoded.prompt_tokens + len(decoded.tokens) / 2  # decode time is ~linear in depth
    return ideal.prefill(0, decoded.prompt_tokens) + undrafted * ideal.decode(round(middle))


def summarize(
    calls: list[Decoded],
    ideal: Ideal,
    min_rows: int,
    drift: list[float],
    reference: list[Decoded],
) -> dict[str, Any]:
    """One way's calls: time, drafts, efficiency against the ideal of its own rounds, and
    the ratio to the engine's floor. `drift` scales each call's ideal and floor by the
    engine's speed right after it; `reference` is the exact-plain way's calls."""
    seconds = sum(c.seconds for c in calls)
    drafted = sum(c.drafted for c in calls)
    accepted = sum(c.accepted for c in calls)
    decode_seconds = sum(c.seconds - c.prompt_seconds for c in calls)
    decode_tokens = sum(len(c.tokens) for c in calls)
    verify = [(n, e) for c in calls for n, e in c.rounds if n > 1]
    rounds = [(c.prompt_tokens, n, e) for c in calls for n, e in c.rounds]
    # Tokens per single-decode's worth of engine time: a round of n tokens costs c(n).
    cost = sum(ideal.cost(d, max(n, min_rows)) for d, n, _ in rounds)  # exact mode pads 1 row
    per_cost = sum(e for _, _, e in rounds) / max(cost, 1e-9)
    ideal_seconds = sum(ideal.call(c, min_rows) for c in calls)
    ideal_now = sum(ideal.call(c, min_rows) * d for c, d in zip(calls, drift, strict=True))
    floor = sum(floor_seconds(c, ideal) for c in calls)
    floor_now = sum(floor_seconds(c, ideal) * d for c, d in zip(calls, drift, strict=True))
    # Where a way's replies differ from the reference's (near ties, or another sample at
    # temperature 1), its decode time is scaled to the reference's reply length.
    same_tokens = sum(
        c.prompt_seconds + (c.seconds - c.prompt_seconds) * len(r.tokens) / len(c.tokens)
        if c.tokens
        else c.seconds
        for c, r in zip(calls, reference, strict=True)
    )
    engine_seconds = sum(c.engine_seconds for c in calls)
    return {
        "seconds": seconds,
        "seconds_same_tokens": same_tokens,
        "call_seconds": [c.seconds for c in calls],
        "prompt_tokens": [c.prompt_tokens for c in calls],
        "completion_tokens": [len(c.tokens) for c in calls],
        "decode_tokens": decode_tokens,
        "decode_seconds": decode_seconds,
        "decode_tps": decode_tokens / max(decode_seconds, 1e-9),
        "drafted": drafted,
        "accepted": accepted,
        "acceptance": accepted / drafted if drafted else None,
        "verification_batches": len(verify),
        "tokens_per_verification": sum(e for _, e in verify) / len(verify) if verify else None,
        "tokens_per_cost": per_cost,
        "ideal_seconds": ideal_seconds,
        "efficiency": ideal_seconds / seconds,
        "efficiency_now": ideal_now / seconds,
        "floor_seconds": floor,
        "floor_ratio": seconds / floor,
        "floor_ratio_now": seconds / floor_now,
        # Where a shortfall comes from: time inside llama_decode during the run itself, so
        # engine/actual is the loop's own overhead and ideal/engine the profile's optimism.
        "engine_seconds": engine_seconds,
        "loop_efficiency": engine_seconds / seconds,
        "profile_vs_engine": ideal_seconds / engine_seconds,
    }


def compare(calls: Calls, now: EngineNow, ideal: Ideal) -> dict[str, Any]:
    """One case decoded every way: each way's summary, which outputs are equal, and where
    the default stands against the fastest way."""
    drift = [seconds / ideal.decode(depth) for depth, seconds in now]
    case: dict[str, Any] = {"engine_drift": drift}
    for name, (exact, _) in VARIANTS.items():
        case[name] = summarize(calls[name], ideal, 1 + exact, drift, calls["exact-plain"])
    texts = {name: [c.text for c in calls[name]] for name in VARIANTS}
    case["same_output"] = {  # only --exact promises the first
        "exact vs exact-plain": texts["exact"] == texts["exact-plain"],
        "default vs single-row": texts["default"] == texts["single-row"],
        "single-row vs exact-plain": texts["single-row"] == texts["exact-plain"],
    }
    fastest = min(case[name]["seconds_same_tokens"] for name in VARIANTS)
    case["default_vs_fastest"] = case["default"]["seconds_same_tokens"] / fastest
    case["default_fastest_or_within_3pct"] = case["default_vs_fastest"] <= WITHIN
    # The calibration's prices against the fixed one they replaced: at least as fast.
    case["calibrated_vs_fixed_price"] = (
        case["fixed-price"]["seconds_same_tokens"] / case["default"]["seconds_same_tokens"]
    )
    case["calibrated_at_least_as_fast"] = case["calibrated_vs_fixed_price"] >= 1 / WITHIN
    case["floor_ratio"] = case["default"]["floor_ratio"]
    for drafts, plain in PAIRS:
        d, p = case[drafts], case[plain]
        case[f"{drafts}_vs_{plain}"] = {
            "measured_decode_speedup": p["decode_seconds"] / d["decode_seconds"],
            "predicted_decode_speedup": d["tokens_per_cost"] / p["tokens_per_cost"],
            "measured_speedup": p["seconds"] / d["seconds"],
        }
    return case


SIDE_BY_SIDE = (  # key, label, format
    ("seconds", "seconds", ".1f"),
    ("seconds_same_tokens", "seconds, reference's tokens", ".1f"),
    ("decode_tokens", "reply tokens", "d"),
    ("decode_tps", "decode tok/s", ".1f"),
    ("acceptance", "drafts accepted", ".3f"),
    ("tokens_per_verification", "tokens per verification", ".2f"),
    ("floor_ratio", "floor ratio (goal <= 1.1)", ".3f"),
    ("floor_ratio_now", "floor ratio, engine now", ".3f"),
)
CASES = {  # result key: title
    "copying": "a reply that copies (one document read greedily)",
    "without_copies": "replies that do not copy (temperature 1)",
}


def print_side_by_side(result: dict[str, Any]) -> None:
    names = list(VARIANTS)
    print(f"calibration used: {calibration_line(result.get('calibration'))}")
    print(f"{'':>28}  " + "  ".join(f"{n:>11}" for n in names))
    for key, title in CASES.items():
        if key not in result:
            continue
        case = result[key]
        print(f"{title}:")
        for field, label, fmt in SIDE_BY_SIDE:
            cells = [case[n][field] for n in names]
            print(
                f"{label:>28}  "
                + "  ".join(f"{c:>11{fmt}}" if c is not None else f"{'-':>11}" for c in cells)
            )
        mark = "yes" if case["default_fastest_or_within_3pct"] else "NO"
        print(
            f"{'default fastest or within 3%':>28}  {mark}: "
            f"{case['default_vs_fastest']:.3f}x the fastest (seconds, reference's tokens)"
        )
        mark = "yes" if case["calibrated_at_least_as_fast"] else "NO"
        print(
            f"{'calibrated vs fixed price':>28}  {mark}: the fixed price took "
            f"{case['calibrated_vs_fixed_price']:.3f}x the default's time (within 3% or more)"
        )
        same = ", ".join(f"{k} {v}" for k, v in case["same_output"].items())
        print(f"{'same output':>28}  {same}")
        for drafts, plain in PAIRS:
            v = case[f"{drafts}_vs_{plain}"]
            print(
                f"{f'{drafts} vs {plain}':>28}  decode speedup predicted "
                f"{v['predicted_decode_speedup']:.3f}, measured "
                f"{v['measured_decode_speedup']:.3f}; whole case {v['measured_speedup']:.3f}"
            )


def calibration_line(record: dict[str, Any] | None) -> str:
    """The calibration a result was read with, in one line (none: drafts were off)."""
    if record is None:
        return "none"
    found = calibration.parse(json.dumps(record).encode())
    return f"{calibration.settings(found)}: {found.summary()}"


def print_copying(case: dict[str, Any]) -> None:
    """The copying read in detail: where its time goes against the engine's profile."""
    names = list(VARIANTS)
    print("the copying read, against the ideal of each way's own rounds:")
    print(f"{'':>24}  " + "  ".join(f"{n:>11}" for n in names))
    keys = ("efficiency", "efficiency_now", "engine_seconds", "loop_efficiency")
    keys += ("profile_vs_engine", "ideal_seconds", "floor_seconds")
    for key in keys:
        cells = [case[n][key] for n in names]
        print(f"{key:>24}  " + "  ".join(f"{c:>11.3f}" for c in cells))
    for name in names:
        s = case[name]
        if s["drafted"]:
            print(f"{'drafted / accepted':>24}  {name}: {s['drafted']} / {s['accepted']}")
    drift = " ".join(f"{d:.2f}" for d in case["engine_drift"])
    print(f"a single decode's seconds after each call / the profile's at that depth: {drift}")
    for name in names:
        calls = " ".join(f"{x:.1f}" for x in case[name]["call_seconds"])
        print(f"seconds per call {name:>11}: {calls}")


def read_ways(
    backend: LlamaCppBackend, args: argparse.Namespace, result: dict, failures: list[str]
) -> None:
    """Part 2: the same calls decoded every way, for a copying reply and non-copying ones."""
    ideal = Ideal(result["engine"])
    settings = reader.Settings(args.chunk_tokens, args.memory_tokens, Sampling(0.0))
    sampled = max(len(backend.tokenize(m)) for m in sampled_messages(args))
    context = max(
        reader.context_needed(backend, [QUESTION], settings),
        backend.chat_overhead() + sampled + args.memory_tokens + 16,
    )
    backends = open_variants(backend.path, backend.options, context)
    # What the default's prices and --exact's round sizes come from (one per model and
    # engine settings, the same for every way: backends/calibration.py).
    used = backends["exact"].calibration
    result["calibration"] = used.to_json() if used is not None else None
    note("a reply that copies: one document, each call decoded every way...")
    copying, now = read_copying(backends, story(args.sentences, seed=3), settings)
    result["copying"] = compare(copying, now, ideal)
    # Draft policies start again from scratch, as in a new `memagent ask`.
    del backends
    backends = open_variants(backend.path, backend.options, context)
    note("replies that do not copy (temperature 1), each decoded every way...")
    result["without_copies"] = compare(*read_sampled(backends, args), ideal)
    del backends
    print_side_by_side(result)
    rows = [result[key]["default_fastest_or_within_3pct"] for key in CASES]
    print(f"default fastest or within 3% in every row: {'yes' if all(rows) else 'NO'}")
    priced = [result[key]["calibrated_at_least_as_fast"] for key in CASES]
    print(
        "calibrated prices at least as fast as the fixed price in every row: "
        + ("yes" if all(priced) else "NO")
    )
    print(
        "floor ratio of the default: "
        + ", ".join(f"{key} {result[key]['floor_ratio']:.3f}" for key in CASES)
        + " (the engine's floor: every prompt token prefilled once, one decode per reply "
        "token no draft predicted)"
    )
    print_copying(result["copying"])
    if args.predict_with and args.predict_with.exists():
        predict_elsewhere(copying, args.predict_with, result)
    elif args.predict_with:
        note(f"no {args.predict_with} (make bench-cheap writes it): no prediction from it")
    for key, title in CASES.items():
        if not result[key]["same_output"]["exact vs exact-plain"]:
            failures.append(f"--exact with drafts changed the output of {title}")


def predict_elsewhere(calls: Calls, path: Path, result: dict) -> None:
    """What these very rounds (same drafts, same acceptance) would gain on the engine
    profiled in `path` (another bench JSON, say a 7B-shaped model's): its batch costs
    and rates priced over each way's rounds."""
    engine = json.loads(path.read_text())["engine"]
    other = Ideal(engine)
    ones = [1.0] * len(calls["exact-plain"])
    summary = {
        name: summarize(calls[name], other, 1 + exact, ones, calls["exact-plain"])
        for name, (exact, _) in VARIANTS.items()
    }
    predicted = result["predicted_elsewhere"] = {"engine": str(path)}
    for drafts, plain in PAIRS:
        d, p = summary[drafts], summary[plain]
        predicted[f"{drafts}_vs_{plain}"] = {
            "decode_speedup": d["tokens_per_cost"] / p["tokens_per_cost"],
            "speedup": p["ideal_seconds"] / d["ideal_seconds"],
        }
        print(
            f"on the engine of {path.name}: {drafts} vs {plain}: decode speedup predicted "
            f"{predicted[f'{drafts}_vs_{plain}']['decode_speedup']:.3f}, whole run "
            f"{predicted[f'{drafts}_vs_{plain}']['speedup']:.3f} (batch costs at depths "
            f"{', '.join(str(d) for d in engine['batch_cost'])})"
        )
    # The ways side by side on that engine: which is fastest there, and the default's
    # time against it (these rounds, drafts and acceptance; that engine's costs).
    seconds = {name: summary[name]["ideal_seconds"] for name in VARIANTS}
    fastest = min(seconds, key=seconds.get)
    predicted["ideal_seconds"] = seconds
    predicted["default_vs_fastest"] = seconds["default"] / seconds[fastest]
    print(
        f"on the engine of {path.name}, seconds: "
        + ", ".join(f"{name} {value:.1f}" for name, value in seconds.items())
        + f"; the default {predicted['default_vs_fastest']:.3f}x the fastest ({fastest})"
    )


def numbers(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "bench" / "reading.json")
    parser.add_argument("--model", help="a GGUF path or registry name (default: memagent's)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--gpu-layers", type=int, default=0, help="layers offloaded to the GPU (99: all)"
    )
    parser.add_argument("--sentences", type=int, default=400, help="document length")
    parser.add_argument("--chunk-tokens", type=int, default=1500)
    parser.add_argument("--memory-tokens", type=int, default=512)
    parser.add_argument("--flash-attn", default="off")
    parser.add_argument("--cache-type-k", default="f16")
    parser.add_argument("--cache-type-v", default="f16")
    parser.add_argument(
        "--depths", type=numbers, default=list(DEPTHS), help="depths of the engine's rates"
    )
    parser.add_argument(
        "--cost-depths", type=numbers, default=list(COST_DEPTHS), help="depths of batch costs"
    )
    parser.add_argument(
        "--seq-depths", type=numbers, default=[2048, 6144], help="depths of the Q-sequence costs"
    )
    parser.add_argument(
        "--rss-tokens", type=numbers, default=[20_000, 2_000_000], help="text sizes for peak RSS"
    )
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--engine-only", action="store_true", help="engine rates and costs only")
    only.add_argument(
        "--questions-only", action="store_true", help="Q-sequence costs and questions together"
    )
    only.add_argument("--rss-only", action="store_true", help="peak RSS of memagent ask only")
    only.add_argument(
        "--reading-only", action="store_true", help="engine, then the ways to decode only"
    )
    parser.add_argument("--skip-rss", action="store_true")
    parser.add_argument(
        "--predict-with",
        type=Path,
        help="another run's JSON: price this run's speculative rounds with its engine costs",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: every part but RSS, on a short document, short replies, few depths",
    )
    parser.add_argument(
        "--sampled-chunks", type=int, default=3, help="replies sampled at temperature 1"
    )
    parser.add_argument(
        "--sampled-sentences", type=int, default=60, help="sentences of each sampled chunk"
    )
    parser.add_argument(
        "--questions", type=int, default=len(sequences.QUESTIONS), help="questions read together"
    )
    if "--quick" in sys.argv[1:]:
        parser.set_defaults(**QUICK)  # flags given beside it still win
    return parser.parse_args()


def main() -> None:
    args = arguments()
    try:
        model = models.resolve(args.model)
    except ModelError as error:
        sys.exit(str(error))
    os.environ[models.ENV_VAR] = str(model.path)  # the RSS part's `memagent ask` too
    result: dict[str, Any] = {
        "machine": f"{platform.machine()}, {args.threads} threads, {platform.processor() or ''}",
        "model": model.path.name,
        "settings": vars(args) | {"out": str(args.out)},
        "load_average_start": os.getloadavg(),  # above ~2: other work shares the 2 cores
    }
    failures = []
    # First, before this process loads a model: `memagent ask` runs as a child.
    if args.rss_only or not (
        args.skip_rss or args.engine_only or args.questions_only or args.reading_only
    ):
        note("peak RSS of memagent ask...")
        result["rss"] = rss.peak_rss(args.rss_tokens)
        rss.print_table(result["rss"])
    if not args.rss_only:
        options = LlamaOptions(
            threads=args.threads,
            gpu_layers=args.gpu_layers,
            flash_attn=args.flash_attn,
            cache_type_k=args.cache_type_k,
            cache_type_v=args.cache_type_v,
        )
        backend = LlamaCppBackend(model.path, options)
        note(
            f"engine: {model.path.name}, {args.threads} threads, flash attention {args.flash_attn}"
        )
        long_tokens = backend.tokenize(story(900, fact=None, seed=11))
        if not args.questions_only:
            backend.prepare(8192)
            result["engine"] = engine_profile(
                backend, long_tokens, tuple(args.depths), tuple(args.cost_depths)
            )
            print_engine(result["engine"])
            if not args.engine_only:
                read_ways(backend, args, result, failures)
        if not args.reading_only:
            sequences.read_questions(backend, args, long_tokens, result, failures)
    result["load_average"] = os.getloadavg()  # above ~2: other processes shared the cores
    # This process's own peak: an 8-sequence context of the deepest Q-sequence depth.
    result["bench_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of this benchmark process {result['bench_peak_rss_mb']:.0f} MB")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str))
    note(f"wrote {args.out}")
    if plots.plot(result, list(VARIANTS), args.out.with_suffix(".png")):
        note(f"wrote {args.out.with_suffix('.png')}")
    if failures:
        sys.exit("; ".join(failures))


if __name__ == "__main__":
    main()
