"""Process hygiene (node/lifecycle.py): building a population's objects without the cyclic
collector walking them again and again, then keeping them out of later collections."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CODE = """
import gc, json
from node.lifecycle import THRESHOLDS, building
collections = []
gc.callbacks.append(lambda phase, info: phase == "start" and collections.append(info["generation"]))
inside = []
gc.disable()  # as the network's fresh interpreter starts: building turns it on afterwards all the same
with building():
    inside.append(gc.isenabled())
    kept = [{"device": i, "links": [i, i + 1]} for i in range(200_000)]
during = len(collections)
frozen = gc.get_freeze_count()
class Node: pass
a, b = Node(), Node(); a.other, b.other = b, a  # a cycle made after building is still collected
del a, b
found = gc.collect()
print(json.dumps({"inside": inside[0], "after": gc.isenabled(), "during": during, "frozen": frozen,
                  "young": gc.get_threshold() == THRESHOLDS, "cycle": found}))
"""


def test_building_collects_nothing_then_freezes_what_it_built():
    out = subprocess.run([sys.executable, "-c", CODE], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    import json
    got = json.loads(out.stdout)
    assert got["inside"] is False and got["after"] is True
    assert got["during"] == 0  # 400,000 tracked objects made, not one collection (the default: one per 700)
    assert got["frozen"] >= 400_000  # each device dict and its list (the ints are not tracked)
    assert got["young"] and got["cycle"] >= 2
