"""summary.json: exactly `Analysis.to_dict()`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec


def _numpy_to_python(value: Any) -> Any:
    """msgspec's hook for types it does not know: numpy scalars and arrays become Python values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise NotImplementedError(f"cannot write {type(value).__name__} as JSON")


_ENCODER = msgspec.json.Encoder(enc_hook=_numpy_to_python)


def dumps(analysis: dict[str, Any], indent: bool = False) -> str:
    """One JSON object; NaN and infinities become null (msgspec's rule for non-finite floats)."""
    encoded = _ENCODER.encode(analysis)
    return (msgspec.json.format(encoded, indent=1) if indent else encoded).decode()


def write_json(analysis: dict[str, Any], path: str | Path) -> Path:
    """Write summary.json (atomically: a full disk leaves no half-written file); returns its path."""
    from trainprof.report import write_text_atomically

    return write_text_atomically(path, dumps(analysis, indent=True) + "\n")
