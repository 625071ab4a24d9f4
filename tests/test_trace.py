"""Loading real torch.profiler traces, and clear errors on bad input."""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

import pytest

from trainprof.trace import TraceLoadError, load_traces, sync_sites_path, worker_name

FIXTURES = Path(
    os.environ.get("TRAINPROF_FIXTURES")
    or Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "traces"
)
pytestmark = pytest.mark.skipif(not FIXTURES.is_dir(), reason=f"fixtures not found at {FIXTURES}")


def test_loads_single_trace_with_counts():
    (trace,) = load_traces(FIXTURES / "gpt2_pathologies")
    assert trace.worker == "gpt2_pathologies"
    assert trace.rank is None
    counts = {category: len(table) for category, table in trace.events.items()}
    # Counted with a plain json pass over the file.
    assert counts["kernel"] == 2460
    assert counts["cuda_runtime"] == 2755
    assert counts["cuda_driver"] == 297
    assert counts["gpu_memcpy"] == 9
    assert counts["python_function"] == 16588
    assert len(trace.memory) > 0
    assert trace.device_properties[0]["name"] == "NVIDIA H200"
    assert trace.sync_sites is None


def test_folder_of_ranks_sorted_by_rank():
    traces = load_traces(FIXTURES / "ddp_straggler")
    assert [t.rank for t in traces] == [0, 1]
    assert [t.worker for t in traces] == ["rank0", "rank1"]
    assert traces[0].distributed_info["world_size"] == 2


def test_frames_nest_item_inside_user_loop():
    (trace,) = load_traces(FIXTURES / "gpt2_pathologies")
    runtime = trace.events["cuda_runtime"]
    sync = [i for i in range(len(runtime)) if trace.names[runtime.name[i]] == "cudaStreamSynchronize"][1]
    frames = trace.frames(int(runtime.thread[sync]))
    chain = frames.chain(frames.innermost(runtime.start_us[sync], runtime.end_us[sync]))
    names = [trace.names[frames.name_ids[i]] for i in chain]
    assert "make_traces.py(50): gpt2_loop" in names
    assert names[-2:] == ["aten::item", "aten::_local_scalar_dense"]


def test_bare_event_list_and_plain_json(tmp_path):
    src = next((FIXTURES / "gpt2_clean").glob("*.pt.trace.json.gz"))
    plain = tmp_path / "w.1.pt.trace.json"
    plain.write_bytes(gzip.decompress(src.read_bytes()))
    assert len(load_traces(plain)[0].events["kernel"]) == 1773
    bare = tmp_path / "bare.json"
    bare.write_text('[{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1.0, "dur": 2.0}]')
    assert len(load_traces(bare)[0].events["kernel"]) == 1


def test_gzip_of_several_members_loads_whole(tmp_path):
    text = gzip.decompress(next((FIXTURES / "gpt2_clean").glob("*.pt.trace.json.gz")).read_bytes())
    middle = len(text) // 2
    split = tmp_path / "w.2.pt.trace.json.gz"
    split.write_bytes(gzip.compress(text[:middle]) + gzip.compress(text[middle:]))
    assert len(load_traces(split)[0].events["kernel"]) == 1773


def test_sync_sites_file_matched_by_worker(tmp_path):
    src = next((FIXTURES / "gpt2_clean").glob("*.pt.trace.json.gz"))
    dst = tmp_path / "trainer-rank-3.1795302433816535958.pt.trace.json.gz"
    shutil.copy(src, dst)
    assert worker_name(dst) == "trainer-rank-3"
    assert sync_sites_path(dst) == tmp_path / "trainer-rank-3.syncsites.json"
    sync_sites_path(dst).write_text(
        '{"version": 1, "worker": "trainer-rank-3", "sites": '
        '[{"step": 3, "call": "implicit", "file": "/a/t.py", "line": 9, "function": "f"}]}'
    )
    (trace,) = load_traces(tmp_path)  # the sites file is not taken for a trace
    assert trace.rank == 3
    assert trace.sync_sites[0]["line"] == 9


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    "case", ["missing", "empty", "truncated_gzip", "not_json", "not_trace", "empty_folder"]
)
def test_bad_input_names_the_file(tmp_path, case):
    if case == "missing":
        target = tmp_path / "nope.pt.trace.json"
    elif case == "empty":
        target = _write(tmp_path / "empty.pt.trace.json", b"")
    elif case == "truncated_gzip":
        target = _write(tmp_path / "cut.pt.trace.json.gz", gzip.compress(b'{"traceEvents": []}' * 100)[:30])
    elif case == "not_json":
        target = _write(tmp_path / "text.json", b"hello, not json")
    elif case == "not_trace":
        target = _write(tmp_path / "config.json", b'{"lr": 0.1}')
    else:
        target = tmp_path / "nothing_here"
        target.mkdir()
        _write(target / "notes.txt", b"x")
    with pytest.raises(TraceLoadError) as error:
        load_traces(target)
    message = str(error.value)
    assert target.name in message
    assert "\n" not in message
