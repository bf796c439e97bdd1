"""The compiled codec kernels (protocol/_kernels.c) give exactly the bytes and values of the numpy
path, for every bit-length, rounding, granularity and awkward length; and the counter-based
dither is uniform and independent enough that stochastic rounding stays unbiased."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.bitpack import pack_lanes, unpack_lanes
from protocol.codecs import dense
from protocol.codecs.dense import dither, quantize, quantize_packed, unpack_dequantize

needs_kernels = pytest.mark.skipif(dense._kernels is None, reason="protocol._kernels not built (no C compiler at install)")
SHAPES = [(1,), (7,), (9,), (4095,), (4097,), (8193,), (3, 2, 2, 5), (64, 32, 5, 5), (13, 17)]


@needs_kernels
@pytest.mark.parametrize("bits", range(2, 33))
def test_compiled_and_numpy_paths_give_the_same_bytes_and_values(bits):
    for k, shape in enumerate(SHAPES):
        x = (np.random.default_rng([bits, k]).normal(size=shape) * 3).astype(np.float32)
        x.reshape(-1)[0] = 0.0  # a value on the grid and an exact zero
        for stochastic in (True, False):
            for per_filter in (True, False):
                fast, s_fast = quantize_packed(x, bits, stochastic, per_filter, np.random.default_rng(5), compiled=True)
                slow, s_slow = quantize_packed(x, bits, stochastic, per_filter, np.random.default_rng(5), compiled=False)
                assert fast.tobytes() == slow.tobytes(), (shape, stochastic, per_filter)
                assert s_fast.tobytes() == s_slow.tobytes()
                a = unpack_dequantize(fast.tobytes(), s_fast, bits, shape, compiled=True)
                b = unpack_dequantize(fast.tobytes(), s_fast, bits, shape, compiled=False)
                assert a.tobytes() == b.tobytes() and a.shape == shape


@needs_kernels
@settings(max_examples=60, deadline=None)
@given(bits=st.integers(2, 32), n=st.integers(1, 5000), scale=st.floats(1e-6, 1e6), seed=st.integers(0, 2**32 - 1))
def test_compiled_path_matches_on_random_tensors(bits, n, scale, seed):
    x = (np.random.default_rng(seed).standard_cauchy(n) * scale).astype(np.float32)
    fast, _ = quantize_packed(x, bits, True, False, np.random.default_rng(seed), compiled=True)
    slow, _ = quantize_packed(x, bits, True, False, np.random.default_rng(seed), compiled=False)
    assert fast.tobytes() == slow.tobytes()


@needs_kernels
@pytest.mark.parametrize("bits", range(2, 33))
def test_the_kernels_touch_nothing_past_their_output(bits):
    """Records are stored as whole 8- or 16-byte words that reach into the records after them;
    where fewer bytes follow in the output, the kernel must store exactly. Guard bytes right after
    each output stay as they were, for lengths around the word and chunk sizes."""
    from protocol import _kernels
    for n in (1, 8, 9, 16, 17, 24, 40, 4096, 4104, 4111, 8200):
        x = (np.random.default_rng([bits, n]).normal(size=n)).astype(np.float32)
        size = (n * bits + 7) // 8
        scale = np.array([((1 << (bits - 1)) - 1) / 4.0], dense._work_dtype(bits))
        packed = np.full(size + 64, 0xA5, np.uint8)
        _kernels.quantize_pack(x, scale, bits, True, 7, packed[:size])
        assert np.all(packed[size:] == 0xA5), n
        values = np.full(n + 16, 123.0, np.float32)
        _kernels.unpack_dequantize(packed[:size].tobytes(), bits, np.array([4.0 / ((1 << (bits - 1)) - 1)], np.float32),
                                   values[:n])
        assert np.all(values[n:] == 123.0), n
        assert np.allclose(values[:n], np.clip(x, -4, 4), atol=8.0 / ((1 << (bits - 1)) - 1) + 1e-6), n


def test_the_numpy_path_is_pack_lanes_of_quantize():
    x = np.random.default_rng(1).normal(size=1000).astype(np.float32)
    packed, scales = quantize_packed(x, 5, True, False, np.random.default_rng(2), compiled=False)
    codes, scales2 = quantize(x, 5, True, False, np.random.default_rng(2))
    assert packed.tobytes() == pack_lanes(codes, 5).tobytes() and np.array_equal(scales, scales2)
    assert np.array_equal(unpack_lanes(packed, 1000, 5), codes)


def test_dither_is_uniform_on_24_bit_fractions_and_changes_with_the_key():
    u = dither(1 << 20, 12345)
    assert u.dtype == np.float32 and u.min() >= 0 and u.max() < 1
    assert np.array_equal(u * 2**24, np.floor(u * 2**24))  # 24-bit fractions, exact in float32
    counts = np.histogram(u, bins=64, range=(0, 1))[0]
    expected = u.size / 64
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 120  # 63 degrees of freedom: the 99.99th percentile is about 115
    assert abs(float(np.corrcoef(u[:-1], u[1:])[0, 1])) < 0.01  # neighbours are not correlated
    assert not np.array_equal(u[:1000], dither(1000, 12346))


def test_stochastic_rounding_with_the_hash_dither_is_unbiased():
    """The mean of many encodings of one tensor converges to it: the standard error bounds it."""
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, size=300).astype(np.float32)
    bits, draws = 3, 3000
    total = np.zeros(x.size)
    for _ in range(draws):
        packed, scales = quantize_packed(x, bits, True, False, rng)
        total += unpack_dequantize(packed.tobytes(), scales, bits, x.shape)
    step = float(scales[0])
    error = total / draws - x
    # each decode is off by at most one step with variance <= step^2 / 4: 5 standard errors
    assert np.all(np.abs(error) <= 5 * 0.5 * step / np.sqrt(draws))


@pytest.mark.parametrize("bits", [14, 15, 16, 17])
def test_stochastic_rounding_at_high_bit_lengths_has_no_measurable_bias(bits):
    """Over 2^23 values of a normal tensor and 4 keys, the mean of code - (x s + qmax), in steps, is
    within 4 standard errors of 0 on the compiled path. Float32's y = x s + qmax + u rounded y + u to
    half an ulp of codes near 2^b and biased it upwards (+0.0014 of a step at b = 16, about 19
    standard errors); from b = 14 the product is taken exactly (dense.PAIR_FROM_BITS)."""
    from protocol.codecs import dense

    rng = np.random.default_rng(1)
    x = rng.standard_normal(1 << 23).astype(np.float32)
    rows, s, _ = dense._scaling(x, bits, False)
    exact = rows.reshape(-1).astype(np.float64) * float(s[0]) + ((1 << (bits - 1)) - 1)
    errors = []
    for key in range(4):
        packed, _ = quantize_packed(x, bits, True, False, np.random.default_rng(key))
        errors.append(float((unpack_lanes(packed, x.size, bits).astype(np.float64) - exact).mean()))
    standard_error = (1 / 6) ** 0.5 / np.sqrt(4 * x.size)  # Bernoulli(f) - f, f uniform: variance 1/6
    assert abs(np.mean(errors)) < 4 * standard_error


def test_fp16_through_torch_is_numpy_bit_for_bit():
    """Processes that hold torch convert with it (F16C); the bytes are numpy's (round half to even,
    overflow to infinity, subnormals), and every half decodes to numpy's float32 (NaN stays NaN)."""
    import torch  # noqa: F401  (loaded: the codec takes the torch path)

    from protocol.codecs.dense import Fp16
    rng = np.random.default_rng(0)
    x = rng.integers(0, 2**32, 1_000_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([x[np.isfinite(x)], np.float32([65504, 65519.99, 65520, -65520, 2.98e-8, 3e-8, 6e-8, 0.0, -0.0])])
    with np.errstate(over="ignore"):
        assert Fp16().encode(x, None).data.tobytes() == x.astype("<f2").tobytes()
    halves = np.arange(65536, dtype=np.uint16).view("<f2")
    got = Fp16.decode({}, halves.tobytes(), (65536,))
    nan = np.isnan(halves)
    assert got.view(np.uint32)[~nan].tobytes() == halves[~nan].astype(np.float32).view(np.uint32).tobytes()
    assert np.all(np.isnan(got[nan]))


@needs_kernels
def test_bf16_kernel_is_the_numpy_rounding_bit_for_bit():
    from protocol.codecs.dense import Bf16
    bits = np.random.default_rng(4).integers(0, 2**32, 1_000_000, dtype=np.uint64).astype(np.uint32)
    bits = np.concatenate([bits, np.uint32([0x7F7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00001, 0xFFFFFFFF, 0x00008000,
                                            0x00018000, 0x3F808000, 0x3F818000, 0])])
    x = bits.view(np.float32)
    assert Bf16().encode(x, None).data.tobytes() == Bf16.encode_numpy(x).data.tobytes()


@pytest.mark.parametrize("spec", [{"name": "int", "bits": b} for b in (2, 5, 8, 12, 16, 17, 32)]
                         + [{"name": "int", "bits": 8, "rounding": "nearest"}, {"name": "bf16"}, {"name": "fp16"}])
def test_a_machine_without_the_kernel_sends_and_reads_the_same_bytes(monkeypatch, spec):
    """The whole state codec with the compiled module absent (no C compiler at install)."""
    from protocol.codecs import decode_state, encode_state, make_codec
    rng = np.random.default_rng(9)
    state = {"w": (rng.normal(size=(8, 3, 5, 5)) * 0.1).astype(np.float32), "b": rng.normal(size=37).astype(np.float32)}
    with_kernel = encode_state(state, make_codec(spec), np.random.default_rng(1))
    frames = [bytes(memoryview(f)) for f in with_kernel.frames]
    decoded_with, _ = decode_state(frames)
    monkeypatch.setattr(dense, "_kernels", None)
    without = encode_state(state, make_codec(spec), np.random.default_rng(1))
    assert [bytes(memoryview(f)) for f in without.frames] == frames
    decoded_without, _ = decode_state(frames)
    assert all(decoded_with[k].tobytes() == decoded_without[k].tobytes() for k in state)


@needs_kernels
@pytest.mark.parametrize("bits", [14, 16, 17, 24, 25, 31, 32])
def test_the_float32_pair_path_matches_numpy_where_codes_saturate(bits):
    """b >= 14 rounds stochastically in float32 pairs (quantize_pair): values far past the scale's
    range, right at its ends, zeros and subnormals give the numpy path's codes (clamped in int64)."""
    from protocol import _kernels
    from protocol.bitpack import pack_lanes
    qmax = (1 << (bits - 1)) - 1
    special = [0.0, -0.0, 1.0, -1.0, 1.0 - 2**-24, -(1.0 - 2**-24), 1.0 + 2**-23, -1.0 - 2**-23, 3.0, -3.0,
               1e3, -1e3, 1e30, -1e30, 1e-40, -1e-40, 2**-20, 0.5, -0.5]
    rng = np.random.default_rng(bits)
    x = np.concatenate([np.array(special, np.float32), rng.uniform(-1.01, 1.01, 1000).astype(np.float32)])
    s = np.array([qmax / 1.0], np.float64)
    out = np.empty((x.size * bits + 7) // 8, np.uint8)
    _kernels.quantize_pack(x, s, bits, True, 99, out)
    codes = dense._codes(x.reshape(1, -1), s, bits, 99)
    assert out.tobytes() == pack_lanes(codes, bits).tobytes()
    assert codes[special.index(1e30)] == 2 * qmax and codes[special.index(-1e30)] == 0
    assert codes[special.index(0.0)] == qmax


def test_the_pair_path_rounds_the_exact_product():
    """Against exact rational arithmetic: code = floor(x*s + qmax + u) for s the float64 scale, the
    float32 dither u; the pair path may differ only where x*s + u lies within 2^-20 of an integer."""
    from fractions import Fraction
    for bits in (17, 22, 25, 29, 32):
        qmax = (1 << (bits - 1)) - 1
        rng = np.random.default_rng(bits)
        x = rng.normal(size=3000).astype(np.float32)
        s = np.array([qmax / (float(np.abs(x).max()) + dense.ALPHA_EPSILON)], np.float64)
        codes = dense._codes(x.reshape(1, -1), s, bits, 1234)
        u = dither(x.size, 1234)
        near = 0
        for i in range(x.size):
            exact = Fraction(float(x[i])) * Fraction(float(s[0])) + qmax + Fraction(float(u[i]))
            want = min(max(exact.__floor__(), 0), 2 * qmax)
            if int(codes[i]) != want:
                assert abs(exact - round(exact)) < Fraction(1, 2**20), (bits, i)
                near += 1
        assert near <= 2, (bits, near)


@pytest.mark.parametrize("bits", [25, 28, 30, 31, 32])
def test_dequantizing_past_24_bits_in_float32_is_within_one_ulp_of_float64(bits):
    """b > 24 dequantizes in float32 (d = d_hi + d_lo, the error-free product): against the float64
    product rounded to float32, a value may differ only by one unit in the last place, and rarely."""
    rng = np.random.default_rng(bits)
    qmax = (1 << (bits - 1)) - 1
    codes = rng.integers(0, 2 * qmax + 1, 200_000, dtype=np.int64).astype(np.uint32)
    codes[:3] = [0, qmax, 2 * qmax]  # both ends and zero
    for scale in (1.7e-3 / qmax, 3.1e25 / qmax, 2.0**-40):
        scales = np.array([scale], np.float32)
        new = dense.dequantize(codes, scales, bits, (codes.size,))
        old = ((codes.astype(np.float64) - qmax) * np.float64(scales[0])).astype(np.float32)
        ulps = np.abs(new.view(np.int32).astype(np.int64) - old.view(np.int32).astype(np.int64))
        assert ulps.max() <= 1 and np.count_nonzero(ulps) <= 20, (scale, int(np.count_nonzero(ulps)))
        assert new[1] == 0.0 and new[0] == -new[2]


@needs_kernels
def test_32_bit_codes_go_straight_to_an_aligned_buffer_and_through_one_that_is_not():
    """At 32 bits the kernels write and read the codes in place where the buffer is 4-byte aligned,
    and through their code buffer where it is not: the same bytes and values either way."""
    from protocol import _kernels
    x = np.random.default_rng(3).normal(size=5000).astype(np.float32)
    s = np.array([(2**31 - 1) / (float(np.abs(x).max()) + dense.ALPHA_EPSILON)], np.float64)
    backing = np.zeros(4 * x.size + 8, np.uint8)
    aligned, shifted = backing[:4 * x.size], backing[1:4 * x.size + 1]
    _kernels.quantize_pack(x, s, 32, True, 5, aligned)
    first = aligned.tobytes()
    _kernels.quantize_pack(x, s, 32, True, 5, shifted)
    assert shifted.tobytes() == first
    scale = np.array([1.0 / s[0]], np.float32)
    want = dense.dequantize(np.frombuffer(first, "<u4"), scale, 32, (x.size,))
    for packed in (np.frombuffer(first, np.uint8), shifted):  # aligned, then not
        values = np.empty(x.size, np.float32)
        _kernels.unpack_dequantize(packed, 32, scale, values)
        assert values.tobytes() == want.tobytes()
    assert np.abs(want - x).max() <= 2 * float(scale[0])
