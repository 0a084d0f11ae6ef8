"""How many readings an in-process model reads at once when --parallel is not given: as the
calibration of the model on this machine says a batch pays (backends/calibration.py
Calibration.readings_at_once), one at a time where it does not, said in one line on stderr;
`--parallel N` is obeyed whatever it says. And a model's first reading on a machine, which
measures the calibration, records it in its trace as every later reading does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.story import FACT_QUESTION, story

from memagent_cli.backends import calibration
from memagent_cli.backends.calibration import MOST
from memagent_cli.trace import read_trace

pytestmark = pytest.mark.model

STEPS = ["--chunk-tokens", "200", "--memory-tokens", "32", "--temperature", "0", "--no-reuse"]
ONE_AT_A_TIME = (
    "reading the 3 documents one at a time: on this machine a batch costs about as "
    "much as its rows read apart (calibration; --parallel N to read together)"
)


def documents(tmp_path: Path) -> tuple[list[str], Path]:
    """3 documents of 3, 1 and 2 chunks (read at once, the second is answered first), and
    the file that lists them."""
    paths = []
    for i, sentences in enumerate((45, 15, 30)):
        path = tmp_path / f"book{i}.txt"
        path.write_text(story(sentences, seed=10 + i))
        paths.append(str(path))
    listing = tmp_path / "documents.txt"
    listing.write_text("\n".join(paths) + "\n")
    return paths, listing


def seed_costs(env: dict[str, str], cost) -> None:
    """The kept calibration (tests/conftest.py on_tiny_model), its costs made `cost(rows)`."""
    (kept,) = (Path(env["MEMAGENT_HOME"]) / "calibrations").glob("*.json")
    raw = json.loads(kept.read_text())
    raw["costs"] = {str(w): cost(w) for w in range(1, MOST + 1)}
    kept.write_text(json.dumps(raw))


def read_together(stderr: str) -> bool:
    """Whether the second document's reading started before the first one's was answered."""
    lines = stderr.splitlines()
    traces = [i for i, line in enumerate(lines) if line.startswith("trace: ")]
    answered = [
        i for i, line in enumerate(lines) if line.endswith("answering from the final memory")
    ]
    assert len(traces) == len(answered) == 3, stderr
    return traces[1] < answered[0]


@pytest.mark.usefixtures("on_tiny_model")
@pytest.mark.parametrize(
    ("cost", "parallel", "together"),
    [
        (float, (), False),  # every row a decode: a batch does not pay
        (lambda w: 1.0 + 0.02 * (w - 1), (), True),  # rows nearly free: it pays
        (float, ("--parallel", "2"), True),  # asked for: obeyed
    ],
    ids=["not-paying", "paying", "asked"],
)
def test_several_documents_go_at_once_only_where_the_calibration_says_it_pays(
    memagent, env, tmp_path, cost, parallel, together
):
    seed_costs(env, cost)
    paths, listing = documents(tmp_path)
    result = memagent(
        "ask", "--documents", str(listing), FACT_QUESTION, *STEPS, *parallel, "--json"
    )
    assert result.returncode == 0, result.stderr
    replies = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["document"]["path"] for r in replies] == paths
    assert [len(r["steps"]) for r in replies] == [3, 1, 2]
    assert read_together(result.stderr) == together
    told = [line for line in result.stderr.splitlines() if "at a time" in line]
    assert told == ([] if together else [ONE_AT_A_TIME])


def test_the_first_reading_on_a_machine_records_the_calibration_it_measured(
    memagent, env, tiny_model, tmp_path
):
    """A data folder without a calibration: the first reading measures it when the weights
    load, after the run's header was made; its trace still records it."""
    env["MEMAGENT_MODEL"] = str(tiny_model)
    book = tmp_path / "book.txt"
    book.write_text(story(20, seed=3))
    first = memagent("ask", str(book), FACT_QUESTION, *STEPS, "--json")
    assert first.returncode == 0, first.stderr
    (kept,) = (Path(env["MEMAGENT_HOME"]) / "calibrations").glob("*.json")
    measured = calibration.parse(kept.read_bytes()).record()
    assert json.loads(first.stdout)["settings"]["calibration"] == measured
    header = read_trace(Path(json.loads(first.stdout)["trace"])).header
    assert header.settings.get("calibration") == measured


def test_a_first_use_measures_the_calibration_before_it_decides(
    memagent, env, tiny_model, tmp_path
):
    """No calibration kept yet: it is measured before the readings at once are decided, and
    they go as the calibration measured here says, every trace recording it."""
    env["MEMAGENT_MODEL"] = str(tiny_model)
    paths, listing = documents(tmp_path)
    result = memagent("ask", "--documents", str(listing), FACT_QUESTION, *STEPS, "--json")
    assert result.returncode == 0, result.stderr
    (kept,) = (Path(env["MEMAGENT_HOME"]) / "calibrations").glob("*.json")
    measured = calibration.parse(kept.read_bytes())
    pays = measured.readings_at_once(3) > 1
    assert read_together(result.stderr) == pays
    assert (ONE_AT_A_TIME in result.stderr.splitlines()) == (measured.readings_at_once(3) == 1)
    for reply in map(json.loads, result.stdout.splitlines()):
        header = read_trace(Path(reply["trace"])).header
        assert header.settings["calibration"] == measured.record()
