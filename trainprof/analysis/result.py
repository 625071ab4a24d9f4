"""The analysis result as typed records, and its JSON form (`summary.json`, `trainprof analyze --json`).

This module is the top of the result: `Analysis` and the records that name every analysis module's
types (`Step`, `TraceInfo`, `Summary`). The base records every analysis module builds on (`Record`,
`Where`, `Via`, `Finding`, `plain`) live in `trainprof.analysis.records`, which imports no analysis
module; they are importable from here too.

Each record is built by the module that answers its question (`Step.times` by `steps`, `Verdict`
by `verdict`, a finding's details by the module that finds it); `analysis/core.py` composes them
into an `Analysis`. Records are msgspec Structs: built in C, so the ~40 record classes cost no
import time (a dataclass compiles its methods with `exec`, ~1 ms each) and instances build faster.
Each record writes its own JSON form (`to_dict()`), under the key names documented here.

JSON (`schema_version` 2: `mfu_pct` is against the datasheet's dense peak since 2; 1 read it against
the achievable one, now `mfu_achievable_pct`)
-------------------------
Its JSON Schema, generated from the types of `trainprof.analysis.schema`: docs/schema/analysis.schema.json.
Units are in the names (`_ms`, `_us`, `_bytes`, `_pct` out of 100); `_per_step` is a mean over the
profiled steps; null is unknown or not applicable. `SCHEMA_VERSION` changes when a field is renamed,
removed or changes meaning; new fields may appear without it.

    {"schema_version": 2, "trace": {...}, "steps": [...], "findings": [...]}

trace: `files` (the trace files analysed), `traces` (one per file: one window of one process),
`ranks` (with more than one rank: `rank`, `step_ms`, `comm_ms`, `non_comm_ms` per step,
`step_ms_by_step`, `comm_exposed_ms`, `verdict` (judged again on the rank's waits for later
ranks measured across ranks: `rank-wait-bound` where they hold its step), `last_arrival_pct`,
`waited_ms_per_step`, `exposed_wait_ms_per_step`, `compute_ms` (its compute per step, as
traces[].work), `unprofiled_late_ms` (how much later than the other ranks it reaches its first
forward in un-profiled steps; null without a session's timing), `top_finding` (its own costliest
finding as `[severity] title`, from a session's rank: report.ranks.md lists them; else null);
`distributed.RankRow`),
`step_count` (distinct step numbers),
`summary`, `cross_rank` (null with one rank).

trace.cross_rank (`distributed.CrossRank`): `ranks` (as trace.ranks), `step_skew_ms`,
`step_skew_pct`, `straggler_rank` (only for a straggler finding of `high` or `medium`),
`straggler_doing` (what made it late, in words), `collectives` (by op across ranks, bus bandwidth
from transfer times: as communication.ops), `matched` (`[{step, index, op, bytes, ranks,
transfer_us, busbw_gbps, last_rank, max_wait_us}]`, the longest waits first). A session's rank 0
writes the same object from the ranks' gathered summaries into `summary.ranks.json`:
`{schema_version, ranks_reported, world_size, missing_ranks, cross_rank, findings}`.

trace.summary (`Summary`): `verdict` (the traces' most common verdict, or `straggler: rank R`),
`verdict_by_trace` (`rank R`, else the worker -> its verdict), `mean_step_ms`, `gpu_busy_pct`
(time-weighted: GPU busy time over step time), `syncs_per_step`, `kernels_per_step`,
`peak_memory_bytes`, `straggler_rank`, `comm_ms_per_step`, `comm_exposed_ms_per_step`,
`comm_hidden_pct` (null when no trace communicates), `thresholds_overridden` (name -> value the
caller set), `idle_ms_per_step` (GPU-idle ms per step over every step, by cause as in the step rows,
steady-state, and `one_off`: with `gpu_busy_pct`, where the step went; empty when no trace has GPU
work; `idle_step_pct`: the same in % of `mean_step_ms`), `gpu_step_ms` (the step as the GPU runs it:
`gpu_busy.step_ms`, time-weighted), `mfu_pct`
(against the datasheet's dense peak of `mfu_dtype`, `mfu_peak_tflops`), `mfu_achievable_pct`
(against the achievable peak beside it, `mfu_achievable_tflops`),
`mfu_dtype`, `mfu_flops_known_pct`, `peaks_source`, `peaks_label` (the source in a few words: `H200
(measured)`, `H100 SXM datasheet`) (absent without GPU work; `mfu_pct`
null without FLOPs or peaks, or when the FLOPs it counts are those of less than
`mfu_min_flops_known_share` of the compute time: `mfu_flops_known_pct`), `unprofiled_step_ms`
and `profiler_slowdown_pct` (the session's un-profiled step and how much longer the recorded ones
are, in % of it; null when no trace has un-profiled steps beside it), `unprofiled_gpu_busy_pct`
(the recorded GPU busy time over that step; null likewise), `verdict_caveat` (null, or in
words: the profiler's estimated host cost could have made the verdict, and how to confirm),
`judged_step_ms` and `judged_step_basis` (the step every severity is judged against and the
headline shows, `traces[].step_basis`, weighted by steps: `unprofiled` where the profiler slowed the
recorded steps (`gpu_busy`: the recorded GPU busy time, where those were timed shorter), else `gpu`
(the step as the GPU ran it) with GPU work, else `window`), `one_off_left_out_pct` (the share of the
recorded steps' time one-off costs left the GPU idle, which the verdict leaves out; null under
`one_off_named_share`).

trace.traces[] (`TraceInfo`): `file`, `worker`, `rank`, `window` (which profiling window of its
process: 0, 1, ...), `device` (the GPU's name), `steps` (step
numbers), `has_step_annotations` (steps from `ProfilerStep#N` ranges), `sync_sites_file`,
`sync_sites_matched` (sync points given their line by captured sites), `verdict`,
`peak_memory_bytes`, `launch`, `gpu_idle_holders`, `gpu_idle_host_functions`, `gpu_idle_one_off`,
`compile`, `memory`, `communication`, `gpu_busy`, `profiler`, `step_basis`, `work`, `profiler_estimate`,
`headroom`, `fragmentation`, `memory_history`, `copies`, `attention`, `recompute`.
- step_basis (`step_basis.StepBasis`; the step that judges the trace): `window_ms` (the host's step
  window), `gpu_ms` (the step as the GPU ran it; null without GPU work), `unprofiled_ms` (null without
  the session's un-profiled steps), `judged_ms`, `judged_by` (which of them judges: `window`, `gpu`,
  `unprofiled` or `gpu_busy`), `why`, `unprofiled_idle_ms` and `idle_kept` (where the profiler slowed
  the steps: the most GPU idle an un-profiled step holds, and the share of each GPU-idle finding's
  recorded gain it keeps).
- profiler_estimate (`profiler_overhead.ProfilerHostEstimate`; null with un-profiled steps or no GPU
  work): `ops_per_step`, `python_calls_per_step`, `options` (`stack`, `shapes`, `none`),
  `added_ms_per_step`, `gpu_busy_pct_without`, `could_be_gpu_bound`.
- headroom (`headroom.Headroom`; null without the memory peak's breakdown or the device's memory):
  `device_bytes`, `usable_bytes` (less `headroom_reserve_share`), `fixed_bytes` (persistent,
  gradients, optimizer state at the peak), `scaling_bytes` (activations and temporaries),
  `attention_bytes` (of those, unfused attention's scores: they grow with the square of the
  length), `tokens` (`{step, shape, tokens, batch, seq_len, op}`: the ids the step's embedding lookup
  read; null without one), `bytes_per_token`, `fits_times` (how many times the step's tokens fit),
  `largest_batch` (at the same length), `longest_seq_len` (at the same batch).
- fragmentation (`fragmentation.Fragmentation`; null without `Total Reserved` in the trace):
  `allocated_peak_bytes`, `reserved_peak_bytes`, `cached_bytes` (the difference), `cached_pct` (of
  the reserve), `device_bytes`, `reserved_device_pct`, and from the session's memory file (else null)
  `num_alloc_retries`, `num_ooms`, `segments`, `inactive_split_bytes`, `largest_free_block_bytes`,
  `expandable_segments`, `alloc_conf`.
- memory_history (`memory.HistoryView`; null unless the session recorded it): `file` (the pickle for
  PyTorch's memory viewer), `t_ms` (from the first step mark), `allocated_bytes`, `reserved_bytes`,
  `step_marks` (step -> ms where it began), `oom_at_ms`, `entries`.
- copies (`copies.CopyBreakdown`; null without copy-class kernels): the copy-and-cast class by what
  makes each kernel: `gpu_ms_per_step`, `forward_passes_per_step` (how often each weight is cast
  in a step; null without autocast weight casts), `rows` (`[{kind, label, gpu_ms_per_step,
  calls_per_step, class_pct, op_chain, module, user_line}]`, most time first; `kind` one of
  `copies.COPY_KINDS`' keys).
- attention (`[attention.AttentionSite]`): each fused attention call site (a module's calls of one
  backend): `module`, `backend` (cudnn, flash, memory-efficient, fused (other)), `calls_per_step`,
  `gpu_ms_per_step` (forward and backward kernels), `prep_ms_per_step` (SDPA's other kernels),
  `tflop_per_step`, `achieved_tflops`, `query_shape`, `key_shape`, `dtype`, `mask_shape`,
  `mask_dtype`, `is_causal`, `dropout_p` (null where not recorded), `why_not` (what keeps each faster
  backend out, in words).
- recompute (`recompute.Recomputation`; null without a recomputed forward): `gpu_ms_per_step`,
  `kernels_per_step`, `segments_per_step` (backward nodes that recomputed: about one per
  checkpointed layer), `modules`, `checkpoint_frames`, and with memory recorded `held_bytes_per_step`,
  `largest_segment_bytes`, `peak_bytes`, `device_bytes`, `limit_bytes`, `peak_without_bytes`,
  `segments_that_fit`.
- work (`rank_work.RankWork`; null for a trace of no rank that does not communicate): what ranks are
  compared on, per step: `compute_ms_per_step` (GPU kernels other than communication; a CPU-only
  trace's ops), `kernels_per_step`, `gflop_per_step` (matrix products and attention from recorded
  shapes; null without shapes), `ops` (`[{op, shapes, calls_per_step, gflop_per_step}]`), `host`
  (the loop thread's time by one-rank cause: `[{cause, event, ms_per_step, long_ms_per_step,
  longest_ms}]`), `on_gpu`, `unprofiled_pre_forward_ms` and `unprofiled_step_ms` (medians of a
  session's un-profiled steps; null without them).
- profiler (`profiler_cost.ProfilerCost`; null without the session's un-profiled steps):
  `unprofiled_step_ms` (their median), `unprofiled_steps`, `timing` (how the session timed them:
  `cuda_events`, `host`, or null), `recorded_step_ms` (the host's step window, or the step as the
  GPU ran it where that is longer), `slowdown_pct`, `gpu_busy_ms_per_step`,
  `unprofiled_gpu_busy_pct`, `unprofiled_idle_ms_per_step` (the most GPU idle an un-profiled step
  can hold), `slowed` (the verdict and the findings are judged on the
  un-profiled step: `profiler_slowdown_min_share`).
- verdict (`verdict.Verdict`): `verdict` (gpu-bound, communication-bound, launch-bound, sync-bound,
  blocking-call-bound, warm-up-bound, input-bound, host-bound, rank-wait-bound, mixed, unknown or
  cpu-only),
  `cause` (the GPU-idle cause behind a cause verdict, else null), `why`, `fix`, `gpu_busy_pct`,
  `gpu_idle_ms_per_step`, `idle_ms_per_step` (cause -> steady-state ms), `idle_one_off_ms_per_step`,
  `idle_profiler_ms_per_step`, `idle_launch_ms_per_step`, `idle_sync_ms_per_step`,
  `idle_host_ms_per_step` (host and unknown), `ranked` (`[{verdict, idle_ms_per_step}]`, the cause
  groups with idle time, largest first), `step_ms`, `comm_ms_per_step`, `kernels_per_step`,
  `tiny_kernel_pct`. A cpu-only verdict has only `verdict`, `gpu_busy_pct`, `cause`, `why` and
  the last four.
- launch (`launch.LaunchTotals`): `tiny_kernel_count`, `kernel_count`, `graph_replay_kernel_count`,
  `eager_kernel_count`, `median_launch_us`, `median_kernel_us`, `regions` (the owners of the most
  tiny kernels: `[{function, module, file, line, tiny_kernels, summary, top_ops: [{op,
  tiny_kernels}]}]`, function null for the kernels no owner was found for),
  `unowned_tiny_kernel_count`.
- gpu_idle_holders and gpu_idle_one_off (`idle.IdleHolder`): `[{cause, event, source, op, idle_ms,
  idle_ms_per_step}]`, what decided a share of GPU-idle time (`source`: `runtime call` or `frame`);
  one-off holders also have `steps`.
- gpu_idle_host_functions (`idle.HostFunction`): `[{file, function, code, idle_ms_per_step,
  called_from, stack}]`, `code` user or library.
- compile (`compile.CompileStats`, null without torch.compile): `compile_ms_per_step`,
  `compile_gpu_idle_ms_per_step`, `steps_compiling`, `recompiles_every_step`, `compile_ids`
  (`"F/C"`: frame F's compilation C), `compiled_regions_per_step`, `compiled_frames`, `graph_breaks`
  (null: unknown), `graph_break_sites`, `graph_break_reasons` (reason -> count, from the session's
  live counters), `eager_gap_gpu_idle_ms_per_step`.
- memory (`memory.MemoryProfile`, null without `profile_memory` or block sizes): `peak_bytes`,
  `peak_step`, `peak_at_ms` (from the trace's first step), `by_category` (bytes at the peak:
  `persistent`, `activations`, `gradients`, `optimizer_state`, `temporaries`), `by_family` (bytes at
  the peak: `logits_loss`, `attention_scores`), `largest` (`[{bytes, category, family, op, module,
  phase, allocated_at_ms, python, user}]`, `user` a `where` or null), `series` (`{t_ms,
  allocated_bytes, by_category: {category: [bytes]}, reserved_bytes}`, at most 400 points: every
  event's, or the lowest and highest total of each of 200 equal slices of the events, so the peak
  and the valleys are drawn; report.html plots it; `reserved_bytes` null when the trace has no
  `Total Reserved`), `reserved_peak_bytes` (the largest reserved total inside the steps, or null),
  `activations_by_module` (`[{module, bytes}]`: the activations alive at the peak by the module
  class path that made them, largest first).
- communication (`collectives.CommTotals`, null without any): `on_host` (gloo on a trace with no
  GPU work), `comm_ms_per_step`, `exposed_ms_per_step`, `hidden_pct`, `collectives_per_step`,
  `visible_gpus`, `framework` (DDP, FSDP2, FSDP, DeepSpeed, Megatron, DeepEP or null), `ops`
  (`[{op, library, group_size, calls_per_step, median_bytes, ms_per_step, exposed_ms_per_step,
  busbw_gbps, link: {kind, gbps, source, assumed}, link_pct}]`; one rank's bus bandwidth is its
  best call's, `collectives.collective_stats`).
- gpu_busy (`busy.BusyBreakdown`; null without GPU work): where the busy time goes. `step_ms` (mean
  step as the GPU runs it: the longest of the host window, the span of the step's kernels and their
  summed time), `window_ms` (the host's), `kernel_ms_per_step`, `model_tflop_per_step` (GEMM and
  attention FLOPs from recorded shapes, convolutions' where `with_flops` recorded them), `mfu_pct`
  (those FLOPs at their dtype's datasheet dense peak over `step_ms`, or over the un-profiled step
  where `profiler.slowed`; null when the kernels whose FLOPs are known
  hold less than `mfu_min_flops_known_share` of the compute time), `mfu_achievable_pct` (the same
  at the achievable peaks), `mfu_dtype`, `mfu_peak_tflops`, `mfu_achievable_tflops`, `flops_known_pct`
  (that share: the time of the FLOP-bound classes but unfused attention, and of `other`, whose
  FLOPs are counted), `peaks` (`peaks.DevicePeaks`:
  `{device, source: measured|table, detail, matmul_tflops: {fp32, tf32, bf16, fp16, fp8}, copy_tb_s,
  short_label, datasheet_tflops, datasheet_tb_s, raised}`: the achievable rates (measured, raised to
  the trace's best kernels: `raised`) and the datasheet's),
  `classes` (`[{kernel_class, label, kernels_per_step, gpu_ms_per_step, step_pct, tflop_per_step,
  achieved_tflops, gbyte_per_step, achieved_tb_s, peak_pct, known_pct}]`, most time first;
  `kernel_class` one of `kernel_classes.KernelClass`'s keys: gemm_fp32, gemm_tf32, gemm_bf16_fp16,
  gemm_fp8, gemm, attention_flash, attention_mem_efficient, attention_cudnn, attention_fused,
  attention_unfused, convolution, norm, elementwise, reduction, copy, optimizer, communication,
  other; `peak_pct` of the dtype's achievable matmul peak for FLOP classes, of the achievable copy
  bandwidth for byte classes, never above 100 (work faster than the datasheet allows is unknown,
  and the best kernel raises the achievable peak); `known_pct` the share of the class's time whose
  FLOPs or bytes are known; rates null below `throughput_min_known_share`), `modules`
  (`[{module, path, gpu_ms_per_step, step_pct, top_class, achieved_tflops, flops_peak_pct,
  achieved_tb_s, bytes_peak_pct}]`), `steps` (`[{step, window_ms, kernel_span_ms, kernel_ms, step_ms,
  model_tflop, mfu_pct, mfu_achievable_pct}]`).

steps[] (`Step`): one flat row per step of each trace, in this order:
- `step` (its number), `rank`, `start_ms` (from the trace's first step), `duration_ms`,
  `gpu_busy_ms`, `gpu_busy_pct`, `gpu_idle_ms` (null when the trace has no GPU work), `kernel_ms`,
  `comm_ms`, `memcpy_ms`, `memset_ms`, `kernel_count`, `kernels_launched_before_trace`,
  `comm_kernel_count`, `cpu_op_ms`, `cuda_runtime_ms`, `launch_count`, `launch_ms` (`steps.StepTimes`);
- `sync_count`, `sync_blocked_ms` (`syncs.StepSyncs`);
- `tiny_kernel_count`, `tiny_kernel_pct`, `median_kernel_us`, `graph_replay_kernel_count`,
  `graph_launch_count`, `graph_launch_ms` (`launch.StepLaunch`);
- `idle_<cause>_ms` for each `causes.Cause` in order (launch, sync, blocking, warmup, input, host,
  comm, unknown, profiler: steady-state), `idle_one_off_ms`, `idle_gap_count`; absent when the
  trace has no GPU work; the causes and one-off add up to `gpu_idle_ms` (`idle.StepIdle`);
- `peak_memory_bytes` (null without `profile_memory`);
- `comm_exposed_ms`, `comm_hidden_pct` (null without communication) (`overlap.StepComm`).

findings[] (`Finding`), most severe first; within a severity steady-state before one-off ones, then
the most GPU time at stake, then the most cost (`severity.finding_order`): `kind`, `title`,
`severity` (high, medium, low, info), `op`, `where` (`{file, line, function}` of the user's code),
`via` (`{file, line, function, library, version}` of the library frame that made the call, or null),
`cause` (in words), `count` and `per_step` (`count` over the steps), with `count_of` (what it
counts, in words: `kernels`; null where the count says nothing a reader needs), `cost_ms` with
`cost_of` (what it measures and over what, in words: `ms of CPU time blocked in the syncs, over the
recorded steps`; null where it is no time or the gain again: `figures.FIGURES`), `fix`, `rank`,
`gpu_ms_per_step` (the ms of GPU time per step the fix could win back, which sets the severity
against the trace's judged step, `traces[].step_basis.judged_ms`: high from 20% of it, medium from
5%; 0 for one-off, profiler-overhead and memory findings; null where not estimated, the info kinds),
`gpu_step_pct` (that time in % of the judged step; null without it, and for memory, one-off and
profiler findings: `figures.Figures.gain`),
`window` (which profiling window of its process it is from: 0, 1, ...;
null for findings over all traces), `details`, by kind (a `verdict` there is its trace's verdict, as
in `traces[].verdict`):
- sync_point (`syncs.SyncDetails`): `sync_kind`, `cause` (a `syncs.CAUSES` key), `catalog_site`,
  `why`, `op_chain`, `runtime_calls`, `copies`, `gpu_idle_after_ms`, `cost_pct_of_step_time`,
  `occurrences` (`[{step, at_ms, blocked_ms, gpu_idle_after_ms}]`).
- host_bound (`idle_findings.HostBoundDetails`): `idle_host_ms_per_step`, `idle_named_ms_per_step`,
  `idle_unnamed_ms_per_step`, `idle_host_pct`, `functions` (as gpu_idle_host_functions), `verdict`.
- input_bound, blocking_runtime_call, recurring_warmup, communication_wait, profiler_overhead
  (`idle_findings.IdleCauseDetails`): `idle_ms_per_step`, `idle_pct`, `holders`, `verdict`,
  `allocator` (blocking_runtime_call only, else null: `allocator.AllocatorCalls`, `{python_call,
  where, api_steps, free_calls_per_step, alloc_calls_per_step, free_ms_per_step, alloc_ms_per_step,
  gpu_idle_ms_per_step}`, the Python call behind the allocator's blocking calls).
- one_off (`idle_findings.OneOffDetails`): `steps`, `event`, `op`, `idle_ms`.
- profiler_slowdown (`profiler_cost.ProfilerCost`): as `traces[].profiler`.
- launch_overhead (`launch.LaunchDetails`): `fixes`, `tiny_kernel_pct`, `kernels_per_step`,
  `graph_replay_kernels_per_step`, `graph_launch_ms_per_step`, `launch_ms_per_step`,
  `median_launch_us`, `median_kernel_us`, `gpu_idle_while_launching_ms_per_step`, `regions`,
  `verdict`.
- top_kernels (`kernels.TopKernelsDetails`): `kernels` (`[{name, count, total_ms, mean_us, pct}]`),
  `ops` (`[{op, kernels, total_ms, pct}]`), `top_kernel`, `kernel_ms_per_step`.
- module_costs (`modules.ModuleCostsDetails`): `modules` and `functions` (`[{module, path, function,
  file, line, phases, instances, kernels_per_step, forward_kernels_per_step,
  backward_kernels_per_step, optimizer_kernels_per_step, gpu_ms_per_step, tiny_kernels_per_step,
  tiny_kernel_pct, top_ops, summary}]`), `owned_kernel_pct`, `owned_tiny_kernel_pct`,
  `unowned_kernels_per_step`.
- cpu_only (`host_ops.CpuOnlyDetails`): `top_host_ops` (`[{op, count, total_ms, pct_of_step}]`),
  `step_ms`.
- straggler (`stragglers.StragglerDetails`): `straggler_rank`, `excess_ms_per_step`,
  `others_comm_wait_ms_per_step`, `last_arrival_pct`, `doing` (what made it late, in words),
  `lateness` (`{excess_ms_per_step, compute_excess_ms_per_step, gflop_ratio, kernel_delta_per_step,
  uneven_ops, own_cause, own_event, own_excess_ms_per_step, unprofiled_late_ms_per_step}`), `ranks`
  (as trace.ranks).
- profiler_skew (`stragglers.ProfilerSkewDetails`): `late_rank`, `lateness` (as the straggler's),
  `ranks`.
- recompile, graph_breaks (`compile.CompileStats`): as `traces[].compile`.
- memory_peak (`memory.MemoryFindingDetails`): `family` (a `by_family` key, or `activations`),
  `memory_saved_bytes` (what the fix would save: what the family holds at the peak), `peak_bytes`,
  `by_category`, `largest` (the family's, as in `traces[].memory`).
- memory_fragmentation (`fragmentation.FragmentationDetails`): `facts` (as `traces[].fragmentation`),
  `memory_saved_bytes` (the most expandable segments would give back: the cached bytes).
- out_of_memory (`oom.OutOfMemoryDetails`; always first, `high`, `gpu_ms_per_step` null):
  `failing_step`, `recording` (the profiler was recording it), `exception`, `message`,
  `requested_bytes` (the failing allocation), `device_total_bytes`, `device_free_bytes`, `call`
  (`{file, line, function}` of the innermost frame), `module` (the `nn.Module` class path), `held`
  (`[{category, bytes, how}]`, largest first: `parameters`, `gradients`, `optimizer_state`,
  `activations_and_temporaries` (else `allocated_by_pytorch` without the optimizer's figures), a
  family's key (`how`: `estimated`, its share at the profiled peak), `reserved_unallocated`,
  `outside_pytorch`, `other_processes`), `failing_inputs` (`[{name, shape, dtype}]`),
  `failing_tokens`, `profiled_tokens` (as `headroom.tokens`), `tokens_ratio`, `predicted_peak_bytes`,
  `usable_bytes`, `largest_batch` (at the failing length), `activations_by_module`, `fixes`
  (`[{fix, words, saves_bytes, basis}]`, largest saving first; `fix` one of
  `oom.FIXES`: smaller_micro_batch, fused_linear_cross_entropy, fused_attention,
  activation_checkpointing, shard_optimizer_state, expandable_segments), `allocator` and
  `segments` (the allocator's state at the error, as the memory file's), `observed`.
- exposed_communication (`comm_findings.ExposedCommDetails`): `comm_ms_per_step`,
  `exposed_ms_per_step`, `hidden_pct`, `step_ms`, `by_op` (`[{op, exposed_ms_per_step}]`), `framework`,
  `held_elsewhere` (`[{kind, op, ms_per_step}]`: the exposed time at stake in the straggler or a
  slow-collective finding instead; the finding's `gpu_ms_per_step` is the rest), `predicted_step_ms`
  (the step with that rest hidden: the most the knobs can win), `judged_step_ms` (its trace's
  judged step, which its severity is against).
- no_sync_missing (`comm_findings.NoSyncDetails`): `framework`, `micro_batches_per_step`,
  `synced_micro_batches_per_step`, `extra_comm_ms_per_step`, `extra_exposed_ms_per_step`.
- slow_collective (`comm_findings.SlowCollectiveDetails`): `collective` (as communication.ops[]),
  `across_ranks` (false: from one rank's own times, which include its waits: `info`, no gain claimed).
- The findings on GPU-busy waste (`busy_findings`) carry `gpu_ms_per_step` (the predicted saving),
  `cost_ms` (it over the profiled steps), and in `details` `step_ms` (the GPU step their shares are
  of) and `peaks` (the peaks' source):
  - gemm_precision (`PrecisionDetails`): `gemm_ms_per_step`, `gemm_tflop_per_step`,
    `achieved_tflops`, `predictions` (`[{fix, dtype, gpu_ms_per_step, predicted_gpu_ms_per_step,
    saved_ms_per_step, predicted_step_ms}]`, best first).
  - unfused_attention (`AttentionDetails`): `unfused_ms_per_step`, `attention_tflop_per_step`,
    `score_shape`, `modules`, `fused_ms_per_step`, `fused_tflops`, `sdpa_math_calls_per_step`,
    `fallback_reasons`, `predicted_step_ms`.
  - fusible_layers (`FusionDetails`): `swap` (`fusion.SwapPrediction`: `rows` (`[{op, modules,
    instances, calls_per_step, replaced_ms_per_step, fused_ms_per_step}]`), `replaced_ms_per_step`,
    `fused_ms_per_step`, `saved_ms_per_step`, `copy_tb_s`), `predicted_step_ms`.
  - memory_bound_kernels (`MemoryBoundDetails`): `modules` (`[{module, gpu_ms_per_step,
    gbyte_per_step, achieved_tb_s, bandwidth_pct, floor_ms_per_step}]`), `copy_tb_s`.
  - gemm_shape (`GemmShapeDetails`): `shapes` (`[{op, batch, m, n, k, dtype, calls_per_step,
    gpu_ms_per_step, achieved_tflops, reference_tflops, unaligned, skinny, module}]`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from trainprof.analysis.figures import figures_of
from trainprof.analysis.records import Details, Finding, Record, Via, Where, plain

__all__ = [  # the base records live in `records`; every name stays importable from here
    "SCHEMA_VERSION", "HOST_AHEAD", "Record", "Where", "Via", "Details", "Finding", "plain", "Step",
    "TraceInfo", "Summary", "Analysis",
]

if TYPE_CHECKING:  # pragma: no cover
    from trainprof.analysis.attention import AttentionSite
    from trainprof.analysis.busy import BusyBreakdown
    from trainprof.analysis.collectives import CommTotals
    from trainprof.analysis.compile import CompileStats
    from trainprof.analysis.copies import CopyBreakdown
    from trainprof.analysis.distributed import CrossRank, RankRow
    from trainprof.analysis.fragmentation import Fragmentation
    from trainprof.analysis.headroom import Headroom
    from trainprof.analysis.idle import IdleBreakdown, StepIdle
    from trainprof.analysis.launch import LaunchTotals, StepLaunch
    from trainprof.analysis.memory import HistoryView, MemoryProfile
    from trainprof.analysis.overlap import StepComm
    from trainprof.analysis.profiler_cost import ProfilerCost
    from trainprof.analysis.profiler_overhead import ProfilerHostEstimate
    from trainprof.analysis.rank_work import RankWork
    from trainprof.analysis.recompute import Recomputation
    from trainprof.analysis.step_basis import StepBasis
    from trainprof.analysis.steps import StepTimes
    from trainprof.analysis.syncs import StepSyncs
    from trainprof.analysis.verdict import Verdict
    from trainprof.analysis.views import TraceViews

SCHEMA_VERSION = 2
"""The version of the JSON form documented above (the module docstring)."""


HOST_AHEAD = 1.05
"""A GPU step this much longer than the host's step window: the host ran ahead of the GPU, and its
window is not the step (H200, 2026-11-25: a 128,256-token head's 21.5 ms windows, 49.7 ms steps)."""


class Step(msgspec.Struct):
    """One profiled step of one trace, each part from the module that answers its question.

    `idle` is None when the trace has no GPU work (nothing to split by cause); `peak_memory_bytes`
    None when memory was not recorded. JSON: one flat row (module docstring).
    """

    times: StepTimes
    """Duration, GPU busy and idle time, kernels, copies, host ops and launches (`steps`)."""
    syncs: StepSyncs
    """Sync points and the time the host blocked in them (`syncs`)."""
    launch: StepLaunch
    """Tiny kernels and graph replays (`launch`)."""
    idle: StepIdle | None
    """GPU-idle time by cause (`idle`)."""
    peak_memory_bytes: int | None
    """The largest allocated total inside the step (`memory`)."""
    comm: StepComm | None = None
    """Exposed communication and the hidden share (`overlap`)."""

    def to_dict(self) -> dict[str, Any]:
        """The flat JSON row: the parts' fields in this order, then `peak_memory_bytes`, then the
        communication's."""
        row = {**self.times.to_dict(), **self.syncs.to_dict(), **self.launch.to_dict()}
        if self.idle is not None:
            row.update(self.idle.to_dict())
        row["peak_memory_bytes"] = self.peak_memory_bytes
        if self.comm is not None:
            row.update(self.comm.to_dict())
        return row


class TraceInfo(msgspec.Struct):
    """What one trace (one window of one process) is, and its own verdict, launch and idle figures."""

    file: str
    worker: str
    rank: int | None
    device: str | None
    """The GPU's name from the trace's device properties."""
    step_numbers: list[int]
    has_step_annotations: bool
    """Whether steps come from `ProfilerStep#N` ranges (else from the trace's own structure)."""
    sync_sites_file: str | None
    sync_sites_matched: int
    """Sync points given their exact line by captured sync sites."""
    verdict: Verdict
    peak_memory_bytes: int | None
    launch: LaunchTotals
    idle: IdleBreakdown
    compile: CompileStats | None = None
    """torch.compile's recompiles and graph breaks (`compile`); None when the trace shows no torch.compile."""
    memory: MemoryProfile | None = None
    """The memory peak's breakdown and the memory over time (`memory`); None without `profile_memory`."""
    views: TraceViews | None = None
    """What report.html draws (`analyze(..., views=True)`); not in the JSON form."""
    window: int = 0
    """Which profiling window of its process this trace is (0, 1, ...: `Trace.window`)."""
    comm: CommTotals | None = None
    """Its communication and collectives (`collectives`); None when it has none."""
    busy: BusyBreakdown | None = None
    """Where the GPU's busy time goes (`busy`); None without GPU work."""
    profiler: ProfilerCost | None = None
    """The recorded steps against the session's un-profiled ones (`profiler_cost`); None when the
    trace has no un-profiled steps beside it."""
    step_basis: StepBasis | None = None
    """Its step lengths and the one that judges it (`step_basis`): every finding's severity and the
    headline's step time read it. None only for a `TraceInfo` built by hand."""
    work: RankWork | None = None
    """What its steps did on the measures ranks are compared on (`rank_work`); None for a trace of
    no rank that does not communicate."""
    profiler_estimate: ProfilerHostEstimate | None = None
    """The profiler's estimated host cost per step (`profiler_overhead`); None where the trace has
    un-profiled steps beside it (`profiler` measures instead) or no GPU work."""
    headroom: Headroom | None = None
    """How far the step can grow before it no longer fits (`headroom`); None without the memory
    peak's breakdown or the device's memory."""
    fragmentation: Fragmentation | None = None
    """The allocator's reserve against the tensors (`fragmentation`); None without a reserved total."""
    memory_history: HistoryView | None = None
    """The allocator's recorded history over the window (`memory.history_view`); None unless the
    session recorded it (`memory_history=True`)."""
    copies: CopyBreakdown | None = None
    """The copy-and-cast class by what makes each kernel (`copies`); None without copy kernels."""
    attention: list[AttentionSite] = []
    """Its attention call sites: backend, facts, and why not a faster one (`attention`)."""
    recompute: Recomputation | None = None
    """The forward recomputed in backward (activation checkpointing, `recompute`); None without."""

    def to_dict(self) -> dict[str, Any]:
        """The `trace.traces` entry (module docstring)."""
        return {
            "file": self.file,
            "worker": self.worker,
            "rank": self.rank,
            "window": self.window,
            "device": self.device,
            "steps": self.step_numbers,
            "has_step_annotations": self.has_step_annotations,
            "sync_sites_file": self.sync_sites_file,
            "sync_sites_matched": self.sync_sites_matched,
            "verdict": self.verdict.to_dict(),
            "peak_memory_bytes": self.peak_memory_bytes,
            "launch": self.launch.to_dict(),
            "gpu_idle_holders": [holder.to_dict() for holder in self.idle.holders],
            "gpu_idle_host_functions": [function.to_dict() for function in self.idle.host_functions],
            "gpu_idle_one_off": [holder.to_dict() for holder in self.idle.one_off],
            "compile": self.compile.to_dict() if self.compile is not None else None,
            "memory": self.memory.to_dict() if self.memory is not None else None,
            "communication": self.comm.to_dict() if self.comm is not None else None,
            "gpu_busy": self.busy.to_dict() if self.busy is not None else None,
            "profiler": self.profiler.to_dict() if self.profiler is not None else None,
            "step_basis": self.step_basis.to_dict() if self.step_basis is not None else None,
            "work": self.work.to_dict() if self.work is not None else None,
            "profiler_estimate": None if self.profiler_estimate is None else self.profiler_estimate.to_dict(),
            "headroom": self.headroom.to_dict() if self.headroom is not None else None,
            "fragmentation": self.fragmentation.to_dict() if self.fragmentation is not None else None,
            "memory_history": self.memory_history.to_dict() if self.memory_history is not None else None,
            "copies": self.copies.to_dict() if self.copies is not None else None,
            "attention": [site.to_dict() for site in self.attention],
            "recompute": self.recompute.to_dict() if self.recompute is not None else None,
        }


class Summary(Record, frozen=True):
    """The headline of an analysis, over every trace and rank.

    A `Session` whose loop was not profiled holds `Summary(verdict="not-profiled", reason=...)`
    with no figures; an analysis always has them (`reason` None).
    """

    verdict: str
    """The most common verdict of the traces, or `straggler: rank R` when one rank holds the rest up."""
    verdict_by_trace: dict[str, str] = {}
    """`rank R` (else the worker) -> that trace's verdict."""
    mean_step_ms: float | None = None
    gpu_busy_pct: float | None = None
    """Time-weighted: the union of GPU busy time over the total step time."""
    syncs_per_step: float | None = None
    kernels_per_step: float | None = None
    peak_memory_bytes: int | None = None
    straggler_rank: int | str | None = None
    comm_ms_per_step: float | None = None
    """Communication time per step (collective kernels; gloo on the host without GPU work); None
    when no trace communicates."""
    comm_exposed_ms_per_step: float | None = None
    """The part of it no compute hides (`overlap`)."""
    comm_hidden_pct: float | None = None
    """The hidden share of the communication time."""
    thresholds_overridden: dict[str, float] = {}
    """The cut-offs the caller set, by name (`trainprof.analysis.thresholds`)."""
    idle_ms_per_step: dict[str, float] = {}
    """GPU-idle ms per step over every step: steady-state by cause key (`launch`, `sync`, ...), and
    `one_off`; they add up to the GPU-idle time. Empty when no trace has GPU work."""
    idle_step_pct: dict[str, float] = {}
    """`idle_ms_per_step` in % of `mean_step_ms` (the recorded step), by the same keys: with
    `gpu_busy_pct`, where the recorded step went."""
    gpu_step_ms: float | None = None
    """Mean step time as the GPU runs it: the longest of the host window, the span of the step's
    kernels and their summed time (`busy`); longer than `mean_step_ms` when the host runs ahead."""
    mfu_pct: float | None = None
    """Model FLOPs at the datasheet's dense peak of their dtype over the GPU step time (MFU as the
    field reports it), time-weighted over the traces."""
    mfu_dtype: str | None = None
    """The math dtype holding most of the model FLOPs (the peak MFU is mostly read against)."""
    mfu_achievable_pct: float | None = None
    """The same FLOPs at the achievable peaks (`peaks.DevicePeaks.matmul_tflops`: measured, or
    the trace's best kernels), beside `mfu_pct`."""
    mfu_peak_tflops: float | None = None
    """The datasheet's dense peak of `mfu_dtype`, TFLOP/s."""
    mfu_achievable_tflops: float | None = None
    """The achievable peak of `mfu_dtype`, TFLOP/s."""
    mfu_flops_known_pct: float | None = None
    """The share of the compute time whose FLOPs the MFU counts (`busy.flops_known_share`),
    time-weighted; the MFU is null below `mfu_min_flops_known_share`."""
    peaks_source: str | None = None
    """Where the device peaks came from (`peaks.DevicePeaks.label`)."""
    peaks_label: str | None = None
    """The same in a few words, for a headline (`peaks.DevicePeaks.short_label`)."""
    unprofiled_step_ms: float | None = None
    """The session's un-profiled step (`profiler_cost`), weighted by steps over the traces that
    have one; None when none has."""
    profiler_slowdown_pct: float | None = None
    """How much longer the recorded steps are than that, in % of it."""
    verdict_caveat: str | None = None
    """Where no trace has un-profiled steps and the profiler's estimated host cost could have made the
    verdict (`profiler_overhead`): that, in words, and how to confirm; else None."""
    unprofiled_gpu_busy_pct: float | None = None
    """The recorded GPU busy time per step over the un-profiled step (at most 100), weighted as
    `unprofiled_step_ms`; None when no trace has un-profiled steps beside it."""
    judged_step_ms: float | None = None
    """The step that judges (`step_basis.StepBasis.judged_ms`), weighted by steps over the traces:
    every finding's severity is its gain over its trace's; the headline's step time."""
    judged_step_basis: str | None = None
    """Which step `judged_step_ms` is (a key of `step_basis.STEP_BASES`), that of most steps."""
    one_off_left_out_pct: float | None = None
    """The share of the recorded steps' time that one-off costs (warm-up, context creation) left the
    GPU idle, which the verdict leaves out; None under `one_off_named_share`."""
    reason: str | None = None
    """Why there are no figures (a session that profiled nothing); None for an analysis."""

    @property
    def host_ran_ahead(self) -> bool:
        """Whether the GPU step is over `HOST_AHEAD` times the host's step window: the host ran ahead
        of the GPU, and its windows are not the steps."""
        gpu, host = self.gpu_step_ms, self.mean_step_ms
        return bool(gpu and host and gpu > HOST_AHEAD * host)

    @property
    def other_steps(self) -> list[tuple[str, float]]:
        """The step lengths other than the judged one, as (`STEP_BASES` key, ms): those more than
        `HOST_AHEAD` apart from it and from each other (the host's window, then the GPU's step, then
        the un-profiled step). A headline names the step that judges, and only these beside it."""
        if not self.judged_step_ms:
            return []
        lengths = (("window", self.mean_step_ms), ("gpu", self.gpu_step_ms),
                   ("unprofiled", self.unprofiled_step_ms))
        named: list[tuple[str, float]] = []
        for basis, ms in lengths:
            if basis == self.judged_step_basis or not ms:
                continue
            if all(max(ms, other) > HOST_AHEAD * min(ms, other)
                   for other in (self.judged_step_ms, *(known for _, known in named))):
                named.append((basis, ms))
        return named

    def to_dict(self) -> dict[str, Any]:
        """The `trace.summary` object (module docstring); `reason` only when set."""
        out = msgspec.to_builtins(self)
        if self.reason is None:
            del out["reason"]
        return out


class Analysis(msgspec.Struct):
    """What `analyze()` found: the `summary`, one `Step` per step and trace, the `findings` (most
    severe and costly first), and per trace (`traces`) and per rank (`ranks`, with several ranks)."""

    summary: Summary
    steps: list[Step] = []
    findings: list[Finding] = []
    files: list[str] = []
    """The trace files analysed."""
    traces: list[TraceInfo] = []
    ranks: list[RankRow] = []
    """Per rank (or worker), step and communication time: only with more than one rank."""
    cross_rank: CrossRank | None = None
    """The cross-rank report (`distributed.CrossRank`): only with more than one rank."""

    @property
    def step_count(self) -> int:
        """Distinct step numbers over all traces."""
        return len({step.times.number for step in self.steps})

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: `{"schema_version", "trace", "steps", "findings"}` (module docstring)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "trace": {
                "files": self.files,
                "traces": [trace.to_dict() for trace in self.traces],
                "ranks": [rank.to_dict() for rank in self.ranks],
                "step_count": self.step_count,
                "summary": self.summary.to_dict(),
                "cross_rank": self.cross_rank.to_dict() if self.cross_rank is not None else None,
            },
            "steps": [step.to_dict() for step in self.steps],
            "findings": [{**finding.to_dict(), "gpu_step_pct": self.gpu_step_pct(finding)}
                         for finding in self.findings],
        }

    def judged_step_ms(self, finding: Finding) -> float | None:
        """The judged step of the trace(s) a finding is from (`StepBasis.judged_ms`, weighted by
        steps over its rank's windows), or the summary's for a finding over all traces."""
        if finding.rank is None and finding.window is None:
            return self.summary.judged_step_ms
        judged = [(t.step_basis.judged_ms, len(t.step_numbers)) for t in self.traces
                  if t.rank == finding.rank and t.step_basis is not None
                  and (finding.window is None or t.window == finding.window)]
        steps = sum(n for _, n in judged)
        if not steps:
            return self.summary.judged_step_ms
        return sum(ms * n for ms, n in judged) / steps

    def gpu_step_pct(self, finding: Finding) -> float | None:
        """A finding's GPU time at stake in % of its judged step (`judged_step_ms`); None where it has
        none (`gpu_ms_per_step` None, or a finding about memory: `figures.Figures.gain`)."""
        step_ms = self.judged_step_ms(finding)
        if finding.gpu_ms_per_step is None or not figures_of(finding.kind).gain or not step_ms:
            return None
        return round(100.0 * finding.gpu_ms_per_step / step_ms, 2)
