"""Tensor codecs: a registry of named codecs and the framing of a whole model state."""
from . import dense, sparse  # noqa: F401  (registers the codecs)
from .base import REGISTRY, Codec, CodecError, EncodedTensor, make_codec
from .feedback import ErrorFeedback
from .state import DEFAULT_MAX_FRAME_BYTES, EncodedState, decode_state, encode_state

__all__ = [
    "REGISTRY", "Codec", "CodecError", "EncodedTensor", "make_codec", "ErrorFeedback",
    "DEFAULT_MAX_FRAME_BYTES", "EncodedState", "decode_state", "encode_state",
]
