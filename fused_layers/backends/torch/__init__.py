"""The plain torch backend: each op written with torch's own functions, as the code it replaces.

What runs off the GPU (without Triton's interpreter), under ``torch.compile`` by default (Inductor
then fuses these ops with their neighbours itself), and where a kernel does not cover a call (RoPE
with an odd head dim). Autograd is torch's own.
"""
