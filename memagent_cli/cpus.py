"""The CPUs this process may use: its affinity (taskset, a container's cpuset) and its
cgroup's CPU quota (docker --cpus, systemd's CPUQuota), not the host's count. A 2-CPU
container on a 64-core host that started 64 Tesseracts, or 64 llama.cpp threads, would
run them in turns, and llama.cpp with more threads than cores slows down 10-100x."""

from __future__ import annotations

import os
from pathlib import Path

_CGROUP_ROOT = Path("/sys/fs/cgroup")


def usable() -> int:
    """How many CPUs this process may keep busy at once: at least 1."""
    if hasattr(os, "process_cpu_count"):  # Python 3.13: affinity, and -X cpu_count
        count = os.process_cpu_count() or 1
    elif hasattr(os, "sched_getaffinity"):
        count = len(os.sched_getaffinity(0))
    else:
        count = os.cpu_count() or 1
    limit = quota()
    return max(1, min(count, limit or count))


def quota() -> int | None:
    """The CPUs this process's cgroup quota allows (cgroup_cpus), None without one."""
    try:
        return cgroup_cpus(Path("/proc/self/cgroup").read_text(), _CGROUP_ROOT)
    except OSError:  # not Linux, or no /proc
        return None


def cgroup_cpus(cgroup: str, root: Path) -> int | None:
    """The CPUs a cgroup quota allows, rounded down (at least 1); None without a quota.
    `cgroup` is what /proc/self/cgroup says, `root` where the cgroup file system is
    mounted. Every cgroup from this process's up to the root counts: the tightest wins."""
    found: list[float] = []
    for line in cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if not path.startswith("/"):
            continue
        if hierarchy == "0" and not controllers:  # v2: one tree, cpu.max
            found += _limits(root, path, lambda f: _v2(f / "cpu.max"))
        elif "cpu" in controllers.split(","):  # v1: the cpu controller's own tree
            folder = root / controllers
            found += _limits(folder, path, _v1)
    return max(1, int(min(found))) if found else None


def _limits(root: Path, path: str, read) -> list[float]:  # type: ignore[no-untyped-def]
    """The quota of each cgroup from `path` up to `root` that has one."""
    found = []
    folder = root / path.strip("/")
    while True:
        limit = read(folder)
        if limit is not None:
            found.append(limit)
        if folder == root or root not in folder.parents:
            return found
        folder = folder.parent


def _v2(file: Path) -> float | None:
    """cpu.max: "QUOTA PERIOD" in microseconds, or "max PERIOD" for none."""
    try:
        quota, period = file.read_text().split()
        return _ratio(int(quota), int(period)) if quota != "max" else None
    except (OSError, ValueError):
        return None


def _v1(folder: Path) -> float | None:
    """cpu.cfs_quota_us over cpu.cfs_period_us; a quota of -1 is none."""
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return _ratio(quota, period)


def _ratio(quota: int, period: int) -> float | None:
    """CPUs of a quota over its period; None for none, and for one past what a float holds
    (above about 1e308 CPUs: no limit, where dividing would raise OverflowError)."""
    if quota <= 0 or period <= 0:
        return None
    try:
        return quota / period
    except OverflowError:
        return None
