"""Continuous batching in-process on the held-in needle cases: `memagent eval niah` one case
at a time against N cases at once in one context, and the gain the engine's own N-sequence
cost allows.

    python bench/continuous.py [--lengths 1K,2K --depths 3 --parallel 3]     (make bench)

1. The engine: a decode round of N sequences (1 row each, the default decoding; 2 with
   --exact) against one sequence's round, at the depth of an update call
   (bench/sequences.py's measure).
2. The same cases read by `memagent eval niah --parallel 1` and `--parallel N` (greedy,
   traces on), each a real subprocess; both runs' replies are compared, and the tokens
   each prefilled and decoded. Without --exact the two may write other replies (near-tie
   tokens), so other amounts of work: --exact reads the same tokens both ways.
3. Allowed gain: prefills stay one after another, decode rounds of N cost cost(N) x one, so
   one by one's prefill P and decode D (from its traces) allow (P + D) / (P + D cost(N) / N).

Run alone, under the machine's model lock: it loads the model.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "examples"))

from sequences import sequence_costs  # noqa: E402
from village import story  # noqa: E402

COUNTED = ("prompt_tokens", "completion_tokens", "drafted", "accepted")  # from the traces
MEMAGENT = [sys.executable, "-m", "memagent_cli"]  # also where no console script is installed


def note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def engine_cost(
    depth: int, threads: int, gpu_layers: int | None, rows: int = 1
) -> dict[int, float]:
    """cost(N) of a decode round of `rows` rows per sequence at `depth`, N = 1..8."""
    from memagent_cli.backends.llama_cpp import LlamaCppBackend, LlamaOptions
    from memagent_cli.models import resolve

    options = LlamaOptions(threads=threads, gpu_layers=gpu_layers)
    backend = LlamaCppBackend(resolve(None).path, options)
    tokens = backend.tokenize(story(depth // 8, fact=None))
    costs = sequence_costs(backend, tokens, [depth], passes=3)
    return {q: c for q, c in costs["depths"][depth]["cost"][rows].items()}


def run_eval(haystack: Path, args: argparse.Namespace, parallel: int, home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMAGENT_")}
    env["XDG_DATA_HOME"] = str(home / f"data{parallel}")
    out = home / f"p{parallel}.jsonl"
    command = [
        *MEMAGENT, "eval", "niah", "--haystack", str(haystack),
        "--lengths", args.lengths, "--depths", args.depths,
        "--chunk-tokens", str(args.chunk_tokens), "--memory-tokens", str(args.memory_tokens),
        "--temperature", "0", "-t", str(args.threads), "--parallel", str(parallel),
        "-o", str(out), "--quiet",
    ]  # fmt: skip
    if args.gpu_layers is not None:
        command += ["--gpu-layers", str(args.gpu_layers)]
    if args.exact:
        command += ["--exact"]
    began = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    seconds = time.perf_counter() - began
    if result.returncode != 0:
        raise SystemExit(f"eval failed: {result.stderr[-2000:]}")
    records = [json.loads(line) for line in out.read_text().splitlines()]
    prefill = decode = 0.0
    counts = dict.fromkeys(COUNTED, 0)
    for record in records:
        for line in Path(record["trace"]).read_text().splitlines():
            item = json.loads(line)
            if item.get("type") in ("step", "final"):
                prefill += item.get("prompt_seconds", 0.0)
                decode += item["seconds"] - item.get("prompt_seconds", 0.0)
                for key in counts:
                    counts[key] += item.get(key, 0)
    return {
        "seconds": seconds,
        "replies": {r["id"]: r["reply"] for r in records},
        "prefill_seconds": prefill,
        "decode_seconds": decode,
        "cases": len(records),
        **counts,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="1K,2K")
    parser.add_argument("--depths", default="3")
    parser.add_argument("--chunk-tokens", type=int, default=500)
    parser.add_argument("--memory-tokens", type=int, default=64)
    parser.add_argument("--parallel", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--gpu-layers", type=int, help="layers offloaded to the GPU (default: memagent's)"
    )
    parser.add_argument(
        "--exact", action="store_true", help="both runs with --exact: the same tokens both ways"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "bench" / "continuous.json")
    args = parser.parse_args()
    depth = args.chunk_tokens + 2 * args.memory_tokens + 150  # an update call's depth
    cost = engine_cost(depth, args.threads, args.gpu_layers, rows=2 if args.exact else 1)
    n = args.parallel
    note(f"a round of {n} sequences costs {cost[n]:.2f}x one sequence's (depth {depth})")
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        haystack = home / "haystack.txt"
        haystack.write_text(story(2000, fact=None, seed=7))
        alone = run_eval(haystack, args, 1, home)
        together = run_eval(haystack, args, n, home)
    p, d = alone["prefill_seconds"], alone["decode_seconds"]
    allowed = (p + d) / (p + d * cost[n] / n)
    measured = alone["seconds"] / together["seconds"]
    result = {
        "cases": alone["cases"],
        "parallel": n,
        "cost_of_n_sequences": round(cost[n], 3),
        "one_by_one_seconds": round(alone["seconds"], 1),
        "n_at_once_seconds": round(together["seconds"], 1),
        "one_by_one_prefill_decode": [round(p, 1), round(d, 1)],
        # Prefills run one after another either way; at once, decode seconds overlap.
        "n_at_once_prefill": round(together["prefill_seconds"], 1),
        "measured_gain": round(measured, 3),
        "allowed_gain": round(allowed, 3),
        "fraction_of_allowed": round(measured / allowed, 3),
        "same_replies": alone["replies"] == together["replies"],
        "exact": args.exact,
        "tokens_one_by_one": {k: alone[k] for k in COUNTED},
        "tokens_n_at_once": {k: together[k] for k in COUNTED},
    }
    note(
        f"{alone['cases']} cases: one by one {alone['seconds']:.1f} s, {n} at once "
        f"{together['seconds']:.1f} s: {measured:.3f}x; allowed by the engine "
        f"{allowed:.3f}x ({measured / allowed:.2f} of it); same replies: "
        f"{result['same_replies']}"
    )
    note(
        f"  prefill: one by one {p:.1f} s, {n} at once {together['prefill_seconds']:.1f} s; "
        f"decode one by one {d:.1f} s"
    )
    for key in COUNTED:
        note(f"  {key}: one by one {alone[key]}, {n} at once {together[key]}")
    print(json.dumps(result, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    note(f"wrote {args.out}")


if __name__ == "__main__":
    main()
