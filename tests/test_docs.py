"""The README is the package's front page: its links stay inside the repository and land on real headings.

The documentation site itself is checked by ``mkdocs build --strict`` in .ci/run (links and anchors between
pages); this covers the README, which MkDocs does not build.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def github_anchor(heading: str) -> str:
    """The fragment GitHub gives a heading: lower case, punctuation dropped, each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {github_anchor(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def test_readme_links_stay_in_the_repository_and_land_on_headings() -> None:
    readme = ROOT / "README.md"
    links = LINK.findall(FENCE.sub("", readme.read_text(encoding="utf-8")))
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert local, "the README links into the documentation"
    for link in local:
        path, _, fragment = link.partition("#")
        target = (ROOT / path).resolve() if path else readme
        assert target.is_relative_to(ROOT), f"{link} leaves the repository"
        assert target.is_file(), f"{link}: no such file"
        if fragment:
            assert fragment in anchors(target), f"{link}: {target.name} has no heading #{fragment}"


def test_readme_cites_no_path_outside_the_repository() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "../" not in text
    assert "shared/" not in text


def test_github_anchor_matches_what_github_renders() -> None:
    assert github_anchor("Who a returning client is") == "who-a-returning-client-is"
    assert github_anchor("`RedisBudget` options: `timeout`") == "redisbudget-options-timeout"
    assert github_anchor("Retry-After that follows the live H(t)") == "retry-after-that-follows-the-live-ht"


def test_the_command_line_page_names_every_command_and_option() -> None:
    import argparse

    from admitgate.cli import build_parser

    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name, parser in commands.items():
        assert f"## `admitgate {name}`" in page
        for action in parser._actions:
            for option in action.option_strings:
                assert option in ("-h", "--help") or f"`{option}`" in page, f"admitgate {name} {option}"


def test_every_results_file_has_its_benchmark_section_and_every_cited_one_exists() -> None:
    """One file per benchmark in bench/results/: each is named on the benchmarks page, and no page cites a file
    that is not there (a renamed or removed run)."""
    results = ROOT / "bench" / "results"
    kept = {p.name for p in results.iterdir() if p.is_file() and p.suffix in (".json", ".txt")}
    assert not list(results.glob("*.png")), "images live in docs/img, not beside the results"
    benchmarks = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert not {name for name in kept if name not in benchmarks}, "results files no benchmark section names"
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for cited in re.findall(r"bench/results/([\w.-]+\.(?:json|txt))", page.read_text(encoding="utf-8")):
            assert cited in kept, f"{page.name} cites bench/results/{cited}, which is not there"
