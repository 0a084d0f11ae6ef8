"""`make test`: the model tests and the others at the same time, each on its own share of
the CPUs. Usage: python tests/split_run.py [PYTEST ARGS...]

The model tests run llama.cpp one test at a time on the first half of the CPUs this process
may use (llama.cpp's threads follow the affinity: memagent_cli/cpus.py); the tests that load
no model run on the other half, on two workers. So two llama.cpp processes never run at
once, and llama.cpp never has more threads than cores beside it: its thread pool then slows
down 10-100x. Under a cgroup CPU quota (`docker --cpus=2` on a many-core host) every core
may be in the affinity while the two runs share the quota's time: the halves are then of
as many CPUs as the quota allows. The model tests' output is kept in
build/tests-model.log and printed after the others'. Where a process's CPUs cannot be set
(macOS, Windows) or there is one CPU, the two run one after the other, as before.

(pytest-xdist's `--dist loadgroup` would keep the model tests on one worker, but with
pytest 9.2 it no longer groups: xdist 3.8 renames a test by writing `item._nodeid`, which
pytest 9.2's `nodeid` no longer reads.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = ["-m", "model and not real_model and not slower"]
REST = ["-m", "not model and not real_model"]


def main(args: list[str]) -> int:
    pytest = [sys.executable, "-m", "pytest", *args]
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_setaffinity") else []
    cpus = cpus[: quota() or len(cpus)]
    if len(cpus) < 2:
        return subprocess.call([*pytest, *REST, "-n", "2"]) or subprocess.call([*pytest, *MODEL])
    half = len(cpus) // 2
    log = ROOT / "build" / "tests-model.log"
    log.parent.mkdir(exist_ok=True)
    print(f"model tests on CPU {cpus[:half]}, in {log.relative_to(ROOT)}; the rest on CPU "
          f"{cpus[half:]}", file=sys.stderr)  # fmt: skip
    with log.open("w") as out:
        models = subprocess.Popen(
            [*pytest, *MODEL],
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=lambda: os.sched_setaffinity(0, cpus[:half]),
        )
        try:
            rest = subprocess.call(
                [*pytest, *REST, "-n", "2"],
                preexec_fn=lambda: os.sched_setaffinity(0, cpus[half:]),
            )
        except KeyboardInterrupt:  # Ctrl-C reached both runs: each stops and says so
            models.wait()
            return 130
        model = models.wait()
    print(f"\n---- the model tests ({log.relative_to(ROOT)}) ----", flush=True)
    sys.stdout.write(log.read_text())
    return rest or model


def quota() -> int | None:
    """The CPUs the cgroup quota allows, from memagent's own reading of it."""
    if str(ROOT) not in sys.path:  # run as a script: tests/support/ is on the path
        sys.path.insert(0, str(ROOT))
    from memagent_cli import cpus

    return cpus.quota()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
