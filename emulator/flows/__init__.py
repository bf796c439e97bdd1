"""The flow models of the network process: link arithmetic and max-min fair sharing (links.py,
maxmin.py), the incremental solver (levelflows.py), TCP's window dynamics (transport.py) with its
congestion control as a plug-in (congestion.py), the records they share (records.py), and the
compiled filling and rebalance (_flowfill.c), which owns the records' layout. They know flows, paths and bits, not messages or FL."""
