"""Out of GPU memory, explained (`trainprof.capture.memory`, `analysis.oom`, `analysis.fragmentation`,
`trace.memory_file`): the allocator's state as PyTorch hands it out (synthetic dicts shaped like
`torch.cuda.memory_stats()`, `memory_snapshot()` and a history's `device_traces`), the rules on
synthetic traces with a `<worker>.memory.json` beside them, and a CPU session whose loop raises
`torch.OutOfMemoryError` (what `torch.cuda.OutOfMemoryError` is, on a CPU build too)."""

from __future__ import annotations

import json
import logging
import pickle
import sys
import traceback
from pathlib import Path

import msgspec
import pytest
import torch
from test_memory import MB, _lm_step

import trainprof
from trainprof.analysis import analyze
from trainprof.capture import memory as capture
from trainprof.trace import load_traces
from trainprof.trace import memory_file as mf

GIB = 2**30
ISSUE_MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.75 GiB. GPU 0 has a total capacity of 139.81 GiB of which "
    "1.20 GiB is free. Including non-PyTorch memory, this process has 138.50 GiB memory in use. Of the "
    "allocated memory 134.47 GiB is allocated by PyTorch, and 2.90 GiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
    "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)


# -- reading the allocator ------------------------------------------------------------------------


def test_the_message_figures_are_parsed():
    figures = capture.parse_message(ISSUE_MESSAGE)
    assert figures.requested_bytes == round(2.75 * GIB)
    assert figures.device_index == 0
    assert figures.device_total_bytes == round(139.81 * GIB)
    assert figures.device_free_bytes == round(1.20 * GIB)
    assert figures.process_bytes == round(138.50 * GIB)
    assert figures.allocated_bytes == round(134.47 * GIB)
    assert figures.reserved_unallocated_bytes == round(2.90 * GIB)
    small = capture.parse_message("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 3 has a total "
                                  "capacity of 79.15 GiB of which 512 bytes is free.")
    assert (small.requested_bytes, small.device_index, small.device_free_bytes) == (20 * 2**20, 3, 512)
    assert capture.parse_message("CUDA out of memory.") == capture.MessageFigures()


def test_what_counts_as_out_of_memory():
    assert torch.cuda.OutOfMemoryError is torch.OutOfMemoryError  # the stand-in is the real type
    assert capture.is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory."))
    assert capture.is_out_of_memory(type("Sub", (torch.OutOfMemoryError,), {})("x"))
    assert capture.is_out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 2 MiB"))
    assert not capture.is_out_of_memory(RuntimeError("shape mismatch"))
    assert not capture.is_out_of_memory(MemoryError())  # the host's memory: not the GPU's
    assert not capture.is_out_of_memory(None)


def test_memory_stats_and_segments_in_a_few_figures():
    stats = {"allocated_bytes.all.current": 70 * GIB, "allocated_bytes.all.peak": 90 * GIB,
             "reserved_bytes.all.current": 100 * GIB, "reserved_bytes.all.peak": 120 * GIB,
             "inactive_split_bytes.all.current": 3 * GIB, "segment.all.current": 41, "num_alloc_retries": 5,
             "num_ooms": 1, "num_device_alloc": 60, "num_device_free": 19, "active.all.current": 7}
    read = capture.allocator_stats(stats)
    assert read == mf.AllocatorStats(allocated_bytes=70 * GIB, allocated_peak_bytes=90 * GIB,
                                     reserved_bytes=100 * GIB, reserved_peak_bytes=120 * GIB,
                                     inactive_split_bytes=3 * GIB, segments=41, num_alloc_retries=5,
                                     num_ooms=1, num_device_alloc=60, num_device_free=19)
    assert capture.allocator_stats({}) is None  # a device never used
    segments = [
        {"device": 0, "total_size": 40 * MB, "allocated_size": 30 * MB, "is_expandable": False,
         "blocks": [{"size": 30 * MB, "state": "active_allocated"}, {"size": 10 * MB, "state": "inactive"}]},
        {"device": 0, "total_size": 20 * MB, "allocated_size": 4 * MB,
         "blocks": [{"size": 4 * MB, "state": "active_allocated"}, {"size": 16 * MB, "state": "inactive"}]},
        {"device": 1, "total_size": 999 * MB, "allocated_size": 0,
         "blocks": [{"size": 999 * MB, "state": "inactive"}]},
    ]
    summary = capture.segment_summary(segments, device=0)
    assert summary == mf.SegmentSummary(count=2, reserved_bytes=60 * MB, allocated_bytes=34 * MB,
                                        largest_free_block_bytes=16 * MB, free_blocks=2, expandable=False,
                                        largest_segment_bytes=[40 * MB, 20 * MB])


def test_the_history_totals_are_anchored_on_the_allocators_totals_now():
    # Before the history: 100 allocated, 200 reserved. Then a segment of 50, two allocations, a free.
    entries = [
        {"action": "segment_alloc", "size": 50, "time_us": 1_000},
        {"action": "alloc", "size": 30, "time_us": 1_010},
        {"action": "alloc", "size": 15, "time_us": 1_020},
        {"action": "free_requested", "size": 30, "time_us": 1_030},
        {"action": "free_completed", "size": 30, "time_us": 1_031},
        {"action": "oom", "size": 999, "time_us": 1_040, "device_free": 0},
        {"action": "alloc", "size": 7},  # untimed: not read
    ]
    series = capture.history_series(entries, allocated_now=115, reserved_now=250)
    assert series.time_us == [1_000, 1_010, 1_020, 1_030, 1_031, 1_040]
    assert series.allocated_bytes == [100, 130, 145, 145, 115, 115]
    assert series.reserved_bytes == [250] * 6
    assert series.oom_time_us == 1_040 and series.entries == 6
    # 5,000 entries: blocks allocated and freed in a random order; the kept points hold the highest
    # and the lowest total a replay of every entry finds.
    generator = torch.Generator().manual_seed(0)
    live, many, total, totals = [], [], 1_000, []
    for i in range(5_000):
        if live and torch.rand(1, generator=generator).item() < 0.5:
            size = live.pop(int(torch.randint(len(live), (1,), generator=generator)))
            many.append({"action": "free_completed", "size": size, "time_us": i})
            total -= size
        else:
            size = int(torch.randint(1, 100, (1,), generator=generator))
            live.append(size)
            many.append({"action": "alloc", "size": size, "time_us": i})
            total += size
        totals.append(total)
    kept = capture.history_series(many, allocated_now=total, reserved_now=0, points=100)
    assert len(kept.time_us) <= 100 and kept.time_us == sorted(kept.time_us)
    assert (max(kept.allocated_bytes), min(kept.allocated_bytes)) == (max(totals), min(totals))
    assert all(totals[t] == held for t, held in zip(kept.time_us, kept.allocated_bytes, strict=True))


class _Block(torch.nn.Module):
    def forward(self, hidden, scale=1.0):
        raise torch.OutOfMemoryError(ISSUE_MESSAGE)


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = _Block()

    def forward(self, input_ids, labels=None, **extra):
        return self.block(input_ids.float())


def test_the_traceback_names_the_users_line_the_call_the_module_and_the_batch():
    model = _Model()
    try:
        model(torch.zeros(16, 2048, dtype=torch.long), labels=torch.zeros(16, 2048, dtype=torch.long),
              mask=torch.ones(16, 2048, dtype=torch.bool))
    except torch.OutOfMemoryError as error:
        call = capture.failing_call(error.__traceback__, lambda path: path == __file__)
    assert call.module == "_Model/_Block"
    assert (call.where.file, call.where.function) == (__file__, "forward")  # the user's innermost frame
    assert call.call.function == "forward" and call.call.line == _Block.forward.__code__.co_firstlineno + 1
    assert capture.source_of(call.call) == "raise torch.OutOfMemoryError(ISSUE_MESSAGE)"
    assert [(i.name, i.shape, i.dtype) for i in call.inputs] == [
        ("input_ids", [16, 2048], "int64"), ("labels", [16, 2048], "int64"), ("mask", [16, 2048], "bool")]


def test_an_error_outside_any_module_reads_the_batch_from_the_users_frame():
    """An error in the backward pass or the optimizer has no module frame: the user's frame has the batch."""
    input_ids = torch.zeros(8, 512, dtype=torch.long)  # noqa: F841 - read from this frame
    try:
        torch.empty(2**62, dtype=torch.uint8)  # the host's allocator refuses it at once
    except RuntimeError as error:
        call = capture.failing_call(error.__traceback__, lambda path: path == __file__)
    assert call.module is None and call.where.function == call.call.function
    assert [(i.name, i.shape, i.dtype) for i in call.inputs] == [("input_ids", [8, 512], "int64")]


def test_the_optimizers_memory_counts_each_storage_once():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Linear(64, 32, bias=False))
    # The second layer's weight is a transposed view of the first's: one storage, counted once.
    model[1].weight = torch.nn.Parameter(model[0].weight.t())
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 32)).sum().backward()
    optimizer.step()
    held = capture.held_by_optimizer(optimizer)
    floats = 4
    elements = 32 * 64 + 64 + 32 * 64  # per parameter: its gradient and Adam's two moments are its own
    assert held.parameters_bytes == (32 * 64 + 64) * floats
    assert held.gradients_bytes == elements * floats
    assert held.optimizer_state_bytes == 2 * elements * floats + 3 * floats  # and a float32 step counter each
    assert capture.held_by_optimizer(optimizer, torch.device("cuda", 0)) == mf.HeldByTraining(0, 0, 0)
    assert capture.held_by_optimizer(object()) is None  # not an optimizer: unknown, not an error


def test_a_second_out_of_memory_while_reading_the_first_does_not_loop(monkeypatch):
    memory = capture.MemoryCapture()
    reads = []

    def read_state(*args):  # the allocator fails again while its state is read
        reads.append(args)
        memory.observe(0, 2 * GIB, 0, 0)
        return None

    monkeypatch.setattr(capture, "read_state", read_state)
    memory.observe(0, 3 * GIB, 0, 0)
    assert len(reads) == 1 and memory._observed.requested_bytes == 3 * GIB
    for _ in range(capture.OBSERVED_STATES + 5):  # a loop that fails allocations every step
        memory.observe(0, GIB, 0, 0)
    assert len(reads) == capture.OBSERVED_STATES
    first, second = torch.OutOfMemoryError(ISSUE_MESSAGE), torch.OutOfMemoryError("CUDA out of memory.")
    assert memory.on_error(first, 5, False, None, Path("."), "w")
    assert memory.on_error(second, 6, False, None, Path("."), "w")  # one, but not recorded again
    assert memory.out_of_memory.steps_ended == 5 and memory.out_of_memory.message == ISSUE_MESSAGE
    capture.watch(memory)
    try:
        capture._on_out_of_memory(0, GIB, 0, 0)  # the process's callback hands it on, never raises
        monkeypatch.setattr(memory, "observe", lambda *a: 1 / 0)
        capture._on_out_of_memory(0, GIB, 0, 0)
    finally:
        capture.watch(None)


# -- the memory file ------------------------------------------------------------------------------


def _error(**changes) -> mf.OutOfMemory:
    fields = dict(
        steps_ended=5, exception="OutOfMemoryError", message=ISSUE_MESSAGE, requested_bytes=3_000 * MB,
        device_index=0, device_total_bytes=10_000 * MB, device_free_bytes=200 * MB, process_bytes=9_700 * MB,
        allocated_bytes=9_000 * MB, reserved_unallocated_bytes=600 * MB,
        where=mf.CodeLine(file="/code/train.py", line=42, function="train"),
        call=mf.CodeLine(file="torch/nn/functional.py", line=3462, function="cross_entropy"),
        module="MyForCausalLM", inputs=[mf.TensorInput(name="input_ids", shape=[16, 2048], dtype="int64")],
        held=mf.HeldByTraining(500 * MB, 500 * MB, 1_000 * MB), trace="synthetic.pt.trace.json",
    )
    fields.update(changes)
    return mf.OutOfMemory(**fields)


def _write_memory_file(folder: Path, **changes) -> Path:
    document = mf.MemoryFile(version=mf.FORMAT_VERSION, worker="synthetic", **changes)
    path = folder / "synthetic.memory.json"
    path.write_bytes(mf.encode(document))
    return path


@pytest.mark.parametrize("damage", [
    b"{not json", b'{"version": 1, "worker": "w", "windows": [{"steps_ended": -1}]}',
    b'{"version": 99, "worker": "w"}',
    b'{"version": 1, "worker": "w", "out_of_memory": {"steps_ended": "5"}}',
    b"[]",
])
def test_a_damaged_memory_file_is_ignored_and_the_trace_still_loads(tmp_path, damage, caplog):
    _lm_step(400 * MB, 600 * MB, 200 * MB).write(tmp_path)
    (tmp_path / "synthetic.memory.json").write_bytes(damage)
    with caplog.at_level(logging.WARNING, logger="trainprof"):
        (trace,) = load_traces(tmp_path)
    assert trace.memory_file is None and "not a trainprof memory file" in caplog.text


def test_the_memory_file_round_trips_and_joins_its_window(tmp_path):
    _lm_step(400 * MB, 600 * MB, 200 * MB).write(tmp_path)
    state = mf.AllocatorState(steps_ended=4, trace="synthetic.pt.trace.json",
                              stats=mf.AllocatorStats(1, 2, 3, 4, num_alloc_retries=2))
    _write_memory_file(tmp_path, windows=[state], out_of_memory=_error())
    (trace,) = load_traces(tmp_path)
    assert trace.memory_file.window_state("synthetic.pt.trace.json") == state
    assert trace.memory_file.out_of_memory_after("synthetic.pt.trace.json") == _error()
    assert trace.memory_file.out_of_memory_after(None) is None


# -- the rules -------------------------------------------------------------------------------------


def test_the_out_of_memory_finding_names_the_holders_the_difference_and_each_fixs_saving(tmp_path):
    # The profiled step: B4 x T512 on a 10 GB device; at its peak 1,000 MB persistent, activations
    # 400 (attention scores) + 2,000 (an MLP) + 600 (log-softmax), temporaries 600 (its gradient).
    # The failing step: B16 x T2048 (4x the batch, 4x the length).
    step = _lm_step(400 * MB, logits=600 * MB, activation=2_000 * MB, device_memory=10_000 * MB,
                    ids_shape=[4, 512])
    step.write(tmp_path)
    _write_memory_file(tmp_path, out_of_memory=_error())
    result = analyze(tmp_path)
    finding = result.findings[0]
    assert finding.kind == "out_of_memory" and finding.severity == "high"
    details = finding.details
    assert (finding.where.file, finding.where.line) == ("/code/train.py", 42)
    assert finding.op == "cross_entropy (functional.py:3462)"
    fixed, linear, scores, logits = 1_000 * MB, 3_200 * MB, 400 * MB, 1_200 * MB
    b, s = 4, 4
    predicted = fixed + b * s * (linear + s * scores)  # scores grow with batch x T^2
    assert details.tokens_ratio == 16 and details.failing_tokens == 16 * 2048
    assert details.predicted_peak_bytes == predicted == 77_800 * MB
    usable = 0.95 * 10_000 * MB
    per_sequence = s * (linear + s * scores) / b  # one sequence of 2,048 tokens
    assert details.largest_batch == int((usable - fixed) // per_sequence) == 1
    # What held the device: the optimizer's tensors as measured, the rest of PyTorch's 9,000 MB as
    # activations and temporaries, of which each family by its share at the profiled peak.
    held = {h.category: (h.bytes, h.how) for h in details.held}
    rest = 9_000 * MB - 2_000 * MB
    assert held["parameters"] == (500 * MB, "measured")
    assert held["optimizer_state"] == (1_000 * MB, "measured")
    assert held["activations_and_temporaries"] == (rest, "measured")
    assert held["logits_loss"] == (pytest.approx(rest * logits / (3_600 * MB), abs=1), "estimated")
    assert held["attention_scores"] == (pytest.approx(rest * scores / (3_600 * MB), abs=1), "estimated")
    assert held["reserved_unallocated"] == (600 * MB, "measured")
    assert held["outside_pytorch"] == (100 * MB, "measured")  # 9,700 - 9,000 - 600
    assert held["other_processes"] == (100 * MB, "measured")  # 10,000 - 200 free - 9,700
    saves = {f.fix: f.saves_bytes for f in details.fixes}
    assert saves == {
        "smaller_micro_batch": pytest.approx(predicted - (fixed + per_sequence), abs=1),  # 16 -> 1
        "fused_attention": pytest.approx(scores * b * s * s, abs=1),
        "activation_checkpointing": pytest.approx((3_000 - 1_600) * MB * b * s, abs=1),
        "fused_linear_cross_entropy": pytest.approx(logits * b * s, abs=1),
        "shard_optimizer_state": pytest.approx(1_000 * MB * 7 / 8, abs=1),
    }  # no expandable segments: the 600 MB cache could not have held the 3,000 MB request
    assert [f.fix for f in details.fixes][0] == "smaller_micro_batch"
    assert "from 16 to 1" in details.fixes[0].words and "16 micro-batches" in details.fixes[0].words
    assert "16x the profiled 2,048" in finding.title


def test_out_of_memory_comes_first_and_names_expandable_segments_when_the_cache_could_serve(tmp_path):
    step = _lm_step(400 * MB, logits=600 * MB, activation=200 * MB, device_memory=10_000 * MB,
                    ids_shape=[4, 512])
    step.write(tmp_path)
    _write_memory_file(tmp_path, out_of_memory=_error(reserved_unallocated_bytes=3_500 * MB, inputs=[]))
    result = analyze(tmp_path)
    assert [f.kind for f in result.findings][0] == "out_of_memory"
    assert len([f for f in result.findings if f.kind == "out_of_memory"]) == 1
    details = result.findings[0].details
    assert details.tokens_ratio is None and details.predicted_peak_bytes is None
    saves = {f.fix: f.saves_bytes for f in details.fixes}
    assert saves["expandable_segments"] == 3_500 * MB
    # Without the failing step's tokens, fixes scale by its activations and temporaries at the error
    # (9,000 - 2,000 MB) over the profiled peak's (1,800 MB).
    assert saves["fused_linear_cross_entropy"] == pytest.approx(1_200 * MB * 7_000 / 1_800, abs=2)


def test_a_failing_step_as_large_as_the_profiled_one_points_away_from_the_batch(tmp_path):
    step = _lm_step(400 * MB, logits=600 * MB, activation=200 * MB, device_memory=10_000 * MB,
                    ids_shape=[4, 512])
    step.write(tmp_path)
    same = [mf.TensorInput(name="input_ids", shape=[4, 512], dtype="int64")]
    _write_memory_file(tmp_path, out_of_memory=_error(inputs=same))
    finding = analyze(tmp_path).findings[0]
    assert finding.details.tokens_ratio == 1 and finding.details.predicted_peak_bytes == 2_800 * MB
    assert "that fits: what grew is not the batch" in finding.title


def test_an_error_no_window_explains_is_reported_alone(tmp_path):
    _write_memory_file(tmp_path, out_of_memory=_error(trace=None, steps_ended=1))
    result = analyze(tmp_path)
    assert result.summary.verdict == "not-profiled" and "step 1" in result.summary.reason
    (finding,) = result.findings
    assert finding.kind == "out_of_memory"
    assert finding.details.held[0].category == "activations_and_temporaries"


def _fragmented(tmp_path: Path, device_mb: int, reserved_mb: int, retries: int = 0, conf: str | None = None):
    step = _lm_step(400 * MB, logits=600 * MB, activation=200 * MB, device_memory=device_mb * MB,
                    reserved=reserved_mb * MB)
    step.write(tmp_path)
    state = mf.AllocatorState(steps_ended=2, trace="synthetic.pt.trace.json",
                              stats=mf.AllocatorStats(0, 0, 0, 0, num_alloc_retries=retries))
    _write_memory_file(tmp_path, windows=[state], alloc_conf=conf)
    return analyze(tmp_path)


@pytest.mark.parametrize(("device_mb", "reserved_mb", "retries", "conf", "fires"), [
    (4_000, 3_500, 0, None, True),  # 3.5 GB reserved for 2.8 GB of tensors: 20% cached, 88% of the device
    (4_000, 3_500, 0, "expandable_segments:True", False),  # already expandable
    (100_000, 3_500, 0, None, False),  # a cache on a device with room to spare
    (100_000, 3_500, 3, None, True),  # ... unless the allocator had to retry
    (3_100, 3_000, 0, None, False),  # 7% cached: rounding and reuse
])
def test_fragmentation_sets_the_peak_only_when_the_reserve_presses(tmp_path, device_mb, reserved_mb, retries,
                                                                   conf, fires):
    result = _fragmented(tmp_path, device_mb, reserved_mb, retries, conf)
    found = [f for f in result.findings if f.kind == "memory_fragmentation"]
    facts = result.traces[0].fragmentation
    assert (facts.reserved_peak_bytes, facts.allocated_peak_bytes) == (reserved_mb * MB, 2_800 * MB)
    assert facts.cached_bytes == (reserved_mb - 2_800) * MB and facts.num_alloc_retries == retries
    assert bool(found) == fires
    if fires:
        assert found[0].details.memory_saved_bytes == (reserved_mb - 2_800) * MB
        assert "expandable_segments:True" in found[0].fix and found[0].gpu_ms_per_step == 0.0


def test_the_allocator_history_is_drawn_over_the_steps(tmp_path):
    _lm_step(400 * MB, 600 * MB, 200 * MB).write(tmp_path)
    series = mf.HistorySeries(time_us=[1_000_000, 1_500_000, 2_000_000], allocated_bytes=[1, 5, 2],
                              reserved_bytes=[8, 8, 8], entries=3, oom_time_us=2_000_000)
    history = mf.MemoryHistory(file="synthetic.memory_history.pickle", max_entries=10,
                               trace="synthetic.pt.trace.json",
                               step_marks=[mf.StepMark(step=2, time_us=1_000_000),
                                           mf.StepMark(step=3, time_us=1_800_000)], series=series)
    _write_memory_file(tmp_path, history=history)
    result = analyze(tmp_path, views=True)
    view = result.traces[0].memory_history
    assert view.t_ms == [0.0, 500.0, 1_000.0] and view.step_marks == {2: 0.0, 3: 800.0}
    assert view.oom_at_ms == 1_000.0
    from trainprof.report.html import render_html

    page = render_html(result)
    assert "Allocator history (3 events" in page and page.count('class="step-mark"') == 2
    assert json.loads(json.dumps(result.to_dict()))["trace"]["traces"][0]["memory_history"]["entries"] == 3


# -- a session whose loop runs out of memory -------------------------------------------------------


class _Growing(torch.nn.Module):
    """An MLP whose forward fails as the allocator would on a batch larger than 16."""

    def __init__(self, error: BaseException):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))
        self.error = error

    def forward(self, x):
        if x.shape[0] > 16:
            raise self.error
        return self.net(x)


def _train_until(log_dir: Path, error: BaseException, fail_at: int, seen: dict) -> None:
    torch.manual_seed(0)
    model = _Growing(error)
    optimizer = torch.optim.Adam(model.parameters())
    with trainprof.session(log_dir, "run", wait=1, warmup=1, active=2, console=False,
                           tensorboard_scalars=False, measure_peaks=False) as sess:
        seen["session"] = sess
        for step in range(8):
            x = torch.randn(64 if step == fail_at else 16, 32)
            try:
                model(x).pow(2).mean().backward()
            except torch.OutOfMemoryError as caught:
                seen["traceback"] = traceback.extract_tb(caught.__traceback__)
                seen["innermost"] = _innermost(caught.__traceback__)
                raise
            optimizer.step()
            optimizer.zero_grad()


def _innermost(tb):
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb


def _out_of_memory_message() -> str:
    """The issue's message without `GPU 0`: on a CPU the optimizer's tensors are counted on every device."""
    return ISSUE_MESSAGE.replace("GPU 0 has", "The device has")


@pytest.mark.parametrize("fail_at", [6, 1])
def test_an_out_of_memory_error_leaves_the_loop_unchanged_and_the_report_complete(tmp_path, fail_at):
    error = torch.OutOfMemoryError(_out_of_memory_message())
    seen: dict = {}
    with pytest.raises(torch.OutOfMemoryError) as raised:
        _train_until(tmp_path, error, fail_at, seen)
    # The very object, its traceback as it was raised (the frames below this test's), nothing added.
    assert raised.value is error and error.args == (_out_of_memory_message(),)
    assert traceback.extract_tb(error.__traceback__)[1:] == seen["traceback"]
    assert _innermost(error.__traceback__) is seen["innermost"]
    assert not hasattr(error, "__notes__") and error.__cause__ is None and error.__context__ is None
    sess = seen["session"]
    run = sess.run_dir
    names = {path.name for path in run.iterdir()}
    assert {"summary.json", "report.md", "report.html", f"{sess.worker}.memory.json"} <= names
    assert not [name for name in names if name.endswith(".tmp")]
    summary = json.loads((run / "summary.json").read_text())
    first = summary["findings"][0]
    assert first["kind"] == "out_of_memory" and first["severity"] == "high"
    assert sess.findings[0].kind == "out_of_memory" and sess.summary.verdict != "not-profiled" or fail_at == 1
    details = first["details"]
    assert details["failing_step"] == fail_at and details["requested_bytes"] == round(2.75 * GIB)
    assert details["failing_inputs"] == [{"name": "x", "shape": [64, 32], "dtype": "float32"}]
    assert first["where"]["function"] == "forward" and details["module"] == "_Growing"
    params = (32 * 64 + 64 + 64 + 1) * 4
    held = {h["category"]: h["bytes"] for h in details["held"]}
    # Adam's moments and step counters after the first step; no gradients: zero_grad() set them to None
    # and the failing step's forward had not reached its backward.
    assert held["parameters"] == params and held["optimizer_state"] == 2 * params + 4 * 4
    assert held["gradients"] == 0
    assert "Out of GPU memory in step" in (run / "report.md").read_text()
    page = (run / "report.html").read_text()
    assert page.rstrip().endswith("</html>") and 'id="oom"' in page
    # trainprof analyze of the folder afterwards says the same.
    again = analyze(run)
    assert again.findings[0].kind == "out_of_memory" and again.findings[0].details.failing_step == fail_at
    if fail_at == 1:  # before a recorded step ended: the error alone, no trace
        assert sess.summary.verdict == "not-profiled"
        assert "ran out of GPU memory in step 1" in sess.summary.reason
        assert not sess.trace_files


def test_a_second_out_of_memory_session_in_the_process_reports_its_own(tmp_path):
    for attempt in range(2):
        error = torch.OutOfMemoryError(_out_of_memory_message())
        with pytest.raises(torch.OutOfMemoryError):
            _train_until(tmp_path / str(attempt), error, 6, seen := {})
        assert seen["session"].findings[0].kind == "out_of_memory"
    assert capture._WATCHED is None  # no session left watching the allocator


def test_other_errors_still_end_the_session_unreported(tmp_path):
    class Boom(RuntimeError):
        pass

    seen: dict = {}
    with pytest.raises(Boom):
        with trainprof.session(tmp_path, "run", console=False, tensorboard_scalars=False) as sess:
            seen["session"] = sess
            raise Boom("not memory")
    assert sess.summary.verdict == "not-profiled" and sess.summary.reason == "the training loop raised"
    assert not (sess.run_dir / "summary.json").exists()


class _FakeDevice:
    """`torch.cuda`'s history and statistics calls on a CPU: a device whose history is a list of
    entries (`history`) and whose recording is switched by `_record_memory_history`."""

    def __init__(self, monkeypatch) -> None:
        self.recording: list = []
        self.history = [{"action": "segment_alloc", "size": 64, "time_us": 5_000_000},
                        {"action": "alloc", "size": 48, "time_us": 5_000_100},
                        {"action": "free_completed", "size": 48, "time_us": 5_000_200}]
        memory = torch.cuda.memory
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        totals = {"allocated_bytes.all.current": 16, "reserved_bytes.all.current": 64}
        monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: totals)
        monkeypatch.setattr(memory, "_record_memory_history", lambda enabled="all", **options:
                            self.recording.append((enabled, options)))
        monkeypatch.setattr(memory, "_snapshot", lambda device=None: {"segments": [],
                                                                       "device_traces": [self.history]})


def test_the_history_records_the_first_window_and_is_written_for_the_viewer(tmp_path, monkeypatch):
    device = _FakeDevice(monkeypatch)
    memory = capture.MemoryCapture(history=True, history_entries=1_000)
    # The session's calls around a window of steps 2-3 (wait 1, warm-up 1, active 2).
    for steps_ended, action in enumerate(["none", "warmup", "record", "save"]):
        memory.follow(action, steps_ended)
    assert device.recording == [("all", {"context": "all", "stacks": "python", "max_entries": 1_000})]
    memory.window_ended(tmp_path, "w", "w.1.pt.trace.json.gz", 4)
    memory.follow("none", 4)
    memory.follow("record", 8)  # a second window: one window's history only
    assert device.recording[1:] == [(None, {})]
    history = memory.history
    assert history.trace == "w.1.pt.trace.json.gz" and [m.step for m in history.step_marks] == [2, 3]
    with open(tmp_path / "w.memory_history.pickle", "rb") as file:
        assert pickle.load(file)["device_traces"] == [device.history]  # our own file, just written
    assert history.series.allocated_bytes == [16, 64, 16]  # anchored on the 16 allocated now
    assert history.series.reserved_bytes == [64, 64, 64]


def test_the_session_follows_its_schedule_with_the_history(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(capture.MemoryCapture, "follow",
                        lambda self, action, steps: calls.append((steps, action)))
    with trainprof.session(tmp_path, "run", wait=1, warmup=1, active=2, console=False,
                           tensorboard_scalars=False, memory_history=True):
        _steps(5)
    assert calls == [(0, "none"), (1, "warmup"), (2, "record"), (3, "save"), (4, "none"), (5, "none")]


def _steps(count: int):
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(count):
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer


def test_memory_history_entries_are_checked_once():
    with pytest.raises(ValueError, match="memory_history_entries"):
        trainprof.session(memory_history_entries=0)
    assert trainprof.session(memory_history=True).config.memory_history


def test_the_memory_file_decodes_what_the_session_writes(tmp_path):
    memory = capture.MemoryCapture()
    memory.on_error(torch.OutOfMemoryError(ISSUE_MESSAGE), 3, True, None, tmp_path, "w")
    written = memory.write(tmp_path, "w", "w.1.pt.trace.json.gz")
    read = mf.decode((tmp_path / "w.memory.json").read_bytes())
    assert read == written and read.out_of_memory.recording
    assert read.out_of_memory.trace == "w.1.pt.trace.json.gz"
    assert msgspec.json.decode((tmp_path / "w.memory.json").read_bytes())["version"] == mf.FORMAT_VERSION
    assert capture.MemoryCapture().write(tmp_path, "v", None) is None  # nothing captured: no file
    assert not (tmp_path / "v.memory.json").exists()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
