"""The compiled parts: fused codec kernels (protocol/_kernels.c), the max-min filling and the
rebalance of the flow model (emulator/flows/_flowfill.c), one-pass L1 norms and Laplace noise of DP training
(node/_dpkernels.c), ReLU with a 2x2 max-pool in one pass (node/_layerkernels.c), and the
starting state of numpy's seeded generators (node/_seeding.c).
Optional: without a C compiler the install goes on and the codecs use their numpy path, the flow
model its Python filling and rebalance (the same bytes and numbers), the norms torch's float64 reductions
(the same to about 1e-15), the pool torch's ops (the same numbers), the seeded generators numpy's
SeedSequence (the same state)."""
from setuptools import Extension, setup

# the same float operations in the same order as the Python paths: no contraction into FMAs
EXACT = ["-O3", "-ffp-contract=off", "-fno-fast-math", "-fno-trapping-math"]

setup(ext_modules=[
    Extension("protocol._kernels", ["protocol/_kernels.c"], extra_compile_args=EXACT, optional=True),
    Extension("emulator.flows._flowfill", ["emulator/flows/_flowfill.c"], extra_compile_args=EXACT, optional=True),
    Extension("node._dpkernels", ["node/_dpkernels.c"], extra_compile_args=EXACT, optional=True),
    Extension("node._layerkernels", ["node/_layerkernels.c"], extra_compile_args=EXACT, optional=True),
    Extension("node._seeding", ["node/_seeding.c"], extra_compile_args=EXACT, optional=True),
])
