import numpy as np
import pytest

from protocol.bitpack import code_dtype, pack, packed_size, unpack


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
