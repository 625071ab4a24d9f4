"""The fused ops as custom ops on a GPU: direct launch, CUDA-graph capture, Inductor.

Skips without CUDA. The CPU side (opcheck, fake tensors, graph counts under aot_eager) is in
tests/test_ops.py and tests/test_swap.py.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

from fused_layers.backends.triton import launch  # noqa: E402
from fused_layers.ops import gelu, layer_norm, rms_norm, swiglu  # noqa: E402


def _ops(backend: str) -> dict:
    ops = {
        "layer_norm": (lambda x, w, b: layer_norm(x, w, b, backend=backend), 3),
        "rms_norm": (lambda x, w, b: rms_norm(x, w, backend=backend), 2),
    }
    if backend == "triton":  # the CUDA C++ backend has the norms only
        ops["gelu"] = (lambda x, w, b: gelu(x, backend=backend), 1)
        ops["swiglu"] = (lambda x, w, b: swiglu(x, x * 0.5, backend=backend), 1)
    return ops


def _leaves(shape: tuple[int, int], offset: int = 0) -> list[torch.Tensor]:
    """x (bf16, starting ``offset`` elements into its storage: 16-byte misaligned when odd), w, b."""
    rows, width = shape
    storage = torch.randn(rows * width + offset, device="cuda", dtype=torch.bfloat16)
    x = storage[offset:].view(rows, width)
    w = torch.rand(width, device="cuda", dtype=torch.bfloat16) + 0.5
    b = torch.randn(width, device="cuda", dtype=torch.bfloat16)
    return [t.detach().requires_grad_() for t in (x, w, b)]


def _run(fn, leaves, n_inputs, dy):
    out = fn(*leaves)
    grads = torch.autograd.grad(out, leaves[:n_inputs], dy)
    return [out.detach(), *grads]


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "gelu", "swiglu"])
@pytest.mark.parametrize(
    "shape, offset", [((512, 1024), 0), ((300, 1000), 1), ((4, 20000), 0), ((77, 96), 3)]
)
def test_direct_launch_matches_tritons_launcher(monkeypatch, op, shape, offset):
    """The cached direct launch (from the second call on) gives what Triton's own launcher gives."""
    fn, n_inputs = _ops("triton")[op]
    torch.manual_seed(0)
    leaves = _leaves(shape, offset)
    dy = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    monkeypatch.setattr(launch, "DIRECT_LAUNCH", False)
    expected = _run(fn, leaves, n_inputs, dy)
    monkeypatch.setattr(launch, "DIRECT_LAUNCH", True)
    for _ in range(3):  # the first call fills the cache, the others launch directly
        got = _run(fn, leaves, n_inputs, dy)
        for g, e in zip(got, expected, strict=True):
            torch.testing.assert_close(g, e, atol=0, rtol=0)
    # ...and they really do: Triton's own launcher (JITFunction.run) is not called once warm
    from triton.runtime.jit import JITFunction

    through_triton = []
    original_run = JITFunction.run

    def counting_run(self, *args, **kwargs):
        through_triton.append(self.fn.__name__)
        return original_run(self, *args, **kwargs)

    monkeypatch.setattr(JITFunction, "run", counting_run)
    _run(fn, leaves, n_inputs, dy)
    assert through_triton == [], f"launched through Triton's launcher: {through_triton}"
    monkeypatch.setattr(JITFunction, "run", original_run)
    # the same shape 16-byte aligned (or not) must get its own kernel, not reuse the other's
    other = _leaves(shape, 0 if offset else 1)
    monkeypatch.setattr(launch, "DIRECT_LAUNCH", False)
    expected = _run(fn, other, n_inputs, dy)
    monkeypatch.setattr(launch, "DIRECT_LAUNCH", True)
    for g, e in zip(_run(fn, other, n_inputs, dy), expected, strict=True):
        torch.testing.assert_close(g, e, atol=0, rtol=0)


@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_ops_capture_in_cuda_graphs(backend):
    """Forward+backward of every op captured in one CUDA graph, replayed on new data, equals eager."""
    if backend == "cuda":
        from fused_layers.backends.cuda.build import CudaExtensionUnavailable, load_extension

        try:
            load_extension()
        except CudaExtensionUnavailable as error:
            pytest.skip(str(error))
    for op, (fn, n_inputs) in _ops(backend).items():
        torch.manual_seed(0)
        leaves = _leaves((256, 1024))
        dy = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):  # warm-up off the default stream: compiles, fills caches
                _run(fn, leaves, n_inputs, dy)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static = _run(fn, leaves, n_inputs, dy)
        with torch.no_grad():
            for leaf in leaves:
                leaf.copy_(torch.randn_like(leaf) + (0.5 if leaf.dim() == 1 else 0))
        graph.replay()
        torch.cuda.synchronize()
        expected = _run(fn, leaves, n_inputs, dy)
        for s, e in zip(static, expected, strict=True):
            torch.testing.assert_close(s, e, atol=0, rtol=0, msg=lambda m, op=op: f"{backend} {op}: {m}")


def _tiny(family: str) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if family == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=64,
                                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
        return transformers.GPT2LMHeadModel(config).cuda()
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                      num_attention_heads=2, num_key_value_heads=2, vocab_size=256,
                                      max_position_embeddings=64)  # fmt: skip
    return transformers.LlamaForCausalLM(config).cuda()


@pytest.mark.parametrize("backend", [None, "triton"], ids=["default", "triton"])
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_inductor_compiles_swapped_model(family, mode, backend):
    """Inductor (and its CUDA graphs) on a swapped model: no more graphs than bare, same loss and grads.

    By default the swapped layers hand Inductor plain torch ops; backend="triton" puts the custom ops
    (triton_op) into its graphs.
    """
    import torch._dynamo
    from torch._inductor.compile_fx import compile_fx

    import fused_layers

    ids = torch.randint(0, 256, (2, 64), device="cuda")
    counts = {}
    for variant in ("bare", "swapped"):
        model = _tiny(family).train()
        if variant == "swapped":
            assert fused_layers.swap(model, backend=backend).replaced
        reference = copy.deepcopy(model)
        torch._dynamo.reset()
        graphs: list = []

        def recording_inductor(gm, example_inputs, graphs=graphs):
            graphs.append(gm)
            return compile_fx(gm, example_inputs)

        if mode is None:
            compiled = torch.compile(model, backend=recording_inductor)
        else:
            compiled = torch.compile(model, mode=mode)
        for _ in range(3):  # cudagraph trees record on a later call
            for param in model.parameters():
                param.grad = None
            loss = compiled(input_ids=ids, labels=ids).loss
            loss.backward()
        expected = reference(input_ids=ids, labels=ids).loss
        expected.backward()
        torch.testing.assert_close(loss, expected, atol=1e-4, rtol=1e-4)
        for (name, param), ref in zip(model.named_parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(param.grad, ref.grad, atol=1e-4, rtol=1e-3, msg=name)
        counts[variant] = len(graphs)
        if variant == "swapped" and mode is None:
            targets = {str(node.target) for gm in graphs for node in gm.graph.nodes}
            assert any("fused_layers" in target for target in targets) == (backend == "triton"), targets
    if mode is None:
        assert 0 < counts["swapped"] <= counts["bare"], counts
