import numpy as np
import pytest

from protocol.bitpack import code_dtype, pack, pack_lanes, packed_size, unpack, unpack_lanes


@pytest.mark.parametrize("bits", range(1, 33))
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 63, 64, 65, 1001])
def test_round_trip_every_bit_length(bits, n):
    rng = np.random.default_rng(bits * 1000 + n)
    codes = rng.integers(0, 2**bits, n, dtype=np.uint64).astype(code_dtype(bits))
    packed = pack(codes, bits)
    assert packed.size == packed_size(n, bits) == (n * bits + 7) // 8
    assert np.array_equal(unpack(packed.tobytes(), n, bits), codes)


def test_bit_order_is_lsb_first_stream():
    # values 1 (001) and 2 (010) at 3 bits: bits 0-2 = 1, bits 3-5 = 2 -> 0b010001
    assert pack(np.array([1, 2], np.uint8), 3).tolist() == [0b010001]
    # 12-bit values 0xABC, 0x123 -> stream 0xABC | 0x123 << 12 = 0x123ABC, little-endian bytes
    assert pack(np.array([0xABC, 0x123], np.uint16), 12).tolist() == [0xBC, 0x3A, 0x12]


def test_unpack_rejects_wrong_length():
    with pytest.raises(ValueError, match="expected 2"):
        unpack(b"\x00\x00\x00", 5, 3)


@pytest.mark.parametrize("bits", range(1, 33))
@pytest.mark.parametrize("n", [0, 1, 255, 256, 257, 512, 1001])
def test_lane_layout_round_trips_in_the_same_bytes(bits, n):
    rng = np.random.default_rng(bits * 1000 + n)
    codes = rng.integers(0, 2**bits, n, dtype=np.uint64).astype(code_dtype(bits))
    packed = pack_lanes(codes, bits)
    assert packed.size == packed_size(n, bits)
    assert np.array_equal(unpack_lanes(packed.tobytes(), n, bits), codes)
    rest = n % 256  # the values after the last whole block are pack's plain stream
    assert packed[(n - rest) * bits // 8:].tobytes() == pack(codes[n - rest:], bits).tobytes()


def test_lane_layout_by_hand():
    """Value 8k + l is the k-th value of lane l; at 12 bits lane l's word 0 holds its values 0 and 1
    (bits 0-11, 12-23) and the low 8 bits of value 2; word 0 of lane l is the block's word l."""
    codes = np.arange(256, dtype=np.uint16) * 16 + 5  # distinct 12-bit codes
    words = pack_lanes(codes, 12).view("<u4")
    assert words.size == 256 * 12 // 32
    for lane in range(8):
        v0, v1, v2 = (int(codes[8 * k + lane]) for k in range(3))
        assert int(words[lane]) == v0 | (v1 << 12) | ((v2 & 0xFF) << 24)
        assert int(words[8 + lane]) & 0xF == v2 >> 8  # the rest of value 2 opens the lane's word 1


def test_lane_layout_at_32_bits_is_the_plain_stream():
    codes = np.random.default_rng(0).integers(0, 2**32, 600, dtype=np.uint64).astype(np.uint32)
    assert pack_lanes(codes, 32).tobytes() == codes.astype("<u4").tobytes()
