"""The README and docs/ stay true: every relative link and anchor resolves, the README stays
a front door (at most 250 lines) that links every page, and its table of environment
variables names every variable memagent reads."""

from __future__ import annotations

import re
from pathlib import Path

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


def test_the_readme_names_every_environment_variable_memagent_reads():
    source = "\n".join(p.read_text() for p in (ROOT / "memagent_cli").rglob("*.py"))
    named = set(re.findall(r"\b(?:MEMAGENT|OPENAI|HF|TIKTOKEN|XDG)_[A-Z_]+\b", source))
    assert {"MEMAGENT_MODEL", "MEMAGENT_HOME", "OPENAI_API_KEY", "HF_TOKEN"} <= named
    text = README.read_text()
    table = text[text.index("| variable |") :].split("\n\n", 1)[0]
    missing = sorted(named - NOT_READ - set(re.findall(r"`([A-Z][A-Z_]+)`", table)))
    assert not missing, f"README.md's table of environment variables lacks {missing}"
