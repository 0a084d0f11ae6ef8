"""`memagent paths`: where memagent keeps its files, one setting ($MEMAGENT_HOME) for all."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from memagent_cli.cli.options import JsonOpt, user_errors


class Folder(StrEnum):
    """The folders `memagent paths` names."""

    data = "data"
    models = "models"
    traces = "traces"
    batches = "batches"
    evals = "evals"
    calibrations = "calibrations"
    cache = "cache"
    documents = "documents"
    tiktoken = "tiktoken"


def folders() -> dict[str, Path]:
    """Each folder memagent writes to, from the module that owns it."""
    from memagent_cli import folders as home
    from memagent_cli.backends import calibration_store
    from memagent_cli.backends.tokenizers import cache_directory
    from memagent_cli.documents import cache
    from memagent_cli.evaluation import results
    from memagent_cli.models.hub import models_dir
    from memagent_cli.run.journal import journal_dir
    from memagent_cli.trace import default_dir

    return {
        Folder.data: home.data_dir(),
        Folder.models: models_dir(),
        Folder.traces: default_dir(),
        Folder.batches: journal_dir(),
        Folder.evals: results.default_dir(),
        Folder.calibrations: calibration_store.folder(),
        Folder.cache: home.cache_dir(),
        Folder.documents: cache.directory(),
        Folder.tiktoken: cache_directory(),
    }


@user_errors
def paths(
    folder: Annotated[
        Folder | None,
        typer.Argument(help="Print only this folder's path.", show_default=False),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Where memagent keeps models, traces, journals, eval results, calibrations and its cache.

    $MEMAGENT_HOME moves them all (the cache to $MEMAGENT_HOME/cache); without it they follow
    the platform's folders (XDG_DATA_HOME and XDG_CACHE_HOME on Linux)."""
    from memagent_cli.views import console
    from memagent_cli.views import folders as views

    found = folders()
    if folder is not None:
        console.result(str(found[folder]))
    elif as_json:
        console.result(json.dumps({k: str(v) for k, v in found.items()}, indent=2))
    else:
        views.print_folders(found)
