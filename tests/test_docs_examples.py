"""The guide's Python examples that are not scenarios run as written (docs/guide/extending.md's codec)."""
import math
import re
from pathlib import Path

import numpy as np

from protocol.codecs import decode_state, encode_state, make_codec
from protocol.codecs.base import REGISTRY, Codec, EncodedTensor, expect_length, register

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide"


def python_blocks(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (GUIDE / page).read_text(), re.S)


def test_the_extending_pages_codec_registers_encodes_and_decodes_as_it_says():
    [block] = python_blocks("extending.md")
    names = {"np": np, "math": math, "Codec": Codec, "EncodedTensor": EncodedTensor, "expect_length": expect_length,
             "register": register}
    try:
        exec(block, names)
        codec = make_codec({"name": "sign"})
        assert codec.encodes_delta and not codec.contractive
        x = np.array([0.5, -1.5, 2.0, -0.25, 0.0, 3.0, -2.0, 1.0, 0.75], np.float32)
        enc = encode_state({"w": x}, codec, np.random.default_rng(0), basis="delta")
        assert enc.payload_bytes == math.ceil(x.size / 8) == 2
        state, basis = decode_state(enc.frames)
        scale = float(np.abs(x).mean())
        assert basis == "delta" and np.allclose(state["w"], np.where(x >= 0, scale, -scale))
    finally:
        REGISTRY.pop("sign", None)
