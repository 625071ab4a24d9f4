"""One script per question, each run from the repository root as ``python -m benchmarks.<name>``
(see each module's docstring); ``timing`` holds the GPU timer they share. Results: ``results/``."""
