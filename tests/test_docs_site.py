"""The documentation cannot drift: the README stays a short guide (at most 300 lines) whose links
exist, every page under docs/ is in the site's navigation, and `mkdocs build --strict` passes (CI
installs mkdocs with the test extra; elsewhere the build is skipped where mkdocs is missing, and says
so)."""
import os
import re
import subprocess
import sys

import pytest
import yaml

from conftest import REPO


def test_the_readme_is_a_short_guide_whose_links_exist():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    links = re.findall(r"\]\(([^)#\s]+)", text)
    assert links and all((REPO / link).exists() for link in links if not link.startswith("http")), links
    assert "pip install -e '.[test]' && python -m pytest" in text  # the test command CI runs


def _nav_pages(nav) -> list[str]:
    out = []
    for entry in nav:
        for value in entry.values() if isinstance(entry, dict) else [entry]:
            out += _nav_pages(value) if isinstance(value, list) else [value]
    return out


def test_every_page_is_in_the_navigation():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    pages = set(_nav_pages(config["nav"]))
    on_disk = {str(p.relative_to(REPO / "docs")) for p in (REPO / "docs").rglob("*.md")}
    assert pages == on_disk, (on_disk - pages, pages - on_disk)


def test_the_site_builds_strictly(tmp_path):
    try:
        import mkdocs  # noqa: F401
        import material  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("mkdocs and mkdocs-material are not installed (pip install -e '.[test]' installs them)")
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")], cwd=REPO,
                         capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    html = (tmp_path / "site" / "guide" / "network" / "index.html").read_text()
    assert "BBR" in html and "Links that fade" in html


def test_the_guide_and_the_readme_carry_no_commit_hashes():
    """History lives on the dated pages (docs/2026-*.md); the guide keeps current figures only."""
    hashes = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
    pages = [REPO / "README.md", REPO / "docs" / "index.md", *sorted((REPO / "docs" / "guide").glob("*.md"))]
    found = {p.name: hashes.findall(p.read_text()) for p in pages}
    assert not {k: v for k, v in found.items() if v}
