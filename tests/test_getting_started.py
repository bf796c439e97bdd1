"""Every shell command of docs/guide/getting-started.md runs as written, on small settings (one round;
the page's runs/ folder becomes a temporary one), unless the paragraph before its block says "Not run
here" and why; and README's commands are all either run here or by the same command elsewhere."""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from conftest import REPO, needs_mnist

PAGE = REPO / "docs" / "guide" / "getting-started.md"


def blocks(text: str) -> list[tuple[str, list[str]]]:
    """(the prose before it, its command lines) for every bash block."""
    out, last = [], 0
    for m in re.finditer(r"```bash\n(.*?)```", text, re.S):
        prose = text[last:m.start()].rsplit("```", 1)[-1]  # since the previous block ended
        out.append((prose, [line for line in m.group(1).splitlines() if line.strip()]))
        last = m.end()
    return out


def small(command: str, runs: Path) -> list[str]:
    """The command as the test runs it: the python of this run, runs/ in a temporary folder, one round."""
    args = shlex.split(command.replace("runs/", f"{runs}/"))
    assert args[0] == "python", command
    args[0] = sys.executable
    if args[1:4] == ["-m", "emulator", "run"]:
        args += ["--set", "rounds=1", "--quiet"]
    return args


def test_the_page_marks_what_it_does_not_run_and_says_why():
    found = blocks(PAGE.read_text())
    assert len(found) >= 6
    skipped = [prose for prose, _ in found if "Not run here" in prose]
    assert len(skipped) == 2  # the install (this suite runs in it) and the flagship (run shortened elsewhere)
    assert all(re.search(r"Not run here( \(|:)", p) for p in skipped)


@needs_mnist
def test_every_command_of_the_getting_started_page_runs(tmp_path):
    runs = tmp_path / "runs"
    ran = []
    for prose, lines in blocks(PAGE.read_text()):
        if "Not run here" in prose:
            continue
        for line in lines:
            res = subprocess.run(small(line, runs), cwd=REPO, capture_output=True, text=True, timeout=300,
                                 env=os.environ.copy())
            assert res.returncode == 0, f"{line}\n{res.stderr[-3000:]}"
            ran.append(line)
    assert len(ran) == 6
    for made in ("first/report.html", "first/trace.json", "int8/summary.json", "compare/compare.html"):
        assert (runs / made).exists(), made
