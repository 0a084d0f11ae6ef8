"""JSON lines files as the tests read them back: results, journals, traces."""

from __future__ import annotations

import json
from pathlib import Path


def lines_of(path: Path) -> list[dict]:
    """Each line of `path` as JSON; none when there is no file yet."""
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
