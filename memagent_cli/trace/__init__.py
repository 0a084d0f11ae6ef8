"""Trace files: JSON Lines, a header, one record per finished step, then the final record.

`records` types the lines both ways, `file` reads (and follows) and writes them, `folder`
knows the data folder where traces live by default.
"""

from memagent_cli.provenance import Source
from memagent_cli.trace.file import (
    MAX_TRACE_BYTES,
    Status,
    Trace,
    TraceWriter,
    check_new,
    check_resumable,
    read_trace,
    records,
    start,
)
from memagent_cli.trace.folder import (
    ENGINE_SETTINGS,
    READING_SETTINGS,
    default_dir,
    default_path,
    differences,
    find_run,
    listing,
    locate,
    recent_traces,
    run_identity,
    speculation,
)
from memagent_cli.trace.records import (
    FORMAT_VERSION,
    FinalRecord,
    Header,
    Interruption,
    Record,
    Reply,
    Resumed,
    Skipped,
    StepRecord,
    TraceError,
    chunk_sha256,
    evidence_of,
)

__all__ = [
    "ENGINE_SETTINGS",
    "READING_SETTINGS",
    "FORMAT_VERSION",
    "MAX_TRACE_BYTES",
    "FinalRecord",
    "Header",
    "Interruption",
    "Record",
    "Reply",
    "Resumed",
    "Skipped",
    "Source",
    "Status",
    "StepRecord",
    "Trace",
    "TraceError",
    "TraceWriter",
    "check_new",
    "check_resumable",
    "chunk_sha256",
    "default_dir",
    "default_path",
    "differences",
    "evidence_of",
    "find_run",
    "listing",
    "locate",
    "read_trace",
    "recent_traces",
    "records",
    "run_identity",
    "speculation",
    "start",
]
