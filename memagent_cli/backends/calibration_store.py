"""Where calibrations are kept: one small JSON file per model and machine and engine
settings in the data folder's calibrations/, read only as a bounded regular file, written
atomically and privately, measured under a lock so that two processes starting together
measure once, and what names the machine in their key (the CPU, the GPUs and their driver).

A file is named by its model, then by its whole key: `models info` reads the files of one
model only, however many the folder holds.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import platform
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from memagent_cli.backends.calibration import (
    MAX_FILE_BYTES,
    Calibration,
    Damaged,
    parse,
)
from memagent_cli.files import (
    lock,
    open_private,
    private_folder,
    read_checked,
    read_kept,
    remove_stale,
    replace_private,
)
from memagent_cli.folders import data_dir

_TEMP_PREFIX = ".calibration-"
# A GPU's driver, where the system says it (Linux's NVIDIA and AMD modules).
DRIVER_FILES = ("/sys/module/nvidia/version", "/sys/module/amdgpu/version")
_said: set[str] = set()  # folders where a calibration could not be kept, said once each


def folder() -> Path:
    """Where calibrations are kept."""
    return data_dir() / "calibrations"


def _digest(value: Any, length: int) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:length]


def path_for(key: Mapping[str, Any]) -> Path:
    """The file of the calibration of `key`: its model's digest, then the whole key's."""
    return folder() / f"{_digest(key.get('model'), 12)}-{_digest(dict(key), 20)}.json"


def model_of(model: Path) -> dict[str, Any] | None:
    """What a key says of the model file `model` as it is now (None: it is not there)."""
    path = model.resolve()
    try:
        stat = path.stat()
    except OSError:
        return None
    return {"path": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def load(key: Mapping[str, Any], note: Any = None) -> Calibration | None:
    """The calibration kept for `key`, disputed or not, or None: not measured, or a file
    that is not a sound one (a FIFO, a device, a huge or hostile file: `note` hears why, in
    one line, and it is measured again)."""

    def parsed(data: bytes) -> Calibration:
        found = parse(data)
        if dict(found.key) != dict(key):
            raise Damaged("it is for another model or engine")
        return found

    return read_kept(path_for(key), MAX_FILE_BYTES, parsed, "the calibration", note)


def store(calibration: Calibration, note: Any = None) -> Path | None:
    """Write atomically and privately (0600); None where the data folder cannot be written:
    the calibration still serves this run, and `note` hears once per folder, in one line,
    that every run will measure again."""
    path = path_for(calibration.key)
    try:
        private_folder(path.parent)
        replace_private(path, json.dumps(calibration.to_json(), indent=1), _TEMP_PREFIX)
        remove_stale(path.parent, _TEMP_PREFIX)
        return path
    except OSError as exc:
        if note is not None and str(path.parent) not in _said:
            _said.add(str(path.parent))
            why = exc.strerror or type(exc).__name__
            note(
                f"could not keep this model's calibration in {path.parent} ({why}): each "
                "reading measures it again"
            )
        return None


def dispute(calibration: Calibration, why: str) -> bool:
    """Keep `calibration` as disputed (`why`), so that the next reading measures it again;
    False where it cannot be written (the next reading then reads it as sound)."""
    return store(calibration.disputed_as(why)) is not None


@contextlib.contextmanager
def measuring(key: Mapping[str, Any]) -> Iterator[None]:
    """Hold the lock of measuring `key`'s calibration: a second process waits here, then
    finds the calibration the first one kept. Where no lock can be had (a data folder that
    cannot be written, a FIFO in the lock's place), it measures without one."""
    path = path_for(key).with_suffix(".lock")
    try:
        private_folder(path.parent)
        held = open_private(path, "a")
    except OSError:
        yield
        return
    with held:
        with contextlib.suppress(OSError):  # a lock refused: measured all the same
            lock(held, wait=True)
        yield


def kept_for(model: Path) -> list[Calibration]:
    """The sound calibrations kept for the file `model` as it is now, on this machine (one
    per engine setting measured: threads, offload, flash attention, cache types), disputed
    ones included. Only that model's files are read, every one of them."""
    described = model_of(model)
    if described is None:
        return []
    here = machine()
    found = []
    with contextlib.suppress(OSError):
        for file in sorted(folder().glob(f"{_digest(described, 12)}-*.json")):
            try:
                calibration = parse(read_checked(file, MAX_FILE_BYTES, follow=False))
            except (OSError, Damaged):
                continue
            key = calibration.key
            if key.get("machine") == here and key.get("model") == described:
                found.append(calibration)
    return found


def machine() -> str:
    """The CPU by name (a data folder on a network home is shared by several machines)."""
    with contextlib.suppress(OSError, ValueError):
        text = read_checked(Path("/proc/cpuinfo"), 8 << 20).decode(errors="replace")
        for line in text.splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or platform.machine()


def hardware(devices: Sequence[tuple[str, str, str]], driver: str) -> dict[str, Any]:
    """What a key says of the devices besides the CPU, from (name, description, kind) of
    each device llama.cpp sees ("CUDA0", "NVIDIA H200", "GPU") and the GPU driver's
    version: two nodes of one CPU with other GPUs, or another driver, measure apart."""
    others = [f"{kind} {name}: {description}" for name, description, kind in devices]
    return {"devices": [d for d in others if not d.startswith("CPU ")], "driver": driver}


def gpu_driver(files: Sequence[str] = DRIVER_FILES) -> str:
    """The version of the GPU's kernel driver (NVIDIA's, AMD's), else of the system where
    the driver comes with it (macOS: Metal's); "" where there is none to say."""
    for name in files:
        with contextlib.suppress(OSError, ValueError):
            text = read_checked(Path(name), 4096).decode(errors="replace").strip()
            if text:
                return f"{Path(name).parent.name} {text}"
    if sys.platform == "darwin":
        return f"macOS {platform.mac_ver()[0]}"
    return ""


@functools.cache
def here() -> dict[str, Any]:
    """This machine as a calibration's key names it: the CPU, the devices llama.cpp sees
    besides it, the GPU driver, llama.cpp's version and its system info."""
    import llama_cpp

    from memagent_cli.backends import build

    found = [(d.name, d.description, d.kind) for d in build.devices()]
    return {
        "llama_cpp": str(getattr(llama_cpp, "__version__", "")),
        "system": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
        "machine": machine(),
        **hardware(found, gpu_driver()),
    }


def identity() -> str:
    """A short name of this machine (here()) for a trace's header: what it learns from is
    only the readings of the same machine (run/history.py)."""
    return _digest(here(), 16)
