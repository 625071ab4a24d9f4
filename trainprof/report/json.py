"""summary.json and `--json`: a result in its JSON form (`to_dict()`), written by msgspec.

The fields of an analysis's JSON (`schema_version` 1) are documented in `trainprof.analysis.result`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.diff import TraceDiff
    from trainprof.analysis.result import Analysis


def _numpy_to_python(value: Any) -> Any:
    """msgspec's hook for types it does not know: numpy scalars and arrays become Python values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise NotImplementedError(f"cannot write {type(value).__name__} as JSON")


_ENCODER = msgspec.json.Encoder(enc_hook=_numpy_to_python)


def dumps(document: Analysis | TraceDiff | dict[str, Any], indent: bool = False) -> str:
    """One JSON object: a record's `to_dict()` (an `Analysis`, a `TraceDiff`), or JSON-ready data.
    NaN and infinities become null (msgspec's rule for non-finite floats)."""
    data = document if isinstance(document, dict) else document.to_dict()
    encoded = _ENCODER.encode(data)
    return (msgspec.json.format(encoded, indent=1) if indent else encoded).decode()


def write_json(analysis: Analysis, path: str | Path) -> Path:
    """Write summary.json (atomically: a full disk leaves no half-written file); returns its path."""
    from trainprof.report import write_text_atomically

    return write_text_atomically(path, dumps(analysis, indent=True) + "\n")
