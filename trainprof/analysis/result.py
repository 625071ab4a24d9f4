"""The analysis result: `Finding`s, per-step rows and a summary, and their JSON form."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Where:
    """The innermost frame of the user's code behind a finding (any field may be unknown: None).

    From a trace alone `line` is the function's first line at best; the live capture gives the line.
    """

    file: str | None = None
    line: int | None = None
    function: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """`{"file", "line", "function"}`, the `where` of DEVELOPING.md's finding contract."""
        return {"file": self.file, "line": self.line, "function": self.function}


@dataclass(frozen=True)
class Via:
    """The library frame that made the call behind a finding: the frame a library's setting is about.

    `library` is the top-level package (`transformers`, `accelerate`, `lightning`, `torch`, ...);
    `version` is its version when the run recorded it (None otherwise).
    """

    file: str | None = None
    line: int | None = None
    function: str | None = None
    library: str | None = None
    version: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """`{"file", "line", "function", "library", "version"}`."""
        return {
            "file": self.file,
            "line": self.line,
            "function": self.function,
            "library": self.library,
            "version": self.version,
        }


@dataclass
class Finding:
    """One problem (or fact) found in a trace, with its evidence.

    `where` is the user's code (a `Where`; a `{"file", "line", "function"}` dict is converted);
    `via` the library frame that made the call, when a library did; `cause` the concrete cause in
    words (`"`.item()` of a CUDA tensor"`); `cost_ms` is the CPU or GPU time it costs over all
    profiled steps; `per_step` is `count` / number of steps.
    """

    kind: str
    title: str
    severity: str  # "high" | "medium" | "low" | "info"
    op: str | None
    where: Where
    count: int
    per_step: float
    cost_ms: float
    fix: str | None
    rank: int | None = None
    details: dict = field(default_factory=dict)
    via: Via | None = None
    cause: str | None = None

    def __post_init__(self) -> None:
        self.count, self.per_step, self.cost_ms = plain((self.count, self.per_step, self.cost_ms))
        self.details = plain(self.details)
        if isinstance(self.where, dict):
            self.where = Where(**{k: self.where.get(k) for k in ("file", "line", "function")})
        elif self.where is None:
            self.where = Where()

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able form (the `findings` entries of `Analysis.to_dict()`)."""
        return {
            "kind": self.kind,
            "title": self.title,
            "severity": self.severity,
            "op": self.op,
            "where": self.where.to_dict(),
            "via": self.via.to_dict() if self.via is not None else None,
            "cause": self.cause,
            "count": self.count,
            "per_step": self.per_step,
            "cost_ms": self.cost_ms,
            "fix": self.fix,
            "rank": self.rank,
            "details": self.details,
        }


SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2, "info": 3}


def plain(value: Any) -> Any:
    """`value` with numpy scalars and arrays (in dicts, lists, tuples) as Python numbers and lists.

    The Python API hands out plain floats and ints: `np.float64` prints as `np.float64(2.5)` and
    surprises `json.dumps` and `type(x) is float` checks.
    """
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(item) for item in value)
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):
        return value.tolist()
    return value


@dataclass
class Analysis:
    """What `analyze()` found: `steps` (one dict per step and rank), `findings`, `summary`, `trace`."""

    trace: dict
    steps: list[dict]
    findings: list[Finding]
    summary: dict

    def __post_init__(self) -> None:
        self.trace, self.steps, self.summary = plain(self.trace), plain(self.steps), plain(self.summary)

    def to_dict(self) -> dict[str, Any]:
        """`{"trace": {...}, "steps": [...], "findings": [...]}`; the summary lives in `trace["summary"]`."""
        return {
            "trace": {**self.trace, "summary": self.summary},
            "steps": self.steps,
            "findings": [f.to_dict() for f in self.findings],
        }
