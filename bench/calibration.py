"""How long measuring a model's calibration takes, and what it proves and prices rounds at:
the figures of docs/performance.md's and docs/internals/decoding.md's "The calibration".

    flock /tmp/memagent-tests.lock python bench/calibration.py [--runs 3] [--model PATH]
        [--test-models]

Each run is a process of its own with an empty data folder (MEMAGENT_HOME), so that nothing
kept is read back: it loads the model (the default one unless `--model`) as a reading with
drafts does, which measures the calibration (memagent_cli/backends/calibration.py, measured
in backends/probe.py), and prints what was measured: its seconds, the round sizes proved
exact, the sequences proved together, and each round size's cost in 1-row decodes. The table
at the end has a row per run. `--test-models` also builds the tests' random models
(tests/support/models.py, and tests/test_exact_model.py's F16, F32 and hidden-256 ones, 24
layers deep) and measures each as often. Run it alone on its machine: it loads a model, and
a second process on the cores makes every round dearer.
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SIZES = (2, 4, 8, 17)  # the round sizes the docs quote (17: a token and a full draft)
CONTEXT = 512  # the reading's own context; the calibration makes one of its own
AT_ONCE = 4  # readings that could go together: how many of them the calibration lets


def note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def measure(path: Path) -> dict[str, Any]:
    """Load the model at `path` as a reading with drafts does, measuring its calibration
    (--recalibrate, in case anything is kept); what was measured, without its path."""
    from memagent_cli.backends import calibration
    from memagent_cli.backends.llama_cpp import LlamaCppBackend, LlamaOptions

    backend = LlamaCppBackend(path, LlamaOptions(recalibrate=True))
    began = time.perf_counter()
    backend.prepare(CONTEXT)
    loaded = time.perf_counter() - began
    found = backend.calibration
    assert found is not None and not found.assumed, "no calibration was measured"
    key = found.to_json()["key"]
    return {
        "seconds": found.seconds,
        "load_and_measure_seconds": round(loaded, 3),
        "widths": list(found.widths),
        "together": found.together,
        "costs": {str(w): round(c, 4) for w, c in sorted(found.costs.items())},
        "decode_seconds": found.decode_seconds,
        # How many of 4 readings `ask` would read together by it (run/engine.py), as
        # LlamaCppBackend.readings_at_once decides for the default and for --exact.
        "at_once_of_4": backend.readings_at_once(AT_ONCE),
        "exact_at_once_of_4": found.readings_at_once(
            AT_ONCE, 2, max(found.widths, default=2), exact=True
        ),
        "settings": calibration.settings(found),
        "summary": found.summary(),
        "model": {"file": path.name, "size": key["model"]["size"]},
        "machine": key.get("machine"),
        "llama_cpp": key.get("llama_cpp"),
    }


def run(path: Path, home: Path) -> dict[str, Any]:
    """measure() in a new process with the data folder `home`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMAGENT_")}
    env["MEMAGENT_HOME"] = str(home)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, __file__, "--child", str(path)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"the run failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def test_models(folder: Path) -> list[tuple[str, Path]]:
    """The tests' random models, built in `folder`: the tiny one (2 layers), the same 24
    layers deep, and test_exact_model.py's variants, where rows change with a round's size."""
    sys.path.insert(0, str(ROOT / "tests"))
    from support import hf_model
    from support.models import DEEP_TINY_LAYERS, TINY_EOS_SCALE, TINY_SEED, TINY_SIZES

    from memagent_cli.models.conversion import convert

    deep = {"num_hidden_layers": DEEP_TINY_LAYERS}
    variants = {  # name -> (shape, dtype of the Hugging Face weights, GGUF type)
        "tiny, 2 layers, Q4_1": ({}, "BF16", "Q4_1"),
        "tiny, 24 layers, Q4_1": (deep, "BF16", "Q4_1"),
        "tiny, 24 layers, F16": (deep, "F16", "F16"),
        "tiny, 24 layers, F32": (deep, "F32", "F32"),
        "tiny, 24 layers, hidden 256, Q4_1": (
            deep | {"hidden_size": 256, "intermediate_size": 512},
            "BF16",
            "Q4_1",
        ),
    }
    built = []
    eos = {("model.embed_tokens.weight", hf_model.EOS): TINY_EOS_SCALE}
    for n, (name, (sizes, dtype, quant)) in enumerate(variants.items()):
        source = folder / f"hf-{n}"
        hf_model.build(
            source, sizes=TINY_SIZES | sizes, seed=TINY_SEED, scale_rows=eos, dtype=dtype
        )
        built.append((name, convert.convert(source, folder / f"tiny-{n}.gguf", quant)))
    return built


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="measurements, each from scratch")
    parser.add_argument("--model", type=Path, help="a GGUF (default: the default model)")
    parser.add_argument(
        "--test-models", action="store_true", help="the tests' random models too, built here"
    )
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)  # one measurement
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.child)), flush=True)
        return
    if args.model is None:
        from memagent_cli import models

        args.model = models.resolve(None).path
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; each calibration measured "
          f"{args.runs} times, each time in a new process with an empty data folder")  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory(prefix="memagent-calibration-") as folder:
        chosen = [(args.model.name, args.model)]
        if args.test_models:
            note("building the tests' random models...")
            chosen += test_models(Path(folder))
        for name, path in chosen:
            for n in range(1, args.runs + 1):
                load = " ".join(f"{x:.2f}" for x in os.getloadavg())
                note(f"{name}, run {n} (load average {load})...")
                measured = run(path, Path(folder) / f"home-{len(rows)}")
                measured["load_average_before"] = load
                print(f"{name}, run {n}: {json.dumps(measured)}", flush=True)
                rows.append((name, n, measured))
    first = rows[0][2]
    print(f"machine: {first['machine']}; llama-cpp-python {first['llama_cpp']}; "
          f"{first['settings']}")  # fmt: skip
    print()
    sizes = " | ".join(f"{w} rows" for w in SIZES)
    print(f"| model | run | load average before | seconds measuring | {sizes} (decodes) "
          "| exact rounds | sequences together | of 4 readings at once (--exact) |")  # fmt: skip
    print("|---|---:|---|---:|" + "---:|" * len(SIZES) + "---|---:|---:|")
    for name, n, measured in rows:
        costs = " | ".join(f"{measured['costs'].get(str(w), float('nan')):.2f}" for w in SIZES)
        widths = measured["widths"]
        exact = ", ".join(map(str, widths)) or "none"
        if len(widths) > 2 and widths == list(range(widths[0], widths[-1] + 1)):
            exact = f"{widths[0]}-{widths[-1]}"
        print(
            f"| {name} | {n} | {measured['load_average_before']} | {measured['seconds']:.2f} "
            f"| {costs} | {exact} | {measured['together']} | {measured['at_once_of_4']} "
            f"({measured['exact_at_once_of_4']}) |"
        )
    for name in dict.fromkeys(name for name, _, _ in rows):
        runs = [measured for each, _, measured in rows if each == name]
        seconds = [m["seconds"] for m in runs]
        print()
        print(f"{name}: seconds measuring {min(seconds):.2f}-{max(seconds):.2f}")
        for w in SIZES:
            costs = [m["costs"][str(w)] for m in runs if str(w) in m["costs"]]
            print(f"  a round of {w} rows: {min(costs):.2f}-{max(costs):.2f} decodes")
        at_once = ", ".join(f"{m['at_once_of_4']} ({m['exact_at_once_of_4']})" for m in runs)
        print(f"  of {AT_ONCE} readings, read at once by each run (with --exact): {at_once}")


if __name__ == "__main__":
    main()
