"""Loading real torch.profiler traces, and clear errors on bad input."""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

import pytest

from trainprof.trace import TraceLoadError, load_traces, sync_sites_path, worker_of


def test_loads_single_trace_with_counts(fixtures_dir):
    (trace,) = load_traces(fixtures_dir / "traces/gpt2_pathologies")
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


def test_folder_of_ranks_sorted_by_rank(fixtures_dir):
    traces = load_traces(fixtures_dir / "traces/ddp_straggler")
    assert [t.rank for t in traces] == [0, 1]
    assert [t.worker for t in traces] == ["rank0", "rank1"]
    assert traces[0].distributed_info["world_size"] == 2


def test_frames_nest_item_inside_user_loop(fixtures_dir):
    (trace,) = load_traces(fixtures_dir / "traces/gpt2_pathologies")
    runtime = trace.events["cuda_runtime"]
    sync = [i for i in range(len(runtime)) if trace.names[runtime.name[i]] == "cudaStreamSynchronize"][1]
    frames = trace.frames(int(runtime.thread[sync]))
    chain = frames.chain(frames.innermost(runtime.start_us[sync], runtime.end_us[sync]))
    names = [trace.names[frames.name_ids[i]] for i in chain]
    assert "make_traces.py(50): gpt2_loop" in names
    assert names[-2:] == ["aten::item", "aten::_local_scalar_dense"]


def test_bare_event_list_and_plain_json(fixtures_dir, tmp_path):
    src = next((fixtures_dir / "traces/gpt2_clean").glob("*.pt.trace.json.gz"))
    plain = tmp_path / "w.1.pt.trace.json"
    plain.write_bytes(gzip.decompress(src.read_bytes()))
    assert len(load_traces(plain)[0].events["kernel"]) == 1773
    bare = tmp_path / "bare.json"
    bare.write_text('[{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1.0, "dur": 2.0}]')
    assert len(load_traces(bare)[0].events["kernel"]) == 1


def test_gzip_of_several_members_loads_whole(fixtures_dir, tmp_path):
    text = gzip.decompress(next((fixtures_dir / "traces/gpt2_clean").glob("*.pt.trace.json.gz")).read_bytes())
    middle = len(text) // 2
    split = tmp_path / "w.2.pt.trace.json.gz"
    split.write_bytes(gzip.compress(text[:middle]) + gzip.compress(text[middle:]))
    assert len(load_traces(split)[0].events["kernel"]) == 1773


def test_sync_sites_file_matched_by_worker(fixtures_dir, tmp_path):
    src = next((fixtures_dir / "traces/gpt2_clean").glob("*.pt.trace.json.gz"))
    dst = tmp_path / "trainer-rank-3.1795302433816535958.pt.trace.json.gz"
    shutil.copy(src, dst)
    assert worker_of(dst) == "trainer-rank-3"
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


def test_pytorch_1_8_schema_loads_with_steps_and_two_windows(fixtures_dir):
    traces = load_traces(fixtures_dir / "thirdparty/kineto_resnet50_num_workers_4")
    assert [(t.worker, t.rank, t.window, t.process) for t in traces] == [
        ("worker0", None, 0, "worker0"), ("worker0", None, 1, "worker0")]
    for trace in traces:
        counts = {category: len(table) for category, table in trace.events.items()}
        # `Operator` 20562 events of which 6 are ProfilerStep#N (moved to user_annotation), `Runtime`
        # 12085, `Kernel` 8868, `Memcpy` 12, `Memset` 378: counted with a plain json pass over the file.
        assert (counts["cpu_op"], counts["user_annotation"]) == (20556, 6)
        assert (counts["cuda_runtime"], counts["kernel"], counts["gpu_memcpy"], counts["gpu_memset"]) == (
            12085, 8868, 12, 378)
        steps = [trace.names[i] for i in trace.events["user_annotation"].name]
        assert all(name.startswith("ProfilerStep#") for name in steps)


def test_cuda_sync_records_are_kept_apart_from_gpu_work(fixtures_dir):
    (trace,) = load_traces(fixtures_dir / "thirdparty/hta_cp_simple_add")
    assert len(trace.events["cuda_sync"]) == 41
    assert {trace.names[i] for i in trace.events["cuda_sync"].name} <= {"Stream Sync", "Event Sync",
                                                                       "Context Sync", "Stream Wait Event"}


def test_every_third_party_trace_loads(fixtures_dir):
    for folder in sorted(p for p in (fixtures_dir / "thirdparty").iterdir() if p.is_dir()):
        for trace in load_traces(folder):
            assert len(trace.events["kernel"]) > 0, folder.name


def test_repeat_2_windows_are_one_process_not_two_ranks(fixtures_dir, tmp_path):
    from trainprof.analysis import analyze

    src = next((fixtures_dir / "traces/gpt2_clean").glob("*.pt.trace.json.gz"))
    for stamp in ("1795302414630700547", "1795302499999999999"):
        shutil.copy(src, tmp_path / f"Qwen1.5.{stamp}.pt.trace.json.gz")
    traces = load_traces(tmp_path)
    assert [(t.worker, t.window, t.process) for t in traces] == [("Qwen1.5", i, "Qwen1.5") for i in (0, 1)]
    result = analyze(traces).to_dict()
    assert result["trace"]["ranks"] == []
    assert not any(f["kind"] == "straggler" for f in result["findings"])


@pytest.mark.parametrize(("name", "worker"), [
    ("Qwen1.5.1795302414630700547.pt.trace.json.gz", "Qwen1.5"),
    ("node-1.cluster_4242.1623212756351.pt.trace.json", "node-1.cluster_4242"),
    ("rank0_host_12.pt.trace.json", "rank0_host_12"),
    ("control.json.gz", "control"),
])
def test_worker_of_keeps_its_own_dots(name, worker):
    assert worker_of(Path(name)) == worker


def test_folder_of_runs_loads_the_newest(fixtures_dir, tmp_path, capsys):
    from trainprof.cli import main

    src = next((fixtures_dir / "traces/gpt2_clean").glob("*.pt.trace.json.gz"))
    for age, run in enumerate(("run_b", "run_a")):  # run_a is newer although it sorts first
        (tmp_path / run).mkdir()
        copy = tmp_path / run / f"w.17953024146307{age}0547.pt.trace.json.gz"
        shutil.copy(src, copy)
        os.utime(copy, (1_000_000 + age, 1_000_000 + age))
    (trace,) = load_traces(tmp_path)
    assert trace.path.parent.name == "run_a"
    assert main(["analyze", str(tmp_path), "--json", "--debug"]) == 0
    err = capsys.readouterr().err
    assert "holds 2 run(s); analysing the newest" in err and "run_a" in err and "older: run_b" in err


def test_no_readable_events_says_what_is_missing(tmp_path):
    path = tmp_path / "other.json"
    path.write_text('{"traceEvents": [{"ph": "B", "cat": "foo", "name": "x", "ts": 1}]}')
    with pytest.raises(TraceLoadError) as error:
        load_traces(path)
    assert "needs complete ('ph': 'X') events" in str(error.value) and "B:foo x1" in str(error.value)
