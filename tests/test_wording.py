"""The repository speaks of the product, never of how it was made: no words of the work's process.

What a user reads (README, CHANGELOG, docs), the package, the tests, the benchmarks and their results say what
the code does and why; how a change came about lives in git. ``PROCESS_WORDS`` is the one list: a phrase that
names a step of the work, a look at the code by someone else, a sitting, a day, or what was tried and dropped,
and a commit hash written into prose.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Each phrase of the process, by what it names. Case is ignored.
PROCESS_WORDS: dict[str, str] = {
    "a step of the work": r"\bstop\s+\d+|\bstops\s+\d+(?:[-–]\d+|,? and \d+)",
    "a review": r"\b(?:found\s+in|in|a|the|this|that|its|first|second|third|of)\s+review\b"
    r"|\breview(?:er|ers|ed)\b|\breview['’]s\b|\breview of\b|\(review\)",
    "a sitting": r"\b(?:this|that|the|same|previous|next|earlier|later|whole)\s+session\b(?![ -](?:cookie|id|key))",
    "a day": r"\bthis\s+day\b",
    "what was dropped": r"\bnot\s+kept\b",
    "an issue's number": r"\bissues? #?\d+",
}

#: A commit hash: 7 to 12 hex digits standing alone (not part of a longer word, a path, a ``0x`` constant, a
#: ``#`` colour, a UUID or a longer digest), with at least one digit and one letter (so neither a number nor a
#: word such as "defaced").
COMMIT_HASH = re.compile(r"(?<![\w#./\-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,12}(?![\w\-])", re.I)
WORDS = re.compile("|".join(f"(?:{pattern})" for pattern in PROCESS_WORDS.values()), re.I)

#: Where the words are looked for, under the repository's root.
PLACES = ("README.md", "CHANGELOG.md", "mkdocs.yml", "pyproject.toml", "docs", "admitgate", "tests", "bench", "lab",
          "deploy", "dashboards")  # fmt: skip
TEXT = {".md", ".py", ".json", ".txt", ".toml", ".yml", ".yaml", ".cfg", ".ini", ".sh", ".html", ".js", ".css",
        ".csv", ".rules"}  # fmt: skip
#: This file holds the list itself.
SELF = Path(__file__).resolve()


def files() -> Iterator[Path]:
    for place in PLACES:
        path = ROOT / place
        candidates = [path] if path.is_file() else sorted(path.rglob("*"))
        for candidate in candidates:
            skipped = {"__pycache__", ".venv"} & set(candidate.parts)
            if candidate.suffix in TEXT and candidate.is_file() and candidate.resolve() != SELF and not skipped:
                yield candidate


def prose(path: Path) -> Iterator[tuple[int, str]]:
    """A file's lines, each with its number; of a JSON file, its keys and the string values with a space in
    them (a bare value such as a results file's ``"commit"`` field is a record, not prose)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".json":
        yield from enumerate(text.splitlines(), 1)
        return

    def strings(value: object) -> Iterator[str]:
        if isinstance(value, dict):
            for key, item in value.items():
                yield str(key)
                yield from strings(item)
        elif isinstance(value, list):
            for item in value:
                yield from strings(item)
        elif isinstance(value, str) and " " in value:
            yield value

    for string in strings(json.loads(text)):
        yield 0, string


def findings(path: Path) -> list[str]:
    out = []
    for number, line in prose(path):
        for match in [*WORDS.finditer(line), *(COMMIT_HASH.finditer(line) if " " in line else [])]:
            out.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0)!r} in {line.strip()[:100]!r}")
    return out


def test_the_repository_holds_no_word_of_the_process() -> None:
    found = [finding for path in files() for finding in findings(path)]
    assert not found, f"{len(found)} process words:\n" + "\n".join(found[:60])


def test_the_places_looked_in_hold_the_docs_the_package_and_the_results() -> None:
    looked = {path.relative_to(ROOT).as_posix() for path in files()}
    for expected in ("README.md", "CHANGELOG.md", "docs/index.md", "admitgate/core/gate.py", "bench/herd.py",
                     "bench/results/herd.json", "tests/test_gate.py"):  # fmt: skip
        assert expected in looked


@pytest.mark.parametrize(
    "text",
    ["at stop  41 the herd", "Stop  7: the rule", "stops  26-27", "stops  32 and 33", "found in  review",
     "a review found it", "the reviewer's script", "reviewed and dropped", "(review)", "the  review's fixes",
     "late in the session", "on this  session's machine", "this  day's reading", "tried and not  kept", "not  kept",
     "see issue 49", "at 01b5c78 on a slower machine", "the tree before 991f2a8", "(a6f5839)"],
)  # fmt: skip
def test_a_process_word_is_found(text: str) -> None:
    assert WORDS.search(text) or COMMIT_HASH.search(text), text


@pytest.mark.parametrize(
    "text",
    ["the gate stops  3 requests", "a session cookie", "httpx sessions echo it", "a session of its own",
     "leads a session", "a value of 0x1f2e3d4c", "colour #1f77b4", "550e8400-e29b-41d4-a716-446655440000",
     "sha256 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", "1234567 requests",
     "the word defaced", "bench/results/herd.json", "review your settings before you deploy"],
)  # fmt: skip
def test_what_is_not_a_process_word_passes(text: str) -> None:
    assert not WORDS.search(text) and not COMMIT_HASH.search(text), text
