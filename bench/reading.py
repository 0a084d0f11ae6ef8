"""Reading speed and memory: engine rates, batch costs, speculation, questions together, RSS.

    flock /tmp/memagent-llama.lock .venv/bin/python bench/reading.py     (make bench)

One run, default model, greedy:
1. the engine: prefill and decode rates at depths 512 to 7K tokens, and the cost of
   decoding k tokens in one batch relative to one (k = 2..16) at three depths;
2. one document and question read with speculation off, then on: the same output
   (checked), acceptance, tokens per verification batch, decode tokens/s, step seconds,
   the speedup the measured acceptance and batch costs predict and the one measured; and
   for the plain run, efficiency = ideal time of its exact calls (from the rates) / actual;
3. the cost of Q sequences decoding in one batch relative to one (Q = 1..8, 1 and 2 rows
   per sequence, depths 2048 and 6144), and 4 questions read alone one after another
   versus together: equal answers and memories (checked), seconds, and the measured gain
   against the gain those costs allow (bench/sequences.py);
4. first of all, before this process loads the model: the peak RSS of a real
   `memagent ask` on a 20K-token and a 2M-token text (bench/rss.py).
Tables go to stdout, progress to stderr, the numbers to --out as JSON, and a PNG beside it
if matplotlib is installed (bench/plots.py). --engine-only, --questions-only, --rss-only
and --skip-rss run parts of it (smoke runs); exit status 1 when an output check fails.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

import plots  # noqa: E402
import rss  # noqa: E402
import sequences  # noqa: E402
from village import story  # noqa: E402

from memagent_cli import models, protocol, reader  # noqa: E402
from memagent_cli.backends import Sampling  # noqa: E402
from memagent_cli.backends.decoding import Batch, Decoded  # noqa: E402
from memagent_cli.backends.drafting import DraftPolicy  # noqa: E402
from memagent_cli.backends.llama_cpp import LlamaCppBackend  # noqa: E402
from memagent_cli.chunking import make_chunks  # noqa: E402

DEPTHS = (512, 1024, 2048, 4096, 7168)
COST_DEPTHS = (512, 2048, 6144)
KS = tuple(range(1, 17))
QUESTION = "What is the secret password for the vault?"


def note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def timed_decode(batch: Batch, context: Any) -> float:
    start = time.perf_counter()
    batch.decode(context)
    return time.perf_counter() - start


def engine_profile(backend: LlamaCppBackend, tokens: list[int]) -> dict[str, Any]:
    """Prefill to 7K in n_batch pieces; at each depth time single decodes and k-token batches."""
    import llama_cpp

    decoder = backend.decoder
    assert decoder is not None
    decoder.reset()
    context, memory = decoder.context, decoder.memory
    batch = Batch(decoder.n_batch)
    segments: list[tuple[int, int, float]] = []  # start, tokens, seconds
    rates, costs = [], {}
    pos = 0

    def fill(start: int, count: int) -> None:
        batch.clear()
        for i in range(count):
            batch.add(tokens[start + i], start + i, 0, True)

    def batch_seconds(k: int, repeats: int) -> float:
        """Seconds to decode k tokens at the current depth, each with logits (as a
        verification does); the cache is cut back after each. The minimum of a few tries:
        on a shared 2-core machine any other process stalls llama.cpp's threads."""
        times = []
        for _ in range(repeats):
            fill(pos, k)
            times.append(timed_decode(batch, context))
            llama_cpp.llama_memory_seq_rm(memory, 0, pos, -1)
        return min(times)

    for depth in sorted(set(DEPTHS) | set(COST_DEPTHS)):
        while pos < depth:
            n = min(decoder.n_batch, depth - pos)
            batch.clear()
            for i in range(n):
                batch.add(tokens[pos + i], pos + i, 0, i == n - 1)
            segments.append((pos, n, timed_decode(batch, context)))
            pos += n
        # Single decodes one after another, as generating does.
        singles = []
        for i in range(16):
            fill(pos + i, 1)
            singles.append(timed_decode(batch, context))
        llama_cpp.llama_memory_seq_rm(memory, 0, pos, -1)
        single = statistics.median(sorted(singles)[:8])  # the faster half: see batch_seconds
        if depth in DEPTHS:
            start, n, seconds = segments[-1]
            rates.append({"depth": depth, "prefill_tps": n / seconds, "decode_tps": 1 / single})
            note(f"  depth {depth}: prefill {n / seconds:.0f} tok/s, decode {1 / single:.1f} tok/s")
        if depth in COST_DEPTHS:
            # Sizes take turns, so that a burst of other work does not hit one size only.
            best = {k: min(batch_seconds(k, 1) for _ in range(2)) for k in KS}
            for _ in range(3):
                for k in KS:
                    best[k] = min(best[k], batch_seconds(k, 1))
            costs[depth] = {k: best[k] / best[1] for k in KS}
            note(f"  depth {depth}: batch cost " + " ".join(f"{costs[depth][k]:.2f}" for k in KS))
    decoder.reset()
    return {"rates": rates, "batch_cost": costs, "prefill_segments": segments}


class Ideal:
    """The engine's own time for a call, from the measured rates (linear in depth)."""

    def __init__(self, profile: dict[str, Any]) -> None:
        self.ends, self.cumulative = [0], [0.0]
        for start, n, seconds in profile["prefill_segments"]:
            self.ends.append(start + n)
            self.cumulative.append(self.cumulative[-1] + seconds)
        self.depths = [r["depth"] for r in profile["rates"]]
        self.single = [1 / r["decode_tps"] for r in profile["rates"]]
        self.costs = profile["batch_cost"]

    @staticmethod
    def _interpolate(xs: list, ys: list, x: float) -> float:
        i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)

    def prefill(self, start: int, end: int) -> float:
        ends, cumulative = self.ends, self.cumulative
        return self._interpolate(ends, cumulative, end) - self._interpolate(ends, cumulative, start)

    def decode(self, depth: int) -> float:
        return self._interpolate(self.depths, self.single, depth)

    def cost(self, depth: int, size: int) -> float:
        nearest = min(self.costs, key=lambda d: abs(d - depth))
        return self.costs[nearest][min(size, max(KS))]

    def call(self, decoded: Decoded, min_rows: int) -> float:
        """Prefill what the call prefilled, then each round at its batch cost and depth."""
        seconds = self.prefill(decoded.reused_tokens, decoded.prompt_tokens)
        depth = decoded.prompt_tokens
        for rows, emitted in decoded.rounds:
            seconds += self.decode(depth) * self.cost(depth, max(rows, min_rows))
            depth += emitted
        return seconds


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
            reply = backend.generate(message, max_tokens=max_tokens, sampling=settings.sampling)
            assert backend.last_decoded is not None
            calls[name].append(backend.last_decoded)
            texts[name].append(reply.text)
        memory = protocol.strip_think(texts["plain"][-1])
        note(
            f"  call {index + 1}/{len(chunks) + 1}: "
            + ", ".join(f"{n} {calls[n][-1].seconds:.1f} s" for n in names)
        )
    return {"calls": calls, "texts": texts}


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
    }


def read_speculation(backend: LlamaCppBackend, args: argparse.Namespace, result: dict) -> None:
    """Part 2: one document and question with speculation off and on."""
    ideal = Ideal(result["engine"])
    text = story(args.sentences, seed=3)
    settings = reader.Settings(args.chunk_tokens, args.memory_tokens, Sampling(0.0))
    note("reading, each call once per variant...")
    paired = read_paired(backend, text, settings)
    for name, (exact, _) in VARIANTS.items():
        result[name] = summarize(paired["calls"][name], ideal, 1 + exact)
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
    names = list(VARIANTS)
    print(f"{'':>24}  " + "  ".join(f"{n:>11}" for n in names))
    for key in ("seconds", "decode_tps", "efficiency", "acceptance", "tokens_per_verification"):
        cells = [result[n][key] for n in names]
        print(f"{key:>24}  " + "  ".join(f"{c:>11.3f}" if c else f"{'-':>11}" for c in cells))
    s = result["speculative"]
    print(f"{'drafted / accepted':>24}  {s['drafted']} / {s['accepted']}")
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


def print_engine(engine: dict[str, Any]) -> None:
    print(f"{'depth':>6}  {'prefill tok/s':>13}  {'decode tok/s':>12}")
    for r in engine["rates"]:
        print(f"{r['depth']:>6}  {r['prefill_tps']:>13.0f}  {r['decode_tps']:>12.1f}")
    print("cost of k tokens in one batch, in single decodes:")
    print(f"{'depth':>6}  " + " ".join(f"{k:>5}" for k in KS))
    for depth, table in engine["batch_cost"].items():
        print(f"{depth:>6}  " + " ".join(f"{table[k]:>5.2f}" for k in KS))


def numbers(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "bench" / "reading.json")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sentences", type=int, default=400, help="document length")
    parser.add_argument("--chunk-tokens", type=int, default=1500)
    parser.add_argument("--memory-tokens", type=int, default=512)
    parser.add_argument("--flash-attn", default="off")
    parser.add_argument("--cache-type-k", default="f16")
    parser.add_argument("--cache-type-v", default="f16")
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
    parser.add_argument("--skip-rss", action="store_true")
    return parser.parse_args()


def main() -> None:
    args = arguments()
    model = models.resolve(None)
    result: dict[str, Any] = {
        "machine": f"{platform.machine()}, {args.threads} threads, {platform.processor() or ''}",
        "model": model.path.name,
        "settings": vars(args) | {"out": str(args.out)},
        "load_average_start": os.getloadavg(),  # above ~2: other work shares the 2 cores
    }
    failures = []
    # First, before this process loads a model: `memagent ask` runs as a child.
    if args.rss_only or not (args.skip_rss or args.engine_only or args.questions_only):
        note("peak RSS of memagent ask...")
        result["rss"] = rss.peak_rss(args.rss_tokens)
        rss.print_table(result["rss"])
    if not args.rss_only:
        backend = LlamaCppBackend(
            model.path,
            threads=args.threads,
            gpu_layers=0,
            flash_attn=args.flash_attn,
            cache_type_k=args.cache_type_k,
            cache_type_v=args.cache_type_v,
        )
        note(
            f"engine: {model.path.name}, {args.threads} threads, flash attention {args.flash_attn}"
        )
        long_tokens = backend.tokenize(story(900, fact=None, seed=11))
        if not args.questions_only:
            backend.prepare(8192)
            result["engine"] = engine_profile(backend, long_tokens)
            print_engine(result["engine"])
            if not args.engine_only:
                read_speculation(backend, args, result)
                if not result["same_output"]:
                    failures.append("speculation changed the output")
        note(f"Q sequences in one batch, at depths {args.seq_depths}...")
        costs = result["sequence_costs"] = sequences.sequence_costs(
            backend, long_tokens, args.seq_depths
        )
        if not costs["copy_checked"]:
            failures.append("a sequence copied with llama_memory_seq_cp differs from sequence 0")
        together = None
        if not args.engine_only:
            note("questions read alone, then together...")
            settings = reader.Settings(args.chunk_tokens, args.memory_tokens, Sampling(0.0))
            together = result["together"] = sequences.alone_vs_together(
                backend, story(args.sentences, seed=3), settings, costs
            )
            if not together["same_answers_and_memories"]:
                failures.append("questions read together differ from the same read alone")
        sequences.print_tables(costs, together)
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
