"""`<worker>.syncsites.json` as types: the four things a session writes there, each its own part.

Written by the session (`encode`) beside its traces, read back by the loader (`decode`) into the
`Trace`: one type for both sides. The contract is DEVELOPING.md's ("Captured sync sites"):

    {"version": 2, "worker": "<worker>", "code_layout": {...} | null,
     "sites": [{"step", "call", "file", "line", "function", "stack": [{"file", "line", "function"}]}],
     "compile": {...}, "unprofiled_step_ms": [...], "unprofiled_timing": "cuda_events" | "host",
     "unprofiled_pre_forward_ms": [...]}

- `sites` (`Site`): the synchronizing calls the session caught during recorded steps;
- `code_layout` (`user_code.CodeLayout`): where library code lived in the run;
- `compile` (`CompileCounters`): Dynamo's counters as the last window ended;
- the un-profiled steps (`UnprofiledSteps`): their ms, how they were timed, and the time to each
  one's first forward.

The folder is input from anywhere, and older sessions wrote less (version 1: no layout; no
`compile` or un-profiled steps before those were captured): `decode` keeps what has the contract's
type and drops the rest as if absent (a string step, a list for a file, a negative time), so the
analyses can trust what it returns. Imports no torch.
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal

import msgspec

from trainprof.user_code import CodeLayout

FORMAT_VERSION = 2

Timing = Literal["cuda_events", "host"]
"""How the session timed its un-profiled steps: CUDA events recorded where each step began, or the
host's clock (`trainprof.capture.arrival`)."""


class Frame(msgspec.Struct, frozen=True):
    """One frame of a captured call's stack (outermost first in `Site.stack`); None: unknown."""

    file: str | None = None
    line: int | None = None
    function: str | None = None


class Site(msgspec.Struct, frozen=True):
    """One synchronizing call: the profiler step it happened in, its kind (`implicit`,
    `torch.cuda.synchronize`, ...), the innermost frame of the user's code and the whole stack
    (None: unknown, or not of the contract's type in the file)."""

    step: int | None = None
    call: str | None = None
    file: str | None = None
    line: int | None = None
    function: str | None = None
    stack: list[Frame] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The site as the analysis joins it (`syncs.join_sync_sites`): its known fields only."""
        site: dict[str, Any] = {
            name: getattr(self, name) for name in ("step", "call", "file", "line", "function")
            if getattr(self, name) is not None
        }
        if self.stack is not None:
            site["stack"] = [
                {name: getattr(frame, name) for name in ("file", "line", "function")
                 if getattr(frame, name) is not None}
                for frame in self.stack
            ]
        return site


class CompileCounters(msgspec.Struct, frozen=True):
    """Dynamo's counters since the process started (`trainprof.capture.compile.dynamo_counters`):
    distinct graph-break reasons and each one's count, the frames it tried and compiled, the unique
    graphs; None: not recorded."""

    graph_breaks: int | None = None
    graph_break: dict[str, int] | None = None
    frames_total: int | None = None
    frames_ok: int | None = None
    unique_graphs: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The `compile` object: the counters that are known."""
        return {name: value for name in self.__struct_fields__ if (value := getattr(self, name)) is not None}


class UnprofiledSteps(msgspec.Struct, frozen=True):
    """The steps the profiler did not touch: their ms (the most recent ones, positive) and how they
    were timed (None: not said, or no step times), and the ms from each one's start to its first
    forward (`unprofiled_pre_forward_ms`, from 0); None: not recorded."""

    step_ms: list[float] | None = None
    timing: Timing | None = None
    pre_forward_ms: list[float] | None = None


class SyncSitesFile(msgspec.Struct, frozen=True):
    """What a `<worker>.syncsites.json` holds, one part per thing the session recorded."""

    worker: str | None
    code_layout: CodeLayout | None
    sites: list[Site]
    compile: CompileCounters | None = None
    unprofiled: UnprofiledSteps = UnprofiledSteps()
    version: int = FORMAT_VERSION


def encode(document: SyncSitesFile) -> str:
    """The file's text, as DEVELOPING.md lays it out (times to the microsecond)."""
    payload: dict[str, Any] = {
        "version": document.version,
        "worker": document.worker,
        # where library code lived in this run, so the analysis draws the user/library line here too
        "code_layout": document.code_layout.to_dict() if document.code_layout is not None else None,
        "sites": [msgspec.to_builtins(site) for site in document.sites],
    }
    if document.compile is not None:
        payload["compile"] = document.compile.to_dict()
    steps = document.unprofiled
    if steps.step_ms:
        payload["unprofiled_step_ms"] = [round(ms, 3) for ms in steps.step_ms]
        payload["unprofiled_timing"] = steps.timing
    if steps.pre_forward_ms:
        payload["unprofiled_pre_forward_ms"] = [round(ms, 3) for ms in steps.pre_forward_ms]
    return json.dumps(payload, indent=1)


def decode(document: Any) -> SyncSitesFile | None:
    """The parts of a decoded sync sites file (any JSON value), each value of the contract's type
    kept and any other dropped; None when it is not one (no `sites` list of objects)."""
    if not isinstance(document, dict):
        return None
    sites = document.get("sites")
    if not isinstance(sites, list) or not all(isinstance(site, dict) for site in sites):
        return None
    worker = document.get("worker")
    step_ms = _times(document.get("unprofiled_step_ms"))
    timing = document.get("unprofiled_timing")
    return SyncSitesFile(
        worker=worker if isinstance(worker, str) else None,
        code_layout=CodeLayout.from_dict(document.get("code_layout")),
        sites=[site_of(site) for site in sites],
        compile=compile_counters_of(document.get("compile")),
        unprofiled=UnprofiledSteps(
            step_ms,
            timing if timing in ("cuda_events", "host") and step_ms else None,
            _times(document.get("unprofiled_pre_forward_ms"), allow_zero=True),
        ),
    )


def _typed(value: Any, kind: type) -> Any:
    """`value` when it is of `kind` (a bool is no int), else None."""
    return value if isinstance(value, kind) and not isinstance(value, bool) else None


def site_of(site: dict) -> Site:
    """A site from its JSON object, fields not of the contract's type dropped."""
    stack = site.get("stack")
    return Site(
        step=_typed(site.get("step"), int),
        call=_typed(site.get("call"), str),
        file=_typed(site.get("file"), str),
        line=_typed(site.get("line"), int),
        function=_typed(site.get("function"), str),
        stack=[
            Frame(_typed(f.get("file"), str), _typed(f.get("line"), int), _typed(f.get("function"), str))
            for f in stack if isinstance(f, dict)
        ] if isinstance(stack, list) else None,
    )


def compile_counters_of(counters: Any) -> CompileCounters | None:
    """The `compile` object's counters of the contract's types; None when absent or none is."""
    if not isinstance(counters, dict):
        return None
    reasons = counters.get("graph_break")
    found = CompileCounters(
        graph_breaks=_typed(counters.get("graph_breaks"), int),
        graph_break={
            str(reason): count for reason, count in reasons.items() if isinstance(count, int) and count >= 0
        } if isinstance(reasons, dict) else None,
        frames_total=_typed(counters.get("frames_total"), int),
        frames_ok=_typed(counters.get("frames_ok"), int),
        unique_graphs=_typed(counters.get("unique_graphs"), int),
    )
    return found if found.to_dict() else None


def _times(values: Any, allow_zero: bool = False) -> list[float] | None:
    """A list's finite numbers above 0 (from 0 with `allow_zero`) as floats (booleans, strings and
    the like dropped); None when it is not a list or none is left."""
    if not isinstance(values, list):
        return None
    low = 0.0 if allow_zero else math.ulp(0.0)
    kept = [
        float(value) for value in values
        if isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value < math.inf
    ]
    return kept or None
