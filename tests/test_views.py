"""The views report.html draws (`trainprof.analysis.views`), checked against the trace they come from:
the timeline keeps every GPU microsecond and every idle one with its cause, the op table's self and
total times add up as `key_averages()`'s do, the flame graph is a tree whose nodes never outgrow
their parents. (The memory chart draws the memory analysis' series: tests/test_memory.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from trainprof.analysis import analyze
from trainprof.analysis import timeline_view as timeline_view_module
from trainprof.analysis.attribution import attribute_kernels
from trainprof.analysis.causes import Cause
from trainprof.analysis.idle import idle_breakdown
from trainprof.analysis.memory import memory_profile
from trainprof.analysis.ops import op_table
from trainprof.analysis.syncs import find_sync_points
from trainprof.analysis.thresholds import TIMELINE_EVENTS_PER_LANE, Thresholds
from trainprof.analysis.timeline import build_timeline
from trainprof.analysis.timeline_view import kernel_category, timeline_view
from trainprof.trace import load_traces
from trainprof.trace.model import FRAME_CATEGORIES


@pytest.fixture(scope="module")
def pathologies(fixtures_dir):
    """gpt2_pathologies (launch-bound, syncs, stacks and memory on): its analysis with views, and
    the trace's own timeline."""
    traces = load_traces(fixtures_dir / "traces" / "gpt2_pathologies")
    analysis = analyze(traces, views=True)
    return analysis, analysis.traces[0].views, build_timeline(traces[0])


def _gpu_events_in(timeline, start_us: float, end_us: float) -> tuple[float, int]:
    """Total duration and count of kernels, copies and memsets overlapping [start, end)."""
    trace = timeline.trace
    total, count = 0.0, 0
    for category in ("kernel", "gpu_memcpy", "gpu_memset"):
        table = trace.events[category]
        seen = (table.end_us > start_us) & (table.start_us < end_us)
        total += float(table.dur_us[seen].sum())
        count += int(seen.sum())
    return total, count


def test_timeline_keeps_every_gpu_event_and_every_idle_microsecond(pathologies):
    analysis, views, timeline = pathologies
    view = views.timeline
    busy_us, count = _gpu_events_in(timeline, view.origin_us, view.origin_us + view.end_us)
    assert sum(float(lane.busy_us.sum()) for lane in view.lanes) == pytest.approx(busy_us)
    assert sum(int(lane.count.sum()) for lane in view.lanes) == count
    # The idle lane holds all the analysis's idle time (its causes: the test below).
    idle = view.idle
    total_idle_ms = sum(step.times.gpu_idle_ms for step in analysis.steps)
    assert float(idle.idle_us.sum()) / 1e3 == pytest.approx(total_idle_ms, abs=0.01)
    # Blocks are sorted, inside the view, and the sync marks are the analysis's sync points.
    for lane in view.lanes:
        assert np.all(np.diff(lane.start_us) >= 0) and len(lane.start_us) <= TIMELINE_EVENTS_PER_LANE
        assert np.all(lane.busy_us <= lane.dur_us + 1e-6)
    assert len(view.syncs.at_us) == sum(step.syncs.count for step in analysis.steps)
    calls = {view.strings[i] for i in view.syncs.call.tolist()}
    assert calls and all(call.startswith("cuda") for call in calls) and all(view.syncs.blocked_us >= 0)
    assert any(view.strings[i].startswith("aten::item") for i in view.syncs.op.tolist())


def test_idle_lane_has_each_causes_time(fixtures_dir):
    analysis = analyze(fixtures_dir / "busy" / "llama_swap" / "bare", views=True)
    idle = analysis.traces[0].views.timeline.idle
    assert idle.count.max() == 1  # under the lane limit: every run drawn as it is
    for cause in Cause:
        steady = (idle.cause == cause) & ~idle.one_off
        assert float(idle.idle_us[steady].sum()) / 1e3 == pytest.approx(
            sum(step.idle.costs[cause] for step in analysis.steps), abs=1e-3)
    assert float(idle.idle_us[idle.one_off].sum()) / 1e3 == pytest.approx(
        sum(step.idle.one_off_ms for step in analysis.steps), abs=1e-3)
    # Runs of one cause that touch are one run: neighbours differ in cause or leave a gap.
    same = (idle.cause[1:] == idle.cause[:-1]) & (idle.one_off[1:] == idle.one_off[:-1])
    touching = idle.start_us[1:] <= idle.start_us[:-1] + idle.dur_us[:-1] + 1e-3
    assert not np.any(same & touching)


def test_timeline_joins_the_closest_events_past_the_lane_limit(pathologies, monkeypatch):
    analysis, views, timeline = pathologies
    limit = 50
    monkeypatch.setattr(timeline_view_module, "TIMELINE_EVENTS_PER_LANE", limit)
    owners = attribute_kernels(timeline)
    idle = idle_breakdown(timeline, Thresholds())
    small = timeline_view(timeline, owners, idle.pieces, find_sync_points(timeline))
    lane, full = small.lanes[0], views.timeline.lanes[0]
    assert len(lane.start_us) == limit < len(full.start_us)
    assert float(lane.busy_us.sum()) == pytest.approx(float(full.busy_us.sum()))
    assert int(lane.count.sum()) == int(full.count.sum())
    # The gaps kept between blocks are the largest gaps of the full lane.
    kept_gaps = np.sort(lane.start_us[1:] - (lane.start_us + lane.dur_us)[:-1])
    ends = np.maximum.accumulate(full.start_us + full.dur_us)
    all_gaps = np.sort(full.start_us[1:] - ends[:-1])
    assert np.allclose(kept_gaps, all_gaps[-(limit - 1):])
    # A joined block is named by its longest event.
    longest = int(np.argmax(full.busy_us))
    block = int(np.searchsorted(lane.start_us, full.start_us[longest], side="right")) - 1
    assert small.strings[lane.name[block]] == views.timeline.strings[full.name[longest]]
    assert len(small.idle.start_us) == limit


def test_op_table_adds_up_as_key_averages(pathologies):
    _, views, timeline = pathologies
    rows = {row.op: row for row in views.ops}
    assert all(row.cpu_self_ms <= row.cpu_total_ms + 1e-6 and row.gpu_self_ms <= row.gpu_total_ms + 1e-6
               for row in rows.values())
    # Every op's own host time, summed, is the time of the outermost ops (nothing counted twice).
    trace = timeline.trace
    op_code = FRAME_CATEGORIES.index("cpu_op")
    outermost_us = 0.0
    for thread in np.unique(trace.events["cpu_op"].thread).tolist():
        frames = trace.frames(thread)
        is_op = frames.category_codes == op_code
        counted = is_op & (timeline.step_of(frames.starts) >= 0)
        top = counted & (frames.enclosing_op(frames.parents) < 0)
        outermost_us += float((frames.ends - frames.starts)[top].sum())
    assert len(views.ops) < 150  # every op is in the table: the sums below are complete
    assert sum(row.cpu_self_ms for row in rows.values()) == pytest.approx(outermost_us / 1e3, rel=1e-3)
    # Own GPU time, summed, is the GPU time launched inside an op in the steps.
    kernel_ms = sum(row.gpu_self_ms for row in rows.values())
    in_steps = timeline.kernel_step >= 0
    assert 0 < kernel_ms <= float(timeline.kernels.dur_us[in_steps].sum()) / 1e3 * 1.5
    # A parent op's total holds its children's: aten::linear's GPU time is its addmm/mm's.
    assert rows["aten::linear"].gpu_total_ms >= rows["aten::linear"].gpu_self_ms
    assert rows["aten::addmm"].gpu_self_ms > 0 and rows["aten::addmm"].calls > 0


def test_kernel_table_has_every_kernel_name_whole(pathologies):
    analysis, views, timeline = pathologies
    kernels = views.kernels
    in_steps = timeline.kernel_step >= 0
    names = {timeline.trace.names[i] for i in np.unique(timeline.kernels.name[in_steps]).tolist()}
    assert {row.name for row in kernels} == names  # full names, each once
    assert sum(row.total_ms for row in kernels) == pytest.approx(
        float(timeline.kernels.dur_us[in_steps].sum()) / 1e3, rel=1e-4)
    assert sum(row.pct for row in kernels) == pytest.approx(100, abs=0.1)
    assert [row.total_ms for row in kernels] == sorted((row.total_ms for row in kernels), reverse=True)
    assert any(row.op == "aten::mm" for row in kernels) and all(row.category for row in kernels)


@pytest.mark.parametrize(("name", "category"), [
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128>>(Flash_fwd_params)",
     "attention_flash"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm_bf16_fp16"),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "gemm"),  # its dtype is its op's
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int, ...)",
     "elementwise"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>(float*, float const*, int)",
     "reduction"),
    ("triton_poi_fused_add_mul_0", "elementwise"),
    ("some_custom_kernel", "other"),
])
def test_kernel_category_by_name_is_the_kernel_class(name, category):
    assert kernel_category(name) == category


@pytest.fixture(scope="module")
def eager_attention(fixtures_dir):
    """busy/gpt2_attention/eager (GPT-2 attention as matmul + softmax): its analysis with views."""
    traces = load_traces(fixtures_dir / "busy" / "gpt2_attention" / "eager")
    analysis = analyze(traces, views=True)
    return analysis, build_timeline(traces[0])


def test_timeline_and_kernel_table_colour_kernels_by_the_busy_analysis_classes(eager_attention):
    """The classes no kernel name says (unfused attention: the matmuls and softmax over [T, T]
    scores, found from their ops' shapes) colour the timeline and fill the kernel table, and agree
    with the kernel-class table of the same analysis."""
    analysis, timeline = eager_attention
    trace = analysis.traces[0]
    view = trace.views.timeline
    drawn = {view.categories[code] for lane in view.lanes for code in np.unique(lane.category).tolist()}
    classes = {row.kernel_class for row in trace.busy.classes}
    assert "attention_unfused" in classes and "attention_unfused" in drawn
    named = {kernel_category(name) for name in timeline.trace.names}
    assert "attention_unfused" not in named  # no name says it: the category is the busy analysis'
    table = {row.category for row in trace.views.kernels}
    assert "attention_unfused" in table and table <= set(view.categories)


def test_flame_graph_is_a_tree_of_host_and_gpu_time(pathologies):
    analysis, views, timeline = pathologies
    flame = views.flame
    parent = flame.parent
    assert parent[0] == -1 and np.all(parent[1:] < np.arange(1, len(parent)))  # parents come first
    inner = parent >= 0
    assert np.all(flame.host_us[inner] <= flame.host_us[parent[inner]] + 1e-6)
    assert np.all(flame.gpu_us[inner] <= flame.gpu_us[parent[inner]] + 1e-6)
    threads = np.flatnonzero(parent == 0)
    assert flame.host_us[0] == pytest.approx(flame.host_us[threads].sum())
    assert flame.strings[flame.name[threads[0]]].endswith("(the loop)")
    # The GPU time of the kernels launched in the steps is all under the root.
    in_steps = timeline.kernel_step >= 0
    kernel_us = float(timeline.kernels.dur_us[in_steps].sum())
    assert kernel_us <= flame.gpu_us[0] <= kernel_us * 1.5  # plus copies and memsets
    # Python frames are there (the trace has stacks), merged by path: no two siblings share a name.
    names = [flame.strings[i] for i in flame.name]
    assert any(".py(" in name for name in names) and not any(n.startswith("ProfilerStep#") for n in names)
    pairs = list(zip(parent.tolist(), flame.name.tolist(), strict=True))
    assert len(pairs) == len(set(pairs))


def test_views_only_when_asked_and_absent_from_the_json(fixtures_dir):
    plain = analyze(fixtures_dir / "traces" / "gpt2_clean")
    assert all(trace.views is None for trace in plain.traces)
    assert "views" not in plain.to_dict()["trace"]["traces"][0]


def test_trace_without_memory_or_stacks_has_no_memory_chart(fixtures_dir):
    traces = load_traces(fixtures_dir / "traces" / "ddp_straggler")  # no memory, no stacks
    timeline = build_timeline(traces[0])
    assert memory_profile(timeline) is None
    rows = op_table(timeline)
    assert rows and all(row.calls > 0 for row in rows)
