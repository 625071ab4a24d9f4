"""fused_layers.swap on a GPU with the measured default backends (Triton for every op since 2026-11-24).

Skips without CUDA. A small GPT-2 and Llama in fp32: logits match the unswapped model, and 15 AdamW
steps on one batch track its loss curve.
"""

from __future__ import annotations

import copy

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

transformers = pytest.importorskip("transformers")

import fused_layers  # noqa: E402

STEPS = 15


def _models() -> dict[str, torch.nn.Module]:
    gpt2 = transformers.GPT2Config(n_layer=2, n_embd=256, n_head=4, vocab_size=512, n_positions=128,
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    llama = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=256, intermediate_size=512,
                                     num_attention_heads=4, num_key_value_heads=4, vocab_size=512,
                                     max_position_embeddings=128)
    return {"gpt2": transformers.GPT2LMHeadModel(gpt2), "llama": transformers.LlamaForCausalLM(llama)}


def _losses(model: torch.nn.Module, batches: list[torch.Tensor]) -> list[float]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for ids in batches:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_swapped_model_matches_and_trains_alike_on_gpu(family):
    torch.manual_seed(0)
    reference = _models()[family].cuda()
    swapped = copy.deepcopy(reference)
    record = fused_layers.swap(swapped)
    assert record.replaced, record.summary()
    # one batch seen every step: the loss must fall (random tokens drawn afresh cannot be learnt)
    batches = [torch.randint(0, 512, (4, 128), device="cuda")] * STEPS
    with torch.no_grad():
        expected = reference(input_ids=batches[0]).logits
        got = swapped(input_ids=batches[0]).logits
    assert torch.allclose(got, expected, atol=2e-4, rtol=2e-4), (got - expected).abs().max()
    reference_losses = _losses(reference, batches)
    swapped_losses = _losses(swapped, batches)
    assert reference_losses[-1] < reference_losses[0]
    assert max(abs(a - b) for a, b in zip(reference_losses, swapped_losses, strict=True)) < 2e-3
