"""Compression as a channel: bit-lengths from the schedule on either side, weights or deltas,
error feedback kept only on commit, and the channel's own byte count."""
import numpy as np
import pytest

from node.channel import Channel
from node.schedule import BitSchedule
from protocol.codecs import ErrorFeedback, decode_state, make_codec


def state(*values):
    return {"w": np.array(values, dtype=np.float32)}


def test_bits_come_from_the_codec_or_the_schedule():
    assert Channel(make_codec({"name": "int", "bits": 6})).bits(3) == 6
    schedule = BitSchedule("cosine", rounds=10, b_min=8, b_max=32)
    server = Channel(make_codec("int"), schedule=schedule, side="server")
    client = Channel(make_codec("int"), schedule=schedule, side="client")
    assert server.bits(0) == schedule.server_bits(0, 8) and server.bits(9) == schedule.server_bits(9, 8)
    assert client.bits(4, nu=0.5) == schedule.client_bits(4, 8, 0.5)
    assert Channel(make_codec("fp32")).bits(0) is None


def test_weights_unless_the_channel_or_the_caller_asks_for_a_delta():
    rng = np.random.default_rng(0)
    plain = Channel(make_codec("fp32"))
    got, basis = decode_state(plain.encode(state(3, 5), rng, reference=state(1, 1)).encoded.frames)
    assert basis == "weights" and got["w"].tolist() == [3, 5]
    got, basis = decode_state(plain.encode(state(3, 5), rng, reference=state(1, 1), delta=True).encoded.frames)
    assert basis == "delta" and got["w"].tolist() == [2, 4]
    topk = Channel(make_codec({"name": "topk", "fraction": 0.5}))
    assert topk.carries_delta
    got, basis = decode_state(topk.encode(state(3, 5), rng, reference=state(1, 1)).encoded.frames)
    assert basis == "delta" and got["w"].tolist() == [0, 4]  # the larger half of the delta [2, 4]


def test_error_feedback_residual_is_kept_only_when_the_message_leaves():
    rng = np.random.default_rng(0)
    ch = Channel(make_codec({"name": "topk", "fraction": 0.5}), feedback=ErrorFeedback())
    out = ch.encode(state(3, 5), rng, reference=state(1, 1))
    assert ch.feedback.residual == {} and ch.stats.messages == 0  # not sent yet
    out.commit()
    assert ch.feedback.residual["w"].tolist() == [2, 0]  # what top-k dropped
    assert ch.stats.messages == 1 and ch.stats.payload_bytes == out.encoded.payload_bytes > 0
    assert ch.stats.fp32_bytes == 8


def test_stats_count_bits_and_saving():
    ch = Channel(make_codec({"name": "int", "bits": 8}))
    for _ in range(3):
        ch.encode(state(*range(100)), np.random.default_rng(0), bits=ch.bits(0)).commit()
    s = ch.stats.as_dict()
    assert s["messages"] == 3 and s["mean_bits"] == 8 and s["fp32_bytes"] == 3 * 400
    assert s["saving_vs_fp32"] == pytest.approx(1 - s["payload_bytes"] / 1200)
