"""Text on its way out of memagent, whoever wrote it: a document, a model, a server, a trace
someone sent, a file name. On a terminal or in plain output it loses its control characters;
in JSON every control character and every character UTF-8 cannot hold is escaped."""

from __future__ import annotations

import json
import re
from typing import Any

# C0 controls but tab and newline, DEL, and C1 (0x9b is CSI, 0x9d OSC): what a terminal acts
# on. Lone surrogates are bytes of a name that is not UTF-8 (os.fsdecode's surrogateescape).
_UNSHOWABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")
# What json.dumps(ensure_ascii=False) leaves raw that a terminal acts on or UTF-8 refuses.
_JSON_RAW = re.compile("[\x7f-\x9f\ud800-\udfff]")


def _shown(match: re.Match[str]) -> str:
    return "\ufffd" if match.group() >= "\ud800" else ""


def printable(text: str) -> str:
    """`text` as it may reach a terminal: C0 and C1 control characters removed (newline and
    tab kept), so no escape sequence of a document can move the cursor, set the clipboard or
    disguise a link; and each byte of a name that is not UTF-8 shown as U+FFFD."""
    if _UNSHOWABLE.search(text) is None:
        return text
    return _UNSHOWABLE.sub(_shown, text)


def json_text(value: Any, *, indent: int | None = None, sort_keys: bool = False) -> str:
    """`value` as JSON that keeps every text exactly and is safe to print and to write as
    UTF-8: non-ASCII text stays readable, but control characters, DEL, C1 controls and the
    bytes of names that are not UTF-8 are \\u escapes (json.loads gives each back)."""
    text = json.dumps(value, ensure_ascii=False, indent=indent, sort_keys=sort_keys)
    return _JSON_RAW.sub(lambda match: f"\\u{ord(match.group()):04x}", text)


# The largest number memagent takes from a JSON file someone else may have written (a trace,
# a results file): no count, score or duration comes near, and past 2**53 an integer is no
# longer exact as a float (past 1e308 it is no float at all).
LARGEST = 2**53


def json_number(value: Any, *, signed: bool = False) -> bool:
    """Whether `value`, read from such a file, is a number memagent can use: an int or float
    (not a bool), finite, at most LARGEST in size, and not negative unless `signed`."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return (-LARGEST if signed else 0) <= value <= LARGEST  # NaN compares false


def json_count(value: Any, *, signed: bool = False) -> bool:
    """Whether `value`, read from such a file or a server's reply, is a whole number
    memagent can use: an int (not a bool or a float) that json_number takes."""
    return isinstance(value, int) and json_number(value, signed=signed)


def decoded(argument: str) -> str:
    """A command-line argument as text for the model: its bytes that are not UTF-8 (kept by
    Python as lone surrogates) become U+FFFD, as they do in a text document."""
    return _SURROGATE.sub("\ufffd", argument)
