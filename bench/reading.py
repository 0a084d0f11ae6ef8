"""Reading speed and memory: engine rates, batch costs, speculation, questions together, RSS.

    flock /tmp/memagent-llama.lock .venv/bin/python bench/reading.py     (make bench)

One run, default model, greedy:
1. the engine: prefill and decode rates at depths 512 to 7K tokens, and the cost of
   decoding k tokens in one batch relative to one (k = 2..16) at three depths;
2. one document and question read with speculation off, then on: the same output
   (checked), acceptance, tokens per verification batch, decode tokens/s, step seconds,
   the speedup the measured acceptance and batch costs predict and the one measured; and
   efficiency = ideal time of the exact calls (from the rates) / actual, split into the
   loop's share (time inside llama_decode during the read / actual) and the profile's
   (ideal / that time): on a shared VM the engine's speed drifts between the profile and
   the read, and only the first share is the loop's doing. efficiency_now scales each
   call's ideal by single decodes timed right after the call (against the profile's).
   Then replies that do not copy (sampled at temperature 1), where speculation must cost
   no more than 3%;
3. the cost of Q sequences decoding in one batch relative to one (Q = 1..8, 1 and 2 rows
   per sequence, depths 2048 and 6144), and 4 questions read alone one after another
   versus together: equal answers and memories (checked), seconds, and the measured gain
   against the gain those costs allow (bench/sequences.py);
4. first of all, before this process loads the model: the peak RSS of a real
   `memagent ask` on a 20K-token and a 2M-token text (bench/rss.py).
Tables go to stdout, progress to stderr, the numbers to --out as JSON, and a PNG beside it
if matplotlib is installed (bench/plots.py). --engine-only, --reading-only,
--questions-only, --rss-only and --skip-rss run parts of it (smoke runs); exit status 1
when an output check fails.

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
from memagent_cli.backend import Sampling  # noqa: E402
from memagent_cli.backends.decoding import Decoded  # noqa: E402
from memagent_cli.backends.drafting import DraftPolicy  # noqa: E402
from memagent_cli.backends.llama_cpp import LlamaCppBackend, LlamaOptions  # noqa: E402
from memagent_cli.chunking import make_chunks  # noqa: E402
from memagent_cli.errors import ModelError  # noqa: E402

QUESTION = "What is the secret password for the vault?"


def note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


VARIANTS = {  # name: (exact, speculate)
    "single-row": (False, False),  # llama-cpp-python's create_completion path, numerics and speed
    "plain": (True, False),  # every decode on the batched kernels: the exact reference
    "speculative": (True, True),
}


def read_paired(backend: LlamaCppBackend, text: str, settings: reader.Settings) -> dict:
    """Read `text` as reader.read does, each call made once per variant from an empty cache
    (the order rotating), so that all see the same prompts and the same machine load.
    The memory carried on is the exact plain reply's."""
    decoder = backend.decoder
    assert decoder is not None
    chunks = make_chunks(backend.tokenize(text), settings.chunk_tokens, backend.detokenize)
    policies = {  # each learns from scratch and keeps learning across the calls
        name: DraftPolicy(max_draft=decoder.policy.max_draft, min_rows=1 + exact)
        for name, (exact, _) in VARIANTS.items()
    }
    calls: dict[str, list[Decoded]] = {name: [] for name in VARIANTS}
    texts: dict[str, list[str]] = {name: [] for name in VARIANTS}
    now: list[tuple[int, float]] = []  # per call: depth, a single decode's seconds there
    memory = protocol.INITIAL_MEMORY
    names = list(VARIANTS)
    for index in range(len(chunks) + 1):
        if index < len(chunks):
            message = protocol.render_update(QUESTION, memory, chunks[index].text)
            max_tokens = settings.memory_tokens
        else:
            message, max_tokens = protocol.render_final(QUESTION, memory), protocol.FINAL_MAX_TOKENS
        for name in names[index % 3 :] + names[: index % 3]:
            decoder.reset()
            decoder.exact, decoder.speculate = VARIANTS[name]
            decoder.policy = policies[name]
            decoded = backend.decode(message, max_tokens=max_tokens, sampling=settings.sampling)
            calls[name].append(decoded)
            texts[name].append(decoded.text)
        depth = calls[names[0]][-1].prompt_tokens  # the last call's prompt is cached
        now.append((depth, single_decode_seconds(decoder, depth)))
        memory = protocol.strip_think(texts["plain"][-1])
        note(
            f"  call {index + 1}/{len(chunks) + 1}: "
            + ", ".join(f"{n} {calls[n][-1].seconds:.1f} s" for n in names)
        )
    return {"calls": calls, "texts": texts, "engine_now": now}


def summarize(calls: list[Decoded], ideal: Ideal, min_rows: int) -> dict[str, Any]:
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
    return {
        "seconds": sum(c.seconds for c in calls),
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
        "efficiency": ideal_seconds / sum(c.seconds for c in calls),
        # Where a shortfall comes from: time inside llama_decode during the run itself, so
        # engine/actual is the loop's own overhead and ideal/engine the profile's optimism.
        "engine_seconds": sum(c.engine_seconds for c in calls),
        "loop_efficiency": sum(c.engine_seconds for c in calls) / sum(c.seconds for c in calls),
        "profile_vs_engine": ideal_seconds / sum(c.engine_seconds for c in calls),
    }


def read_speculation(backend: LlamaCppBackend, args: argparse.Namespace, result: dict) -> None:
    """Part 2: one document and question with speculation off and on."""
    ideal = Ideal(result["engine"])
    text = story(args.sentences, seed=3)
    settings = reader.Settings(args.chunk_tokens, args.memory_tokens, Sampling(0.0))
    note("reading, each call once per variant...")
    paired = read_paired(backend, text, settings)
    # The engine's speed drifts on a shared VM: each call's ideal scaled by a single
    # decode's seconds measured right after it, over the profile's at that depth.
    drift = [seconds / ideal.decode(depth) for depth, seconds in paired["engine_now"]]
    result["engine_drift"] = drift
    for name, (exact, _) in VARIANTS.items():
        calls = paired["calls"][name]
        result[name] = summarize(calls, ideal, 1 + exact)
        now = sum(ideal.call(c, 1 + exact) * d for c, d in zip(calls, drift, strict=True))
        result[name]["efficiency_now"] = now / result[name]["seconds"]
    texts = paired["texts"]
    same = result["same_output"] = texts["plain"] == texts["speculative"]
    result["single_row_same_output"] = texts["single-row"] == texts["plain"]
    for base in ("single-row", "plain"):
        b, s = result[base], result["speculative"]
        result[f"vs_{base}"] = {
            "measured_decode_speedup": b["decode_seconds"] / s["decode_seconds"],
            "predicted_decode_speedup": s["tokens_per_cost"] / b["tokens_per_cost"],
            "measured_speedup": b["seconds"] / s["seconds"],
        }
    if args.predict_with and args.predict_with.exists():
        predict_elsewhere(paired["calls"], args.predict_with, result)
    elif args.predict_with:
        note(f"no {args.predict_with} (make bench-cheap writes it): no prediction from it")
    names = list(VARIANTS)
    print(f"{'':>24}  " + "  ".join(f"{n:>11}" for n in names))
    keys = ("seconds", "decode_tps", "efficiency", "efficiency_now", "engine_seconds")
    keys += ("loop_efficiency",)
    keys += ("profile_vs_engine", "acceptance", "tokens_per_verification")
    for key in keys:
        cells = [result[n][key] for n in names]
        print(f"{key:>24}  " + "  ".join(f"{c:>11.3f}" if c else f"{'-':>11}" for c in cells))
    s = result["speculative"]
    print(f"{'drafted / accepted':>24}  {s['drafted']} / {s['accepted']}")
    drift = " ".join(f"{d:.2f}" for d in result["engine_drift"])
    print(f"a single decode's seconds after each call / the profile's at that depth: {drift}")
    for name in names:
        calls = " ".join(f"{x:.1f}" for x in result[name]["call_seconds"])
        print(f"seconds per call {name:>12}: {calls}")
    for base in ("single-row", "plain"):
        v = result[f"vs_{base}"]
        print(
            f"speculative vs {base}: decode speedup predicted "
            f"{v['predicted_decode_speedup']:.3f}, measured {v['measured_decode_speedup']:.3f}; "
            f"whole run {v['measured_speedup']:.3f}"
        )
    print(
        f"same output speculative vs plain: {same}; "
        f"single-row vs plain: {result['single_row_same_output']}"
    )


def without_copies(backend: LlamaCppBackend, args: argparse.Namespace, result: dict) -> None:
    """Part 2b, the other side: replies sampled at temperature 1 (top-p 1), where drafts
    are mostly rejected, plain against speculative with the same seeds: the same text
    (checked), and how much slower speculation is where it cannot pay (target <= 3%)."""
    decoder = backend.decoder
    assert decoder is not None
    chunks = [story(60, seed=seed) for seed in (21, 22, 23)]
    policy = DraftPolicy(max_draft=decoder.policy.max_draft, min_rows=2)
    seconds = {"plain": 0.0, "speculative": 0.0}
    same, drafted, accepted = True, 0, 0
    for index, chunk in enumerate(chunks):
        message = protocol.render_update(QUESTION, protocol.INITIAL_MEMORY, chunk)
        sampling = Sampling(temperature=1.0, top_p=1.0, seed=index)
        texts = {}
        for name in ("plain", "speculative")[:: 1 - 2 * (index % 2)]:
            decoder.reset()
            decoder.exact, decoder.speculate = True, name == "speculative"
            decoder.policy = policy
            decoded = backend.decode(message, max_tokens=args.memory_tokens, sampling=sampling)
            texts[name] = decoded
            seconds[name] += decoded.seconds
            if name == "speculative":
                drafted, accepted = drafted + decoded.drafted, accepted + decoded.accepted
        same = same and texts["plain"].text == texts["speculative"].text
    slower = seconds["speculative"] / seconds["plain"] - 1
    result["without_copies"] = {
        "seconds": seconds, "drafted": drafted, "accepted": accepted,
        "same_output": same, "speculative_slower_by": slower,
    }  # fmt: skip
    print(
        f"replies that do not copy (temperature 1): plain {seconds['plain']:.1f} s, "
        f"speculative {seconds['speculative']:.1f} s ({slower:+.1%}), drafted / accepted "
        f"{drafted} / {accepted}, same output: {same}"
    )


def predict_elsewhere(calls: dict[str, list[Decoded]], path: Path, result: dict) -> None:
    """What these very rounds (same drafts, same acceptance) would gain on the engine
    profiled in `path` (another bench JSON, say a 7B-shaped model's): its batch costs
    and rates priced over each variant's rounds."""
    engine = json.loads(path.read_text())["engine"]
    other = Ideal(engine)
    summary = {n: summarize(calls[n], other, 1 + VARIANTS[n][0]) for n in VARIANTS}
    s = summary["speculative"]
    predicted = result["predicted_elsewhere"] = {"engine": str(path)}
    for base in ("single-row", "plain"):
        b = summary[base]
        predicted[f"vs_{base}"] = {
            "decode_speedup": s["tokens_per_cost"] / b["tokens_per_cost"],
            "speedup": b["ideal_seconds"] / s["ideal_seconds"],
        }
        print(
            f"on the engine of {path.name}: speculative vs {base}: decode speedup predicted "
            f"{predicted[f'vs_{base}']['decode_speedup']:.3f}, whole run "
            f"{predicted[f'vs_{base}']['speedup']:.3f} (batch costs at depths "
            f"{', '.join(str(d) for d in engine['batch_cost'])})"
        )


def numbers(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "bench" / "reading.json")
    parser.add_argument("--model", help="a GGUF path or registry name (default: memagent's)")
    parser.add_argument("--threads", type=int, default=2)
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
        "--reading-only", action="store_true", help="engine, then speculation off and on only"
    )
    parser.add_argument("--skip-rss", action="store_true")
    parser.add_argument(
        "--predict-with",
        type=Path,
        help="another run's JSON: price this run's speculative rounds with its engine costs",
    )
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
        backend = LlamaCppBackend(
            model.path,
            LlamaOptions(
                threads=args.threads,
                gpu_layers=0,
                flash_attn=args.flash_attn,
                cache_type_k=args.cache_type_k,
                cache_type_v=args.cache_type_v,
            ),
        )
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
                read_speculation(backend, args, result)
                if not result["same_output"]:
                    failures.append("speculation changed the output")
                without_copies(backend, args, result)
                if not result["without_copies"]["same_output"]:
                    failures.append("speculation changed a sampled reply")
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
