"""The minimal usage: an unchanged PyTorch training loop inside `with trainprof.session():`.

    python examples/train_loop.py
    tensorboard --logdir log        # PyTorch Profiler tab + trainprof scalars

Steps are found by themselves (each `optimizer.step()` ends one). At exit the session prints the
top findings and writes log/<run>/summary.json and report.md.
"""

import torch

import trainprof


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512))
    model = model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    with trainprof.session(log_dir="log", wait=1, warmup=1, active=3):
        for _ in range(10):
            x = torch.randn(64, 512, device=device)
            loss = (model(x) - x).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            print(f"loss {loss.item():.4f}")  # a sync each step: the report will point here


if __name__ == "__main__":
    main()
