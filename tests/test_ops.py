"""fused_layers.ops against float64 torch references: outputs and every gradient.

Runs on the CPU under Triton's interpreter (tests/conftest.py switches it on), so shapes keep
few rows; the GPU versions of these checks are in tests/gpu/test_ops_gpu.py.
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch
from conftest import OPS, TOLERANCES

from fused_layers import dispatch
from fused_layers.backends import custom_ops
from fused_layers.backends.triton import heuristics, launch
from fused_layers.ops import geglu, gelu, layer_norm, rms_norm, swiglu

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
WIDTHS = (1, 7, 127, 1000, 4097)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", OPS)
def test_op_matches_float64(op_case, op, dtype, width):
    op_case(op, (3, width), dtype)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("layout", ["transposed", "strided", "row_strided"])
def test_non_contiguous_input(op_case, op, layout):
    op_case(op, (5, 127), torch.float32, layout=layout)
    op_case(op, (5, 127), torch.bfloat16, layout=layout)


@pytest.mark.parametrize("op", OPS)
def test_leading_shape(op_case, op):
    op_case(op, (2, 3, 100), torch.float32)
    op_case(op, (2, 3, 100), torch.float16, layout="transposed")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape", [(0, 64), (2, 0, 64)])
def test_zero_rows(op_case, op, shape):
    op_case(op, shape, torch.float32)


@pytest.mark.parametrize("weight, bias", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_layer_norm_optional_affine(op_case, weight, bias, dtype):
    op_case("layer_norm", (4, 1000), dtype, weight=weight, bias=bias)


def test_rms_norm_without_weight(op_case):
    op_case("rms_norm", (4, 1000), torch.float32, weight=False)
    op_case("rms_norm", (4, 1000), torch.bfloat16, weight=False)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("width", [1000, 4097])
def test_looped_path_forced(op_case, monkeypatch, op, dtype, width):
    """Rows wider than the fused limit walk the row in chunks: force it with a tiny limit."""
    monkeypatch.setattr(heuristics, "MAX_FUSED_WIDTH", 64)
    monkeypatch.setattr(heuristics, "LOOP_BLOCK", 256)
    op_case(op, (5, width), dtype)
    op_case(op, (5, width), dtype, layout="row_strided", weight=False)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_looped_path_wide_rows(op_case, op):
    """A real row past MAX_FUSED_WIDTH with the default chunk size: four whole chunks and a ragged
    one. Few: under Triton's interpreter LayerNorm takes about 0.45 s a chunk per call (8 s for a
    70,000-wide row; 2-core machine, 2026-11-25)."""
    width = heuristics.MAX_FUSED_WIDTH + heuristics.LOOP_BLOCK // 2 + 1
    assert width > heuristics.MAX_FUSED_WIDTH and width % heuristics.LOOP_BLOCK
    op_case(op, (2, width), torch.float32)
    op_case(op, (2, width), torch.bfloat16)


@pytest.mark.parametrize(
    ("op", "width", "warps"),
    [("layer_norm", 16384, 8), ("rms_norm", 16384, 16), ("layer_norm", 8192, 8), ("layer_norm", 4096, 4)],
)
def test_forward_plan_holds_wide_rows_with_the_measured_warps(op, width, warps):
    """H200, 2026-11-24: LayerNorm's forward at 8192x16384 held in registers with 8 warps ran at
    3.81 TB/s, with 16 at 2.36, looped at 3.34 (`heuristics.SETTINGS`' fwd_max_warps)."""
    heuristics._plans.clear()
    plan = heuristics.norm_plan(op, 8192, width, torch.device("cpu"))
    assert plan.fused and plan.block_n == width and plan.num_warps == warps


@pytest.mark.parametrize("op", ["gelu_tanh", "gelu_erf", "geglu", "swiglu"])
def test_elementwise_wide(op_case, op):
    """Elementwise ops are flat: a wide row spans many programs, with no width limit."""
    op_case(op, (1, 70001), torch.bfloat16)


@pytest.mark.parametrize("op", OPS)
def test_torch_backend(op_case, op):
    op_case(op, (3, 127), torch.float32, backend="torch")
    op_case(op, (3, 127), torch.bfloat16, backend="torch")


def test_backend_errors():
    x = torch.randn(2, 8)
    for gated in (swiglu, geglu):
        with pytest.raises(ValueError, match="no cuda implementation; use backend 'triton' or 'torch'"):
            gated(x, x, backend="cuda")
    with pytest.raises(ValueError, match="gelu: no cuda implementation"):
        gelu(x, backend="cuda")  # Triton's GELU was faster in both passes: no CUDA C++ one
    with pytest.raises(ValueError, match="unknown backend"):
        gelu(x, backend="numpy")
    with pytest.raises(ValueError, match="approximate"):
        gelu(x, approximate="sigmoid")
    with pytest.raises(ValueError, match="share shape"):
        swiglu(x, x[:, :4])
    with pytest.raises(ValueError, match="weight must have shape"):
        layer_norm(x, torch.ones(7))
    assert set(dispatch.DEFAULT_BACKEND) == {
        "gelu", "layer_norm", "rms_norm", "geglu", "swiglu", "rope", "linear_cross_entropy"
    }


def test_cpu_fallback_warns_once(monkeypatch):
    """Off CUDA and without the interpreter, every op runs its torch version; one warning per process."""
    monkeypatch.setattr(launch, "INTERPRETING", False)
    monkeypatch.setattr(dispatch, "_warned_fallback", False)
    x = torch.randn(3, 16, requires_grad=True)
    w = torch.randn(16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [gelu(x), layer_norm(x, w), rms_norm(x, w), geglu(x, x), swiglu(x, x)]
        outs.append(rms_norm(x, w, backend="cuda"))
    assert len([c for c in caught if "not on a CUDA device" in str(c.message)]) == 1
    for out in outs:  # torch versions: autograd graph of torch's own ops, no Python autograd.Function
        assert not isinstance(out.grad_fn, torch.autograd.function.BackwardCFunction), type(out.grad_fn)
    torch.testing.assert_close(outs[0], torch.nn.functional.gelu(x, approximate="tanh"))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("weight_dtype", ["same", "float32"])
def test_rms_norm_matches_llama(dtype, weight_dtype):
    """Output bit-for-bit (up to a rare last-place difference) and gradients close to LlamaRMSNorm."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    width = 1000
    module = LlamaRMSNorm(width, eps=1e-6)
    with torch.no_grad():
        module.weight.copy_(1 + 0.5 * torch.randn(width))
    module.to(dtype if weight_dtype == "same" else torch.float32)
    x = torch.randn(2, 3, width).to(dtype).requires_grad_()
    x_ours = x.detach().clone().requires_grad_()
    w_ours = module.weight.detach().clone().requires_grad_()
    ref = module(x)
    out = rms_norm(x_ours, w_ours, eps=1e-6, backend="triton")
    assert out.dtype == ref.dtype
    diff = (out.float() - ref.float()).abs()
    # fp32: rsqrt and the row sum may differ in the last place (reduction order), so a few
    # ulps; fp16/bf16: rounding to the input dtype hides that, so at most one ulp, rarely.
    # Triton's CPU interpreter (3.9) truncates fp32 -> bf16 casts instead of rounding to
    # nearest even as the GPU does, so under it bf16 gets two roundings' worth of slack and no
    # bit-equality check; tests/gpu/test_ops_gpu.py checks that on the GPU.
    interpreted_bf16 = dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"
    # fp16/bf16: a last-place difference in x_normed, times the weight, rounded again: 2 ulps
    ulps = 4 if ref.dtype == torch.float32 and dtype == torch.float32 else 2
    eps_in = torch.finfo(dtype).eps  # x_normed is rounded to the input dtype
    bound = (ulps * torch.finfo(ref.dtype).eps + (2 * eps_in if interpreted_bf16 else 0)) * ref.float().abs()
    assert bool((diff <= bound).all()), f"max diff {diff.max().item()}"
    if dtype != torch.float32 and not interpreted_bf16:
        assert (diff == 0).float().mean().item() >= 0.99
    dy = torch.randn_like(ref)
    ref.backward(dy)
    out.backward(dy)
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(x_ours.grad, x.grad, atol=atol, rtol=rtol)
    torch.testing.assert_close(w_ours.grad, module.weight.grad, atol=atol * 3, rtol=rtol)


def test_a_cuda_default_steps_aside_for_triton_off_gpu(monkeypatch):
    """A measured default may be CUDA C++ (layer_norm's and rms_norm's are); off the GPU, Triton serves."""
    assert all(set(pair) <= {"triton", "cuda"} for pair in dispatch.DEFAULT_BACKEND.values())
    monkeypatch.setitem(dispatch.DEFAULT_BACKEND, "layer_norm", ("cuda", "triton"))
    x = torch.randn(2, 8, requires_grad=True)
    assert dispatch._default_backend("layer_norm", (x,)) == "triton"
    with torch.no_grad():
        assert dispatch._default_backend("layer_norm", (x,)) == "triton"


# ---- the custom ops (torch.ops.fused_layers.*): registration, fake tensors, tracing -------------------


def _custom_op_cases() -> list:
    """(op name, args) for every Triton custom op, forward and backward, with odd shapes."""
    x = torch.randn(3, 5, 40)
    w, b = torch.randn(40), torch.randn(40)
    dy = torch.randn(3, 5, 40)
    stats = torch.stack([torch.randn(15), torch.rand(15) + 0.5])
    return [
        ("layer_norm", (x, w, b, 1e-5)),
        ("layer_norm", (x.to(torch.bfloat16), None, None, 1e-5)),
        ("layer_norm_backward", (dy, x, w, stats, True, True)),
        ("layer_norm_backward", (dy, x, None, stats, False, False)),
        ("rms_norm", (x, w, 1e-6)),
        ("rms_norm_backward", (dy, x, w, stats[1], True)),
        ("gelu", (x.transpose(0, 2), "tanh")),
        ("gelu_backward", (dy, x, "none")),
        ("gated", (x, x + 1, 2)),
        ("gated_backward", (dy, x, x + 1, 0)),
    ]


@pytest.mark.parametrize("case", range(10))
def test_custom_op_opcheck(case):
    """torch.library.opcheck: schema, fake implementation against the real one, autograd registration."""
    custom_ops.register_custom_ops()
    name, args = _custom_op_cases()[case]
    if name in ("layer_norm", "rms_norm", "gelu", "gated"):  # differentiable inputs for the autograd check
        args = tuple(a.detach().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point()
                     and a.dim() > 0 else a for a in args)  # fmt: skip
    torch.library.opcheck(getattr(torch.ops.fused_layers, name).default, args)


@pytest.mark.parametrize("op", OPS)
def test_fake_tensor_shapes(op):
    """Under FakeTensorMode the fused functions return fake outputs of the eager outputs' shape and dtype."""
    from conftest import _ours
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    x, b = torch.randn(2, 2, 3, 24, dtype=torch.bfloat16)
    inputs = {"x": x, "b": b, "weight": torch.randn(24), "bias": torch.randn(24)}
    expected = _ours(op, inputs, "triton")
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = {k: mode.from_tensor(v) for k, v in inputs.items()}
        out = _ours(op, fake, "triton")
    assert isinstance(out, FakeTensor)
    assert out.shape == expected.shape and out.dtype == expected.dtype


def test_eager_calls_skip_the_dispatcher_and_traced_calls_use_it():
    """Plain eager tensors run the thin autograd.Function; make_fx records the custom ops instead."""
    from torch.fx.experimental.proxy_tensor import make_fx

    x, w, b = torch.randn(4, 32, requires_grad=True), torch.randn(32), torch.randn(32)
    assert "LayerNormFunction" in type(layer_norm(x, w, b, backend="triton").grad_fn).__name__
    assert "RMSNormFunction" in type(rms_norm(x, w, backend="triton").grad_fn).__name__
    assert not custom_ops.traced(x)

    def step(x, w, b):
        y = layer_norm(x, w, b, backend="triton")
        return swiglu(gelu(y, backend="triton"), rms_norm(y, w, backend="triton"), backend="triton")

    graph = make_fx(step, tracing_mode="fake")(x.detach(), w, b)
    calls = [node.target for node in graph.graph.nodes if node.op == "call_function"]
    targets = [str(target) for target in calls if "getitem" not in str(target)]
    assert targets == [f"fused_layers.{op}.default" for op in ("layer_norm", "gelu", "rms_norm", "gated")], (
        targets
    )
    torch.testing.assert_close(graph(x.detach(), w, b), step(x.detach(), w, b))


def test_launch_hooks_count_only_when_set():
    """An empty HookChain (Triton >= 3.6's default hook) is no hook; a chain holding a call is one.

    Compared with None, the empty chain sent every eager launch through Triton's own launcher.
    """
    knobs = pytest.importorskip("triton.knobs")
    assert not launch._hooked(None)
    assert not launch._hooked(knobs.runtime.launch_enter_hook)
    if hasattr(knobs, "HookChain"):
        chain = knobs.HookChain()
        assert not launch._hooked(chain)
        chain.add(lambda *args: None)
        assert launch._hooked(chain)
    assert launch._hooked(lambda *args: None)  # older Triton: a plain callable


@pytest.mark.parametrize("programs, shape", [(1, (2, 5)), (300, (2, 1000)), (129, (7,))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_sum_partials_matches_torch(programs, shape, dtype):
    """The backward's last step: per-program fp32 partial rows summed in one kernel, cast to dtype."""
    from fused_layers.backends.triton.partials import sum_partials

    partial = torch.randn(programs, *shape, dtype=torch.float32)
    got = sum_partials(partial, dtype)
    expected = partial.double().sum(0)
    assert got.shape == expected.shape and got.dtype == dtype
    # fp32 sums in another order; bf16: one rounding (the interpreter truncates: one ulp)
    tol = (
        {"atol": 1e-4 * programs**0.5, "rtol": 1e-5}
        if dtype == torch.float32
        else {"atol": 0.05, "rtol": 2**-7}
    )
    torch.testing.assert_close(got.double(), expected, **tol)


# -- the gated MLP's backward writes over its own gradient -----------------------------------------


def _gated_mlp(seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A SwiGLU MLP (hidden 8, intermediate 24) and the same MLP fused with the Triton backend."""
    from fused_layers import FusedGatedMLP

    torch.manual_seed(seed)
    gate, up, down = torch.nn.Linear(8, 24), torch.nn.Linear(8, 24), torch.nn.Linear(24, 8)

    class Plain(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate_proj, self.up_proj, self.down_proj = gate, up, down

        def forward(self, x):
            return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))

    return Plain(), FusedGatedMLP(gate, up, down, "silu", backend="triton")


def _overwrites(monkeypatch) -> list[bool]:
    """Record, per call of the Triton gated backward, whether it returned dc's buffer as da."""
    from fused_layers.backends.triton import gated

    seen, real = [], gated._gated_bwd

    def spy(dc, *args, **kwargs):
        da, db = real(dc, *args, **kwargs)
        seen.append(da.data_ptr() == dc.data_ptr())
        return da, db

    monkeypatch.setattr(gated, "_gated_bwd", spy)
    return seen


def _grads(model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    x = x.clone().requires_grad_()
    model(x).square().sum().backward()
    grads = [x.grad] + [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


def test_the_fused_mlps_backward_writes_over_its_own_gradient_and_stays_exact(monkeypatch):
    seen = _overwrites(monkeypatch)
    plain, fused = _gated_mlp()
    x = torch.randn(5, 8)
    expected = _grads(plain, x)
    got = _grads(fused, x)
    assert seen == [True]
    for want, have in zip(expected, got, strict=True):
        torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-5)


def test_a_hook_on_down_proj_or_a_direct_call_keeps_the_gradient_intact(monkeypatch):
    seen = _overwrites(monkeypatch)
    plain, fused = _gated_mlp()
    x = torch.randn(5, 8)
    kept = []
    def keep_input_gradient(module, inputs, output) -> None:
        inputs[0].register_hook(kept.append)

    # A user's forward hook holding the gradient of down_proj's input: it must read the real one.
    handle = fused.down_proj.register_forward_hook(keep_input_gradient)
    try:
        _grads(fused, x)
    finally:
        handle.remove()
    hidden = torch.nn.functional.silu(plain.gate_proj(x)) * plain.up_proj(x)
    hidden.retain_grad()
    plain.down_proj(hidden).square().sum().backward()
    torch.testing.assert_close(kept[0], hidden.grad, rtol=1e-5, atol=1e-5)
    # The public op on its own never overwrites: its caller may hold the output's gradient.
    a, b = torch.randn(4, 6, requires_grad=True), torch.randn(4, 6, requires_grad=True)
    c = swiglu(a, b, backend="triton")
    c.retain_grad()
    c.sum().backward()
    torch.testing.assert_close(c.grad, torch.ones(4, 6))
    assert seen == [False, False]
