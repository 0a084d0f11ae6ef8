"""The readers after MemAgent: each a small module of templates, reply parsing, retrieval
and the state carried between steps, as its authors' released evaluation code runs it
(docs/readers.md). MemAgent's own templates stay in `memagent_cli/protocol.py`."""

from __future__ import annotations

NAMES = ("memagent", "infmem", "rememr1")
DEFAULT = "memagent"
