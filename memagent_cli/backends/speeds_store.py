"""The prefill and decode rates `inspect` measured (backends/speed.py), kept per model and
machine as the calibration is (backends/calibration.py): a second look at another text with
the same model prices its calls in a moment, and `ask` can say before a reading what it
expects. `--recalibrate` measures them again.

A file per key in the data folder's speeds/, 0600 in a 0700 folder, read only when it is a
regular file of at most MAX_FILE_BYTES; one that is not sound is measured again.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memagent_cli.backends.speed import Speed
from memagent_cli.files import private_folder, read_kept, remove_stale, replace_private
from memagent_cli.folders import data_dir

if TYPE_CHECKING:
    from memagent_cli.backends.llama_cpp import LlamaCppBackend

VERSION = 1
MAX_FILE_BYTES = 16 << 10  # a kept speed is under 2 KB
# A speed measured to some depth prices calls a little deeper too: its lines carry on.
DEEPER = 1.25
_TEMP_PREFIX = ".speed-"
_FIELDS = ("prefill_base", "prefill_slope", "decode_base", "decode_slope")


@dataclass(frozen=True)
class Kept:
    """A speed measured on this machine, the depth it was asked to reach, and when."""

    key: Mapping[str, Any]
    speed: Speed
    asked_to: int  # the depth measuring was asked for (it may have stopped short: budget)
    measured: str = ""  # when, UTC

    def serves(self, depth: int) -> bool:
        """Whether it prices calls as deep as `depth`: it reached that far, or was asked to
        and stopped short within its budget (measuring again would stop there too)."""
        return depth <= DEEPER * max(self.speed.measured_to, self.asked_to)

    def to_json(self) -> dict[str, Any]:
        speed = self.speed
        return {
            "version": VERSION,
            "key": dict(self.key),
            "speed": {name: getattr(speed, name) for name in _FIELDS}
            | {"measured_to": speed.measured_to, "seconds": speed.seconds},
            "asked_to": self.asked_to,
            "measured": self.measured,
        }


class Damaged(ValueError):
    """A file that is not a kept speed this version wrote: measure again."""


def key_for(calibration_key: Mapping[str, Any], *, batch: int, exact: bool) -> dict[str, Any]:
    """The key of a speed: what picks llama.cpp's kernels (a backend's calibration_key: the
    model file as it is, the build, the machine, threads, offload, attention, cache types),
    and what else changes a rate: the batch a prompt is read in, and the throwaway row of
    exact decoding."""
    key = {k: v for k, v in calibration_key.items() if k != "version"}
    return key | {"kind": "speed", "version": VERSION, "batch": batch, "exact": exact}


def folder() -> Path:
    return data_dir() / "speeds"


def path_for(key: Mapping[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return folder() / f"{digest}.json"


def parse(data: bytes) -> Kept:
    """A kept speed from its file; Damaged with the reason unless every field is sound."""
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise Damaged("it is not JSON") from exc
    if not isinstance(raw, dict) or raw.get("version") != VERSION:
        raise Damaged("it is not a speed this version wrote")
    key, speed, asked = raw.get("key"), raw.get("speed"), raw.get("asked_to")
    if not isinstance(key, dict) or not isinstance(speed, dict):
        raise Damaged("its key or speed is not an object")
    values = [speed.get(name) for name in _FIELDS]
    if not all(_number(v) and 0 <= v < 1e3 for v in values):
        raise Damaged("its rates are not sound")
    if values[0] <= 0 or values[2] <= 0:  # a token costs something
        raise Damaged("its rates are not sound")
    measured_to, seconds = speed.get("measured_to"), speed.get("seconds", 0.0)
    if not (_whole(measured_to) and _whole(asked) and 0 <= measured_to < 1 << 24):
        raise Damaged("its depths are not depths")
    if not (_number(seconds) and 0 <= seconds < 1e6) or not 0 <= asked < 1 << 24:
        raise Damaged("its depths or time are not sound")
    measured = raw.get("measured", "")
    return Kept(
        key,
        Speed(*(float(v) for v in values), measured_to=measured_to, seconds=float(seconds)),
        asked,
        measured if isinstance(measured, str) else "",
    )


def _number(value: object) -> bool:
    return isinstance(value, float | int) and not isinstance(value, bool) and math.isfinite(value)


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def load(key: Mapping[str, Any], note: Any = None) -> Kept | None:
    """The speed kept for `key`, or None: none kept, or a file that is not sound (`note`
    hears why, in one line). Read only as a regular file, a bounded number of bytes (a FIFO
    or /dev/zero in its place cannot stall it)."""

    def parsed(data: bytes) -> Kept:
        found = parse(data)
        if dict(found.key) != dict(key):
            raise Damaged("it is for another model or engine")
        return found

    return read_kept(path_for(key), MAX_FILE_BYTES, parsed, "the kept speed", note)


def store(key: Mapping[str, Any], speed: Speed, asked_to: int) -> Path | None:
    """Keep `speed` for `key`, written atomically and privately; None where the data folder
    cannot be written (the speed still serves this run)."""
    kept = Kept(key, speed, asked_to, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    path = path_for(key)
    try:
        private_folder(path.parent)
        replace_private(path, json.dumps(kept.to_json(), indent=1), _TEMP_PREFIX)
        remove_stale(path.parent, _TEMP_PREFIX)
        return path
    except OSError:
        return None


def backend_key(backend: LlamaCppBackend) -> dict[str, Any]:
    """The key of the speed of `backend`'s model as its engine runs it here."""
    return key_for(backend.calibration_key(), batch=backend.batch_size, exact=backend.exact)


def kept_for(
    backend: LlamaCppBackend, depth: int, key: Mapping[str, Any] | None = None, note: Any = None
) -> Kept | None:
    """The speed kept for `backend` (or for `key`) that prices calls as deep as `depth`;
    None where there is none, or with --recalibrate."""
    if backend.options.recalibrate:
        return None
    found = load(key if key is not None else backend_key(backend), note)
    return found if found is not None and found.serves(depth) else None
