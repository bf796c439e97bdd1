"""Every document a source file cites is in the repository, and so is every section it cites."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [p for folder in ("protocol", "node", "emulator", "tools", "scenarios", "examples")
           for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".c", ".yaml")]
CITATION = re.compile(r"\b(docs/[a-z_]+\.md)(?: (part \d|\d+(?:\.\d+)?))?")


def headings(doc: Path) -> set[str]:
    """'1.5' for '### 1.5 ...', 'part 2' for '## Part 2: ...', '3' for '## 3. ...'."""
    found = set()
    for line in doc.read_text().splitlines():
        if m := re.match(r"#+ (?:Part (\d)\b|(\d+(?:\.\d+)?)\.? )", line):
            found.add(f"part {m[1]}" if m[1] else m[2])
    return found


def test_cited_documents_and_sections_exist():
    assert SOURCES, "no source files found"
    cited = [(src, m[1], m[2]) for src in SOURCES for m in CITATION.finditer(src.read_text(errors="replace"))]
    assert len(cited) > 20
    missing = []
    for src, doc, section in cited:
        path = ROOT / doc
        if not path.exists():
            missing.append(f"{src.relative_to(ROOT)}: {doc}")
        elif section and section not in headings(path):
            missing.append(f"{src.relative_to(ROOT)}: {doc} {section}")
    assert not missing, missing


def test_no_source_file_points_outside_the_repository():
    outside = [str(src.relative_to(ROOT)) for src in SOURCES
               if re.search(r"ALGORITHMS\.md|DESIGN\.md|\.\./shared[/]docs", src.read_text(errors="replace"))]
    assert not outside, outside
