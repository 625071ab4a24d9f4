"""Thin adapters over `trainprof.Session` for training frameworks.

- `trainprof.integrations.hf.TrainprofCallback`: a `transformers.TrainerCallback`;
- `trainprof.integrations.lightning.TrainprofCallback`: a Lightning `Callback`
  (`lightning.pytorch` or `pytorch_lightning`);
- accelerate needs none: `with trainprof.session():` around the loop (docs/integrations.md).

Each takes `trainprof.session`'s keyword arguments and ends one step per optimizer step of the
framework (not per micro-batch under gradient accumulation). This package imports no framework:
import the submodule of the one you use.
"""
