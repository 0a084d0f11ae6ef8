"""Models from the Hugging Face Hub: `OWNER/NAME[:QUANT]` picks a GGUF file the way
llama.cpp's `-hf` does, or, for a repository of Hugging Face weights, has them converted
(models/pulling.py). Downloads resume where they stopped and are checked against the Hub's
sha256.

Its parts: `specs` (what a spec names, and where a pulled file lies), `listing` (a
repository's files, and the Hub's errors as sentences), `download` (resumable, checked),
`verified` (the record of files checked whole). Room on the disk and renames that survive
a power loss are models/disk.py's.
"""

from memagent_cli.models.disk import check_space, durable_rename
from memagent_cli.models.hub.download import download, partial_path
from memagent_cli.models.hub.listing import RemoteFile, endpoint_url, list_files, safe_name
from memagent_cli.models.hub.specs import (
    DEFAULT_QUANTS,
    PREFIX,
    Spec,
    choose,
    find_pulled,
    is_model,
    looks_like_repo,
    models_dir,
    note_other_matches,
    parse,
    repo_dir,
    spec_of,
    tag_pattern,
)
from memagent_cli.models.hub.verified import VERIFIED_FILE

__all__ = [
    "DEFAULT_QUANTS",
    "PREFIX",
    "VERIFIED_FILE",
    "RemoteFile",
    "Spec",
    "check_space",
    "choose",
    "download",
    "durable_rename",
    "endpoint_url",
    "find_pulled",
    "is_model",
    "list_files",
    "looks_like_repo",
    "models_dir",
    "note_other_matches",
    "parse",
    "partial_path",
    "repo_dir",
    "safe_name",
    "spec_of",
    "tag_pattern",
]
