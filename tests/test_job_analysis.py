"""`trainprof analyze DIR` under torchrun (trainprof/job_analysis.py): every process analyses its share
of the folder, rank 0 gathers the shares through the job's store and prints what one process prints.

One torchrun job and two jobs whose processes get torchrun's variables by hand (rank 0 hosts the
store), on the CPU: 4-8 s each on the 2-core development machine, where torchrun's agent and every
process import torch (2.5 s each). Then the split and the gather's rules in this process, on an
in-process store.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainprof.analysis import analyze
from trainprof.analysis.core import compose
from trainprof.analysis.folder import folder_results
from trainprof.analysis.thresholds import Thresholds
from trainprof.job_analysis import (
    JobError,
    JobPlace,
    Share,
    _await_ranks,
    _collect,
    _own_share,
    _packed,
    _progress_key,
    _put,
    _share_key,
    _take,
    _unpacked,
    job_place,
)

pytestmark = pytest.mark.xdist_group("gloo")  # one worker runs these and test_distributed's job in turn

REPO = Path(__file__).resolve().parents[1]


def _env(**variables: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE")}
    return {**env, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **variables}


def _alone(*args: str) -> subprocess.CompletedProcess:
    """`trainprof analyze ...` in one process."""
    return subprocess.run([sys.executable, "-m", "trainprof", "analyze", *args], capture_output=True,
                          text=True, cwd=REPO, env=_env(), timeout=120)


def _torchrun(processes: int, *args: str) -> subprocess.CompletedProcess:
    """`torchrun --nproc_per_node N -m trainprof analyze ...` (`--standalone`: a free port)."""
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc_per_node={processes}", "-m", "trainprof", "analyze", *args],
                          capture_output=True, text=True, cwd=REPO, env=_env(), timeout=180)


def _by_hand(processes: int, *args: str) -> list[subprocess.CompletedProcess]:
    """The job's processes started with torchrun's variables set by hand, without its agent (rank 0
    hosts the store); each one's outcome, by rank."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    started = [
        subprocess.Popen([sys.executable, "-m", "trainprof", "analyze", *args], cwd=REPO, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=_env(RANK=str(rank), WORLD_SIZE=str(processes), LOCAL_WORLD_SIZE=str(processes),
                                  MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
        for rank in range(processes)
    ]
    outcomes = []
    for process in started:
        stdout, stderr = process.communicate(timeout=180)
        outcomes.append(subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr))
    return outcomes


def _ranks_folder(fixtures_dir: Path, folder: Path) -> Path:
    """Four ranks (copies of ddp_straggler's two traces with their `distributedInfo` rank rewritten, as
    benchmarks/rank_scaling.py builds them) and a worker with no rank and two windows (resnet50's)."""
    folder.mkdir()
    bases = sorted((fixtures_dir / "traces/ddp_straggler").glob("*.pt.trace.json.gz"))
    texts = [gzip.decompress(base.read_bytes()).decode() for base in bases]
    for rank in range(4):
        text, count = re.subn(r'("distributedInfo": \{"backend": "nccl", "rank": )\d+(, "world_size": )\d+',
                              rf"\g<1>{rank}\g<2>4", texts[rank % 2], count=1)
        assert count == 1
        (folder / f"trainer{3 - rank}.{1795302433816535958 + rank}.pt.trace.json").write_text(text)
    for window in (fixtures_dir / "thirdparty/kineto_resnet50_num_workers_4").glob("*.pt.trace.json.gz"):
        (folder / window.name).symlink_to(window)
    return folder


def test_torchrun_with_two_processes_prints_what_one_process_prints(fixtures_dir, tmp_path):
    folder = _ranks_folder(fixtures_dir, tmp_path / "ranks")
    alone = _alone(str(folder), "--json")
    job = _torchrun(2, str(folder), "--json")
    assert alone.returncode == 0 and job.returncode == 0, job.stderr[-3000:]
    assert job.stdout == alone.stdout
    traces = json.loads(job.stdout)["trace"]["traces"]
    # the names sort the ranks backwards (trainer3 is rank 0): the order is by rank, then the windows
    assert [(trace["rank"], trace["window"]) for trace in traces] == [(0, 0), (1, 0), (2, 0), (3, 0),
                                                                     (None, 0), (None, 1)]


def test_three_processes_over_two_files_print_what_one_prints(fixtures_dir):
    """Rank 2 has no file and hands over an empty share; the other ranks print nothing."""
    folder = fixtures_dir / "traces/ddp_straggler"
    alone = _alone(str(folder), "--json")
    job = _by_hand(3, str(folder), "--json")
    assert [(done.returncode, done.stderr) for done in job] == [(0, "")] * 3
    assert [done.stdout for done in job] == [alone.stdout, "", ""]
    assert json.loads(alone.stdout)["trace"]["summary"]["straggler_rank"] == 1


def test_bad_input_read_by_another_rank_is_the_error_one_process_gives(fixtures_dir, tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    (first,) = (fixtures_dir / "traces/ddp_straggler").glob("rank0.*.pt.trace.json.gz")
    (folder / first.name).symlink_to(first)
    (folder / "z.pt.trace.json").write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": "late"}]}')
    alone = _alone(str(folder))
    rank_0, rank_1 = _by_hand(2, str(folder))  # z sorts second: rank 1 reads it
    assert alone.returncode == rank_0.returncode == 2
    assert alone.stderr.startswith("trainprof: error: ") and "z.pt.trace.json" in alone.stderr
    assert rank_0.stderr == alone.stderr and rank_0.stdout == alone.stdout == ""
    assert (rank_1.returncode, rank_1.stdout, rank_1.stderr) == (0, "", "")


# ---- the split and the gather's rules, in this process ----------------------------------------------


def test_a_job_is_recognised_by_torchruns_variables():
    torchrun = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h",
                "MASTER_PORT": "1"}
    assert job_place(torchrun) == JobPlace(rank=1, world_size=4, local_world_size=2)
    assert job_place({**torchrun, "WORLD_SIZE": "1", "RANK": "0"}) is None  # one process: the usual path
    assert job_place({key: value for key, value in torchrun.items() if key != "MASTER_ADDR"}) is None
    assert job_place({**torchrun, "RANK": "x"}) is None
    assert job_place({}) is None


def test_the_shares_partition_the_folder_and_compose_as_one_process(fixtures_dir, tmp_path):
    folder = _ranks_folder(fixtures_dir, tmp_path / "ranks")
    limits = Thresholds(None)
    shares = [_own_share(JobPlace(rank, 4, 4), folder, limits, 1, lambda *_: None) for rank in range(4)]
    indexes = [[index for index, _, _ in share.outcomes] for _, share in shares]
    assert indexes == [[0, 4], [1, 5], [2], [3]]
    assert len({(share.file_count, share.listing) for _, share in shares}) == 1
    travelled = [_unpacked(rank, _packed(share)) for rank, (_, share) in enumerate(shares)]
    outcomes = [outcome for share in travelled for outcome in share.outcomes]
    in_order = folder_results(outcomes, folder)
    assert folder_results(outcomes[::-1], folder) == in_order
    assert compose(in_order, limits).to_dict() == analyze(folder, workers=1).to_dict()


def test_an_error_that_does_not_pickle_travels_as_its_type_and_message():
    class Odd(Exception):
        def __init__(self, a, b):
            super().__init__(f"{a}/{b}")

        def __reduce__(self):
            raise TypeError("no")

    share = _unpacked(1, _packed(Share(1, "d", [(0, None, Odd(1, 2))])))
    assert repr(share.outcomes[0][2]) == "RuntimeError('Odd: 1/2')"


def test_rank_0_stops_waiting_for_a_rank_that_finishes_no_file():
    import torch.distributed as dist

    store = dist.HashStore()
    for rank in range(3):
        store.add(_progress_key(rank), 0)
    _put(store, 1, _packed(Share(0, "", [])))
    start = time.monotonic()
    with pytest.raises(JobError, match=r"^rank 2 finished no trace in 0 s and sent no results"):
        _collect(store, 3, 0.3, lambda *_: None)
    assert 0.3 <= time.monotonic() - start < 5
    assert not store.check([_share_key(1)])  # a share is dropped from the store once read


def test_rank_0_waits_as_long_as_a_rank_finishes_files():
    import threading

    import torch.distributed as dist

    store = dist.HashStore()
    store.add(_progress_key(1), 0)

    def slow_rank():  # a file every 0.1 s for 0.6 s, twice the silence allowed, then its share
        for _ in range(6):
            time.sleep(0.1)
            store.add(_progress_key(1), 1)
        _put(store, 1, _packed(Share(2, "d", [])))

    thread = threading.Thread(target=slow_rank)
    thread.start()
    shares = _collect(store, 2, 0.3, lambda *_: None)
    thread.join()
    assert shares == {1: Share(2, "d", [])}


def test_rank_0_names_the_ranks_that_never_joined():
    import torch.distributed as dist

    store = dist.HashStore()
    store.add(_progress_key(0), 0)
    store.add(_progress_key(2), 0)
    with pytest.raises(JobError, match=r"^ranks 1, 3 did not join within 0 s: .* WORLD_SIZE=1"):
        _await_ranks(store, 4, 0.2)


def test_a_share_over_a_store_values_limit_travels_in_pieces():
    """torch's TCPStore server refuses a value over 8 MiB; a share of thousands of traces is more."""
    from datetime import timedelta

    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=30))
    client = dist.TCPStore("127.0.0.1", server.port, 1, False, timeout=timedelta(seconds=30))
    data = os.urandom(20 * 2**20)
    _put(client, 3, data)
    assert _take(server, 3) == data
    assert not server.check([_share_key(3)]) and not server.check([_share_key(3) + "/0"])
