"""Secure aggregation's bytes (Bonawitz et al., CCS 2017; SecAgg+, Bell et al., CCS 2020): the
cryptographic primitives (keys.py), Shamir's secret sharing (shamir.py), the fixed-point encoding a
cohort shares (fixedpoint.py) and the masks that hide each client's vector but cancel in the sum
(masking.py). Pure functions of their inputs; the phases as messages between actors are node's."""
