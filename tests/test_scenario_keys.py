"""The scenario reference (docs/scenario-keys.md) is generated from the schema and cannot drift: this
test fails when the page is not what tools/scenario_keys.py writes from emulator/scenario.py, and checks
that it lists every key a scenario may hold, nested sections included (issue 45, item 2 in part)."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import scenario_keys  # noqa: E402


def test_the_reference_page_is_what_the_schema_gives():
    assert scenario_keys.OUT.read_text() == scenario_keys.page(), "run: python tools/scenario_keys.py"


def test_every_key_of_the_schema_is_listed_with_its_bounds():
    from emulator.scenario import Scenario

    listed = {line.split("`")[1] for line in scenario_keys.OUT.read_text().splitlines() if line.startswith("| `")}
    assert set(Scenario.model_fields) <= listed
    for key in ("network.tcp.congestion_control", "population.links[].up_trace.synthetic.mean_mbps",
                "algorithm.privacy.compute_factor", "algorithm.quantization.horizon", "run.trace",
                "population.devices[].ms_per_sample", "selection.clients_per_round"):
        assert key in listed, key
    assert len(listed) > 250
    seed = next(line for line in scenario_keys.OUT.read_text().splitlines() if line.startswith("| `seed`"))
    assert ">= 0" in seed
