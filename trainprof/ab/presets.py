"""Which model? Hugging Face causal LMs built from a config (a preset, a local config or one in the
local cache; never a download), their FLOPs per training step, and ``run_model``: an A/B run over
one of them, what ``trainprof ab --model`` runs."""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from trainprof import bench
from trainprof.ab.results import ABResult
from trainprof.ab.runner import run
from trainprof.ab.steps import StepFactory
from trainprof.ab.variants import DEFAULT_VARIANTS, Variant

#: Presets: a config (no download) and the default batch x sequence.
PRESETS = {
    "gpt2-tiny": "CPU-sized GPT-2: 2 layers, d=64, 4 heads, vocab 512; B2 x T32",
    "gpt2-124m": "GPT-2 124M (GPT2Config defaults: 12 layers, d=768, vocab 50257); B8 x T1024",
    "llama-1b": "Llama-3.2-1B's shape: 16 layers, d=2048, MLP 8192, 32 heads / 8 KV heads, vocab 128256, "
    "tied embeddings; B4 x T2048",
    "llama-1b-32k": "llama-1b with Llama-2's vocabulary (32000) and an untied lm_head; B4 x T2048",
}


class ModelNotFound(ValueError):
    """``--model`` names no preset, no local config and no cached Hugging Face config."""


def load_config(name: str):  # -> (transformers.PretrainedConfig, default batch, default seq)
    """The config of a preset, a local config path, or a cached Hugging Face config name (no download)."""
    import transformers

    if name == "gpt2-tiny":
        return (
            transformers.GPT2Config(
                n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=64, bos_token_id=0, eos_token_id=0
            ),
            2,
            32,
        )
    if name == "gpt2-124m":
        return transformers.GPT2Config(), 8, 1024
    if name in ("llama-1b", "llama-1b-32k"):
        vocab, tied = (128256, True) if name == "llama-1b" else (32000, False)
        return (
            transformers.LlamaConfig(
                hidden_size=2048,
                intermediate_size=8192,
                num_hidden_layers=16,
                num_attention_heads=32,
                num_key_value_heads=8,
                vocab_size=vocab,
                max_position_embeddings=8192,
                tie_word_embeddings=tied,
                rope_theta=500000.0,
                bos_token_id=0,
                eos_token_id=0,
            ),
            4,
            2048,
        )
    try:
        config = transformers.AutoConfig.from_pretrained(name, local_files_only=True)
    except Exception as error:
        raise ModelNotFound(
            f"--model {name}: not a preset ({', '.join(PRESETS)}), a local config, or a Hugging Face config "
            f"in the local cache (no download is made): {type(error).__name__}"
        ) from None
    positions = (
        getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None) or 512
    )
    return config, 4, min(512, positions)


def model_flops_per_step(model: torch.nn.Module, config, batch: int, seq: int) -> float:
    """Training FLOPs of one step: (6 N + 12 L d T) x B x T (PaLM's formula, stated in the result's
    ``method["flops"]``)."""
    embeddings = [m for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    lookup = {id(m.weight) for m in embeddings}
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    n = sum(p.numel() for p in model.parameters() if id(p) not in lookup)
    if output is not None and id(output.weight) in lookup:  # tied: the lm_head matmul still runs
        n += output.weight.numel()
    layers = config.num_hidden_layers
    hidden = config.hidden_size
    return float((6 * n + 12 * layers * hidden * seq) * batch * seq)


def _autocast_off() -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


def hf_factory(
    config,
    *,
    batch: int,
    seq: int,
    device: torch.device,
    dtype: torch.dtype,
    autocast: bool,
    seed: int = 0,
    lr: float = 3e-4,
    distinct_batches: int = 4,
) -> tuple[StepFactory, torch.nn.Module]:
    """A step factory for a causal LM built from ``config``: every variant a deep copy of one model.

    Data: ``distinct_batches`` random token batches (seeded) cycled, so the loss falls over the run
    and parity is checked on a moving loss. AdamW (fused on CUDA), zero_grad(set_to_none=True).
    Returns the factory and the base model (for FLOPs).
    """
    import transformers

    transformers.logging.set_verbosity_error()
    # Dropout off: variants draw random numbers differently (torch.compile has its own RNG), so
    # masks would differ and loss parity would measure the masks, not the kernels.
    for key, value in config.to_dict().items():
        if (key.endswith("pdrop") or key.endswith("dropout")) and isinstance(value, float):
            setattr(config, key, 0.0)
    torch.manual_seed(seed)
    with torch.device(device):
        base = transformers.AutoModelForCausalLM.from_config(config)
    base = base.to(dtype).train()
    generator = torch.Generator().manual_seed(seed)
    batches = [
        torch.randint(0, config.vocab_size, (batch, seq), generator=generator).to(device)
        for _ in range(distinct_batches)
    ]
    cuda = bench.is_cuda(device)

    def factory(variant: Variant):
        model = copy.deepcopy(base)
        call = variant.apply(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, fused=cuda or None)

        def step(i: int) -> torch.Tensor:
            ids = batches[i % len(batches)]
            context = torch.autocast(device.type, dtype=torch.bfloat16) if autocast else _autocast_off()
            with context:
                loss = call(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return loss

        step.optimizer = optimizer
        return step, model

    return factory, base


def run_model(
    name: str,
    variants: Sequence[str] = DEFAULT_VARIANTS,
    *,
    steps: int = 20,
    warmup: int = 3,
    block: int = 2,
    batch: int | None = None,
    seq: int | None = None,
    dtype: str = "fp32",
    autocast: bool = False,
    device: str | torch.device | None = None,
    log_dir: str | Path | None = None,
    profile: bool = True,
) -> ABResult:
    """``trainprof ab --model NAME``: ``run`` over a Hugging Face causal LM built from a config."""
    config, default_batch, default_seq = load_config(name)
    batch, seq = batch or default_batch, seq or default_seq
    dev = bench.resolve_device(device)
    param_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    factory, base = hf_factory(config, batch=batch, seq=seq, device=dev, dtype=param_dtype, autocast=autocast)
    flops = model_flops_per_step(base, config, batch, seq)
    started = time.time()
    result = run(
        factory,
        variants,
        steps=steps,
        warmup=warmup,
        block=block,
        device=dev,
        precision="bf16" if (dtype == "bf16" or autocast) else "fp32",
        tokens_per_step=batch * seq,
        flops_per_step=flops,
        log_dir=log_dir,
        profile=profile,
        label=name,
        config={
            "batch": batch,
            "seq": seq,
            "dtype": dtype,
            "autocast": autocast,
            "parameters": sum(p.numel() for p in base.parameters()),
            "preset": PRESETS.get(name),
        },
    )
    result.config["wall_s"] = round(time.time() - started, 1)
    return result
