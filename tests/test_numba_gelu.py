"""The numba CUDA GELU (``fused_layers.backends.numba``) under numba's CUDA simulator on the CPU
(``NUMBA_ENABLE_CUDASIM=1``, set by conftest without a GPU): both forms, float32 and float16,
output and gradient against float64 torch; bfloat16 handed to Triton; one custom op when traced.
Small tensors: the simulator runs one Python thread per GPU thread."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fused_layers import dispatch, gelu

pytest.importorskip("numba")

# Max abs error against float64 on randn inputs: fp32 rounding; fp16's 2**-11 relative at |y| ~ 3.
TOLERANCE = {torch.float32: 1e-6, torch.float16: 4e-3}


@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_output_and_gradient_match_float64(dtype: torch.dtype, approximate: str) -> None:
    generator = torch.Generator().manual_seed(0)
    x = (torch.randn(3, 37, generator=generator) * 3).to(dtype).requires_grad_()  # 111: no full block
    dy = torch.randn(3, 37, generator=generator).to(dtype)
    y = gelu(x, approximate, backend="numba")
    y.backward(dy)
    reference = x.detach().double().requires_grad_()
    expected = F.gelu(reference, approximate=approximate)
    expected.backward(dy.double())
    assert y.dtype == dtype and y.shape == x.shape
    assert (y.double() - expected).abs().max().item() < TOLERANCE[dtype]
    assert (x.grad.double() - reference.grad).abs().max().item() < TOLERANCE[dtype]


def test_bfloat16_goes_to_triton_and_a_traced_call_is_one_custom_op() -> None:
    x = torch.randn(2, 40).to(torch.bfloat16)
    torch.testing.assert_close(gelu(x, backend="numba"), gelu(x, backend="triton"), rtol=0, atol=0)
    assert dispatch.has_implementation("gelu", "numba")
    graphs = []

    def keep(gm, _inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(lambda t: gelu(t, "tanh", backend="numba") * 2, backend=keep, fullgraph=True)
    x32 = torch.randn(2, 40)
    torch.testing.assert_close(compiled(x32), 2 * F.gelu(x32, approximate="tanh"), rtol=1e-5, atol=1e-6)
    targets = [str(node.target) for node in graphs[0].graph.nodes if node.op == "call_function"]
    assert any("gelu_numba" in target for target in targets), targets
