"""summary.json: exactly `Analysis.to_dict()`."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def dumps(analysis: dict[str, Any], indent: bool = False) -> str:
    """One JSON object (orjson when installed; NaN/inf become null either way)."""
    try:
        import orjson
    except ImportError:
        import json

        return json.dumps(_finite(analysis), indent=1 if indent else None)
    option = orjson.OPT_SERIALIZE_NUMPY | (orjson.OPT_INDENT_2 if indent else 0)
    return orjson.dumps(analysis, option=option).decode()


def _finite(value: Any) -> Any:
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def write_json(analysis: dict[str, Any], path: str | Path) -> Path:
    """Write summary.json; returns its path."""
    path = Path(path)
    path.write_text(dumps(analysis, indent=True) + "\n", encoding="utf-8")
    return path
