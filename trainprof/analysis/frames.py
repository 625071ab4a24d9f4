"""Who called it: user frames and op chains from the nesting of python_function / cpu_op events."""

from __future__ import annotations

import functools
import re

import msgspec

from trainprof.trace import Trace
from trainprof.user_code import is_user_file

# A line number of more than 18 digits is no line (and int() refuses 4,301 digits and more).
_PY_FRAME = re.compile(r"^(.*)\((\d{1,18})\): (.*)$")
# python_function names of the profiler's own frames (its stop/exit path synchronizes the device).
PROFILER_FILES = ("torch/profiler/", "torch/autograd/profiler")


class PyFrame(msgspec.Struct, frozen=True):
    """A parsed `python_function` event name: `file(line): function`."""

    file: str
    line: int
    function: str


@functools.lru_cache(maxsize=65536)  # the analyses parse the same few thousand names again and again
def parse_py_frame(name: str) -> PyFrame | None:
    """Parse `make_traces.py(50): gpt2_loop`; None for `<built-in ...>`, `nn.Module: ...` and the like."""
    if name.startswith("<") or name.startswith("nn.Module:"):
        return None
    match = _PY_FRAME.match(name)
    if match is None:
        return None
    return PyFrame(match.group(1), int(match.group(2)), match.group(3))


def is_profiler_file(file: str) -> bool:
    """True for frames of torch.profiler itself."""
    return any(marker in file for marker in PROFILER_FILES)


class CallContext(msgspec.Struct):
    """What enclosed one CPU call: cpu_op chain, annotations, python frames (outermost first).

    `user` is the innermost user frame and `user_index` its position in `python` (-1 if none).
    """

    ops: list[str]
    annotations: list[str]
    python: list[str]
    user: PyFrame | None
    user_index: int = -1

    @property
    def below_user(self) -> list[str]:
        """The python frames inside the innermost user frame (all of them without one), outermost first."""
        return self.python[self.user_index + 1:]

    @property
    def op_chain(self) -> str | None:
        """`aten::item -> aten::_local_scalar_dense`, or None without an enclosing cpu_op."""
        return " -> ".join(self.ops) if self.ops else None

    @property
    def in_profiler(self) -> bool:
        """True when the call comes from torch.profiler's own code (its exit synchronize)."""
        return any(is_profiler_file(p) for p in self.python)


def call_context(trace: Trace, thread: int, start_us: float, end_us: float) -> CallContext:
    """The enclosing frames of a CPU call on `thread` spanning [start_us, end_us]."""
    frames = trace.frames(thread)
    ops, annotations, python = [], [], []
    user, user_index = None, -1
    for i in frames.chain(frames.innermost(start_us, end_us)):
        category = frames.categories[i]
        name = trace.names[int(frames.name_ids[i])]
        if category == "cpu_op":
            ops.append(name)
        elif category == "user_annotation":
            annotations.append(name)
        else:
            python.append(name)
            parsed = parse_py_frame(name)
            if parsed is not None and is_user_file(parsed.file, trace.code_layout):
                user, user_index = parsed, len(python) - 1
    return CallContext(ops, annotations, python, user, user_index)
