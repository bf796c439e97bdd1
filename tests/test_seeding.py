"""Named random streams (node/seeding.py): the compiled start state is numpy's own, the pure path
gives the same, and draws from a parked stream are those of np.random.default_rng."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from node import seeding

WORD = st.one_of(st.integers(0, 3), st.integers(2**32 - 2, 2**32 + 1), st.integers(0, 2**64 - 1))


def _numpy_start(entropy):
    s = np.random.default_rng(entropy).bit_generator.state["state"]
    return s["state"], s["inc"]


@settings(max_examples=2000, deadline=None)
@given(st.lists(WORD, max_size=12))
def test_the_start_state_is_numpys(entropy):
    assert seeding.pcg64_start(entropy) == _numpy_start(entropy)


@pytest.mark.skipif(seeding._seeding is None, reason="node._seeding is not built")
@settings(max_examples=300, deadline=None)
@given(st.lists(WORD, max_size=80))
def test_the_compiled_state_equals_the_pure_path(entropy):
    high, low, inc_high, inc_low = seeding._seeding.pcg64_start(entropy)
    assert (high << 64 | low, inc_high << 64 | inc_low) == _numpy_start(entropy)


def test_numpy_integers_and_tuples_are_taken_as_numpy_takes_them():
    for entropy in ([np.int64(7), np.uint32(2**31)], (3, 0xD1), [True, 0]):
        assert seeding.pcg64_start(entropy) == _numpy_start(entropy)


@pytest.mark.parametrize("entropy, error", [([-1], ValueError), ([2**64 + 5], None), ([1.5], TypeError)])
def test_what_the_compiled_path_cannot_take_goes_to_numpy(entropy, error):
    """Negative or fractional numbers fail as numpy fails; integers of 2**64 and more, which the
    compiled path does not take, get numpy's state."""
    if error is None:
        assert seeding.pcg64_start(entropy) == _numpy_start(entropy)
    else:
        with pytest.raises(error):
            seeding.pcg64_start(entropy)
        with pytest.raises(error):
            np.random.default_rng(entropy)


def test_a_parked_stream_draws_what_default_rng_draws_across_parking():
    entropy = [0, 1234567890123, 42, 1]
    fresh = np.random.default_rng(entropy)
    want = [fresh.geometric(0.01), fresh.random(), fresh.exponential(0.5), fresh.beta(2.0, 5.0)]
    stream, got = seeding.parked(entropy), []
    for draw in (lambda g: g.geometric(0.01), lambda g: g.random(), lambda g: g.exponential(0.5), lambda g: g.beta(2.0, 5.0)):
        rng = seeding.lend(stream)
        seeding.drawing([9, 9])  # another stream borrows the scratch generator between draws
        rng = seeding.lend(stream)
        got.append(draw(rng))
        stream = seeding.keep(stream, rng)
    assert got == want
    own = np.random.default_rng(5)
    assert seeding.keep(own, seeding.lend(own)) is own  # a generator of its own is kept as it is


def test_the_pure_python_switch_gives_the_same_streams(monkeypatch):
    entropy = [3, 2**40 + 7, 0xC0]
    compiled = seeding.pcg64_start(entropy)
    monkeypatch.setattr(seeding, "_seeding", None)
    assert seeding.pcg64_start(entropy) == compiled == _numpy_start(entropy)
