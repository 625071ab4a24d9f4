"""Which implementation a fused op runs inside a compiled graph (``fused_layers.compile_choice``,
``fused_layers.compile_probe``): shape classes, the cache on disk, the choice read while Dynamo
traces, and swap's record of it. The timing itself needs a GPU (tests/gpu); here the timer is
replaced."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from fused_layers import compile_choice, compile_probe, swap
from fused_layers.ops.rms_norm import rms_norm


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """A cache of this test's own: an empty folder, and no table read yet in this process."""
    monkeypatch.setenv("FUSED_LAYERS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compile_choice, "_table", None)
    return tmp_path / "compile_choice.json"


CPU = torch.device("cpu")


def _choice(
    op: str, dims: tuple[int, ...], backend: str, dtype: str = "torch.float32"
) -> compile_choice.Choice:
    return compile_choice.Choice(
        op,
        dtype,
        compile_choice.shape_class(op, dims),
        backend,
        "triton",
        1.0,
        2.0,
        "test probe",
        "2026-11-25",
    )


def test_shape_classes():
    assert compile_choice.shape_class("rms_norm", (2048,)) == "w2048"
    assert compile_choice.shape_class("layer_norm", (768,)) == "w1024"
    assert compile_choice.shape_class("swiglu", (8192,)) == "w8192"
    assert compile_choice.shape_class("gelu", ()) == "any"
    assert compile_choice.shape_class("linear_cross_entropy", (2048, 128256)) == "h2048-v131072"
    assert compile_choice.shape_class("linear_cross_entropy", (768, 50257)) == "h1024-v65536"


def test_record_and_lookup_through_the_file(cache, monkeypatch):
    choice = _choice("rms_norm", (64,), "triton")
    compile_choice.record(choice, CPU)
    assert compile_choice.lookup("rms_norm", torch.float32, (50,), CPU) == choice  # same class, w64
    assert compile_choice.lookup("rms_norm", torch.bfloat16, (64,), CPU) is None  # another dtype
    assert compile_choice.lookup("rms_norm", torch.float32, (65,), CPU) is None  # another class
    on_disk = json.loads(cache.read_text())
    assert list(on_disk) == [compile_choice.environment(CPU)]
    monkeypatch.setattr(compile_choice, "_table", None)  # a new process reads the file
    assert compile_choice.lookup("rms_norm", torch.float32, (64,), CPU) == choice
    cache.write_text("{not json")
    monkeypatch.setattr(compile_choice, "_table", None)
    assert compile_choice.lookup("rms_norm", torch.float32, (64,), CPU) is None  # unreadable: measure again


def _fused_ops_in_graph(function, *args) -> set[str]:
    """The fused_layers ops in the forward graph Dynamo and AOT autograd make of ``function``."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def keep(gm, _inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    compiled = torch.compile(
        function, backend=aot_autograd(fw_compiler=keep, bw_compiler=keep), fullgraph=True
    )
    compiled(*args).sum().backward()
    return {str(node.target) for node in graphs[0].graph.nodes if "fused_layers" in str(node.target)}


def test_under_compile_the_recorded_choice_runs_else_inductors_code():
    x = torch.randn(4, 64, requires_grad=True)
    w = torch.randn(64, requires_grad=True)
    assert _fused_ops_in_graph(lambda a, b: rms_norm(a, b), x, w) == set()  # nothing measured
    compile_choice.record(_choice("rms_norm", (64,), "triton"), CPU)
    assert _fused_ops_in_graph(lambda a, b: rms_norm(a, b) * 2, x, w) == {"fused_layers.rms_norm.default"}
    compile_choice.record(_choice("rms_norm", (64,), "torch"), CPU)
    assert _fused_ops_in_graph(lambda a, b: rms_norm(a, b) * 3, x, w) == set()


def test_measure_keeps_the_faster_and_records_it(cache):
    timings = {"triton": 0.5, "torch": 0.8}
    timer = lambda op, backend, dtype, dims, device: timings[backend]  # noqa: E731
    choice = compile_probe.measure("swiglu", torch.float32, (128,), CPU, timer=timer)
    assert (choice.backend, choice.custom_backend, choice.custom_ms, choice.inductor_ms) == (
        "triton",
        "triton",
        0.5,
        0.8,
    )
    assert "swiglu(a, b)" in choice.probe and "Inductor's 0.800" in choice.describe()
    timings["torch"] = 0.4
    slower = compile_probe.measure("swiglu", torch.float32, (128,), CPU, timer=timer)
    assert slower.backend == "torch" and compile_choice.lookup("swiglu", torch.float32, (128,), CPU) == slower
    assert "Inductor, 0.400 ms against triton's 0.500" == slower.describe()


def test_timing_needs_a_gpu_and_swap_says_what_runs_under_compile():
    with pytest.raises(ValueError, match="CUDA"):
        compile_probe._time_ms("gelu", "torch", torch.float32, (), CPU)
    model = nn.ModuleDict({"norm": nn.LayerNorm(64), "other": nn.LayerNorm(32)})
    compile_choice.record(_choice("layer_norm", (64,), "triton"), CPU)
    record = swap(model, for_compile=True)  # on the CPU nothing is measured
    assert (
        record.under_compile["layer_norm float32 w64"]
        == "custom op (triton), 1.000 ms against Inductor's 2.000"
    )
    assert record.under_compile["layer_norm float32 w32"] == "Inductor (not measured: not on a CUDA device)"
    assert "under torch.compile: layer_norm float32 w64: custom op (triton)" in record.summary()
    assert "under torch.compile" not in record.summary(under_compile=False)
    plain = swap(nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(32)))
    assert plain.summary().endswith("Inductor for 2 op/dtype/shape classes (not measured)")
