"""The README's example document (examples/village.py) and the fact planted in it."""

from __future__ import annotations

import sys
from pathlib import Path

# examples/ is no package: the README runs village.py as a script, and the tests build their
# documents with the same function.
_EXAMPLES = str(Path(__file__).resolve().parents[2] / "examples")
if _EXAMPLES not in sys.path:
    sys.path.insert(0, _EXAMPLES)

from village import FACT, story  # noqa: E402

__all__ = ["FACT", "FACT_QUESTION", "FACT_VALUE", "story"]

FACT_QUESTION = "What is the secret password for the vault?"
FACT_VALUE = "PELICAN"
