"""Why each sync happens: cause, `via` (the library call) and `where` (the user's frame), and the
catalog of known framework sync sites, on real H200 traces and on minimal synthetic ones.

The synthetic traces are built event by event as torch.profiler writes them: nested
`python_function` frames (`file(line): function`, relative to sys.path), `cpu_op`s, the runtime
calls and their GPU copies joined by correlation id, inside one `ProfilerStep#` range.
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import pytest

from trainprof.analysis import analyze
from trainprof.analysis.syncs import CAUSES
from trainprof.capture.syncs import SyncCapture
from trainprof.catalog import match_sync_site, sync_sites, version_in
from trainprof.trace import load_traces
from trainprof.user_code import CodeLayout, current_layout, is_user_file, library_of, with_versions

ITEM_OPS = ["aten::item", "aten::_local_scalar_dense"]
D2H = [("cudaMemcpyAsync", "Memcpy DtoH (Device -> Pinned)"), ("cudaStreamSynchronize", None)]
USER = "train.py(10): train"


# -- a minimal trace, event by event ----------------------------------------------------------


class TraceWriter:
    """Writes sync scenarios one after another inside one ProfilerStep, on one CPU thread."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.now = 1000.0
        self.correlation = 0

    def _event(
        self, cat: str, name: str, ts: float, dur: float, pid: int = 100, tid: int = 1, **args
    ) -> None:
        self.events.append(
            {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}
        )

    def sync(self, python: list[str], ops: list[str], calls: list[tuple[str, str | None]]) -> None:
        """One sync: python frames (outermost first), cpu_ops inside them, runtime calls inside those."""
        span = 1000.0
        start = self.now
        for depth, name in enumerate(python):
            self._event("python_function", name, start + depth, span - 2 * depth)
        base = start + len(python)
        for depth, op in enumerate(ops):
            self._event("cpu_op", op, base + depth, span - 2 * len(python) - 2 * depth)
        inner = base + len(ops) + 1
        for index, (call, copy) in enumerate(calls):
            self.correlation += 1
            at = inner + 10 * index
            self._event("cuda_runtime", call, at, 8, correlation=self.correlation)
            if copy is not None:
                self._event(
                    "gpu_memcpy",
                    copy,
                    at + 2,
                    3,
                    pid=0,
                    tid=7,
                    correlation=self.correlation,
                    device=0,
                    stream=7,
                )
        # GPU work after the sync, launched by an op as in any training step, so the GPU is busy
        self.correlation += 1
        self._event("cpu_op", "aten::mm", start + span + 1, 6)
        self._event("cuda_runtime", "cudaLaunchKernel", start + span + 2, 3, correlation=self.correlation)
        self._event(
            "kernel",
            "gemm",
            start + span + 6,
            20,
            pid=0,
            tid=7,
            device=0,
            stream=7,
            correlation=self.correlation,
        )
        self.now = start + span + 50

    def write(self, folder: Path, layout: CodeLayout | None = None, sites: list[dict] | None = None) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        step = {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            "pid": 100,
            "tid": 1,
            "ts": 900.0,
            "dur": self.now - 850.0,
            "args": {},
        }
        path = folder / "w.1795302410720486528.pt.trace.json"
        path.write_text(json.dumps({"traceEvents": [step, *self.events]}))
        if layout is not None or sites is not None:
            document = {
                "version": 2,
                "worker": "w",
                "sites": sites or [],
                "code_layout": layout.to_dict() if layout is not None else None,
            }
            (folder / "w.syncsites.json").write_text(json.dumps(document))
        return path


def _syncs(result):
    return [f for f in result.findings if f.kind == "sync_point"]


def _one_sync(tmp_path: Path, python: list[str], ops: list[str], calls, **write) -> object:
    writer = TraceWriter()
    writer.sync(python, ops, calls)
    (finding,) = _syncs(analyze(writer.write(tmp_path, **write)))
    return finding


# -- causes named from the frames between the user frame and the op ----------------------------

CAUSE_CASES = {
    "print": (
        [
            USER,
            "<built-in function print>",
            "torch/_tensor.py(570): __format__",
            "torch/_tensor_str.py(700): _str",
            "<built-in method item of Tensor object at 0x1>",
        ],
        ITEM_OPS,
        D2H,
    ),
    "tolist": (
        [USER, "<built-in method tolist of Tensor object at 0x1>"],
        ["aten::to", "aten::_to_copy", "aten::copy_"],
        D2H,
    ),
    "numpy": (
        [USER, "<built-in method numpy of Tensor object at 0x1>"],
        ["aten::to", "aten::_to_copy", "aten::copy_"],
        D2H,
    ),
    "cpu": (
        [USER, "<built-in method cpu of Tensor object at 0x1>"],
        ["aten::to", "aten::_to_copy", "aten::copy_"],
        [("cudaMemcpyAsync", "Memcpy DtoH (Device -> Pageable)"), ("cudaStreamSynchronize", None)],
    ),
    "bool": ([USER], ["aten::is_nonzero", *ITEM_OPS], D2H),
    "item": ([USER, "<built-in method item of Tensor object at 0x1>"], ITEM_OPS, D2H),
    "data_dependent_shape": ([USER], ["aten::index", "aten::nonzero"], D2H),
    "pageable_copy": (
        [USER, "<built-in method to of Tensor object at 0x1>"],
        ["aten::to", "aten::_to_copy", "aten::copy_"],
        [("cudaMemcpyAsync", "Memcpy HtoD (Pageable -> Device)"), ("cudaStreamSynchronize", None)],
    ),
    "pinned_copy_blocking": (
        [USER, "<built-in method to of Tensor object at 0x1>"],
        ["aten::to", "aten::_to_copy", "aten::copy_"],
        [("cudaMemcpyAsync", "Memcpy HtoD (Pinned -> Device)"), ("cudaStreamSynchronize", None)],
    ),
    "device_synchronize": (
        [USER, "torch/cuda/__init__.py(1040): synchronize", "<built-in function _cuda_synchronize>"],
        [],
        [("cudaDeviceSynchronize", None)],
    ),
    "event_synchronize": (
        [USER, "torch/cuda/streams.py(220): synchronize"],
        [],
        [("cudaEventSynchronize", None)],
    ),
    "stream_synchronize": (
        [USER, "torch/cuda/streams.py(100): synchronize"],
        [],
        [("cudaStreamSynchronize", None)],
    ),
}


@pytest.mark.parametrize("cause", sorted(CAUSE_CASES))
def test_cause_is_named_from_the_trace_alone(tmp_path, cause):
    python, ops, calls = CAUSE_CASES[cause]
    finding = _one_sync(tmp_path, python, ops, calls)
    assert finding.details.cause == cause
    assert finding.cause == CAUSES[cause].words
    # No library made the call: the cause's generic fix (these one-step traces have neither backward
    # nor optimizer: an inference loop's, where the cause has one).
    assert finding.fix == (CAUSES[cause].inference_fix or CAUSES[cause].fix)
    assert finding.where.to_dict() == {"file": "train.py", "line": None, "function": "train"}
    assert finding.details.catalog_site is None


def test_print_names_torch_tensor_str_as_via(tmp_path):
    python, ops, calls = CAUSE_CASES["print"]
    finding = _one_sync(tmp_path, python, ops, calls)
    assert (finding.via.file, finding.via.function, finding.via.library) == (
        "torch/_tensor_str.py",
        "_str",
        "torch",
    )


def test_hip_runtime_names_are_syncs_too(tmp_path):
    finding = _one_sync(
        tmp_path,
        [USER, "<built-in method item of Tensor object at 0x1>"],
        ITEM_OPS,
        [("hipMemcpyWithStream", "Memcpy DtoH (Device -> Pageable)"), ("hipStreamSynchronize", None)],
    )
    assert finding.details.cause == "item" and finding.count == 1


def test_pinned_non_blocking_copy_is_not_a_sync(tmp_path):
    writer = TraceWriter()
    writer.sync(
        [USER, "<built-in method to of Tensor object at 0x1>"],
        ["aten::to", "aten::_to_copy", "aten::copy_"],
        [("cudaMemcpyAsync", "Memcpy HtoD (Pinned -> Device)")],
    )
    writer.sync(*CAUSE_CASES["item"])
    result = analyze(writer.write(tmp_path))
    assert [f.details.cause for f in _syncs(result)] == ["item"]


def test_distinct_causes_behind_one_user_line_are_distinct_findings(tmp_path):
    writer = TraceWriter()
    trainer = [
        "train.py(3): main",
        "transformers/trainer.py(1520): train",
        "transformers/trainer.py(1602): _inner_training_loop",
        "transformers/trainer.py(1882): _run_epoch",
    ]
    for _ in range(2):
        writer.sync(trainer, ["aten::is_nonzero", *ITEM_OPS], D2H)
        writer.sync(
            [
                *trainer,
                "transformers/trainer.py(2150): _maybe_log_save_evaluate",
                "<built-in method item of Tensor object at 0x1>",
            ],
            ITEM_OPS,
            D2H,
        )
    findings = _syncs(analyze(writer.write(tmp_path)))
    by_cause = {f.details.cause: f for f in findings}
    assert set(by_cause) == {"bool", "item"} and len(findings) == 2
    assert all(f.where.function == "main" and f.count == 2 for f in findings)
    assert by_cause["bool"].via.function == "_run_epoch"
    assert by_cause["item"].via.function == "_maybe_log_save_evaluate"


# -- the catalog -----------------------------------------------------------------------------

CATALOG_CASES = {
    "transformers.trainer.nan_inf_filter": (
        [
            "train.py(3): main",
            "transformers/trainer.py(1520): train",
            "transformers/trainer.py(1602): _inner_training_loop",
            "transformers/trainer.py(1882): _run_epoch",
        ],
        ["aten::is_nonzero", *ITEM_OPS],
        D2H,
        "logging_nan_inf_filter=False",
    ),
    "transformers.trainer.logging_item": (
        [
            "train.py(3): main",
            "transformers/trainer.py(1520): train",
            "transformers/trainer.py(2150): _maybe_log_save_evaluate",
            "<built-in method item of Tensor object at 0x1>",
        ],
        ITEM_OPS,
        D2H,
        "logging_steps",
    ),
    "transformers.masking_utils.packed_sequences": (
        [
            "train.py(3): main",
            "torch/nn/modules/module.py(1780): _call_impl",
            "transformers/models/gpt2/modeling_gpt2.py(511): forward",
            "transformers/masking_utils.py(865): create_causal_mask",
            "transformers/masking_utils.py(761): _preprocess_mask_arguments",
            "transformers/masking_utils.py(729): find_packed_sequence_indices",
        ],
        ["aten::is_nonzero", *ITEM_OPS],
        D2H,
        "torch_compile=True",
    ),
    "accelerate.send_to_device.blocking": (
        [
            "train.py(3): main",
            "<built-in function next>",
            "accelerate/data_loader.py(600): __iter__",
            "accelerate/utils/operations.py(136): send_to_device",
            "accelerate/utils/operations.py(136): send_to_device",
            "<built-in method to of Tensor object at 0x1>",
        ],
        ["aten::to", "aten::_to_copy", "aten::copy_"],
        [("cudaMemcpyAsync", "Memcpy HtoD (Pinned -> Device)"), ("cudaStreamSynchronize", None)],
        "DataLoaderConfiguration(non_blocking=True)",
    ),
    "lightning.progress_bar_to_item": (
        [
            "train.py(3): main",
            "lightning/pytorch/trainer/connectors/logger_connector/result.py(470): metrics",
            "lightning/fabric/utilities/apply_func.py(120): convert_tensors_to_scalars",
            "lightning_utilities/core/apply_func.py(29): apply_to_collection",
            "lightning/fabric/utilities/apply_func.py(129): to_item",
            "<built-in method item of Tensor object at 0x1>",
        ],
        ITEM_OPS,
        D2H,
        "prog_bar=False",
    ),
    "lightning.logger_to_item": (
        [
            "train.py(3): main",
            "pytorch_lightning/trainer/connectors/logger_connector/logger_connector.py(100): log_metrics",
            "lightning_fabric/utilities/apply_func.py(120): convert_tensors_to_scalars",
            "lightning_utilities/core/apply_func.py(29): apply_to_collection",
            "lightning_fabric/utilities/apply_func.py(129): to_item",
            "<built-in method item of Tensor object at 0x1>",
        ],
        ITEM_OPS,
        D2H,
        "log_every_n_steps",
    ),
    "torch.grad_scaler.found_inf": (
        [
            "train.py(3): main",
            "torch/amp/grad_scaler.py(450): step",
            "torch/amp/grad_scaler.py(363): _maybe_opt_step",
            "<built-in method item of Tensor object at 0x1>",
        ],
        ITEM_OPS,
        D2H,
        "fused=True",
    ),
}


@pytest.mark.parametrize("site_id", sorted(CATALOG_CASES))
def test_known_framework_site_gets_the_catalog_fix(tmp_path, site_id):
    python, ops, calls, setting = CATALOG_CASES[site_id]
    finding = _one_sync(tmp_path, python, ops, calls)
    assert finding.details.catalog_site == site_id
    (site,) = [s for s in sync_sites() if s.id == site_id]
    assert finding.fix == site.fix and setting in finding.fix
    assert finding.where.function == "main"
    assert finding.via.function in site.functions
    assert finding.via.library == finding.via.file.split("/")[0]  # e.g. lightning_fabric standalone


def test_lightning_to_item_without_its_caller_gets_the_generic_fix(tmp_path):
    finding = _one_sync(
        tmp_path,
        [
            "train.py(3): main",
            "lightning/fabric/utilities/apply_func.py(129): to_item",
            "<built-in method item of Tensor object at 0x1>",
        ],
        ITEM_OPS,
        D2H,
    )
    assert finding.details.catalog_site is None
    assert finding.fix == CAUSES["item"].fix
    assert (finding.via.function, finding.via.library) == ("to_item", "lightning")


def test_unknown_library_site_gets_the_generic_fix_of_its_cause(tmp_path):
    # `somelib` is installed but unknown to trainprof: the run's recorded layout says it is a library.
    layout = CodeLayout(library_packages=frozenset({"somelib"}), versions=(("somelib", "1.2.3"),))
    python = [
        "train.py(3): main",
        "somelib/engine.py(40): run_step",
        "<built-in method item of Tensor object at 0x1>",
    ]
    finding = _one_sync(tmp_path, python, ITEM_OPS, D2H, layout=layout)
    assert finding.details.catalog_site is None
    assert finding.fix == CAUSES["item"].fix
    assert finding.where.function == "main"
    assert (finding.via.file, finding.via.function, finding.via.library, finding.via.version) == (
        "somelib/engine.py",
        "run_step",
        "somelib",
        "1.2.3",
    )


def test_catalog_entry_outside_its_versions_is_not_applied(tmp_path):
    python, ops, calls, _ = CATALOG_CASES["transformers.masking_utils.packed_sequences"]
    old = CodeLayout(versions=(("transformers", "4.40.0"),))
    finding = _one_sync(tmp_path, python, ops, calls, layout=old)
    assert finding.details.catalog_site is None and finding.fix == CAUSES["bool"].fix
    assert finding.via.version == "4.40.0"


def test_catalog_entries_are_complete_and_checked():
    sites = sync_sites()
    assert len({s.id for s in sites}) == len(sites) >= 10
    for site in sites:
        assert site.functions and site.causes and site.why and site.fix and site.checked, site.id
        assert set(site.causes) <= set(CAUSES), site.id
    assert match_sync_site([("transformers/trainer.py", "_run_epoch")], "item") is None  # cause must fit


def test_version_specs():
    assert version_in("2.13.0+cpu", ">=2.3") and not version_in("2.2.1", ">=2.3")
    assert version_in("5.0.0.dev0", ">=5.0") and version_in(None, ">=9")
    assert not version_in("4.40.0", ">=4.53") and version_in("4.53", ">=4.53,<5")


# -- real H200 traces --------------------------------------------------------------------------

def test_pathologies_pageable_copy_and_two_items(fixtures_dir):
    findings = _syncs(analyze(fixtures_dir / "traces/gpt2_pathologies"))
    causes = {f.details.cause: f for f in findings}
    assert set(causes) == {"pageable_copy", "item"}
    assert (causes["pageable_copy"].count, causes["item"].count) == (3, 6)  # 1 and 2 per step, 3 steps
    assert all(f.where.function == "gpt2_loop" and f.via is None for f in findings)  # the user called them
    assert causes["pageable_copy"].fix == CAUSES["pageable_copy"].fix


def test_clean_loop_has_no_user_sync(fixtures_dir):
    assert _syncs(analyze(fixtures_dir / "traces/gpt2_clean")) == []


# The H200 runs of tests/fixtures/stacks (README there): per step, by catalog site.
STACK_TRUTH = {
    "hf_trainer": {
        "transformers.trainer.nan_inf_filter": 4,
        "accelerate.send_to_device.blocking": 4,
        "transformers.masking_utils.packed_sequences": 2,
        "transformers.trainer.logging_item": 2,
    },
    "lightning": {"lightning.progress_bar_to_item": 2, "lightning.batch_to_pageable": 2},
    "accelerate": {"accelerate.send_to_device.blocking": 4},
}


@pytest.mark.parametrize("stack", sorted(STACK_TRUTH))
def test_real_framework_runs_every_sync_traced_to_its_catalog_site(fixtures_dir, stack):
    findings = _syncs(analyze(fixtures_dir / "stacks" / stack))
    assert {f.details.catalog_site: f.per_step for f in findings} == STACK_TRUTH[stack]
    user_function = {"hf_trainer": "run_hf", "lightning": "run_lightning", "accelerate": "run_accelerate"}[
        stack
    ]
    assert all(
        f.where.function == user_function and f.where.file == "record_stack_traces.py" for f in findings
    )
    for finding in findings:
        assert finding.via.library in ("transformers", "accelerate", "lightning")
        assert not is_user_file(finding.via.file)


@pytest.mark.parametrize("stack", sorted(STACK_TRUTH))
def test_capture_rule_agrees_with_the_sync_debug_stacks(fixtures_dir, stack):
    """torch's own sync-debug stacks of the same runs (absolute paths, as the live capture sees them):
    the innermost user frame is the recording script, never a lightning_utilities or torch frame."""
    truth = json.loads((fixtures_dir / "stacks" / stack / "truth.json").read_text())
    capture = SyncCapture()
    for site in truth["sync_debug_sites"]:
        stack_frames = [(f["file"], f["line"], f["function"]) for f in site["stack"]]
        recorded = capture.record("implicit", stack_frames)
        assert recorded.file is None or recorded.file.endswith("benchmarks/record_stack_traces.py"), recorded
    assert any(s.file is not None for s in capture.take_sites())


def test_captured_stack_gives_via_its_exact_line(tmp_path):
    python, ops, calls, _ = CATALOG_CASES["transformers.trainer.nan_inf_filter"]
    writer = TraceWriter()
    writer.sync(python, ops, calls)
    site_packages = "/venv/lib/python3.12/site-packages"
    sites = [
        {
            "step": 1,
            "call": "implicit",
            "file": "/home/me/train.py",
            "line": 7,
            "function": "main",
            "stack": [
                {"file": "/home/me/train.py", "line": 7, "function": "main"},
                {"file": f"{site_packages}/transformers/trainer.py", "line": 1525, "function": "train"},
                {"file": f"{site_packages}/transformers/trainer.py", "line": 1913, "function": "_run_epoch"},
            ],
        }
    ]
    (trace,) = load_traces(writer.write(tmp_path, layout=CodeLayout(), sites=sites))
    (finding,) = _syncs(analyze([trace]))
    assert finding.where.to_dict() == {"file": "/home/me/train.py", "line": 7, "function": "main"}
    assert (finding.via.file, finding.via.line, finding.via.function) == (
        "transformers/trainer.py",
        1913,
        "_run_epoch",
    )


# -- user code vs library code -----------------------------------------------------------------


@pytest.mark.parametrize(
    "file",
    [
        "/code/train.py",
        "/home/u/proj/lightning/train.py",
        "train.py",
        "make_traces.py",
        "/home/me/src/trainprof/trainprof/demo.py",
    ],
)
def test_user_files_are_not_fooled_by_folder_names(file):
    assert is_user_file(file)


@pytest.mark.parametrize(
    "file",
    [
        "/usr/lib/python3.12/site-packages/lightning_utilities/core/apply_func.py",
        "lightning_utilities/core/apply_func.py",
        "lightning_fabric/utilities/apply_func.py",
        "/opt/venv/lib/python3.11/dist-packages/somepkg/x.py",
        "/usr/lib/python3.11/json/decoder.py",
        "dataclasses.py",
        "<frozen runpy>",
        "torch/nn/modules/module.py",
        "/home/me/src/trainprof/trainprof/session/lifecycle.py",
    ],
)
def test_library_files(file):
    assert not is_user_file(file)


def test_recorded_layout_decides_ambiguous_top_level_names():
    # A run started as `python -m lightning.train` from ~/proj: its `lightning` package is the user's.
    layout = CodeLayout(user_packages=frozenset({"lightning"}), library_packages=frozenset({"einops"}))
    assert is_user_file("lightning/train.py", layout) and not is_user_file("lightning/train.py")
    assert not is_user_file("einops/einops.py", layout)
    assert is_user_file("/src/transformers/src/transformers/trainer.py")  # no layout: not a known root
    checkout = CodeLayout(roots=("/src/transformers/src/transformers/",))
    assert not is_user_file("/src/transformers/src/transformers/trainer.py", checkout)
    assert library_of("/src/transformers/src/transformers/trainer.py", checkout) == "transformers"


def test_layout_round_trips_and_knows_this_process():
    layout = with_versions(current_layout())  # versions from the installed distributions
    assert "torch" in layout.library_packages
    assert layout.version_of("torch") == importlib.metadata.version("torch")
    assert current_layout().versions == ()  # recorded beside the sync sites only
    assert CodeLayout.from_dict(json.loads(json.dumps(layout.to_dict()))) == layout
    assert CodeLayout.from_dict({"roots": [3, "/x"], "user_packages": "nope"}) == CodeLayout(roots=("/x/",))
    assert CodeLayout.from_dict(["not", "a", "layout"]) is None


def test_the_install_folders_are_sysconfigs_without_loading_its_build_variables():
    import sysconfig

    from trainprof.user_code import _scheme_paths

    assert _scheme_paths() == sysconfig.get_paths()
