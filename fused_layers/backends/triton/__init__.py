"""The Triton backend: one file per op (kernels, a launcher that reshapes and picks block sizes, one
autograd.Function and its custom ops), and what those files share:

- ``language``: Triton, or a stand-in where it is not installed;
- ``launch``: the direct launch of eager calls and the custom-op definitions of traced ones;
- ``heuristics``: block sizes, row tiles and persistent grids, each rule with its measurement;
- ``partials``: the norms' last backward step, per-program partial sums summed in one kernel;
- ``blocks``: the jit functions the kernels address their loads with (a flat block, a row tile).

Each op file's entry function (``gelu``, ``layer_norm``, ...) takes arguments that
``fused_layers.ops`` has already checked.
"""
