"""Knowledge as data: known framework sync sites (`sync_sites.json`), read once.

Each entry names a call site inside a library (a path suffix and function names, optionally a
caller further out), the causes it produces, why it syncs, the setting or code change that removes
it, the library versions it applies to, and where it was checked in the library's own source.
`match_sync_site` finds the entry for one sync point's library frames.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

import msgspec


class CatalogSite(msgspec.Struct, frozen=True):
    """One known sync site (one entry of `sync_sites.json`)."""

    id: str
    library: str
    file: str
    functions: tuple[str, ...]
    causes: tuple[str, ...]
    why: str
    fix: str
    versions: str
    checked: tuple[str, ...]
    caller_file: str | None = None
    caller_functions: tuple[str, ...] = ()

    def at(self, file: str, function: str) -> bool:
        """Whether a frame in `file` running `function` is this site's call site."""
        return file.replace("\\", "/").endswith(self.file) and function in self.functions

    def called_from(self, file: str, function: str) -> bool:
        """Whether a frame is this site's required caller (always true without one)."""
        return file.replace("\\", "/").endswith(self.caller_file or "") and function in self.caller_functions


@functools.lru_cache(maxsize=1)
def sync_sites() -> tuple[CatalogSite, ...]:
    """The catalog's entries, in file order."""
    # Imported here: only a sync point with library frames asks, and importlib.resources imports
    # tempfile and random (json and it: 3 ms of `trainprof analyze`'s start, 2-core development
    # machine, 2026-11-25).
    import json
    from importlib import resources

    text = resources.files(__package__).joinpath("sync_sites.json").read_text(encoding="utf-8")
    entries = []
    for entry in json.loads(text)["sites"]:
        caller = entry.get("caller") or {}
        entries.append(
            CatalogSite(
                id=entry["id"],
                library=entry["library"],
                file=entry["file"],
                functions=tuple(entry["functions"]),
                causes=tuple(entry["causes"]),
                why=entry["why"],
                fix=entry["fix"],
                versions=entry.get("versions", "*"),
                checked=tuple(entry.get("checked", ())),
                caller_file=caller.get("file"),
                caller_functions=tuple(caller.get("functions", ())),
            )
        )
    return tuple(entries)


def _release(version: str) -> tuple[int, ...]:
    """`2.13.0+cpu` -> (2, 13, 0); `5.0.0.dev0` -> (5, 0, 0)."""
    parts = []
    for piece in version.split("+", 1)[0].split("."):
        match = re.match(r"\d+", piece)
        if match is None:
            break
        parts.append(int(match.group()))
    return tuple(parts)


def version_in(version: str | None, spec: str) -> bool:
    """Whether `version` satisfies `spec` (`*`, or comma-separated `>=X`, `>X`, `<X`, `<=X`, `==X`).

    An unknown version (None) satisfies every spec: the frames already name the library.
    """
    if version is None or spec.strip() in ("", "*"):
        return True
    have = _release(version)
    checks = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
              "<": lambda a, b: a < b, "==": lambda a, b: a == b}
    for clause in spec.split(","):
        clause = clause.strip()
        operator = next((op for op in (">=", "<=", "==", ">", "<") if clause.startswith(op)), None)
        if operator is None:
            continue
        want = _release(clause[len(operator):].strip())
        width = max(len(have), len(want))
        if not checks[operator](have + (0,) * (width - len(have)), want + (0,) * (width - len(want))):
            return False
    return True


def match_sync_site(
    frames: Sequence[tuple[str, str]],
    cause: str,
    version_of: dict[str, str] | None = None,
) -> tuple[CatalogSite, int] | None:
    """The catalog entry for a sync, and the index in `frames` of its call site; None if none.

    `frames` are the library frames between the user's frame and the op, outermost first, as
    `(file, function)`; the innermost matching frame wins. `version_of` maps a library to its
    recorded version (entries whose `versions` exclude it are skipped).
    """
    versions = version_of or {}
    for index in range(len(frames) - 1, -1, -1):
        file, function = frames[index]
        for site in sync_sites():
            if cause not in site.causes or not site.at(file, function):
                continue
            if not version_in(versions.get(site.library), site.versions):
                continue
            if site.caller_file is not None and not any(
                site.called_from(f, fn) for f, fn in frames[:index]
            ):
                continue
            return site, index
    return None
