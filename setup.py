"""The one compiled part: fused codec kernels (protocol/_kernels.c). Optional: without a C
compiler the install goes on and the codecs use their numpy path, which gives the same bytes."""
from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "protocol._kernels", ["protocol/_kernels.c"],
    # the same float operations in the same order as the numpy path: no contraction into FMAs
    extra_compile_args=["-O3", "-ffp-contract=off", "-fno-fast-math", "-fno-trapping-math"],
    optional=True,
)])
