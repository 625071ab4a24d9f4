"""fused_layers.swap on tiny GPT-2, Llama and BERT built from configs, and on plain torch modules.

Runs the fused ops' Triton kernels (under TRITON_INTERPRET=1 without a GPU, set by conftest).
"""

from __future__ import annotations

import copy
import functools
import os

import pytest
import torch
from torch import nn

import fused_layers
from fused_layers import FusedGatedMLP, FusedGELU, FusedLayerNorm, FusedRMSNorm, swap, unswap
from fused_layers.dispatch import choose_backend

transformers = pytest.importorskip("transformers")
from transformers import activations  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRMSNorm  # noqa: E402

VOCAB = 128
SEQ = 16
BATCH = 2
TRAIN_STEPS = 20


def _gpt2() -> nn.Module:
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=VOCAB,
        n_positions=SEQ,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel(config)


def _llama() -> nn.Module:
    config = transformers.LlamaConfig(
        num_hidden_layers=2,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped queries: the fused RoPE sees Hq != Hk
        vocab_size=VOCAB,
        max_position_embeddings=SEQ,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    return transformers.LlamaForCausalLM(config)


def _bert() -> nn.Module:
    config = transformers.BertConfig(
        num_hidden_layers=2,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=SEQ,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=0,
    )
    return transformers.BertForMaskedLM(config)


# family -> (builder, source classes whose every instance swap must replace, classes whose every
# instance keeps its place but has its apply_rotary_pos_emb rerouted to the fused rope, whether the
# root (a causal LM) keeps its place with its loss fused and its base model its causal mask skipped)
FAMILIES = {
    "gpt2": (_gpt2, (nn.LayerNorm, activations.NewGELUActivation), (), True),
    "llama": (_llama, (LlamaRMSNorm, LlamaMLP), (LlamaAttention,), True),
    "bert": (_bert, (nn.LayerNorm, activations.GELUActivation), (), False),
}
FUSED = (FusedLayerNorm, FusedGELU, FusedRMSNorm, FusedGatedMLP)


def _build(family: str) -> nn.Module:
    torch.manual_seed(0)
    return FAMILIES[family][0]()


def _batches(n: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(1, VOCAB, (BATCH, SEQ), generator=generator) for _ in range(n)]


def _loss(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, labels=ids).loss


def _classes(model: nn.Module) -> dict[str, type]:
    return {path: type(module) for path, module in model.named_modules()}


def _globals_at_rest(namespace) -> dict:
    """The globals of ``namespace`` once every route of a model another test dropped is settled: a
    collected model's route is restored at the next safe point (``fused_layers.routing.settle``),
    which may otherwise be the swap under test (a garbage collection picks its moment)."""
    import gc

    from fused_layers import routing

    gc.collect()
    routing.settle()
    return dict(vars(namespace))


def _assert_namespace_unchanged(namespace, before: dict) -> None:
    """Every global of ``namespace`` is the object it was, and none was added."""
    after = vars(namespace)
    assert [name for name, value in before.items() if after.get(name) is not value] == []
    assert set(after) - set(before) <= {"__warningregistry__"}  # a warning raised in the module


def test_triton_path_is_exercised():
    x = torch.randn(4, 8)
    expected = "triton" if (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1") else "torch"
    assert choose_backend("layer_norm", None, x) == expected == "triton"


@pytest.mark.parametrize("family", FAMILIES)
def test_swap_matches_logits_and_records_exactly(family):
    model = _build(family).eval()
    swapped = copy.deepcopy(model)
    _, sources, rerouted, loss = FAMILIES[family]
    expected_paths = {path for path, m in model.named_modules() if type(m) in sources}
    rerouted_paths = {path for path, m in model.named_modules() if type(m) in rerouted}
    base = {"gpt2": "transformer", "llama": "model"}.get(family)
    kept_paths = rerouted_paths | ({"", base} if loss else set())
    keys_before = list(swapped.state_dict())

    record = swap(swapped)

    assert set(record.replaced_paths) == expected_paths | kept_paths
    assert len(record.replaced_paths) == len(expected_paths) + len(kept_paths)
    assert sum(record.replaced.values()) == len(expected_paths) + len(kept_paths)
    assert set(record.replaced) == {cls.__name__ for cls in sources} | {
        f"{cls.__name__}.apply_rotary_pos_emb" for cls in rerouted
    } | (
        {f"{type(model).__name__}.lm_head", f"{type(model.get_submodule(base)).__name__}.causal_mask"}
        if loss
        else set()
    )
    assert (record.replaced_ops.get("") == "linear_cross_entropy") == loss
    assert (record.replaced_ops.get(base) == "causal_mask") == loss
    assert record.left == []
    assert all(isinstance(swapped.get_submodule(path), FUSED) for path in expected_paths)
    assert {path for path, op in record.replaced_ops.items() if op == "rope"} == rerouted_paths
    assert all(type(swapped.get_submodule(path)) in rerouted for path in rerouted_paths)  # kept in place
    assert list(swapped.state_dict()) == keys_before
    ids = _batches(1)[0]
    with torch.no_grad():
        torch.testing.assert_close(swapped(ids).logits, model(ids).logits, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_training_curve_tracks_unswapped(family):
    reference = _build(family).train()
    fused = copy.deepcopy(reference)
    swap(fused)
    batches = _batches(2)
    curves = {}
    for name, model in (("reference", reference), ("fused", fused)):
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        losses = []
        # Two fixed batches in turn: a curve that falls well below ln(VOCAB) within 20 steps.
        for step in range(TRAIN_STEPS):
            ids = batches[step % len(batches)]
            loss = _loss(model, ids)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        curves[name] = losses
    diffs = [abs(a - b) for a, b in zip(curves["reference"], curves["fused"], strict=True)]
    assert max(diffs) < 1e-4, (curves, diffs)  # measured ~5e-7 in fp32
    assert curves["fused"][-1] < 0.8 * curves["fused"][0]  # it learns
    assert abs(curves["fused"][-1] - curves["reference"][-1]) / curves["reference"][-1] < 0.01


@pytest.mark.parametrize("family", FAMILIES)
def test_unswap_and_context_manager_restore_originals(family):
    model = _build(family)
    classes = _classes(model)
    params = {name: id(p) for name, p in model.named_parameters()}
    modeling = _globals_at_rest(modeling_llama)  # what unswap must leave as it found

    record = swap(model)
    assert record.replaced_paths
    assert _classes(model) != classes
    assert {name: id(p) for name, p in model.named_parameters()} == params  # same Parameter objects
    unswap(model)
    assert _classes(model) == classes
    assert {name: id(p) for name, p in model.named_parameters()} == params
    _assert_namespace_unchanged(modeling_llama, modeling)  # apply_rotary_pos_emb the same object again
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())

    with swap(model) as record:
        kept = ("rope", "linear_cross_entropy", "causal_mask")  # the module stays
        modules = [path for path, op in record.replaced_ops.items() if op not in kept]
        assert modules and all(isinstance(model.get_submodule(path), FUSED) for path in modules)
        if FAMILIES[family][3]:
            assert isinstance(model.lm_head, fused_layers.FusedLMHead)
    assert _classes(model) == classes
    _assert_namespace_unchanged(modeling_llama, modeling)
    unswap(model)  # nothing left to undo: a no-op
    assert _classes(model) == classes


class _StructuralRMSNorm(nn.Module):
    """Another family's RMSNorm copied from Llama (eps attribute named ``eps``)."""

    def __init__(self, width: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(width) + 0.5)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype)


class _OnePlusRMSNorm(_StructuralRMSNorm):
    """Gemma's variant: scales by (1 + weight), which the fused rms_norm does not."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return (1.0 + self.weight) * (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype)


class _GatedMLP(nn.Module):
    def __init__(self, act_fn: nn.Module, width: int = 16) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(width, 2 * width, bias=False)
        self.up_proj = nn.Linear(width, 2 * width, bias=False)
        self.down_proj = nn.Linear(2 * width, width, bias=False)
        self.act_fn = act_fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def test_torch_modules_structural_matches_and_left_reasons():
    torch.manual_seed(0)
    shared = nn.LayerNorm(16)
    model = nn.ModuleDict(
        {
            "ln": nn.LayerNorm(16, elementwise_affine=False),
            "ln_nobias": nn.LayerNorm(16, bias=False),
            "ln_2d": nn.LayerNorm((4, 16)),
            "gelu_erf": nn.GELU(),
            "gelu_tanh": nn.GELU(approximate="tanh"),
            "fast_gelu": activations.FastGELUActivation(),
            "quick_gelu": activations.QuickGELUActivation(),
            "rms": _StructuralRMSNorm(16),
            "one_plus_rms": _OnePlusRMSNorm(16),
            "swiglu_mlp": _GatedMLP(nn.SiLU()),
            "geglu_mlp": _GatedMLP(activations.GELUTanh()),
            "relu_mlp": _GatedMLP(nn.ReLU()),
            "a": nn.Sequential(shared),
            "b": nn.Sequential(shared),
        }
    )
    x = torch.randn(3, 4, 16)
    with torch.no_grad():
        expected = {name: model[name](x) for name in model}

    record = swap(model)

    left = {item.path: item for item in record.left}
    assert set(left) == {"ln_2d", "quick_gelu", "one_plus_rms", "relu_mlp"}
    assert "last dim" in left["ln_2d"].reason
    assert "differs" in left["one_plus_rms"].reason
    assert "ReLU" in left["relu_mlp"].reason
    assert "TABLE" in left["quick_gelu"].reason
    assert record.replaced == {
        "LayerNorm": 4,
        "GELU": 2,
        "FastGELUActivation": 1,
        "_StructuralRMSNorm": 1,
        "_GatedMLP": 2,
    }
    assert model["a"][0] is model["b"][0]  # a module shared by two paths stays shared
    assert model["gelu_tanh"].approximate == "tanh" and model["gelu_erf"].approximate == "none"
    assert model["geglu_mlp"].activation == "tanh" and model["swiglu_mlp"].activation == "silu"
    with torch.no_grad():
        for name in model:
            torch.testing.assert_close(model[name](x), expected[name], atol=1e-5, rtol=1e-4)
    unswap(model)
    assert type(model["rms"]) is _StructuralRMSNorm and model["a"][0] is shared


def test_ops_subset_and_unknown_op():
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.GELU())
    record = swap(model, ops=("gelu",))
    assert record.replaced == {"GELU": 1}
    assert [(item.path, item.reason) for item in record.left] == [("1", "op 'layer_norm' not in ops")]
    with pytest.raises(ValueError, match="unknown ops"):
        swap(model, ops=("softmax",))


def test_package_exports():
    for name in ("gelu", "layer_norm", "rms_norm", "geglu", "swiglu", "rope", "swap", "unswap", "SwapRecord"):
        assert hasattr(fused_layers, name), name


def test_cuda_backend_only_where_the_extension_has_the_op():
    modules = {"ln": nn.LayerNorm(8), "rms": _StructuralRMSNorm(8), "mlp": _GatedMLP(nn.SiLU(), 8)}
    model = nn.ModuleDict({**modules, "gelu": nn.GELU()})
    swap(model, backend="cuda")  # builds nothing: the backend is only stored until a forward
    assert model["ln"].backend == "cuda" and model["rms"].backend == "cuda"
    assert model["mlp"].backend is None and model["gelu"].backend is None


def _compile_counting(model: nn.Module) -> tuple[nn.Module, list]:
    """``torch.compile(model)`` with a backend that records each graph and runs it through aot_eager.

    aot_eager traces forward and backward with fake tensors (the custom ops' fake implementations
    and registered autograd) and then runs the graphs eagerly; one graph per break plus one.
    """
    import torch._dynamo

    aot_eager = torch._dynamo.lookup_backend("aot_eager")
    graphs: list = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return aot_eager(gm, example_inputs)

    return torch.compile(model, backend=backend), graphs


@functools.cache
def _compiled_bare(family: str) -> tuple[int, torch.Tensor, dict[str, torch.Tensor]]:
    """The unswapped model's graph count, loss and grads under `_compile_counting`: the same for
    both backends of the test below, so compiled once per family."""
    import torch._dynamo

    model = _build(family).train()
    torch._dynamo.reset()
    compiled, graphs = _compile_counting(model)
    loss = _loss(compiled, _batches(1)[0])
    loss.backward()
    return len(graphs), loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("backend", [None, "triton"], ids=["default", "triton"])
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_compile_swapped_model_no_more_graphs_and_same_numbers(family, backend):
    """torch.compile of a swapped model: no extra graph breaks, same loss and grads.

    By default the swapped layers give Inductor plain torch ops to fuse (no custom op in the graph);
    with backend="triton" the fused ops go into the graph as custom ops.
    """
    import torch._dynamo

    ids = _batches(1)[0]
    bare_count, bare_loss, bare_grads = _compiled_bare(family)
    model = _build(family).train()
    assert swap(model, backend=backend).replaced
    torch._dynamo.reset()
    compiled, graphs = _compile_counting(model)
    swapped_loss = _loss(compiled, ids)
    swapped_loss.backward()
    swapped_grads = {n: p.grad for n, p in model.named_parameters()}
    # every fused op went into a graph, none ran outside one
    graph_ops = {str(node.target) for gm in graphs for node in gm.graph.nodes}
    assert any("fused_layers" in target for target in graph_ops) == (backend == "triton"), graph_ops
    eager_model = copy.deepcopy(model)
    for param in eager_model.parameters():
        param.grad = None
    eager_loss = _loss(eager_model, ids)
    eager_loss.backward()
    torch.testing.assert_close(swapped_loss, eager_loss, atol=1e-5, rtol=1e-5)
    for name, param in eager_model.named_parameters():
        torch.testing.assert_close(param.grad, swapped_grads[name], atol=1e-5, rtol=1e-4)
    assert len(graphs) <= bare_count, (len(graphs), bare_count)
    torch.testing.assert_close(swapped_loss.detach(), bare_loss, atol=1e-4, rtol=1e-4)
    for name, grad in bare_grads.items():
        torch.testing.assert_close(swapped_grads[name], grad, atol=1e-4, rtol=1e-3, msg=name)


# ---- RoPE: a module-level function rerouted for the swapped model only --------------------------------


@pytest.fixture
def rope_calls(monkeypatch):
    """The threads that ran the fused rope's kernels (its autograd.Function), one entry per call.

    Also checks that no model of an earlier test still routes Hugging Face's function: swapped
    models that were never unswapped release their routes when collected (their swap record holds
    a cycle, so it takes a collection; compiled ones are held by Dynamo's caches until a reset), and
    routing.settle() puts the function back.
    """
    import gc
    import threading

    import torch._dynamo

    from fused_layers import routing
    from fused_layers.backends.triton.rope import RopeFunction

    torch._dynamo.reset()
    gc.collect()
    routing.settle()
    assert (
        routing.original_function(modeling_llama, "apply_rotary_pos_emb")
        is modeling_llama.apply_rotary_pos_emb
    )

    calls: list[str] = []
    apply = RopeFunction.apply

    def counting(*args):
        calls.append(threading.current_thread().name)
        return apply(*args)

    monkeypatch.setattr(RopeFunction, "apply", counting)
    return calls


def test_rope_is_rerouted_for_the_swapped_model_only(rope_calls):
    """Two Llamas in one process: the swapped one runs the fused rope, the other Hugging Face's."""
    original = modeling_llama.apply_rotary_pos_emb
    bare = _build("llama").eval()
    swapped = copy.deepcopy(bare)
    record = swap(swapped, ops=("rope",))
    assert record.replaced == {"LlamaAttention.apply_rotary_pos_emb": 2}
    assert modeling_llama.apply_rotary_pos_emb is not original  # the dispatcher, installed once
    ids = _batches(1)[0]
    with torch.no_grad():
        expected = bare(ids).logits
        assert rope_calls == []
        got = swapped(ids).logits
        assert len(rope_calls) == 2  # one per layer
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
        assert torch.equal(bare(ids).logits, expected) and len(rope_calls) == 2
    # a second swapped model shares the dispatcher; the function comes back with the last unswap
    other = copy.deepcopy(bare)
    swap(other, ops=("rope",))
    unswap(swapped)
    assert modeling_llama.apply_rotary_pos_emb is not original
    with torch.no_grad():
        swapped(ids), other(ids)
    assert len(rope_calls) == 4  # the other model only
    unswap(other)
    assert modeling_llama.apply_rotary_pos_emb is original


def test_rope_route_survives_an_exception_and_stays_on_its_thread(rope_calls):
    """A forward that raises leaves no route behind; another thread, running an unswapped model
    while the swapped attention's forward is running, gets Hugging Face's function."""
    import threading

    bare = _build("llama").eval()
    swapped = copy.deepcopy(bare)
    swap(swapped, ops=("rope",))
    ids = _batches(1)[0]
    attention = swapped.model.layers[0].self_attn
    with pytest.raises(Exception):  # noqa: B017 (whatever Hugging Face raises on a bad input)
        attention(torch.randn(1, 4, 31), position_embeddings=(torch.ones(1, 4, 8), torch.ones(1, 4, 8)))
    with torch.no_grad():
        bare(ids)
    assert rope_calls == []

    def run_bare_in_another_thread(_module, _args, _kwargs):
        thread = threading.Thread(target=lambda: bare(ids), name="other")
        thread.start()
        thread.join()

    # registered after swap's own pre-hook: it runs while the swapped forward is routed
    handle = attention.register_forward_pre_hook(run_bare_in_another_thread, with_kwargs=True)
    try:
        with torch.no_grad():
            swapped(ids)
    finally:
        handle.remove()
        unswap(swapped)
    assert rope_calls == ["MainThread", "MainThread"]


def test_rope_left_when_the_function_is_not_hugging_faces(monkeypatch):
    """The rows are checked at swap time: another formula, or another signature, stays."""

    def interleaved(q, k, cos, sin, unsqueeze_dim=1):  # GPT-J style pairs, not rotate_half
        def rotate(x):
            return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)

        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        return q * cos + rotate(q) * sin, k * cos + rotate(k) * sin

    model = _build("llama")
    monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", interleaved)
    record = swap(model, ops=("rope",))
    left = [item for item in record.left if item.class_name == "LlamaAttention"]
    assert record.replaced == {} and len(left) == 2
    assert all("differs" in item.reason for item in left), left
    assert modeling_llama.apply_rotary_pos_emb is interleaved
    monkeypatch.setattr(
        modeling_llama, "apply_rotary_pos_emb", lambda q, k, cos, sin, position_ids=None: (q, k)
    )
    record = swap(model, ops=("rope",))
    left = [item for item in record.left if item.class_name == "LlamaAttention"]
    assert len(left) == 2 and all("not Hugging Face's" in item.reason for item in left), left


def test_rope_swapped_twice_and_rebound_after_swap(rope_calls):
    model = _build("llama")
    original = modeling_llama.apply_rotary_pos_emb
    first = swap(model, ops=("rope",))
    second = swap(model, ops=("rope",))
    assert len(first.replaced_paths) == 2 and second.replaced_paths == []
    assert [item.reason for item in second.left if item.class_name == "LlamaAttention"] == [
        "its apply_rotary_pos_emb is already rerouted by an earlier swap"
    ] * 2

    def someone_elses(q, k, cos, sin, unsqueeze_dim=1):
        return original(q, k, cos, sin, unsqueeze_dim)

    modeling_llama.apply_rotary_pos_emb = someone_elses  # e.g. another library's global patch
    try:
        with pytest.warns(RuntimeWarning, match="rebound after the swap"):
            unswap(model)
        assert modeling_llama.apply_rotary_pos_emb is someone_elses  # theirs is left as it is
    finally:
        modeling_llama.apply_rotary_pos_emb = original


def test_rope_route_is_copied_with_the_model(rope_calls):
    """copy.deepcopy of a swapped model: the copy runs the fused rope too, and each unswaps alone."""
    original = modeling_llama.apply_rotary_pos_emb
    model = _build("llama").eval()
    swap(model)
    duplicate = copy.deepcopy(model)
    ids = _batches(1)[0]
    unswap(model)
    assert modeling_llama.apply_rotary_pos_emb is not original  # the copy still routes it
    with torch.no_grad():
        model(ids)
        assert rope_calls == []
        duplicate(ids)
    assert len(rope_calls) == 2
    unswap(duplicate)
    assert modeling_llama.apply_rotary_pos_emb is original
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in duplicate.modules())


@pytest.mark.parametrize(
    "config_name, attention",
    [
        ("MistralConfig", "MistralAttention"),
        ("Qwen2Config", "Qwen2Attention"),
        ("Qwen3Config", "Qwen3Attention"),
    ],
)
def test_rope_rows_of_other_families(rope_calls, config_name, attention):
    """Mistral, Qwen2 and Qwen3 (q/k norms before the rotation) get the fused rope, logits unchanged."""
    config = getattr(transformers, config_name)(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, vocab_size=VOCAB, max_position_embeddings=SEQ,
        bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    swapped = copy.deepcopy(model)
    record = swap(swapped, ops=("rope",))
    assert record.replaced == {f"{attention}.apply_rotary_pos_emb": 2}
    ids = _batches(1)[0]
    with torch.no_grad():
        torch.testing.assert_close(swapped(ids).logits, model(ids).logits, atol=1e-5, rtol=1e-4)
    assert len(rope_calls) == 2
    unswap(swapped)


def test_a_collected_route_is_restored_at_a_safe_point_not_in_the_finalizer():
    """A collection (which may run inside a torch.compile trace) only marks the route; the global
    stays the dispatcher, calling the original, until settle() or the next route or removal."""
    import gc
    import types

    from fused_layers import routing

    namespace = types.ModuleType("routing_test_namespace")
    original = lambda x: x + 1  # noqa: E731
    namespace.f = original
    module = nn.Linear(2, 2)
    routing.route_function(module, namespace, "f", lambda x: x * 10)
    dispatcher = namespace.f
    assert dispatcher is not original
    with torch.no_grad():
        calls = []
        module.register_forward_pre_hook(lambda m, args: calls.append(namespace.f(3)))
        module(torch.zeros(2))
    assert calls == [30]  # inside the routed forward: the implementation
    del module
    gc.collect()
    assert namespace.f is dispatcher and namespace.f(3) == 4  # marked, not rebound; the original runs
    routing.settle()
    assert namespace.f is original
    # the next route of the function settles first, then installs a fresh dispatcher
    other = nn.Linear(2, 2)
    route = routing.route_function(other, namespace, "f", lambda x: x * 10)
    assert namespace.f is not original and routing.original_function(namespace, "f") is original
    route.remove()
    assert namespace.f is original
