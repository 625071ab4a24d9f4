"""The fused loss of causal LMs (``fused_layers.causal_lm``): tiny models of every family the swap
table names, on the CPU (the Triton kernels under the interpreter), against the same model
unswapped: the loss and every parameter's gradient, the logits without labels, and the ways a
model is called (tuples, positional labels, num_items_in_batch, shift_labels, torch.compile).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from fused_layers import FusedLMHead, swap, unswap

transformers = pytest.importorskip("transformers")

VOCAB, BATCH, SEQ = 97, 2, 8  # a vocabulary that is a multiple of no block size
_LLAMA_LIKE = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=VOCAB,
    max_position_embeddings=SEQ,
    bos_token_id=0,
    eos_token_id=0,
    pad_token_id=0,
)

# family -> (config, its causal LM class name, whether the lm_head is the embedding's Parameter)
FAMILIES = {
    "gpt2": (
        lambda: transformers.GPT2Config(
            n_layer=1,
            n_embd=32,
            n_head=2,
            vocab_size=VOCAB,
            n_positions=SEQ,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=0,
            eos_token_id=0,
        ),  # fmt: skip
        True,
    ),
    "llama-tied": (lambda: transformers.LlamaConfig(**_LLAMA_LIKE, tie_word_embeddings=True), True),
    "llama": (lambda: transformers.LlamaConfig(**_LLAMA_LIKE, tie_word_embeddings=False), False),
    "mistral": (lambda: transformers.MistralConfig(**_LLAMA_LIKE), False),
    "qwen2": (lambda: transformers.Qwen2Config(**_LLAMA_LIKE), False),
    "qwen3": (lambda: transformers.Qwen3Config(**_LLAMA_LIKE, head_dim=8), False),
    "gemma": (lambda: transformers.GemmaConfig(**_LLAMA_LIKE, head_dim=8), True),
    "gemma2-softcap": (
        lambda: transformers.Gemma2Config(**_LLAMA_LIKE, head_dim=8, final_logit_softcapping=3.0),
        True,
    ),
    "gemma3-softcap": (
        lambda: transformers.Gemma3TextConfig(**_LLAMA_LIKE, head_dim=8, final_logit_softcapping=3.0),
        True,
    ),
}


def _model(family: str) -> nn.Module:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(FAMILIES[family][0]())
    return model.train()


def _batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (BATCH, SEQ), generator=generator)
    labels = ids.clone()
    labels[0, :3] = -100  # a padded prompt
    return ids, labels


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


@pytest.fixture(scope="module", params=list(FAMILIES))
def pair(request) -> tuple[str, nn.Module, nn.Module]:
    """(family, unswapped model, its copy with only the loss swapped)."""
    reference = _model(request.param)
    fused = copy.deepcopy(reference)
    record = swap(fused, ops=("linear_cross_entropy",))
    assert record.replaced_ops == {"": "linear_cross_entropy"}, record
    return request.param, reference, fused


def test_loss_and_every_gradient_match_the_unswapped_model(pair):
    family, reference, fused = pair
    ids, labels = _batch()
    for model in (reference, fused):
        model.zero_grad(set_to_none=True)
    expected = reference(input_ids=ids, labels=labels)
    got = fused(input_ids=ids, labels=labels)
    expected.loss.backward()
    got.loss.backward()
    assert isinstance(fused.lm_head, FusedLMHead)
    assert (fused.lm_head.weight is fused.get_input_embeddings().weight) == FAMILIES[family][1]  # ties kept
    assert got.logits is None and expected.logits.shape == (BATCH, SEQ, VOCAB)
    assert type(got) is type(expected)
    assert got.loss.item() == pytest.approx(expected.loss.item(), rel=1e-5)
    reference_grads, fused_grads = _grads(reference), _grads(fused)
    assert set(fused_grads) == set(reference_grads)
    worst = {name: _rel(fused_grads[name], reference_grads[name]) for name in reference_grads}
    assert max(worst.values()) < 1e-4, worst


def test_without_labels_the_logits_are_unchanged(pair):
    _, reference, fused = pair
    ids, _ = _batch(2)
    with torch.no_grad():
        expected, got = reference(input_ids=ids), fused(input_ids=ids)
    assert got.loss is None
    torch.testing.assert_close(got.logits, expected.logits, rtol=0, atol=0)


def _llama_pair() -> tuple[nn.Module, nn.Module]:
    reference = _model("llama-tied")
    fused = copy.deepcopy(reference)
    swap(fused, ops=("linear_cross_entropy",))
    return reference, fused


def test_tuple_output_positional_labels_and_hugging_face_loss_options():
    reference, fused = _llama_pair()
    ids, labels = _batch(3)
    with torch.no_grad():
        as_tuple = fused(input_ids=ids, labels=labels, return_dict=False)
        expected_tuple = reference(input_ids=ids, labels=labels, return_dict=False)
        # labels is LlamaForCausalLM.forward's sixth parameter
        positional = fused(ids, None, None, None, None, labels)
        summed = fused(input_ids=ids, labels=labels, num_items_in_batch=torch.tensor(5))
        expected_summed = reference(input_ids=ids, labels=labels, num_items_in_batch=torch.tensor(5))
        shift = torch.randint(0, VOCAB, (BATCH, SEQ))
        shifted = fused(input_ids=ids, labels=labels, shift_labels=shift)
        expected_shifted = reference(input_ids=ids, labels=labels, shift_labels=shift)
    assert isinstance(as_tuple, tuple) and len(as_tuple) == len(expected_tuple) - 1  # no logits
    assert as_tuple[0].item() == pytest.approx(expected_tuple[0].item(), rel=1e-5)
    assert positional.loss.item() == pytest.approx(expected_tuple[0].item(), rel=1e-5)
    assert summed.loss.item() == pytest.approx(expected_summed.loss.item(), rel=1e-5)
    assert shifted.loss.item() == pytest.approx(expected_shifted.loss.item(), rel=1e-5)
    assert shifted.loss.item() != pytest.approx(as_tuple[0].item(), rel=1e-3)


def test_a_failed_call_leaves_no_state_and_copies_use_their_own_head():
    reference, fused = _llama_pair()
    ids, labels = _batch(4)
    with pytest.raises(ValueError, match="labels must have shape"):
        fused(input_ids=ids, labels=labels[:, :-1])
    assert fused.lm_head.pending is None and fused.lm_head.loss is None
    twin = copy.deepcopy(fused)
    with torch.no_grad():
        expected = reference(input_ids=ids, labels=labels).loss
        got = twin(input_ids=ids, labels=labels).loss
    assert got.item() == pytest.approx(expected.item(), rel=1e-5)
    assert fused.lm_head.pending is None and twin.lm_head is not fused.lm_head


def test_unswap_restores_the_head_and_the_logits():
    _, fused = _llama_pair()
    head = fused.lm_head.weight
    unswap(fused)
    assert type(fused.lm_head) is nn.Linear and fused.lm_head.weight is head
    assert not fused._forward_hooks and not fused._forward_pre_hooks
    ids, labels = _batch(5)
    assert fused(input_ids=ids, labels=labels).logits.shape == (BATCH, SEQ, VOCAB)


def test_a_head_that_is_not_a_plain_linear_is_left_with_the_reason():
    model = _model("llama")
    model.lm_head = nn.Sequential(nn.Linear(32, VOCAB))
    record = swap(model, ops=("linear_cross_entropy",))
    left = {item.path: item for item in record.left}
    assert left[""].class_name == "LlamaForCausalLM" and "not a plain nn.Linear" in left[""].reason
    assert "" not in record.replaced_ops


def test_compiled_swapped_model_is_one_graph_with_the_same_loss():
    """Dynamo traces the hooks and the head's state with the forward (fullgraph: no break)."""
    reference, fused = _llama_pair()
    graphs = []

    def backend(gm, _inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(fused, backend=backend, fullgraph=True)
    ids, labels = _batch(6)
    got = compiled(input_ids=ids, labels=labels)
    expected = reference(input_ids=ids, labels=labels)
    got.loss.backward()
    expected.loss.backward()
    assert len(graphs) == 1 and got.logits is None
    assert got.loss.item() == pytest.approx(expected.loss.item(), rel=1e-5)
    assert _rel(fused.lm_head.weight.grad, reference.lm_head.weight.grad) < 1e-4
    assert fused.lm_head.pending is None


def _sdpa_masks(model: nn.Module, **inputs) -> list[bool]:
    """Per attention layer, whether SDPA got an explicit mask (torch.compile's graph of the forward)."""
    graphs = []

    def backend(gm, _inputs):
        graphs.append(gm)
        return gm.forward

    torch.compile(model, backend=backend)(**inputs)
    calls = [n for g in graphs for n in g.graph.nodes if "scaled_dot_product_attention" in str(n.target)]
    assert calls
    return [n.kwargs.get("attn_mask", n.args[3] if len(n.args) > 3 else None) is not None for n in calls]


def test_under_compile_sdpa_runs_causal_without_a_mask_where_eager_does(monkeypatch):
    """transformers before 5.24 (or on torch < 2.14) build the (B, 1, T, T) mask whenever Dynamo
    traces: that is simulated by turning Hugging Face's own skip off. The swapped model's SDPA
    then still gets no mask (is_causal), unless a padding mask is given; the loss is the same."""
    from transformers import masking_utils

    monkeypatch.setattr(masking_utils, "_ignore_causal_mask_sdpa", lambda *args, **kwargs: False)
    reference = _model("llama")
    fused = copy.deepcopy(reference)
    record = swap(fused, ops=("causal_mask",))
    assert record.replaced_ops == {"model": "causal_mask"} and fused.config._attn_implementation != "sdpa"
    ids, labels = _batch(7)
    assert all(_sdpa_masks(reference, input_ids=ids))
    assert not any(_sdpa_masks(fused, input_ids=ids))
    padded = torch.ones_like(ids)
    padded[0, :2] = 0
    assert all(_sdpa_masks(fused, input_ids=ids, attention_mask=padded))  # padding: Hugging Face's mask
    with torch.no_grad():
        expected = reference(input_ids=ids, labels=labels).loss
        got = fused(input_ids=ids, labels=labels).loss
        expected_padded = reference(input_ids=ids, attention_mask=padded, labels=labels).loss
        got_padded = fused(input_ids=ids, attention_mask=padded, labels=labels).loss
    assert got.item() == pytest.approx(expected.item(), rel=1e-5)
    assert got_padded.item() == pytest.approx(expected_padded.item(), rel=1e-5)
    unswap(fused)
    assert fused.config._attn_implementation == "sdpa"


def test_the_skip_conditions(monkeypatch):
    from fused_layers import causal_mask

    plain = dict(
        q_length=8, kv_length=8, q_offset=0, kv_offset=0, attention_mask=None, allow_is_causal_skip=True
    )
    # Dynamo before torch 2.13 read torch.compiler.is_exporting() as True while compiling too: unused
    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)
    assert causal_mask._skippable(plain)
    for change in (
        {"attention_mask": torch.ones(2, 8)},
        {"local_size": 4},
        {"allow_is_causal_skip": False},
        {"kv_length": 9},
        {"q_offset": torch.tensor(0)},
    ):
        assert not causal_mask._skippable({**plain, **change}), change
    monkeypatch.setattr(torch.compiler, "_is_exporting_flag", True)  # torch.export running
    assert not causal_mask._skippable(plain)


def test_a_model_without_sdpa_keeps_its_attention():
    model = transformers.AutoModelForCausalLM.from_config(FAMILIES["llama"][0](), attn_implementation="eager")
    record = swap(model, ops=("causal_mask",))
    left = {item.path: item.reason for item in record.left}
    assert "not 'sdpa'" in left["model"] and "model" not in record.replaced_ops
    assert model.config._attn_implementation == "eager"
