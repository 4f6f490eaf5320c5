"""The documentation's references resolve, and the library's source carries no measurements.

- Every section cited as ``§N`` or ``§N.M`` in leettriton/, tests/, perf/, docs/ and README.md is a
  heading of a file in docs/ (headings carry their § numbers: docs/design.md, "Where each section is").
- Every relative link in docs/*.md and README.md points to a file or folder that exists.
- No docstring or comment in leettriton/ quotes a timing figure or a perf/results path: figures go stale
  with every tune, so the source states the rule and its reason and cites docs/ (docs/README.md).

Plain file reads, no leettriton import: the whole file runs in well under a second.
"""
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

HEADING = re.compile(r"^#+\s+§(\d+(?:\.\d+)?)\s", re.MULTILINE)
CITATION = re.compile(r"§(\d+(?:\.\d+)?)")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
# A timing figure: a decimal with ms, µs or us, or an integer with ms or µs.
TIMING = re.compile(r"[0-9]\.[0-9]+ ?(ms|µs|us)\b|\b[0-9]+ ?(ms|µs)\b")
RESULTS_PATH = re.compile(r"perf/results")

CITING = ("leettriton", "tests", "perf", "docs")
TEXT_SUFFIXES = {".py", ".md", ".sh", ".txt", ".toml", ".cfg", ".json", ".jsonl", ".csv", ".log", ".patch"}


def headings():
    """§ number -> the docs/ files whose headings carry it."""
    found = {}
    for path in sorted(DOCS.glob("*.md")):
        for number in HEADING.findall(path.read_text(encoding="utf-8")):
            found.setdefault(number, []).append(path.name)
    return found


def citing_files():
    files = [ROOT / "README.md"] if (ROOT / "README.md").exists() else []
    for top in CITING:
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and path.suffix in TEXT_SUFFIXES and "__pycache__" not in path.parts:
                files.append(path)
    return files


def read(path):
    return path.read_text(encoding="utf-8", errors="replace")


def test_every_section_has_one_home():
    found = headings()
    assert found, "no heading in docs/ carries a § number"
    doubled = {}
    for path in sorted(DOCS.glob("*.md")):
        numbers = HEADING.findall(read(path))
        for number in set(numbers):
            if numbers.count(number) > 1:
                doubled.setdefault(number, []).append(path.name)
    for number, files in found.items():
        if len(files) > 1:
            doubled.setdefault(number, []).extend(files)
    assert not doubled, f"sections with more than one heading (a § must have one home): {doubled}"


def test_every_section_is_in_the_design_table():
    """docs/design.md's table lists every section with the file that holds it."""
    table = {}
    for line in read(DOCS / "design.md").splitlines():
        row = re.match(r"^\|\s*§(\d+(?:\.\d+)?)\s*\|[^|]*\|\s*\[[^\]]*\]\(([^)]+)\)\s*\|", line)
        if row:
            table[row.group(1)] = row.group(2)
    found = headings()
    wrong = {number: (table.get(number), files) for number, files in found.items()
             if table.get(number) not in files}
    extra = sorted(set(table) - set(found))
    assert not wrong, f"design.md's table names another file (or none) for: {wrong}"
    assert not extra, f"design.md's table lists sections that no heading has: {extra}"


def test_every_cited_section_resolves():
    found = headings()
    missing = []
    for path in citing_files():
        text = read(path)
        for match in CITATION.finditer(text):
            if match.group(1) not in found:
                line = text.count("\n", 0, match.start()) + 1
                missing.append(f"{path.relative_to(ROOT)}:{line}: §{match.group(1)}")
    assert not missing, "citations of sections that no heading in docs/ carries:\n" + "\n".join(missing)


def test_relative_links_resolve():
    pages = sorted(DOCS.glob("*.md")) + [ROOT / "README.md"]
    broken = []
    for page in pages:
        if not page.exists():
            continue
        text = read(page)
        for match in LINK.finditer(text):
            target = match.group(1).split("#", 1)[0]
            if not target or re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
                continue  # an anchor in the same page, or a URL (http:, mailto:, ...)
            if not (page.parent / target).exists():
                line = text.count("\n", 0, match.start()) + 1
                broken.append(f"{page.relative_to(ROOT)}:{line}: {match.group(1)}")
    assert not broken, "relative links to files that do not exist:\n" + "\n".join(broken)


def library_sources():
    return sorted(p for p in (ROOT / "leettriton").rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("pattern, what", [(TIMING, "timing figures"),
                                           (RESULTS_PATH, "perf/results paths")],
                         ids=["timings", "results-paths"])
def test_no_measurements_in_library_source(pattern, what):
    hits = []
    for path in library_sources():
        for number, line in enumerate(read(path).splitlines(), 1):
            if pattern.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not hits, (f"{what} in leettriton/ (docstrings state the rule and its reason and cite "
                      f"docs/design.md §; figures live in perf/results):\n" + "\n".join(hits))


def test_the_lint_catches_what_it_should():
    """The patterns above flag real figures and let rules through."""
    for figure in ("0.213 ms", "3.7 µs", "24.2us", "187 ms", "45 µs", "see perf/results/h100/x.log"):
        assert TIMING.search(figure) or RESULTS_PATH.search(figure), figure
    for rule in ("at most 256 keys", "timeout_ms=100", "§2.3", "2 × 8192", "params", "1 stage"):
        assert not (TIMING.search(rule) or RESULTS_PATH.search(rule)), rule
    assert CITATION.findall("see docs/design.md §4.5 and §10") == ["4.5", "10"]
    assert HEADING.findall("## §4.2 Validation\n### §10 Gradients\nnot §3 a heading") == ["4.2", "10"]
