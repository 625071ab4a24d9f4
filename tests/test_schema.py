"""The JSON form of an analysis against its types (`trainprof.analysis.schema`): the checked-in JSON
Schema is the one they generate, and every fixture's `analyze --json` output decodes into them."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from trainprof.analysis import analyze
from trainprof.analysis.schema import json_schema, validate
from trainprof.report.json import dumps

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests/fixtures"
RUNS = sorted({
    path.parent for path in FIXTURES.rglob("*.json.gz")
    if "trace" in path.name or path.parent.parent.name == "thirdparty"
})


def test_the_checked_in_schema_is_the_types():
    """Regenerate with `python -m trainprof.analysis.schema > docs/schema/analysis.schema.json`."""
    assert (ROOT / "docs/schema/analysis.schema.json").read_text() == json_schema()
    schema = json.loads(json_schema())
    finding = schema["$defs"]["FindingJSON"]
    assert "sync_point" in finding["properties"]["kind"]["enum"]
    assert finding["additionalProperties"] is False


@pytest.fixture(scope="module")
def outputs() -> dict[str, str]:
    return {str(run.relative_to(FIXTURES)): dumps(analyze(run)) for run in RUNS}


def test_every_fixture_output_fits_the_schema(outputs):
    assert len(outputs) >= 30
    kinds = set()
    for name, text in outputs.items():
        document = validate(text)  # raises, naming the field, on any output the types do not allow
        kinds |= {finding.kind for finding in document.findings}
        assert name and document.trace.step_count > 0
    assert {"sync_point", "launch_overhead", "top_kernels"} <= kinds


@pytest.mark.parametrize(("path", "value", "field"), [
    (("findings", 0, "kind"), "sync_points", "$.findings[0].kind"),
    (("findings", 0, "severity"), "urgent", "$.findings[0].severity"),
    (("trace", "traces", 0, "verdict", "verdict"), "fast", "$.trace.traces[0].verdict.verdict"),
    (("steps", 0, "new_field_ms"), 1.0, "new_field_ms"),
    (("steps", 0, "kernel_count"), "12", "$.steps[0].kernel_count"),
])
def test_an_output_off_the_schema_is_refused(outputs, path, value, field):
    document = json.loads(outputs["traces/gpt2_clean"])
    *parents, last = path
    target = document
    for key in parents:
        target = target[key]
    target[last] = value
    with pytest.raises(msgspec.ValidationError, match=field.replace("$", r"\$").replace("[", r"\[")):
        validate(json.dumps(document))
