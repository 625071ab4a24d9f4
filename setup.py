"""The one compiled part of trainprof: `trainprof.trace._scan`, the loader's C scanner.

Optional: where it does not build (no C compiler), trainprof reads every trace with msgspec alone,
with the same results (DEVELOPING.md, "Loading").
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("trainprof.trace._scan", ["trainprof/trace/_scan.c"], optional=True)])
