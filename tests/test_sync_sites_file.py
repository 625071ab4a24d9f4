"""`<worker>.syncsites.json` through one type on both sides (`trainprof.trace.sync_sites_file`): what
the session encodes the loader decodes to the same parts, and older or damaged files still load."""

from __future__ import annotations

import json

from trainprof.trace.sync_sites_file import (
    CompileCounters,
    Frame,
    Site,
    SyncSitesFile,
    UnprofiledSteps,
    decode,
    encode,
)
from trainprof.user_code import CodeLayout

SITE = Site(step=3, call="implicit", file="/a/train.py", line=9, function="train",
            stack=[Frame("/a/train.py", 9, "train"), Frame(None, None, None)])


def _document(**parts) -> SyncSitesFile:
    layout = CodeLayout.from_dict({"roots": ["/venv/lib/"], "library_packages": ["torch"],
                                   "user_packages": ["train"], "versions": {"torch": "2.13.0"}})
    return SyncSitesFile(worker="w", code_layout=layout, sites=[SITE], **parts)


def test_what_the_session_writes_the_loader_reads_back():
    document = _document(
        compile=CompileCounters(graph_breaks=1, graph_break={"a reason": 2}, frames_total=3, frames_ok=2,
                                unique_graphs=2),
        unprofiled=UnprofiledSteps([50.4567, 48.0], "cuda_events", [0.0, 1.25]),
    )
    text = encode(document)
    read = decode(json.loads(text))
    assert read is not None
    assert read.sites == document.sites and read.compile == document.compile
    assert read.unprofiled == UnprofiledSteps([50.457, 48.0], "cuda_events", [0.0, 1.25])  # to the µs
    assert read.code_layout is not None and read.code_layout.to_dict() == document.code_layout.to_dict()
    assert read.worker == "w" and read.version == 2


def test_the_file_keeps_the_contracts_layout():
    """DEVELOPING.md's keys: the four parts flat at the top, optional ones only when recorded."""
    plain = json.loads(encode(_document()))
    assert list(plain) == ["version", "worker", "code_layout", "sites"]
    assert plain["sites"][0] == {"step": 3, "call": "implicit", "file": "/a/train.py", "line": 9,
                                 "function": "train", "stack": [
                                     {"file": "/a/train.py", "line": 9, "function": "train"},
                                     {"file": None, "line": None, "function": None}]}
    timed = json.loads(encode(_document(unprofiled=UnprofiledSteps([1.0], "host"))))
    assert timed["unprofiled_step_ms"] == [1.0] and timed["unprofiled_timing"] == "host"
    assert "unprofiled_pre_forward_ms" not in timed and "compile" not in timed


def test_an_older_or_damaged_file_loads_what_has_the_contracts_type():
    version_1 = decode({"version": 1, "sites": [{"step": 1, "call": "implicit", "line": 4}]})
    assert version_1 is not None and version_1.code_layout is None and version_1.compile is None
    assert version_1.sites[0].to_dict() == {"step": 1, "call": "implicit", "line": 4}
    assert version_1.unprofiled == UnprofiledSteps()
    damaged = decode({"sites": [], "compile": {"graph_breaks": "2", "frames_ok": True},
                      "unprofiled_step_ms": [1.0, -2, "3", True, float("inf")], "unprofiled_timing": "wall"})
    assert damaged is not None and damaged.compile is None
    assert damaged.unprofiled == UnprofiledSteps([1.0], None, None)
    assert decode({"sites": {}}) is None and decode([1]) is None and decode({"sites": [3]}) is None
