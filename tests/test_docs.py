"""The README and docs/ stay true: every relative link and anchor resolves, the README stays
a front door (at most 250 lines) that links every page, the configuration page's table of
environment variables names every variable memagent reads, a figure quoted on several pages
is the same figure on each, and user pages keep the bench's lab notebook out."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]

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
    unlinked = [p.name for p in PAGES[1:] if p.resolve() not in linked]
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
    "llama.cpp's first build": (r"llama\.cpp.{0,100}? takes (?:about )?([\d-]+) minutes", "5"),
    "a 7B's prefill on 2 cores": (r"7B-shaped model.{0,200}?[Pp]refill(?:ed|s)? ([\d.]+)", "19"),
    "a 7B's decode on 2 cores": (r"7B-shaped model.{0,250}?decod(?:ed|e) ([\d.-]+)", "2.4-2.7"),
    "memagent-7b's download": (r"([\d.]+) GB (?:to )?download(?! ?\w)", "15.2"),
    "the default model's download": (r"SmolLM2-135M-Instruct \([^)]{0,20}?([\d.]+) MB\)", "98"),
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
    found = quotes(pattern, PAGES)
    assert found, f"no page quotes {fact} any more: update FACTS"
    wrong = [(page, figure) for page, figure in found if figure != value]
    assert not wrong, f"{fact} is {value}, but these pages say otherwise: {wrong}"


def test_two_pages_that_disagree_on_a_figure_fail(tmp_path):
    (tmp_path / "a.md").write_text("`make test` takes about 5 minutes on 2 cores.\n")
    (tmp_path / "b.md").write_text("make test   # every test (about\n8 minutes on 2 cores)\n")
    found = quotes(FACTS["make test's time on 2 cores"][0], sorted(tmp_path.glob("*.md")))
    assert found == [("a.md", "5"), ("b.md", "8")]


# The bench's own aims and how its figures were carried between machines belong to
# bench/README.md and docs/development.md, not to the pages a user reads.
LAB_NOTEBOOK = ["raw output not kept", "raw outputs not kept", "the 1.1 goal", "aim: 0.95",
                "machine lent", "lent to some sessions", "the bench aims"]  # fmt: skip
NOT_FOR_USERS_ONLY = {"development.md"}


def test_user_pages_keep_the_lab_notebook_out():
    found = [
        (page.name, phrase)
        for page in PAGES
        if page.name not in NOT_FOR_USERS_ONLY
        for phrase in LAB_NOTEBOOK
        if phrase in " ".join(page.read_text().split())
    ]
    assert not found, found


# Terms the glossary defines: a page that uses one links to the glossary.
GLOSSARY = ROOT / "docs" / "glossary.md"
TERMS = ["prefill", "decode", "sub_em", "greedy", "depth", "floor", "round"]


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
        used = [t for t in TERMS if re.search(rf"\b{t}(?:s|ed|ing)?\b", words)]
        if used and "glossary.md" not in page.read_text():
            unlinked.append((page.name, used))
    assert not unlinked, f"pages that use the glossary's terms without linking it: {unlinked}"
