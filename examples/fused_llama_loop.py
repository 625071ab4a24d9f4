"""A small Llama trained with its layers swapped for fused_layers' (the loss included): the
program `trainprof ncu` is shown on in BENCHMARKS.md.

    trainprof run examples/fused_llama_loop.py                              # profile: log/<run>
    trainprof ncu --top 5 log/<run> -- python examples/fused_llama_loop.py   # its top kernels

bf16, 4 layers of width 1024, vocabulary 32,000, B4 x T1024, 12 AdamW steps on random tokens.
Needs a CUDA device.
"""

import torch
import transformers

import fused_layers


def main(steps: int = 12) -> None:
    config = transformers.LlamaConfig(
        hidden_size=1024,
        intermediate_size=4096,
        num_hidden_layers=4,
        num_attention_heads=16,
        num_key_value_heads=4,
        vocab_size=32000,
        max_position_embeddings=1024,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16).train()
    print(fused_layers.swap(model).summary(under_compile=False))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    ids = torch.randint(0, config.vocab_size, (4, 1024), device="cuda")
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    print(f"loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
