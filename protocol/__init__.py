"""Bytes on the wire: the message envelope and the tensor codecs. Depends on nothing of ours."""
