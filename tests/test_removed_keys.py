"""What was removed says so: the scenario key in one line, the wire fields as unknown fields."""
import pytest

from conftest import REPO
from emulator.scenario import ScenarioError, load_scenario
from protocol import envelope


def test_run_speculate_is_an_error_that_says_it_was_removed():
    with pytest.raises(ScenarioError) as err:
        load_scenario(REPO / "scenarios" / "smoke.yaml", ["run.speculate=true"])
    assert "smoke.yaml: run.speculate: removed: hosts no longer train tasks ahead" in str(err.value)
    assert len(str(err.value).splitlines()) == 1
    load_scenario(REPO / "scenarios" / "smoke.yaml")  # without the key: fine


@pytest.mark.parametrize("op, fields", [
    ("send", dict(src="c0", dst="server", kind="update", round=0, t=0.0, n=0, body={}, payload=0, fp32=0, early=True)),
    ("deliver", dict(src="server", dst="c0", kind="task", round=0, t=0.0, hold=1, body={}, device=None, shared=0, preview=3)),
])
def test_the_wire_format_has_no_speculation_fields(op, fields):
    with pytest.raises(envelope.ProtocolError):
        envelope.unpack(envelope.pack(op, **fields))
    fields.pop("early", None), fields.pop("preview", None)
    assert envelope.unpack(envelope.pack(op, **fields))["op"] == op
    with pytest.raises(envelope.ProtocolError):
        envelope.unpack(envelope.pack("preview", src="server", dst=["c0"], kind="task", round=0, body={}, preview=1, eta=[0.0]))
