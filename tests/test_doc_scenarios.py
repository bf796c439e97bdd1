"""The scenarios the documentation shows are scenarios the schema accepts: every YAML block of the
README and docs/ that is a whole scenario validates as it is, one that is a part of one (top-level
keys of the schema only) validates merged into scenarios/smoke.yaml, and the README's annotated
copy of smoke.yaml is that file."""
import re

import pytest
import yaml

from conftest import REPO

from emulator.scenario import Scenario, load_scenario

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def yaml_blocks():
    """The YAML blocks that are scenarios or parts of one (a Kubernetes job, say, is not)."""
    for page in PAGES:
        for n, block in enumerate(re.findall(r"```ya?ml\n(.*?)```", page.read_text(), re.S)):
            data = yaml.safe_load(block)
            if isinstance(data, dict) and set(data) <= set(Scenario.model_fields):
                yield pytest.param(page, block, id=f"{page.relative_to(REPO)}#{n}")


@pytest.mark.parametrize("page, block", list(yaml_blocks()))
def test_each_scenario_block_validates(tmp_path, page, block):
    data = yaml.safe_load(block)
    if "task" not in data:  # a part: merged into smoke
        base = yaml.safe_load((REPO / "scenarios" / "smoke.yaml").read_text())
        data = {**base, **data}
    path = tmp_path / "block.yaml"
    path.write_text(yaml.safe_dump(data))
    load_scenario(path)  # raises ScenarioError with the key and the value


def test_the_readmes_smoke_is_the_shipped_one():
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", (REPO / "README.md").read_text(), re.S) if "name: smoke" in b)
    assert yaml.safe_load(block) == yaml.safe_load((REPO / "scenarios" / "smoke.yaml").read_text())


def test_there_are_scenario_blocks_to_check():
    assert sum(1 for p in yaml_blocks() if "task:" in p.values[1]) >= 2
