"""Nothing a user types crashes the schema: every leaf of the flagship scenario replaced by a hostile
value (a list, a mapping, null, a string, a negative number, a huge one, a boolean) either validates or
is one ScenarioError line naming where (issue 47: a list where a profile name belongs was a traceback;
so was a negative seed, at world building)."""
import copy
from pathlib import Path

import pytest
import yaml

from emulator.scenario import ScenarioError, load_scenario

ROOT = Path(__file__).resolve().parent.parent
HOSTILE = [[1, 2], {"a": 1}, None, "x", -1, 1e308, True]


def leaves(d, path=()):
    if isinstance(d, dict):
        for k, v in d.items():
            yield from leaves(v, path + (k,))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            yield from leaves(v, path + (i,))
    else:
        yield path


def test_every_hostile_leaf_is_refused_in_one_line_or_accepted(tmp_path):
    base = yaml.safe_load((ROOT / "scenarios" / "edge_1000.yaml").read_text())
    cases = refused = 0
    for path in leaves(base):
        for value in HOSTILE:
            doc = copy.deepcopy(base)
            holder = doc
            for key in path[:-1]:
                holder = holder[key]
            holder[path[-1]] = value
            file = tmp_path / "hostile.yaml"
            file.write_text(yaml.safe_dump(doc))
            cases += 1
            try:
                load_scenario(file)
            except ScenarioError as err:
                refused += 1
                assert len(str(err).splitlines()) == 1 and "Traceback" not in str(err), (path, value, str(err))
    assert cases > 400 and refused > cases // 2


@pytest.mark.parametrize("sets, words", [
    (["population.devices[0].profile=[phone_mid]"], "population.devices[0].profile: a profile's name, got ['phone_mid']"),
    (["seed=-1"], "seed: must be >= 0"),
    (["seed=9223372036854775808"], "seed: must be <= 4294967295"),  # numpy's legacy generator raised at world building
])
def test_the_two_found_crashes_are_one_line_now(sets, words):
    with pytest.raises(ScenarioError) as err:
        load_scenario(ROOT / "scenarios" / "edge_1000.yaml", sets)
    assert words in str(err.value)


def test_more_primary_classes_than_the_data_set_has_is_one_line_not_a_hang():
    """classes_per_client past the classes looped for ever over the primary classes (found by a wider sweep)."""
    from click.testing import CliRunner

    from emulator.cli import main

    res = CliRunner().invoke(main, ["validate", str(ROOT / "scenarios" / "ring_fibfl.yaml"), "--set",
                                    "task.partition.classes_per_client=1000000000000"])
    assert res.exit_code == 2 and "classes_per_client 1000000000000 is more than the data set's 10 classes" in res.stderr
