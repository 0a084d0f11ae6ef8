"""Two runs given the same --trace: whichever takes the trace's lock first writes it, and the
other neither truncates nor unlinks it (issue 39, item 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_trace_view import book, header

from memagent_cli.chunking import make_chunks
from memagent_cli.trace import TraceError, TraceWriter, file, read_trace


def fresh_header():
    document = book()
    return header(document, make_chunks(list(document.text.encode()), 60, bytes))


def test_a_second_run_that_checked_first_does_not_wipe_the_live_trace(tmp_path, monkeypatch):
    path = tmp_path / "same.jsonl"
    first = TraceWriter(path, fresh_header())
    with monkeypatch.context() as later:
        # Both runs checked the path before either opened it (started together).
        later.setattr(file, "check_new", lambda path: None)
        with pytest.raises(TraceError, match="already exists|another memagent run"):
            TraceWriter(path, fresh_header())
    first.interrupted("SIGINT")
    first.close()
    written = path.read_bytes()
    assert not written.startswith(b"\0"), written[:40]
    trace = read_trace(path)
    assert trace.problems == [] and trace.interruption is not None


def test_a_trace_unlinked_by_anothers_probe_before_its_lock_is_made_again(tmp_path, monkeypatch):
    # check_new's probe creates the path and unlinks it: a run that opened the probe's file
    # in between would otherwise write into a file no longer in any folder.
    path = tmp_path / "same.jsonl"
    real_lock = file.lock
    unlinked: list[Path] = []

    def probe_then_lock(handle):
        if not unlinked:
            path.unlink()
            unlinked.append(path)
        return real_lock(handle)

    monkeypatch.setattr(file, "lock", probe_then_lock)
    writer = TraceWriter(path, fresh_header())
    writer.interrupted("SIGINT")
    writer.close()
    assert unlinked and read_trace(path).interruption is not None


def test_a_finished_trace_written_meanwhile_is_kept(tmp_path, monkeypatch):
    path = tmp_path / "same.jsonl"
    done = TraceWriter(path, fresh_header())
    done.close()
    kept = path.read_bytes()
    monkeypatch.setattr(file, "check_new", lambda path: None)  # checked before it was there
    with pytest.raises(TraceError, match="already exists"):
        TraceWriter(path, fresh_header())
    assert path.read_bytes() == kept
