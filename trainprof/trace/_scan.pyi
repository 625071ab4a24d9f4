"""Types of the C module `trainprof/trace/_scan.c` (built by setup.py)."""

from typing import Any

X_FIELDS: tuple[tuple[str, str, int], ...]
MEMORY_FIELDS: tuple[tuple[str, str, int], ...]
X_SIZE: int
MEMORY_SIZE: int

def scan(text: Any, categories: Any, codes: Any) -> tuple[Any, ...] | None: ...
