"""The compiled parts: fused codec kernels (protocol/_kernels.c) and the max-min filling of the
flow model (emulator/_flowfill.c). Optional: without a C compiler the install goes on and the
codecs use their numpy path, the flow model its Python filling, which give the same bytes and
numbers."""
from setuptools import Extension, setup

# the same float operations in the same order as the Python paths: no contraction into FMAs
EXACT = ["-O3", "-ffp-contract=off", "-fno-fast-math", "-fno-trapping-math"]

setup(ext_modules=[
    Extension("protocol._kernels", ["protocol/_kernels.c"], extra_compile_args=EXACT, optional=True),
    Extension("emulator._flowfill", ["emulator/_flowfill.c"], extra_compile_args=EXACT, optional=True),
])
