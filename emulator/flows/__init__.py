"""The flow models of the network process: link arithmetic and max-min fair sharing (links.py,
maxmin.py), the incremental solver (levelflows.py), TCP's window dynamics (transport.py) and the
compiled filling and rebalance (_flowfill.c). They know flows, paths and bits, not messages or FL."""
