"""Codec round trips, exact sizes, unbiasedness, and strict decoding."""
import math

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.codecs import CodecError, ErrorFeedback, decode_state, encode_state, make_codec
from protocol.codecs.dense import quantize

MNIST_CNN_SHAPES = {
    "features.0.weight": (32, 1, 5, 5), "features.0.bias": (32,),
    "features.3.weight": (64, 32, 5, 5), "features.3.bias": (64,),
    "classifier.1.weight": (512, 3136), "classifier.1.bias": (512,),
    "classifier.3.weight": (10, 512), "classifier.3.bias": (10,),
}
AWKWARD = [(), (1,), (7,), (3, 2, 2, 5)]


def rand_state(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return {k: (rng.normal(size=s) * 0.1).astype(np.float32) for k, s in shapes.items()}


@pytest.mark.parametrize("bits", range(2, 33))
@pytest.mark.parametrize("rounding", ["stochastic", "nearest"])
def test_int_round_trip_shapes_and_error_bound(bits, rounding):
    rng = np.random.default_rng(bits)
    state = {f"t{i}": (rng.normal(size=s) * 3).astype(np.float32) for i, s in enumerate(AWKWARD)}
    enc = encode_state(state, make_codec({"name": "int", "bits": bits, "rounding": rounding}), rng)
    assert enc.payload_bytes == sum(math.ceil(max(1, int(np.prod(s))) * bits / 8) for s in AWKWARD)
    dec, basis = decode_state([bytes(memoryview(f)) for f in enc.frames])
    assert basis == "weights"
    for name, x in state.items():
        assert dec[name].shape == x.shape and dec[name].dtype == np.float32
        rows = x.reshape(x.shape[0], -1) if x.ndim == 4 else x.reshape(1, -1)
        step = (np.abs(rows).max(axis=1) / (2 ** (bits - 1) - 1))[:, None]
        err = np.abs(dec[name].reshape(rows.shape) - rows)
        bound = 0.5 * step if rounding == "nearest" else step
        assert np.all(err <= bound * (1 + 1e-6) + np.spacing(np.abs(rows)))  # output is float32: one ulp more


def test_whole_mnist_cnn_at_8_bits_is_its_parameter_count():
    state = rand_state(MNIST_CNN_SHAPES)
    assert sum(v.size for v in state.values()) == 1_663_370
    enc = encode_state(state, make_codec({"name": "int", "bits": 8}), np.random.default_rng(0))
    assert enc.payload_bytes == 1_663_370
    enc5 = encode_state(state, make_codec({"name": "int", "bits": 5}), np.random.default_rng(0))
    assert enc5.payload_bytes == sum(math.ceil(v.size * 5 / 8) for v in state.values())
    assert encode_state(state, make_codec("fp32"), None).payload_bytes == 4 * 1_663_370


def test_stochastic_quantization_is_unbiased():
    """Mean of many decodes converges to x; tolerance from the rounding variance, not guessed."""
    rng = np.random.default_rng(7)
    x = rng.uniform(-1, 1, size=200).astype(np.float32)
    bits, draws = 3, 4000
    total = np.zeros_like(x, dtype=np.float64)
    for _ in range(draws):
        codes, scales = quantize(x, bits, True, False, rng)
        total += (codes.astype(np.float64) - 3) * scales[0]
    mean = total / draws
    step = float(np.abs(x).max() + 2.220446049250313e-16) / 3
    frac = (x / step) - np.floor(x / step)
    sd = step * np.sqrt(frac * (1 - frac)) / np.sqrt(draws)  # std of the mean of Bernoulli steps
    z = np.abs(mean - x) / np.maximum(sd, 1e-12)
    assert np.all(z[sd > 0] < 5.0)  # 5 sigma for each of 200 values
    assert abs(float(np.mean((mean - x)[sd > 0] / sd[sd > 0]))) < 0.5  # no systematic drift
    nearest = quantize(x, bits, False, False, rng)
    biased = (nearest[0].astype(np.float64) - 3) * nearest[1][0]
    assert np.abs(biased - x).max() > 0.1 * step  # nearest is not the mean


@pytest.mark.parametrize("spec", ["fp32", "fp16", {"name": "topk", "fraction": 0.1},
                                  {"name": "topk", "fraction": 0.1, "value_bits": 6}, {"name": "randomk", "fraction": 0.3}])
def test_other_codecs_round_trip(spec):
    rng = np.random.default_rng(1)
    state = {f"t{i}": rng.normal(size=s).astype(np.float32) for i, s in enumerate(AWKWARD)}
    state["counter"] = np.array(12345, dtype=np.int64)
    enc = encode_state(state, make_codec(spec), rng)
    dec, _ = decode_state(enc.frames)
    assert dec["counter"] == 12345 and dec["counter"].dtype == np.int64
    for name, x in state.items():
        assert dec[name].shape == x.shape
    if spec == "fp32":
        assert all(np.array_equal(dec[k], state[k]) for k in state)


def test_topk_keeps_largest_and_packs_indices():
    x = np.zeros(1000, np.float32)
    x[[3, 500, 999]] = [5.0, -7.0, 1.0]
    codec = make_codec({"name": "topk", "fraction": 0.003})
    enc = codec.encode(x, np.random.default_rng(0))
    assert enc.payload_bytes == math.ceil(3 * 10 / 8) + 3 * 4  # 10-bit indices, fp32 values
    y = codec.decode(enc.meta, memoryview(enc.data), (1000,))
    assert np.array_equal(x, y)


def test_randomk_is_unbiased_and_seeded():
    rng = np.random.default_rng(3)
    x = rng.normal(size=50).astype(np.float32)
    codec = make_codec({"name": "randomk", "fraction": 0.2})
    mean = np.mean([codec.decode(e.meta, memoryview(e.data), x.shape)
                    for e in (codec.encode(x, rng) for _ in range(20000))], axis=0)
    sd = np.abs(x) * np.sqrt((1 / 0.2) - 1) / np.sqrt(20000)
    assert np.all(np.abs(mean - x) < 5 * sd + 1e-6)


def test_error_feedback_carries_residual():
    ef, codec = ErrorFeedback(), make_codec({"name": "topk", "fraction": 0.5})
    d = {"w": np.array([1.0, 0.1, -2.0, 0.2], np.float32)}
    first, _ = decode_state(ef.encode(d, codec, np.random.default_rng(0)).frames)
    assert np.allclose(ef.residual["w"], d["w"] - first["w"])
    second, _ = decode_state(ef.encode(d, codec, np.random.default_rng(0)).frames)
    # the small entries accumulate until they win a place
    assert np.allclose(second["w"] + ef.residual["w"], d["w"] * 2 - first["w"])


# ---- strict decoding ----------------------------------------------------------------------------
def frames_for(state, spec="fp32"):
    return [bytes(memoryview(f)) for f in encode_state(state, make_codec(spec), np.random.default_rng(0)).frames]


def edit_header(frames, fn):
    header = msgpack.unpackb(frames[0])
    fn(header)
    return [msgpack.packb(header, use_bin_type=True), *frames[1:]]


@pytest.mark.parametrize("mutate, message", [
    (lambda h: h.update(v=9), "version 9 unknown"),
    (lambda h: h["tensors"][0].update(codec="zstd"), "codec 'zstd' unknown"),
    (lambda h: h["tensors"][0].update(bits=40), "'bits'=40 out of range"),
    (lambda h: h["tensors"][0].update(shape=[5, 3]), "does not match the model's"),
    (lambda h: h["tensors"][0].update(scales=np.array([np.nan], "<f4").tobytes()), "scale"),
])
def test_decoder_rejects_with_named_check(mutate, message):
    state = {"w": np.ones((4, 3), np.float32)}
    frames = edit_header(frames_for(state, {"name": "int", "bits": 8, "granularity": "per_tensor"}), mutate)
    with pytest.raises(CodecError, match=message):
        decode_state(frames, {"w": ((4, 3), "f4")})


def test_decoder_rejects_length_mismatch_and_oversize():
    frames = frames_for({"w": np.ones(10, np.float32)})
    with pytest.raises(CodecError, match="frame has 36 bytes, header implies 40"):
        decode_state([frames[0], frames[1][:36]])
    with pytest.raises(CodecError, match="over the limit"):
        decode_state(frames, max_frame_bytes=16)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzzed_frames_only_raise_codec_error(data):
    spec = data.draw(st.sampled_from(["fp32", "fp16", {"name": "int", "bits": 5}, {"name": "topk", "fraction": 0.3}]))
    frames = frames_for({"a": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones((2, 1, 2, 2), np.float32)}, spec)
    which = data.draw(st.integers(0, len(frames) - 1))
    raw = bytearray(frames[which])
    action = data.draw(st.sampled_from(["truncate", "flip", "random", "extend"]))
    if action == "truncate" and raw:
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    elif action == "flip" and raw:
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] ^= data.draw(st.integers(1, 255))
    elif action == "random":
        raw = bytearray(data.draw(st.binary(max_size=200)))
    else:
        raw += data.draw(st.binary(min_size=1, max_size=50))
    frames[which] = bytes(raw)
    try:
        state, _ = decode_state(frames, max_frame_bytes=4096)
    except CodecError:
        return
    assert all(v.nbytes <= 4096 * 8 for v in state.values())
