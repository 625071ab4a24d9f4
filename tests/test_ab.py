"""trainprof.ab on the CPU: gpt2-tiny, bare vs fused, a few steps (one run shared by the tests).

The fused ops run their plain-torch fallback here (TRITON_INTERPRET unset for the run: the Triton
interpreter costs ~2 s a step); swap still replaces HF's NewGELUActivation (pow, tanh, mul, add)
by one gelu op, which the diff must show.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import trainprof
from trainprof.ab import REPLACED_RANGE, ABResult, Variant, median_ci, run_model
from trainprof.cli import main


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("ab")
    patch = pytest.MonkeyPatch()
    patch.delenv("TRITON_INTERPRET", raising=False)
    from fused_layers.backends.triton import launch

    # fused_layers reads TRITON_INTERPRET once, at import: another test file may have imported it first.
    patch.setattr(launch, "INTERPRETING", False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 2 shared cores: spinning worker threads made steps 100x slower
    try:
        result = run_model(
            "gpt2-tiny", ["bare", "fused"], steps=3, warmup=1, block=1, device="cpu", log_dir=log_dir
        )
    finally:
        torch.set_num_threads(threads)
        patch.undo()
    return result, log_dir


def test_json_shape_and_host_clock(tiny_run):
    result, _ = tiny_run
    data = json.loads(json.dumps(result.to_dict()))
    assert data["clock"] == "host" and "host time" in data["method"]["timing"]
    assert [v["name"] for v in data["variants"]] == ["bare", "fused"], data["skipped"]
    for variant in data["variants"]:
        assert len(variant["blocks_ms"]) == 2 and len(variant["losses"]) == 3
        assert variant["ci_low_ms"] <= variant["median_ms"] <= variant["ci_high_ms"]
        assert variant["tokens_per_s"] > 0 and 0 < variant["mfu"] < 1
        assert variant["peak_memory_bytes"] is None  # not measured on a CPU
    assert data["variants"][0]["speedup"] == 1.0
    notes = data["variants"][1]["notes"][0]
    assert "lm_head x1, GPT2Model.causal_mask x1, LayerNorm x5, NewGELUActivation x2" in notes
    assert data["config"]["tokens_per_step"] == 2 * 32 and data["config"]["flops_per_step"] > 0


def test_loss_parity_holds(tiny_run):
    result, _ = tiny_run
    bare, fused = result.variant("bare"), result.variant("fused")
    assert bare.losses[0] == pytest.approx(6.24, abs=0.05)  # ln(512) = 6.24 at a random init
    assert fused.parity_ok and fused.parity_max_rel_diff <= 1e-3
    assert bare.losses != [bare.losses[0]] * 3  # the model trains: the loss moves


def test_parity_noise_floor_is_measured(tiny_run):
    result, _ = tiny_run
    floor = result.parity_noise_floor
    assert floor is not None and 0 <= floor < 1e-4  # fp32 weights moved by 2^-23, three steps
    assert result.variant("fused").parity_tolerance == 1e-3  # the fixed fp32 tolerance dominates
    assert "noise floor" in result.method["parity"] or "rounding step" in result.method["parity"]


def _logistic_factory(rate_of):
    """A chaotic 'training' (the logistic map at r=3.9): one rounding step of difference in w grows
    to order one within ~30 steps, as bf16 weight updates do over a Llama run."""

    def factory(variant: Variant):
        w = torch.nn.Parameter(torch.full((4,), 0.3, dtype=torch.float32))
        model = torch.nn.Module()
        model.w = w
        rate = rate_of(variant)

        def step(i: int) -> torch.Tensor:
            with torch.no_grad():
                if variant.fused:  # the same map, another rounding order
                    w.copy_(rate * w - rate * w * w)
                else:
                    w.copy_(rate * w * (1 - w))
            return w.sum() + 1.0

        return step, model

    return factory


def _logistic_ab(rate_of) -> ABResult:
    """bare and fused of `_logistic_factory(rate_of)`, 60 steps on the CPU, no profile."""
    return trainprof.ab.run(
        _logistic_factory(rate_of), variants=("bare", "fused"), steps=60, warmup=1, block=5, device="cpu",
        profile=False,
    )  # fmt: skip


def test_parity_allows_the_drift_rounding_alone_makes():
    result = _logistic_ab(lambda variant: 3.9)
    fused = result.variant("fused")
    assert fused.parity_max_rel_diff > 1e-2  # far beyond the fixed fp32 tolerance of 1e-3 ...
    assert result.parity_noise_floor > 1e-2  # ... and so is the twin's drift
    assert fused.parity_ok, (fused.parity_max_rel_diff, fused.parity_tolerance)


def test_parity_catches_a_wrong_variant_before_the_twin_drifts():
    # The "fused" variant uses another rate: wrong from its first step, when the twin is still level.
    result = _logistic_ab(lambda variant: 3.95 if variant.fused else 3.9)
    assert not result.variant("fused").parity_ok


def test_diff_lists_the_swapped_ops(tiny_run):
    result, log_dir = tiny_run
    ops = {row["name"]: row for row in result.diffs["fused"]["ops"]}
    # NewGELUActivation's tanh formula became one gelu op, forward and backward.
    assert ops["aten::tanh"]["status"] == "removed" and ops["aten::tanh"]["calls_a"] == 2.0
    assert ops["aten::gelu"]["status"] == "added" and ops["aten::gelu"]["calls_b"] == 2.0
    assert ops["aten::gelu_backward"]["status"] == "added"
    assert sorted(p.name for p in log_dir.iterdir()) == ["_prediction", "bare", "fused"]
    assert main(["diff", str(log_dir / "bare"), str(log_dir / "fused"), "--json"]) == 0


def test_prediction_sees_the_replaced_modules(tiny_run):
    result, _ = tiny_run
    prediction = result.prediction
    assert prediction["replaced_modules"] == 7 and prediction["replaced_calls_per_step"] == 7.0
    assert prediction["ranges_per_step"] == 14.0  # forward and backward of each, in the profiled step
    assert prediction["host_ms_per_step"] > 0
    assert prediction["available"] is False and "CPU" in prediction["reason"]


def test_markdown_and_console_render(tiny_run):
    import io

    from trainprof.report.ab import print_ab, render_ab_markdown

    data = tiny_run[0].to_dict()
    markdown = render_ab_markdown(data)
    assert markdown.startswith("## A/B: gpt2-tiny") and "a CPU run: every time is host time" in markdown
    out = io.StringIO()
    print_ab(data, out)
    assert "bare -> fused: ops that changed" in out.getvalue()


def test_a_cpu_run_prints_only_what_it_measured(tiny_run):
    """`trainprof ab --device cpu` printed ~100 lines of zero GPU columns and three prediction lines
    that said opposite things (issue #37, item 6); its fused variant ran torch code unsaid."""
    import io

    from trainprof.ab.variants import ON_CPU_NOTE
    from trainprof.report.ab import print_ab

    data = tiny_run[0].to_dict()
    out = io.StringIO()
    print_ab(data, out, width=160)
    text = out.getvalue()
    for unmeasured in ("GPU busy %", "kernel GPU ms", "kernels / step", "launches / step", "memcpys / step",
                       "syncs / step", "GPU ms", "peak memory"):
        assert unmeasured not in text, unmeasured
    assert "host ms bare" in text and "cpu ops / step" in text
    predictions = [line for line in text.splitlines() if "prediction" in line or line.startswith("model:")]
    assert predictions == ["no fused prediction: " + data["prediction"]["reason"]]
    assert ON_CPU_NOTE in data["variants"][1]["notes"]
    assert "fused: on the CPU the swapped modules run fused_layers' plain torch versions" in text


def test_user_step_function_api():
    def factory(variant: Variant):
        torch.manual_seed(0)
        model = variant.apply(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        data = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))

        def step(i: int) -> torch.Tensor:
            loss = model(data).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            return loss

        return step

    result = trainprof.ab.run(
        factory, variants=("bare",), steps=4, warmup=1, block=1, device="cpu", profile=False
    )
    assert result.variants[0].parity_ok and len(result.variants[0].losses) == 4
    assert result.variants[0].losses[-1] < result.variants[0].losses[0]


def test_variants_run_interleaved_in_rotated_order():
    order = []

    def factory(variant: Variant):
        def step(i: int) -> torch.Tensor:
            order.append(variant.name)
            return torch.tensor(1.0)

        return step

    variants = ("bare", "fused", "compile")
    trainprof.ab.run(factory, variants, steps=4, warmup=1, block=1, device="cpu", profile=False)
    warmup = list(variants)
    rounds = ["bare", "fused", "compile", "fused", "compile", "bare", "compile", "bare", "fused"]
    assert order == warmup + rounds


def test_importing_the_package_imports_no_torch():
    code = (
        "import sys, trainprof; names = trainprof.ab.__all__; "
        "assert 'torch' not in sys.modules, 'torch imported'; "
        "assert 'run' in names and 'run_model' in names"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_variant_parsing_and_median_ci():
    assert Variant.parse("fused+compile") == Variant("fused+compile", fused=True, compile=True)
    for bad in ("fast", "fused+liger", "fused+fused", ""):
        with pytest.raises(ValueError):
            Variant.parse(bad)
    low, high, coverage = median_ci([5.0, 1.0, 4.0, 2.0, 3.0, 9.0, 7.0, 8.0, 6.0])
    assert (low, high) == (2.0, 8.0) and coverage == pytest.approx(0.9609, abs=1e-4)
    assert median_ci([1.0, 2.0]) == (1.0, 2.0, 0.5)
    assert REPLACED_RANGE.startswith("trainprof.")


def test_analyze_never_takes_the_prediction_folder_for_a_run(tiny_run):
    """`ab --log-dir` keeps its prediction's trace in `_prediction`, written last: `trainprof analyze
    DIR` took it for the newest run."""
    from trainprof.trace import newest_run

    _, log_dir = tiny_run
    assert (log_dir / "_prediction").is_dir()
    run, runs = newest_run(log_dir)
    assert run is not None and sorted(r.name for r in runs) == ["bare", "fused"]


def _variant(name: str, low: float, high: float, coverage: float) -> dict:
    return {"name": name, "notes": [], "median_ms": (low + high) / 2, "ci_low_ms": low, "ci_high_ms": high,
            "ci_coverage": coverage, "speedup": 1.0, "mfu": None, "tokens_per_s": None,
            "peak_memory_bytes": None, "parity_ok": None}


def test_overlapping_intervals_cannot_be_told_apart(tiny_run):
    from trainprof.ab.results import VariantResult
    from trainprof.ab.runner import compare_intervals
    from trainprof.report.ab import ab_tables

    def result(low: float, high: float) -> VariantResult:
        return VariantResult(**{**_variant("v", low, high, 0.5), "blocks_ms": [], "losses": [],
                                "parity_max_rel_diff": None})

    reference = result(10.0, 12.0)
    assert compare_intervals(reference, result(11.0, 13.0)) == "cannot tell apart"
    assert compare_intervals(reference, result(7.0, 9.5)) == "faster"
    assert compare_intervals(reference, result(12.5, 14.0)) == "slower"
    # the tiny run: 2 timed blocks per variant, so its intervals cover the median with 50%, not 95%
    data = tiny_run[0].to_dict()
    assert data["variants"][1]["vs_reference"] in ("faster", "slower", "cannot tell apart")
    (variants, *_) = ab_tables(data)
    assert [c.name for c in variants.columns][2:5] == ["CI of the median (coverage)", "speedup", "vs bare"]
    assert all(row[2].endswith("(50%)") for row in variants.rows)
    assert variants.rows[1][4] == data["variants"][1]["vs_reference"]


def test_cli_unknown_model_is_one_line(capsys):
    assert main(["ab", "--model", "/nonexistent/config-dir", "--steps", "2", "--warmup", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainprof: error: --model /nonexistent/config-dir") and err.count("\n") == 1


@pytest.mark.parametrize("quiet", [False, True])
def test_cli_prints_its_phases_once_per_run_unless_quiet(capsys, quiet):
    argv = ["ab", "--model", "gpt2-tiny", "--variants", "bare", "--steps", "2", "--warmup", "1",
            "--block", "1", "--device", "cpu", "--no-profile", "--json"]  # fmt: skip
    argv += ["--quiet"] if quiet else []
    for _ in range(2):  # a second run in the same process: its handler gone, the lines not doubled
        assert main(argv) == 0
        err = capsys.readouterr().err
        phases = [line for line in err.splitlines() if line.startswith("trainprof ab: ")]
        if quiet:
            assert phases == []
        else:
            assert [line.split(" (")[0] for line in phases] == [
                "trainprof ab: bare built and warmed up",
                "trainprof ab: 1 timed rounds done",
                "trainprof ab: parity noise twin done",
                "trainprof ab: matmul peak and copy bandwidth measured",
            ]


# ---- RoPE: rerouted by swap, so ranged through a routed function rather than a module's hooks ------


def _tiny_llama():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256, max_position_embeddings=32, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def test_prediction_ranges_rope_forward_and_backward(monkeypatch):
    """The annotated step covers RoPE: each attention's apply_rotary_pos_emb is ranged in forward
    and backward (its backward ops inside the range), with the fused kernel's fewest bytes; the
    model and the modeling module are as before afterwards."""
    from torch.profiler import profile
    from transformers.models.llama import modeling_llama

    from fused_layers.backends.triton import launch
    from trainprof.ab.prediction import annotate_swappable

    monkeypatch.setattr(launch, "INTERPRETING", False)  # swap's check runs the torch versions
    model = _tiny_llama()
    hf_rope = modeling_llama.apply_rotary_pos_emb
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    with annotate_swappable(model) as seen, profile() as prof:
        model(input_ids=ids, labels=ids).loss.backward()
    assert modeling_llama.apply_rotary_pos_emb is hf_rope
    assert not any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks for m in model.modules())
    assert sorted(path for path, op in seen.paths.items() if op == "rope") == [
        "model.layers.0.self_attn",
        "model.layers.1.self_attn",
    ]
    assert len(seen.paths) == 9  # and 5 RMSNorms, 2 MLPs
    # per RoPE call, fp32: q (2, 4, 16, 16) and k (2, 2, 16, 16), in and out, in both passes, plus
    # cos and sin (one 16-wide row per position) read in both passes
    q_k_bytes = (2 * 4 * 16 * 16 + 2 * 2 * 16 * 16) * 4
    assert seen.bytes_per_call.count(2 * 2 * q_k_bytes + 2 * 2 * (2 * 16 * 16) * 4) == 2
    events = prof.events()
    ranges = [e for e in events if e.name == REPLACED_RANGE]
    assert len(ranges) == 18  # forward and backward of each of the 9
    negations = [e for e in events if e.name == "NegBackward0"]  # rotate_half's -x2, in backward
    assert len(negations) == 4  # q and k, two layers
    for event in negations:
        assert any(
            r.thread == event.thread and r.time_range.start <= event.time_range.start <= r.time_range.end
            for r in ranges
        ), event


def test_functions_are_routed_through_a_decorated_forward():
    """A forward wrapped by a decorator (functools.wraps, as transformers 5.24's deprecate_kwarg
    wraps LlamaAttention.forward) is read through ``__wrapped__``: the wrapper's own code calls none
    of the modeling module's functions by name."""
    import functools
    import types

    from trainprof.ab.variants import _route_functions

    modeling = types.ModuleType("fake_modeling")
    exec(
        "import functools, torch\n"
        "def rope(x):\n    return x + 1\n"
        "def keyword_renamed(fn):\n"
        "    @functools.wraps(fn)\n"
        "    def wrapper(*args, **kwargs):\n        return fn(*args, **kwargs)\n"
        "    return wrapper\n"
        "class Attention(torch.nn.Module):\n"
        "    @keyword_renamed\n"
        "    def forward(self, x):\n        return rope(x)\n",
        modeling.__dict__,
    )
    assert "rope" not in modeling.Attention.forward.__code__.co_names  # the wrapper's code
    routed, other = modeling.Attention(), modeling.Attention()
    assert _route_functions(routed, modeling, {"rope": functools.partial(torch.mul, 10)}) == 1
    x = torch.ones(2)
    assert torch.equal(routed(x), x * 10) and torch.equal(other(x), x + 1)


def test_liger_functions_are_routed_to_the_model_only():
    """apply_liger's last step: a function Liger rebound in the modeling module (and that apply_liger
    put back) runs for this model's attention modules only."""
    from transformers.models.llama import modeling_llama

    from trainprof.ab.variants import _route_functions

    model, other = _tiny_llama(), _tiny_llama()
    hf_rope = modeling_llama.apply_rotary_pos_emb
    calls = []

    def liger_like(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
        calls.append(q.shape)
        return hf_rope(q, k, cos, sin, unsqueeze_dim)

    assert _route_functions(model, modeling_llama, {"apply_rotary_pos_emb": liger_like}) == 2
    ids = torch.randint(0, 256, (1, 8))
    with torch.no_grad():
        other(ids)
        assert calls == []
        model(ids)
    assert len(calls) == 2


def test_ab_reads_mfu_against_the_datasheet_table_the_analysis_reads(monkeypatch):
    """`trainprof ab` and `trainprof analyze` give one MFU: against the datasheet's dense peak of
    the step's dtype (`peaks.KNOWN_DEVICES`), the measured peak beside it (`mfu_achievable`)."""
    from types import SimpleNamespace

    from trainprof import bench
    from trainprof.ab import runner

    monkeypatch.setattr(bench, "is_cuda", lambda device: True)
    h200 = SimpleNamespace(name="NVIDIA H200", total_memory=150e9)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: h200)
    assert runner._datasheet_peak(torch.device("cuda"), "bf16") == 989.4e12
    h200.name = "Mystery GPU"
    assert runner._datasheet_peak(torch.device("cuda"), "bf16") is None
