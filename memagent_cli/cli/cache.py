"""`memagent cache`: the extracted text of documents kept so a second question skips
extraction (never an encrypted document's text)."""

from __future__ import annotations

import json

import typer

from memagent_cli.cli.options import Command, Group, JsonOpt, user_errors

app = typer.Typer(
    cls=Group,
    help="The cache of extracted document text: what it holds, and clearing it "
    "(`memagent paths documents` prints its folder).",
    no_args_is_help=True,
)


@app.command("info", cls=Command)
@user_errors
def cache_info(as_json: JsonOpt = False) -> None:
    """How many documents the cache holds, their size, and its limit.

    $MEMAGENT_DOCUMENT_CACHE_BYTES sets the limit (0 turns the cache off); past it, the
    documents used longest ago go first."""
    from memagent_cli.documents import cache
    from memagent_cli.views import console
    from memagent_cli.views import folders as views

    usage = cache.usage()
    if as_json:
        fields = {"path": str(usage.path), "documents": usage.entries, "bytes": usage.bytes}
        console.result(json.dumps(fields | {"limit_bytes": usage.limit}, indent=2))
    else:
        views.print_cache(usage)


@app.command("clear", cls=Command)
@user_errors
def cache_clear() -> None:
    """Delete every cached document text."""
    from memagent_cli.documents import cache
    from memagent_cli.views import folders as views

    views.cleared(cache.clear())
