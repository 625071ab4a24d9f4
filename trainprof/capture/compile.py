"""What a session reads of torch.compile while the loop runs: Dynamo's graph-break and frame counters.

A trace shows where compiled regions begin and end, but not why Dynamo broke a graph, nor that it
gave up on a frame; Dynamo counts each break by its reason in
`torch._dynamo.utils.counters["graph_break"]`, the frames it tried and
compiled in `counters["frames"]` (`total`, `ok`), and the graphs it made in
`counters["stats"]["unique_graphs"]`. The counters are read when
a profiling window ends, only if torch.compile was used in the process (Dynamo is imported by then;
reading never imports it), and a failure to read them is no failure of the run.
"""

from __future__ import annotations

import sys
from typing import Any

REASON_CHARS = 300
"""A graph-break reason on one line, cut to this: some hold a whole explanation with hints."""


def dynamo_counters() -> dict[str, Any] | None:
    """`{"graph_breaks": distinct reasons, "graph_break": {reason: count}, "frames_total",
    "frames_ok", "unique_graphs"}` from Dynamo's counters (counted since the process started), or
    None when torch.compile was not used or they cannot be read."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:  # torch.compile never ran here: nothing to read, and no import of Dynamo
        return None
    try:
        breaks = utils.counters.get("graph_break", {})
        reasons: dict[str, int] = {}
        for reason, count in dict(breaks).items():
            key = " ".join(str(reason).split())[:REASON_CHARS]
            reasons[key] = reasons.get(key, 0) + int(count)
        frames = dict(utils.counters.get("frames", {}))
        stats = dict(utils.counters.get("stats", {}))
        return {
            "graph_breaks": len(reasons),
            "graph_break": reasons,
            "frames_total": int(frames.get("total", 0)),
            "frames_ok": int(frames.get("ok", 0)),
            "unique_graphs": int(stats.get("unique_graphs", 0)),
        }
    except Exception:  # a changed or broken counters object: the analysis goes without them
        return None
