import msgpack
import numpy as np
import pytest

from node.data import partition_dirichlet, partition_iid
from node.models import build_model, count_parameters
from protocol import envelope


def test_mnist_cnn_has_exactly_1663370_parameters():
    assert count_parameters(build_model("mnist_cnn", (1, 28, 28), 10)) == 1_663_370


def test_envelope_round_trip_and_strict_rejections():
    env = envelope.unpack(envelope.pack("timer", actor="c0001", at=1.5, tag="deadline:0"))
    assert env["op"] == "timer" and env["at"] == 1.5
    bad = [
        (msgpack.packb({"v": envelope.VERSION + 1, "op": "stop"}), f"version {envelope.VERSION + 1} unknown"),
        (msgpack.packb({"v": 1, "op": "stop"}), "version 1 unknown"),  # the release before the batch op
        (msgpack.packb({"v": envelope.VERSION, "op": "teleport"}), "op 'teleport' unknown"),
        (msgpack.packb({"v": envelope.VERSION, "op": "timer", "actor": "a", "at": 1.0}), "field 'tag' missing"),
        (msgpack.packb({"v": envelope.VERSION, "op": "timer", "actor": "a", "at": "soon", "tag": "x"}), "'at' has the wrong type"),
        (msgpack.packb({"v": envelope.VERSION, "op": "stop", "extra": 1}), "unexpected fields"),
        (b"\xc1garbage", "not valid msgpack"),
        (b"x" * (envelope.MAX_ENVELOPE_BYTES + 1), "over the limit"),
    ]
    for frame, message in bad:
        with pytest.raises(envelope.ProtocolError, match=message):
            envelope.unpack(frame)
    with pytest.raises(envelope.ProtocolError, match="kind 'gossipx' unknown"):
        envelope.unpack(envelope.pack("deliver", src="a", dst="b", kind="gossipx", round=0, t=0.0, hold=1, body={}, device=None, shared=0))


def test_partitions_cover_all_samples_once_and_are_seeded():
    labels = np.repeat(np.arange(10), 100)
    for shards in (partition_iid(1000, 7, np.random.default_rng(1)),
                   partition_dirichlet(labels, 7, 0.3, np.random.default_rng(1), min_size=5)):
        allidx = np.concatenate(shards)
        assert np.array_equal(np.sort(allidx), np.arange(1000))
    a = partition_dirichlet(labels, 7, 0.3, np.random.default_rng(2))
    b = partition_dirichlet(labels, 7, 0.3, np.random.default_rng(2))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_idx_reader_plain_gzip_and_malformed(tmp_path):
    import gzip as gz

    from node.data import DataError, read_idx

    arr = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    raw = bytes([0, 0, 8, 3]) + np.array([2, 3, 4], ">i4").tobytes() + arr.tobytes()
    (tmp_path / "a-idx3-ubyte").write_bytes(raw)
    (tmp_path / "b-idx3-ubyte.gz").write_bytes(gz.compress(raw))
    assert np.array_equal(read_idx(tmp_path / "a-idx3-ubyte"), arr)
    assert np.array_equal(read_idx(tmp_path / "b-idx3-ubyte.gz"), arr)
    (tmp_path / "short").write_bytes(raw[:-1])
    with pytest.raises(DataError, match="holds 23 bytes"):
        read_idx(tmp_path / "short")
    (tmp_path / "float").write_bytes(bytes([0, 0, 0x0D, 1]) + raw[4:])
    with pytest.raises(DataError, match="not an IDX file"):
        read_idx(tmp_path / "float")
