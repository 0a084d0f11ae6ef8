"""`memagent models`: list, describe, pull and convert GGUF models."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from memagent_cli.cli.options import (
    Command,
    Group,
    JsonOpt,
    QuietOpt,
    ReaderOpt,
    stop_on_sigterm,
    user_errors,
)
from memagent_cli.errors import ModelError
from memagent_cli.models.conversion.quantize import NEEDS_IMATRIX, QuantType, quant_type
from memagent_cli.views import console as display
from memagent_cli.views.progress import reporter

app = typer.Typer(
    cls=Group,
    help="List, describe, download, convert and remove GGUF models.",
    no_args_is_help=True,
)


# The types memagent makes, for the --help of `pull` and `convert` alike.
_TYPES_HELP = (
    f"{', '.join(QuantType)}, any case; those that need an importance matrix "
    f"({', '.join(NEEDS_IMATRIX)}) are not made"
)


def _quant_type(value: str) -> QuantType:
    """--quant as a type memagent makes; the error names those, and why not another."""
    try:
        return quant_type(value)
    except ModelError as exc:
        raise typer.BadParameter(exc.message) from None


def _complete_quant(incomplete: str) -> list[str]:
    """Shell completion for --quant: the types memagent makes, in the case being typed (the
    shell offers only what starts with it)."""
    names = [kind.value.lower() if incomplete.islower() else kind.value for kind in QuantType]
    return [name for name in names if name.startswith(incomplete)]


@app.command("list", cls=Command)
@user_errors
def models_list(as_json: JsonOpt = False) -> None:
    """The registry's models and every GGUF found locally, read from their headers."""
    from memagent_cli import models
    from memagent_cli.views import models as modelview

    rows = models.catalogue()
    if as_json:
        display.result_json([row.to_json() for row in rows], indent=2)
    else:
        modelview.print_catalogue(rows)


@app.command("info", cls=Command)
@user_errors
def models_info(
    model: Annotated[
        str,
        typer.Argument(
            help="GGUF file, registry name, or hf:OWNER/NAME[:QUANT] already pulled.",
            metavar="MODEL",
        ),
    ],
    as_json: JsonOpt = False,
) -> None:
    """One model's architecture, quantization, context, chat template and calibration."""
    from memagent_cli import models
    from memagent_cli.backends import calibration, calibration_store
    from memagent_cli.views import models as modelview

    row = models.describe(model)
    kept = calibration_store.kept_for(row.path) if row.path is not None else []
    if as_json:
        found = [c.to_json() for c in kept]
        display.result_json(row.to_json(template=True) | {"calibrations": found}, indent=2)
        return
    modelview.print_info(row)
    display.result("")
    if not kept:
        display.result(
            "calibration: none on this machine yet (measured at its first reading with "
            "drafts, in seconds; --recalibrate measures again)"
        )
    for each in kept:
        display.result(f"calibration ({calibration.settings(each)}): {each.summary()}")


@app.command(
    "pull",
    cls=Command,
    help="Download a GGUF into the data folder, resuming a partial download; a repository of "
    "Hugging Face weights is downloaded, converted and quantized. Prints the GGUF's path."
    f"\n\nQUANT of Hugging Face weights: {_TYPES_HELP}.",
)
@user_errors
def models_pull(
    model: Annotated[
        str,
        typer.Argument(
            help="OWNER/NAME[:QUANT] on the Hugging Face Hub, or a registry name[:QUANT] "
            "\\[default QUANT: Q4_K_M].",
            metavar="MODEL",
        ),
    ],
    delete_shards: Annotated[
        bool,
        typer.Option(
            "--delete-shards",
            help="Delete each downloaded shard once converted, for a lower disk peak.",
        ),
    ] = False,
    quiet: QuietOpt = False,
) -> None:
    from memagent_cli import models

    stop_on_sigterm()  # a pull stopped by SIGTERM cleans up as on Ctrl-C
    report = reporter(quiet)
    with report.progress("bytes") as progress:
        pulled = models.pull(
            model, note=report.note, progress=progress, delete_shards=delete_shards
        )
    display.result(str(pulled.path))


@app.command("convert", cls=Command)
@user_errors
def models_convert(
    folder: Annotated[
        Path,
        typer.Argument(
            help="A Hugging Face model folder: config.json, safetensors, tokenizer.json.",
            metavar="PATH",
        ),
    ],
    quant: Annotated[
        QuantType,
        typer.Option(
            "--quant",
            parser=_quant_type,
            autocompletion=_complete_quant,
            metavar="TYPE",
            help=f"llama.cpp type: {_TYPES_HELP}.",
        ),
    ] = QuantType.Q4_K_M,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            metavar="FILE",
            help="GGUF to write \\[default: where --model finds it].",
            show_default=False,
        ),
    ] = None,
    keep_intermediate: Annotated[
        bool,
        typer.Option(
            "--keep-intermediate",
            help="Keep the BF16 or F16 intermediate, to quantize other types from it.",
        ),
    ] = False,
    reader: Annotated[
        str | None,
        typer.Option(
            "--reader",
            metavar=ReaderOpt.__metadata__[0].metavar,
            callback=ReaderOpt.__metadata__[0].callback,
            show_default=False,
            help="The reader the model was trained for, recorded in the GGUF \\[default: the "
            "registry's for its repository, else memagent].",
        ),
    ] = None,
    quiet: QuietOpt = False,
) -> None:
    """Convert a local Hugging Face model to GGUF and quantize it; prints the GGUF's path."""
    from memagent_cli import models

    stop_on_sigterm()  # a conversion stopped by SIGTERM cleans up as on Ctrl-C
    report = reporter(quiet)
    with report.progress("bytes") as progress:
        model = models.convert(
            folder,
            quant=quant,
            out=out,
            keep_intermediate=keep_intermediate,
            reader=reader,
            note=report.note,
            progress=progress,
        )
    display.result(str(model.path))


@app.command("rm", cls=Command)
@user_errors
def models_rm(
    model: Annotated[
        str,
        typer.Argument(
            help="A model as `models list` names it; without :QUANT, every quantization.",
            metavar="NAME[:QUANT]",
        ),
    ],
    as_json: JsonOpt = False,
) -> None:
    """Remove a pulled or converted model from the data folder and say how much it freed."""
    from memagent_cli.models import removal
    from memagent_cli.views import models as modelview

    removed = removal.remove(model)
    if as_json:
        display.result_json(removed.to_json(), indent=2)
    else:
        modelview.print_removal(removed)
