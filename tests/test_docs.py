"""The README and docs/ stay true: every relative link and anchor resolves, the README stays
a front door (at most 250 lines) that links every page, the configuration page's table of
environment variables names every variable memagent reads, a figure quoted on several pages
is the same figure on each, every speed figure on a user page comes from a kept run or says
it was computed, the tables of "How long for my book" are bench/book_time.py's, user pages
keep the bench's lab notebook and the maintainers' wording out, and the runs kept in
bench/results/ name no path of the machine they ran on."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# The README's pages, then the development pages under docs/internals/.
TOP = [README, *sorted((ROOT / "docs").glob("*.md"))]
PAGES = [*TOP, *sorted((ROOT / "docs" / "internals").glob("*.md"))]

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
# Variables memagent's code names without reading them: folders.py names HF_HOME as another
# tool's equivalent of MEMAGENT_HOME.
NOT_READ = {"HF_HOME"}


def prose(text: str) -> str:
    """`text` without its code blocks and inline code, where a link is only an example."""
    return _CODE.sub("", _FENCE.sub("", text))


def links(text: str) -> list[str]:
    return _LINK.findall(prose(text))


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lowercase, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+)$", _FENCE.sub("", text), re.M):
        base = slug(heading)
        name, n = base, 0
        while name in found:  # GitHub numbers repeated headings: name, name-1, name-2
            n += 1
            name = f"{base}-{n}"
        found.add(name)
    return found


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """Every relative link of `page` whose file, or whose anchor in it, does not exist."""
    problems = []
    for target in links(page.read_text()):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(root)}: {target}"
        if not resolved.exists():
            problems.append(f"{where}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved.read_text()):
            problems.append(f"{where}: no heading with that anchor")
    return problems


def test_every_relative_link_resolves():
    assert len(PAGES) > 10
    problems = [problem for page in PAGES for problem in broken_links(page)]
    assert not problems, "\n".join(problems)


def test_a_broken_link_or_anchor_is_reported(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Where files go\n")
    page = tmp_path / "README.md"
    page.write_text(
        "See [a](docs/a.md), [files](docs/a.md#where-files-go), [web](https://x.org/b.md),\n"
        "[gone](docs/b.md), [bad](docs/a.md#nowhere) and [self](#top).\n"
        "`[in code](docs/c.md)` and\n```\n[in a block](docs/d.md)\n```\n# Top\n"
    )
    assert broken_links(page, tmp_path) == [
        "README.md: docs/b.md: no such file",
        "README.md: docs/a.md#nowhere: no heading with that anchor",
    ]


def test_anchors_are_githubs():
    text = "# memagent ask\n## On a GPU (one H100)\n### Measured: the guard, off\n"
    text += "## Step\n## Step\n"
    assert anchors(text) == {
        "memagent-ask",
        "on-a-gpu-one-h100",
        "measured-the-guard-off",
        "step",
        "step-1",
    }


def test_the_readme_is_a_front_door_that_links_every_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 250, "README.md is over 250 lines: move detail to docs/"
    linked = {(README.parent / target.partition("#")[0]).resolve() for target in links(text)}
    unlinked = [p.name for p in TOP[1:] if p.resolve() not in linked]
    assert not unlinked, f"README.md links no {unlinked}"
    assert (ROOT / "LICENSE").read_text().split()[:3] == ["Apache", "License", "Version"]


def test_the_configuration_page_names_every_environment_variable_memagent_reads():
    source = "\n".join(p.read_text() for p in (ROOT / "memagent_cli").rglob("*.py"))
    named = set(re.findall(r"\b(?:MEMAGENT|OPENAI|HF|TIKTOKEN|XDG)_[A-Z_]+\b", source))
    assert {"MEMAGENT_MODEL", "MEMAGENT_HOME", "OPENAI_API_KEY", "HF_TOKEN"} <= named
    text = (ROOT / "docs" / "configuration.md").read_text()
    table = text[text.index("| variable |") :].split("\n\n", 1)[0]
    missing = sorted(named - NOT_READ - set(re.findall(r"`([A-Z][A-Z_]+)`", table)))
    assert not missing, f"docs/configuration.md's table of environment variables lacks {missing}"


# A figure that several pages quote has one value: each fact, the words that quote it (the
# figure is the pattern's group) and that value. Change a figure in every page at once.
FACTS = {
    "make test's time on 2 cores": (r"make test(?![-\w])`?.{0,80}?(?:about|under) (\d+) min", "5"),
    "llama.cpp's first build": (
        r"llama\.cpp.{0,100}? \(?(?:takes )?(?:about )?([\d-]+) minutes",
        "5",
    ),
    "a 7B's prefill on 2 cores": (
        r"7B-shaped (?:model|engine).{0,200}?[Pp]refill(?:ed|s)? ([\d.-]+)",
        "18.5-18.9",
    ),
    "a 7B's decode on 2 cores": (
        r"7B-shaped (?:model|engine).{0,250}?decod(?:ed|e) ([\d.-]+)",
        "2.4-2.7",
    ),
    "memagent-7b's download": (r"([\d.]+) GB (?:to )?download(?! ?\w)", "15.2"),
    "the default model's download": (r"SmolLM2-135M-Instruct \([^)]{0,20}?([\d.]+) MB\)", "98"),
    "a step's prompt at the defaults": (
        r"(?:step's prompt|a prompt of)[^.]{0,30}?(\d,\d{3})",
        "6,200",
    ),
    "a full step of the default model, 2 cores": (
        r"([\d.]+) s for (?:each full step|the second)",
        "63.5",
    ),
    "tokens a page of prose": (r"page of prose is about (\d+)", "420"),
    "a 300-page book's tokens": (r"300-page book (?:is about |\()(\d+)K tokens", "126"),
    "the 0.5B's conversion on 2 cores": (
        r"converted and quantized (?:to Q4_K_M )?in ([\d.-]+) s",
        "8.4-9.4",
    ),
    "flash attention's decode at 7K": (r"decode ([\d.]+) against 29\.4", "10.5"),
    "OCR's seconds a page": (r"about ([\d.]+) s a page", "0.4"),
}


def quotes(pattern: str, pages: list[Path]) -> list[tuple[str, str]]:
    """(page, figure) for each place the pages quote a fact, code blocks included."""
    return [
        (page.name, found.group(1))
        for page in pages
        for found in re.finditer(pattern, " ".join(page.read_text().split()))
    ]


@pytest.mark.parametrize("fact", sorted(FACTS))
def test_a_figure_quoted_on_several_pages_is_one_figure(fact):
    pattern, value = FACTS[fact]
    found = quotes(pattern, user_pages())
    assert found, f"no page quotes {fact} any more: update FACTS"
    wrong = [(page, figure) for page, figure in found if figure != value]
    assert not wrong, f"{fact} is {value}, but these pages say otherwise: {wrong}"


def test_two_pages_that_disagree_on_a_figure_fail(tmp_path):
    (tmp_path / "a.md").write_text("`make test` takes about 5 minutes on 2 cores.\n")
    (tmp_path / "b.md").write_text("make test   # every test (about\n8 minutes on 2 cores)\n")
    found = quotes(FACTS["make test's time on 2 cores"][0], sorted(tmp_path.glob("*.md")))
    assert found == [("a.md", "5"), ("b.md", "8")]


# The bench's own aims and how its figures were carried between machines belong to
# bench/README.md and the development pages, not to the pages a user reads.
LAB_NOTEBOOK = ["raw output not kept", "raw outputs not kept", "the 1.1 goal", "aim: 0.95",
                "machine lent", "lent to some sessions", "the bench aims"]  # fmt: skip
NOT_FOR_USERS_ONLY = {"development.md"}
INTERNALS = ROOT / "docs" / "internals"


def user_pages() -> list[Path]:
    """The pages a user reads: not the development pages, nor the help made by a tool."""
    return [
        page
        for page in PAGES
        if page.name not in NOT_FOR_USERS_ONLY | {"cli.md"} and page.parent != INTERNALS
    ]


def test_user_pages_keep_the_lab_notebook_out():
    found = [
        (page.name, phrase)
        for page in user_pages()
        for phrase in LAB_NOTEBOOK
        if phrase in " ".join(page.read_text().split())
    ]
    assert not found, found


# How sources were looked up, which machine of the project's ran what, issue and commit
# numbers, temporary folders: words for maintainers, kept off the pages a user reads and the
# bench's README.
MAINTAINERS = [r"\bissue \d+", r"\bissues? #\d+", r"`/tmp\b", r"under /tmp", r"search tool",
               r"other agents", r"\bsessions?\b.{0,20}\blent\b", r"device tool", r"\(`[0-9a-f]{7}`",
               r"this machine cannot reach", r"the Hub cannot be reached"]  # fmt: skip


def test_user_pages_and_the_bench_readme_keep_the_maintainers_wording_out():
    pages = [*user_pages(), ROOT / "bench" / "README.md"]
    found = [
        (page.name, pattern)
        for page in pages
        for pattern in MAINTAINERS
        if re.search(pattern, prose(page.read_text()))
    ]
    assert not found, found


def test_the_maintainers_wording_check_finds_it(tmp_path):
    page = "Figures quoted in issue 37 were looked up with the search tool (`da6b90c`)."
    assert [p for p in MAINTAINERS if re.search(p, page)] == [
        r"\bissue \d+",
        r"search tool",
        r"\(`[0-9a-f]{7}`",
    ]


# A speed figure: a rate, or the time a question, a step or a book takes.
SPEED = re.compile(
    r"(?<!at most )\b\d[\d,.]*(?:-\d[\d,.]*)? ?(?:tok/s|tokens a second|pages a second"
    r"|readings a minute|s a (?:page|step|call|case)|s/page|s per case"
    r"|(?:min|minutes|hours?|h)\b(?! ?[-\w]*\())"
)
# Words that say where a figure comes from: a kept run, or a computation said to be one.
SOURCED = re.compile(
    r"bench/results/|\.log\b|\.json\b|\.txt\b|computed|never run|not measured", re.I
)


def unsourced(text: str) -> list[str]:
    """The speed figures of `text`'s prose whose paragraph (or list item) names no kept file
    and says nothing of being computed; a figure a FACTS entry checks is sourced there."""
    found = []
    for block in re.split(r"\n\s*\n|\n(?=\s*(?:[-*]|\d+\.) )", _FENCE.sub("", text)):
        words = " ".join(block.split())
        if SOURCED.search(words) or words.startswith("|"):
            continue  # tables: the paragraph before or after names their source
        facts = [m.span(1) for pattern, _ in FACTS.values() for m in re.finditer(pattern, words)]
        found += [
            m.group(0)
            for m in SPEED.finditer(words)
            if not any(a <= m.start() < b for a, b in facts)
        ]
    return found


def test_every_speed_figure_on_a_user_page_comes_from_a_kept_run_or_says_it_was_computed():
    found = {page.name: unsourced(page.read_text()) for page in user_pages()}
    assert not {name: figures for name, figures in found.items() if figures}, found


def test_an_unsourced_speed_figure_is_found():
    text = "A book takes 3-6 hours on 2 cores.\n\nOne step took 63.5 s (`readers.txt`).\n"
    assert unsourced(text) == ["3-6 hours"]
    assert unsourced("Computed: 5.1-6.4 h on 2 cores, 12 min a step.\n") == []


def _book_time():
    spec = importlib.util.spec_from_file_location("book_time", ROOT / "bench" / "book_time.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


CHOOSING = ROOT / "docs" / "choosing-a-model.md"


def test_how_long_for_my_book_is_book_time_s_tables():
    book_time = _book_time()
    text = CHOOSING.read_text()
    for table in (book_time.book_table(300), book_time.step_table(), book_time.before_table()):
        assert "\n".join(table) in text, "run python bench/book_time.py and paste its tables"


def cells(text: str, heading: str) -> dict[tuple[str, str], str]:
    """(model, column) -> cell of the first table after `heading`."""
    lines = text[text.index(heading) :].splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    block = []
    for line in lines[first:]:
        if not line.startswith("|"):
            break
        block.append([c.strip() for c in line.strip("|").split("|")])
    head, rows = block[0], block[2:]
    return {
        (row[0], name): value
        for row in rows
        for name, value in zip(head[1:], row[1:], strict=False)
    }


def test_the_readme_quotes_the_book_table_as_it_is():
    readme = cells(README.read_text(), "## How long for my book")
    full = cells(CHOOSING.read_text(), "One question on a 300-page book")
    assert len(readme) >= 9
    wrong = {key: (value, full.get(key)) for key, value in readme.items() if full.get(key) != value}
    assert not wrong, f"README cell -> (README, choosing-a-model.md): {wrong}"


# Terms the glossary defines: a page that uses one links to the glossary.
GLOSSARY = ROOT / "docs" / "glossary.md"
TERMS = ["prefill", "decode", "sub_em", "greedy", "depth", "floor", "round", "chunk", "memory",
         "step", "reader", "evidence", "journal", "calibration", "AMX", "REPACK",
         "continuous batching", "prefix caching"]  # fmt: skip


def test_the_glossary_defines_its_terms_and_pages_that_use_them_link_it():
    defined = " ".join(GLOSSARY.read_text().split())
    assert all(f"**{term}**" in defined for term in TERMS), "docs/glossary.md lacks a term"
    unlinked = []
    for page in PAGES:
        # cli.md is --help, made by a tool; readers.md quotes the readers' code, where
        # "greedy" is a regular expression's and "floor" an IDF weight's.
        if page == GLOSSARY or page.name in ("cli.md", "readers.md"):
            continue
        words = prose(page.read_text()).lower()
        used = [t for t in TERMS if re.search(rf"\b{t.lower()}(?:s|ed|ing)?\b", words)]
        if used and "glossary.md" not in page.read_text():
            unlinked.append((page.name, used))
    assert not unlinked, f"pages that use the glossary's terms without linking it: {unlinked}"


def install_check(page: Path) -> tuple[str, str]:
    """The output block of `page`'s install check, and the section around it."""
    text = page.read_text()
    section = text[text.index("## Check the install") :]
    section = section[: section.index("\n## ", 3)]
    return re.search(r"```text\n(.*?)```", section, re.S)[1], section


def test_the_install_check_shown_is_a_quiet_kept_run():
    """The README's install check is a run kept under bench/results/, quiet (the process had
    most of two cores), and the quickstart shows the same."""
    output, section = install_check(README)
    if "PLACEHOLDER" in output:
        pytest.skip("README's install check is a placeholder: bench/README.md says how to fill it")
    assert install_check(ROOT / "docs" / "quickstart.md")[0] == output
    kept = re.search(r"\((bench/results/[^)\s]+\.txt)\)", section)
    assert kept, "the install check names no kept file under bench/results/"
    lines = (ROOT / kept[1]).read_text().splitlines()
    for line in output.splitlines():
        shown = line.split(" [...]")[0]
        assert any(shown in kept_line for kept_line in lines), f"not in {kept[1]}: {line}"
    cpu = re.search(r"Percent of CPU this job got: (\d+)%", "\n".join(lines))
    assert cpu and int(cpu[1]) >= 150, "the kept run shows a busy machine"


# A path of the machine a run was kept on: its users' homes, its scratch and work folders.
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:tmp|root|home|work|Users|var/folders)/[^\s\"',)]*")


def machine_paths(text: str) -> list[str]:
    return MACHINE_PATH.findall(text)


def test_kept_runs_name_no_path_of_the_machine_they_ran_on():
    """bench/results/ is published as it is: a path there says whose machine, and where its
    files lay, and reruns elsewhere differ from it in nothing but that."""
    found = {
        str(path.relative_to(ROOT)): machine_paths(path.read_text(errors="replace"))
        for path in sorted((ROOT / "bench" / "results").rglob("*"))
        if path.is_file()
    }
    assert not {name: paths for name, paths in found.items() if paths}, found


def test_a_machine_path_in_a_kept_run_is_found():
    assert machine_paths('"stdout": "/tmp/tmpab12/model.gguf",') == ["/tmp/tmpab12/model.gguf"]
    assert machine_paths("--model /home/ann/q.gguf -o build/bench/x.jsonl") == ["/home/ann/q.gguf"]
    assert machine_paths("converted in $TMPDIR/model.gguf; see bench/results/x.txt") == []
