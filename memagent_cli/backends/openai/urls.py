"""What is sent where, and what is shown: a server URL's credentials never appear in a
trace, --json, a report or an error; a key goes only where it belongs; and whether a
call crosses a network in the clear."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping

import httpx2

# The user:password@ of a URL (also one without a scheme): sent, never shown or recorded.
_CREDENTIALS = re.compile(r"(^|[A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s]*@")
# OPENAI_API_KEY is the OpenAI SDK's key for its own base URL: it goes with OPENAI_BASE_URL,
# or to OpenAI, and to no other server (cli/options.py).
_OPENAI_SERVER = "https://api.openai.com/v1"


def without_credentials(text: str) -> str:
    """`text` (a URL, or a message that quotes one) with every URL's user:password@ left
    out, as a trace, --json, an HTML report or an error may show it."""
    return _CREDENTIALS.sub(r"\1", text)


def openai_api_key(url: str | None, environ: Mapping[str, str]) -> str | None:
    """$OPENAI_API_KEY where `url` is the server the OpenAI SDK would send it to: the one
    $OPENAI_BASE_URL names, or OpenAI's own; else None, whatever the variable holds."""
    key = environ.get("OPENAI_API_KEY") or None
    if key is None or not url:
        return None
    home = [
        _OPENAI_SERVER,
        *([environ["OPENAI_BASE_URL"]] if environ.get("OPENAI_BASE_URL") else []),
    ]
    origin = _origin(url)
    return key if origin is not None and origin in {_origin(place) for place in home} else None


def in_the_clear(url: str) -> bool:
    """Whether what is sent to `url` crosses a network unencrypted: plain http to a host
    other than this machine (127.0.0.0/8, ::1, localhost)."""
    try:
        parsed = httpx2.URL(url)
    except httpx2.InvalidURL:
        return False  # never sent: opening the backend says what is wrong with it
    if parsed.scheme != "http":
        return False
    host = parsed.host.lower().rstrip(".")
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True  # a name: another machine as far as anyone can tell from here


def _origin(url: str) -> tuple[str, str, int | None] | None:
    """Scheme, host and port of `url` (None if it is not one): where a request goes."""
    try:
        parsed = httpx2.URL(url)
    except httpx2.InvalidURL:
        return None
    default = {"http": 80, "https": 443}.get(parsed.scheme)
    return parsed.scheme, parsed.host.lower().rstrip("."), parsed.port or default
