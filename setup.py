"""The compiled parts of trainprof: `trainprof.trace._scan`, the loader's C scanner, and
`trainprof.trace._forest`, one-pass walks over the frames' forest.

Optional: where they do not build (no C compiler), trainprof reads every trace with msgspec alone
and walks the forest with numpy, with the same results (DEVELOPING.md: "Loading", and "Frames" under
"Analysis").
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("trainprof.trace._scan", ["trainprof/trace/_scan.c"], optional=True),
        Extension("trainprof.trace._forest", ["trainprof/trace/_forest.c"], optional=True),
    ]
)
