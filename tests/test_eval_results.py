"""Results files (append, resume, damage), the report table and JSON, and the plots."""

from __future__ import annotations

import io
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from rich.console import Console

from memagent_cli.evaluation import plot, report, results
from memagent_cli.evaluation.results import ResultsError
from memagent_cli.views import evaluation as views


def record(group: str, i: int, sub_em: float, tokens: int = 7168, seconds: float = 2.0, **kw):
    base = {"id": f"q{i}", "group": group, "sub_em": sub_em, "em": 0.0, "f1": 0.5}
    base["prediction"] = "x" if sub_em else None  # right answers are boxed, wrong ones not
    return base | {"seconds": seconds, "tokens": tokens} | kw


def test_records_are_appended_and_read_back(tmp_path):
    path = tmp_path / "deep" / "run.jsonl"
    with results.Writer(path) as writer:
        writer.add(record("eval_50", 1, 1.0, question="Où?"))
    with results.Writer(path) as writer:  # a second run appends
        writer.add(record("eval_50", 2, 0.0))
    run = results.read(path)
    assert [r["id"] for r in run.records] == ["q1", "q2"]
    assert run.records[0]["question"] == "Où?"
    assert run.finished == {("eval_50", "q1"), ("eval_50", "q2")}
    assert run.skipped == 0 and run.label == "run"


def test_a_line_cut_by_a_crash_is_dropped_before_appending(tmp_path):
    path = tmp_path / "run.jsonl"
    path.write_text(json.dumps(record("g", 1, 1.0)) + "\n" + '{"id": "q2", "gro')
    assert results.read(path).skipped == 1
    with results.Writer(path) as writer:
        writer.add(record("g", 3, 0.0))
    run = results.read(path)
    assert [r["id"] for r in run.records] == ["q1", "q3"] and run.skipped == 0


def test_reading_refuses_what_is_not_results(tmp_path):
    with pytest.raises(ResultsError, match="not found"):
        results.read(tmp_path / "none.jsonl")
    assert results.read(tmp_path / "none.jsonl", missing_ok=True).records == []
    (tmp_path / "trace.jsonl").write_text('{"type": "header"}\n')
    with pytest.raises(ResultsError, match="holds no eval results"):
        results.read(tmp_path / "trace.jsonl")
    with pytest.raises(ResultsError, match="not a regular file"):
        results.read(tmp_path)


def test_the_default_path_is_a_new_file_in_the_data_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    when = datetime(2026, 11, 21, 15, 4, 5, tzinfo=UTC)
    path = results.default_path(Path("/data/eval 50.json"), when)
    assert path == tmp_path / "memagent" / "evals" / "20261121-150405-eval-50.jsonl"


def test_length_labels_follow_the_paper():
    labels = [report.length_label(t) for t in plot.REFERENCE_TOKENS]
    assert labels == list(plot.REFERENCE_LENGTHS)
    assert report.length_label(500) == "500"


def test_groups_are_summarized_as_the_authors_print_them():
    records = [
        record("eval_100", 1, 1.0, tokens=14336, seconds=4.0, em=1.0, f1=1.0),
        record("eval_100", 2, 0.0, tokens=14336, seconds=6.0, em=0.0, f1=0.67),
        record("eval_50", 1, 1.0),
        record("eval_50", 2, 1.0),
        record("eval_50", 3, 0.0),
    ]
    rows = report.summarize(records)
    assert [r.group for r in rows] == ["eval_50", "eval_100"]  # shortest first
    short, long = rows
    assert (short.label, short.cases, short.sub_em, short.em, short.f1) == (
        "7K", 3, 66.67, 0.0, 50.0,
    )  # fmt: skip
    assert (long.label, long.sub_em, long.f1) == ("14K", 50.0, 83.5)
    assert long.seconds_per_case == 5.0
    assert (short.boxed, long.boxed) == (66.67, 50.0)
    assert long.tokens_per_second == pytest.approx(2 * 14336 / 10, abs=0.1)
    assert report.overall(records).sub_em == 60.0


def test_needle_runs_have_recall_only_and_a_depth_grid():
    records = [
        record("8K", d, s, tokens=8192, em=None, f1=None, depth=float(d))
        for d, s in ((0, 1.0), (50, 0.5), (100, 0.0))
    ] + [record("32K", 0, 0.0, tokens=32768, em=None, f1=None, depth=0.0)]
    row = report.summarize(records)[0]
    assert (row.sub_em, row.em, row.f1) == (50.0, None, None)
    lengths, depths, grid = report.depth_grid(records)
    assert lengths == ["8K", "32K"] and depths == [0.0, 50.0, 100.0]
    assert grid == [[100.0, 0.0], [50.0, None], [0.0, None]]


def test_the_table_and_the_json_object(tmp_path):
    path = tmp_path / "run.jsonl"
    with results.Writer(path) as writer:
        for r in (record("eval_50", 1, 1.0), record("[red]eval_100", 1, 0.0, tokens=14336)):
            writer.add(r)
    run = results.read(path)
    out = io.StringIO()
    views.print_table(Console(file=out, width=120), run)
    text = out.getvalue()
    assert "[red]eval_100" in text  # group names are text, never markup
    assert "7K" in text and "14K" in text and "all" in text
    summary = report.to_json(run)
    assert summary["cases"] == 2 and summary["overall"]["sub_em"] == 50.0
    assert [g["group"] for g in summary["groups"]] == ["eval_50", "[red]eval_100"]
    json.dumps(summary)


# The paper's rows as the protocol spec prints them, copied by hand (not from the code).
PAPER_ROWS = """
| RL-MemAgent-14B | 83.59 | 82.03 | 84.38 | 80.47 | 76.56 | 81.25 | 75.00 | 77.34 | 76.56 | 78.12 |
| RL-MemAgent-7B | 82.03 | 79.69 | 78.91 | 77.34 | 79.69 | 72.66 | 74.22 | 76.56 | 75.78 | 71.09 |
"""


def test_the_paper_rows_are_the_specs():
    for name, values in plot.REFERENCE.items():
        line = next(x for x in PAPER_ROWS.splitlines() if x.startswith(f"| {name} |"))
        cells = [c.strip() for c in line.strip("|").split("|")[1:]]
        assert [float(c) for c in cells] == list(values)


def png_size(path: Path) -> tuple[int, int]:
    from PIL import Image

    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        return image.size


def test_plots_are_pngs_that_open(tmp_path):
    pytest.importorskip("matplotlib")
    rows = report.summarize([record("eval_50", 1, 1.0), record("eval_100", 1, 0.0, tokens=14336)])
    plot.save(plot.accuracy_figure([("q4", rows), ("q8", rows)]), tmp_path / "acc.png")
    width, height = png_size(tmp_path / "acc.png")
    assert width > 400 and height > 300
    grid = [[100.0, None], [50.0, 0.0]]
    plot.save(plot.heatmap_figure(["8K", "32K"], [0.0, 50.0], grid), tmp_path / "h.png")
    assert png_size(tmp_path / "h.png")[0] > 400
    with pytest.raises(plot.PlotError, match="Cannot save the plot"):
        plot.save(plot.accuracy_figure([("q4", rows)]), tmp_path / "acc.unknown")


def test_a_missing_matplotlib_is_one_sentence(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    # memagent is not on PyPI: the extra is installed from its checkout (docs/install.md).
    with pytest.raises(plot.PlotError, match=r"\.venv/bin/pip install matplotlib") as refused:
        plot.save(plot.accuracy_figure([]), tmp_path / "acc.png")
    assert "memagent[plot]" not in str(refused.value)


def test_a_line_longer_than_a_record_is_skipped_without_holding_it(tmp_path):
    """A results file of 900 MB on one line (a hole of NUL bytes, so no disk) before a
    record: the reader skips the line a bounded piece at a time, so it reads the record
    after it in 1.2 GB of address space (Python and its imports take about 0.4 GB)."""
    import resource
    import subprocess

    path = tmp_path / "run.jsonl"
    with path.open("wb") as file:
        file.truncate(900 << 20)
        file.seek(0, 2)
        file.write(b"\n" + json.dumps(record("g", 1, 1.0)).encode() + b"\n")
    limit = 1200 << 20
    code = (
        "import sys; from pathlib import Path; from memagent_cli.evaluation import results; "
        "run = results.read(Path(sys.argv[1])); print(len(run.records), run.skipped)"
    )

    done = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)),
    )

    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["1", "1"]
