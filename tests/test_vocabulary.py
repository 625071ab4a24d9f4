"""The analysis' vocabulary (`trainprof.analysis.kinds`): one registry of finding kinds that every
finding is held to, documented in docs/findings.md, and `Literal` types whose strings are the JSON's."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from trainprof.analysis import busy_findings, idle_findings
from trainprof.analysis.causes import CAUSES, Cause
from trainprof.analysis.kinds import (
    GROUPS,
    KINDS,
    SEVERITY_ORDER,
    CauseKey,
    FindingKind,
    Severity,
    findings_table,
)
from trainprof.analysis.result import Finding, Where
from trainprof.analysis.severity import FIRST_KINDS, IDLE_KINDS, ONE_OFF_KINDS

ROOT = Path(__file__).resolve().parent.parent


def test_the_type_and_the_registry_name_the_same_kinds():
    assert sorted(typing.get_args(FindingKind)) == sorted(KINDS)
    assert all(info.group in GROUPS and info.meaning for info in KINDS.values())
    assert (IDLE_KINDS | FIRST_KINDS | ONE_OFF_KINDS) <= set(KINDS)


def test_each_kind_names_the_module_that_makes_it():
    """The registry's `module` holds the kind's name: a kind moved to another module moves there."""
    for kind, info in KINDS.items():
        source = (ROOT / "trainprof/analysis" / f"{info.module}.py").read_text()
        assert f'"{kind}"' in source, (kind, info.module)


def test_the_tables_that_name_kinds_use_registered_ones():
    assert {kind for _, kind, _ in idle_findings._CAUSE_FINDINGS} <= set(KINDS)
    assert typing.get_type_hints(busy_findings._Context.finding)["kind"] == FindingKind


def test_a_finding_of_an_unregistered_kind_is_refused():
    def finding(kind: str) -> Finding:
        return Finding(kind=kind, title="t", severity="low", op=None, where=Where(), count=1,  # type: ignore[arg-type]
                       per_step=1.0, cost_ms=0.0, fix=None)

    assert finding("sync_point").kind == "sync_point"
    with pytest.raises(ValueError, match="unregistered finding kind 'sync_points'"):
        finding("sync_points")


def test_docs_findings_md_is_generated_from_the_registry():
    """Regenerate with `python -m trainprof.analysis.kinds > docs/findings.md`."""
    assert (ROOT / "docs/findings.md").read_text() == findings_table()
    assert all(f"| `{kind}` |" in findings_table() for kind in KINDS)


def test_severities_and_cause_keys_are_the_strings_the_json_carries():
    assert list(typing.get_args(Severity)) == list(SEVERITY_ORDER)
    assert list(typing.get_args(CauseKey)) == [cause.key for cause in Cause]
    assert all(info.verdict is None or isinstance(info.verdict, str) for info in CAUSES.values())
