"""The analysis result: `Finding`s, per-step rows and a summary, and their JSON form."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Finding:
    """One problem (or fact) found in a trace, with its evidence.

    `where` is `{"file", "line", "function"}` of the user's code (values may be None); `cost_ms` is
    the CPU or GPU time it costs over all profiled steps; `per_step` is `count` / number of steps.
    """

    kind: str
    title: str
    severity: str  # "high" | "medium" | "low" | "info"
    op: str | None
    where: dict
    count: int
    per_step: float
    cost_ms: float
    fix: str | None
    rank: int | None = None
    details: dict = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able form (the `findings` entries of `Analysis.to_dict()`)."""
        return {
            "kind": self.kind,
            "title": self.title,
            "severity": self.severity,
            "op": self.op,
            "where": dict(self.where),
            "count": self.count,
            "per_step": self.per_step,
            "cost_ms": self.cost_ms,
            "fix": self.fix,
            "rank": self.rank,
            "details": self.details,
        }


SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2, "info": 3}


@dataclass
class Analysis:
    """What `analyze()` found: `steps` (one dict per step and rank), `findings`, `summary`, `trace`."""

    trace: dict
    steps: list[dict]
    findings: list[Finding]
    summary: dict

    def to_dict(self) -> dict[str, Any]:
        """`{"trace": {...}, "steps": [...], "findings": [...]}`; the summary lives in `trace["summary"]`."""
        return {
            "trace": {**self.trace, "summary": self.summary},
            "steps": self.steps,
            "findings": [f.to_dict() for f in self.findings],
        }
