"""A small CPU training loop the session tests put trainprof around, and the warnings they read."""

from __future__ import annotations

import torch


def model_and_optimizer(seed: int = 0):
    """A two-layer MLP (32 -> 64 -> 1) and its SGD optimizer, seeded."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))
    return model, torch.optim.SGD(model.parameters(), lr=1e-3)


def train(model, optimizer, steps: int) -> int:
    """`steps` optimizer steps on random batches; returns how many ran."""
    done = 0
    for _ in range(steps):
        model(torch.randn(16, 32)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        done += 1
    return done


def trainprof_warnings(caught) -> list[str]:
    """The messages of the caught warnings that trainprof gave."""
    return [str(w.message) for w in caught if str(w.message).startswith("trainprof")]
