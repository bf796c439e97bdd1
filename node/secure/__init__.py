"""Secure aggregation as messages between the server and client actors (algorithm.secure_aggregation):
config.py (the scenario's settings, the cryptography's measured cost model), vector.py (an update as
the cohort's fixed-point vector), client.py and server.py (the two halves' state machines), actor.py
(the server actor's part). The bytes and the cryptography are protocol/secagg's."""
