"""The files memagent writes, as a user on a shared machine meets them: traces, journals,
results, reports and the document cache hold the document's words, so they are private
(0600, in 0700 folders memagent makes) whatever the umask; a place that cannot be written is
one sentence before any model work; and two runs never write one file at once."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest
from support import builders
from support.command import MEMAGENT, assert_clean_failure, words
from support.fake_openai import FakeServer, served
from support.story import story

from memagent_cli.trace import read_trace

STEPS = ["--chunk-tokens", "300", "--memory-tokens", "64", "--temperature", "0"]
ROOT = os.geteuid() == 0 if hasattr(os, "geteuid") else False


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def doc(tmp_path) -> Path:
    return builders.pdf(tmp_path / "book.pdf", [story(60, seed=1), story(60, seed=2)])


@pytest.mark.parametrize("umask", [0o022, 0o000], ids=["umask-022", "umask-000"])
def test_every_file_holding_the_document_is_private_whatever_the_umask(
    memagent, env, fake_server, doc, tmp_path, umask
):
    data = Path(env["XDG_DATA_HOME"])
    shared = tmp_path / "shared"  # a folder the user made: it keeps its mode
    shared.mkdir()
    shared.chmod(0o755)
    report = shared / "report.html"
    named = shared / "new" / "deeper" / "named.jsonl"
    asked = memagent("ask", str(doc), "Who?", *served(fake_server, *STEPS), "--html",
                str(report), umask=umask)  # fmt: skip
    assert asked.returncode == 0, asked.stderr
    again = memagent("ask", str(doc), "What?", *served(fake_server, *STEPS), "--trace",
                str(named), umask=umask)  # fmt: skip
    assert again.returncode == 0, again.stderr
    cases = [{"_id": "c1", "input": "Who?", "context": story(20, seed=3), "answers": ["x"]}]
    (tmp_path / "eval_50.json").write_text(json.dumps(cases))
    evaluated = memagent("eval", str(tmp_path / "eval_50.json"), *served(fake_server, *STEPS),
                    umask=umask)  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr

    home = data / "memagent"
    (trace,) = (home / "traces").glob("*book*.jsonl")
    (results,) = (home / "evals").glob("*.jsonl")
    (entry,) = (home / "cache" / "documents").glob("*.json")
    files = [trace, results, entry, report, named]
    folders = [data, home, home / "traces", home / "batches", home / "evals", home / "cache",
               home / "cache" / "documents", named.parent, named.parent.parent]  # fmt: skip
    assert {str(p): oct(mode(p)) for p in files} == {str(p): "0o600" for p in files}
    assert {str(p): oct(mode(p)) for p in folders} == {str(p): "0o700" for p in folders}
    assert mode(shared) == 0o755


def test_a_file_the_user_made_keeps_its_mode(cli, fake_server, doc, tmp_path):
    report = tmp_path / "report.html"
    report.write_text("old")
    report.chmod(0o644)
    result = cli("ask", str(doc), "Who?", *served(fake_server, *STEPS), "--html", str(report))
    assert result.returncode == 0, result.stderr
    assert mode(report) == 0o644 and "<html" in report.read_text()


# ---------------------------------------------------------- places that cannot be written

# Each fails for root too: a regular file where a folder should be (ENOTDIR), and sysfs,
# where no one creates files (EACCES).
UNWRITABLE = {
    "file-as-folder": lambda tmp: tmp / "plain-file" / "sub",
    "sysfs": lambda tmp: Path("/sys/memagent-test/sub"),
}


@pytest.fixture(params=[*UNWRITABLE, "read-only"])
def unwritable(request, tmp_path) -> Path:
    """A folder path that the user cannot write under."""
    (tmp_path / "plain-file").write_text("x")
    if request.param != "read-only":
        if request.param == "sysfs" and not Path("/sys/kernel").is_dir():
            pytest.skip("no sysfs here")
        return UNWRITABLE[request.param](tmp_path)
    if ROOT:
        pytest.skip("root writes into a read-only folder: the other cases cover it")
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o500)
    return folder / "sub"


def test_a_data_folder_that_cannot_be_written_is_one_sentence_before_any_model(
    cli, env, doc, unwritable
):
    env["MEMAGENT_HOME"] = str(unwritable)
    # A model that does not exist: the data folder is checked first.
    result = cli("ask", str(doc), "Who?", "-m", "nope.gguf", "--no-document-cache")
    assert_clean_failure(result, 1, f"Cannot write traces in {unwritable / 'traces'}")


def test_an_eval_whose_results_cannot_be_written_is_one_sentence_before_any_model(
    cli, env, tmp_path, unwritable
):
    cases = [{"_id": "c1", "input": "Who?", "context": story(20, seed=3), "answers": ["x"]}]
    (tmp_path / "eval_50.json").write_text(json.dumps(cases))
    data = str(tmp_path / "eval_50.json")
    out = unwritable / "run.jsonl"
    named = cli("eval", data, "-m", "nope.gguf", "-o", str(out))
    assert_clean_failure(named, 1, f"Cannot write results to {out}")
    env["MEMAGENT_HOME"] = str(unwritable)
    default = cli("eval", data, "-m", "nope.gguf")
    assert_clean_failure(default, 1, f"Cannot write results to {unwritable / 'evals'}")
    traces = cli("eval", data, "-m", "nope.gguf", "-o", str(tmp_path / "run.jsonl"))
    assert_clean_failure(traces, 1, f"Cannot write traces in {unwritable / 'traces'}")
    assert not (tmp_path / "run.jsonl").exists()  # a run that never began leaves no file


def test_a_trace_or_report_that_cannot_be_written_is_one_sentence(cli, doc, unwritable):
    trace = cli("ask", str(doc), "Who?", "-m", "nope.gguf", "--trace", str(unwritable / "t.jsonl"))
    assert_clean_failure(trace, 1, f"Cannot write the trace {unwritable / 't.jsonl'}")
    report = unwritable / "r.html"
    result = cli("ask", str(doc), "Who?", "-m", "nope.gguf", "--html", str(report))
    assert_clean_failure(result, 1, f"Cannot write the report {report}")


def test_a_file_to_write_that_is_a_link_to_nothing_says_so(cli, doc, tmp_path):
    """Each said "No such file or directory" of a path the user meant to create."""
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "gone")
    cases = [{"_id": "c1", "input": "Who?", "context": story(20, seed=3), "answers": ["x"]}]
    (tmp_path / "eval_50.json").write_text(json.dumps(cases))
    for args in (
        ["ask", str(doc), "Who?", "--html", str(link)],
        ["eval", str(tmp_path / "eval_50.json"), "-o", str(link)],
    ):
        result = cli(*args, "-m", "nope.gguf")  # said before any model is sought
        assert_clean_failure(result, 1, f"{link}: it is a link to a file that does not exist")


@pytest.mark.skipif(ROOT, reason="root writes into a read-only file")
def test_a_read_only_trace_to_resume_is_one_sentence_before_any_model(cli, fake_server, doc):
    path = doc.with_suffix(".jsonl")
    fake_server.fail_after, fake_server.fail_status = 2, 400
    first = cli("ask", str(doc), "Who?", *served(fake_server, *STEPS), "--trace", str(path))
    assert first.returncode != 0 and read_trace(path).steps
    path.chmod(0o400)
    again = cli("ask", str(doc), "Who?", "-m", "nope.gguf", "--resume", str(path))
    assert_clean_failure(again, 1, f"Cannot write the trace {path}: Permission denied")


# ------------------------------------------------------------------ two writers, one file


def test_resuming_a_trace_another_run_is_writing_is_refused(env, cli, doc, tmp_path):
    path = tmp_path / "run.jsonl"
    with FakeServer(hold_after=2) as server:  # two steps, then the run waits, still writing
        args = [str(MEMAGENT), "ask", str(doc), "Who?", *served(server, *STEPS)]
        first = subprocess.Popen(
            [*args, "--trace", str(path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 120
            while not server.held and time.monotonic() < deadline and first.poll() is None:
                time.sleep(0.05)
            assert server.held, first.stderr.read() if first.poll() is not None else ""
            before = path.read_bytes()
            second = cli("ask", str(doc), "Who?", *served(server, *STEPS), "--resume", str(path))
            assert_clean_failure(second, 1, f"{path} is being written by another memagent run")
            assert path.read_bytes() == before and server.held == 1
        finally:
            server.release()
            stdout, stderr = first.communicate(timeout=120)
    assert first.returncode == 0, stderr
    trace = read_trace(path)
    assert trace.finished and not trace.problems  # one run's records, never two mixed


def test_two_evals_on_one_results_file_are_refused(env, cli, tmp_path):
    cases = [
        {"_id": f"c{i}", "input": "Who?", "context": story(40, seed=i), "answers": ["x"]}
        for i in range(3)
    ]
    data = tmp_path / "eval_50.json"
    data.write_text(json.dumps(cases))
    out = tmp_path / "run.jsonl"
    with FakeServer(hold_after=3) as server:
        command = [str(MEMAGENT), "eval", str(data), *served(server, *STEPS), "-o", str(out)]
        first = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            deadline = time.monotonic() + 120
            while not server.held and time.monotonic() < deadline and first.poll() is None:
                time.sleep(0.05)
            assert server.held
            before = out.read_bytes()
            # Another model's settings, and no traces: only the results file is shared.
            second = cli("eval", str(data), *served(server, *STEPS[:-2]), "-o", str(out),
                         "--no-trace")  # fmt: skip
            assert_clean_failure(second, 1, f"Another memagent eval is writing {out}")
            assert out.read_bytes() == before
        finally:
            server.release()
            stdout, stderr = first.communicate(timeout=120)
    assert first.returncode == 0, stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["id"] for r in records) == ["c0", "c1", "c2"]
    assert "Traceback" not in words(stderr)


@pytest.fixture
def others_home(tmp_path) -> tuple[Path, list[str]]:
    """(a folder this user cannot enter, as another user's home is, the command prefix that
    runs memagent as this user there). Root enters any folder, so as root memagent runs
    without the capabilities that let it (setpriv), in a folder of another user's."""
    folder = tmp_path / "home-of-another"
    folder.mkdir()
    if not ROOT:
        folder.chmod(0o000)
        yield folder, []
        folder.chmod(0o700)
        return
    prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]
    if shutil.which("setpriv") is None or subprocess.run([*prefix, "true"]).returncode != 0:
        pytest.skip("root enters any folder, and setpriv cannot run memagent as a user here")
    os.chown(folder, 65534, 65534)
    folder.chmod(0o700)
    yield folder, prefix


def test_a_trace_in_a_folder_the_user_cannot_enter_is_one_sentence(env, doc, others_home):
    folder, prefix = others_home
    trace = folder / "run.jsonl"

    def run(*args: str) -> subprocess.CompletedProcess:
        command = [*prefix, str(MEMAGENT), *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)

    written = run("ask", str(doc), "Who?", "-m", "nope.gguf", "--trace", str(trace))
    assert_clean_failure(written, 1, f"Cannot write the trace {trace}: Permission denied")
    resumed = run("ask", str(doc), "Who?", "-m", "nope.gguf", "--resume", str(trace))
    assert_clean_failure(resumed, 1, f"{trace}: Permission denied")
    for args in ([], ["--json"], ["--html", str(doc.with_suffix(".html"))]):
        shown = run("trace", str(trace), *args)
        assert_clean_failure(shown, 1, f"Cannot read trace {trace}: Permission denied")
    report = folder / "r.html"
    html = run("ask", str(doc), "Who?", "-m", "nope.gguf", "--html", str(report))
    assert_clean_failure(html, 1, f"Cannot write the report {report}: Permission denied")
    read = run("ask", str(folder / "book.pdf"), "Who?", "-m", "nope.gguf")
    assert_clean_failure(read, 1, f"Cannot read {folder / 'book.pdf'}: Permission denied")


def test_a_small_file_is_replaced_whole_and_privately_or_not_at_all(tmp_path):
    """The data folder's small files (calibrations, kept speeds, the pulled files' record,
    the document cache) are written through one helper: 0600, the old file intact until
    the new one is whole, no temporary file left by a failed write, and only the stale
    temporary files of the helper's own prefix removed."""
    from memagent_cli.files import remove_stale, replace_private

    path = tmp_path / "kept.json"
    path.write_text("old")
    replace_private(path, "new", ".kept-")
    assert path.read_text() == "new" and mode(path) == 0o600
    with pytest.raises(UnicodeEncodeError):
        replace_private(path, "half \ud800 a lone surrogate", ".kept-")
    assert path.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.json"]
    stale, fresh, other = tmp_path / ".kept-1.tmp", tmp_path / ".kept-2.tmp", tmp_path / "k.lock"
    for made in (stale, fresh, other):
        made.write_text("")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    os.utime(other, (time.time() - 7200, time.time() - 7200))
    remove_stale(tmp_path, ".kept-", suffix=".tmp")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".kept-2.tmp", "k.lock", "kept.json"]
