"""How the kernels address what they load: a block of a flat tensor, a tile of a matrix's rows.

Inlined by Triton into each kernel that calls them: the same code as written out in place.
"""

from __future__ import annotations

from fused_layers.backends.triton.language import tl, triton


@triton.jit
def flat_block(n_elements, BLOCK: tl.constexpr):
    """This program's offsets into a flat tensor of ``n_elements`` and their mask.

    int64 offsets: tensors past 2**31 elements are common at these widths."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    return offsets, offsets < n_elements


@triton.jit
def load_fp32(ptr, offsets, mask):
    """``ptr[offsets]`` in fp32, 0 where ``mask`` is off."""
    return tl.load(ptr + offsets, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def row_tile(tile, M, col_mask, ROWS: tl.constexpr):
    """Rows ``tile * ROWS + [0, ROWS)`` of an (M, N) matrix (int64), their mask, and the tile's 2-D
    mask with the columns' ``col_mask``."""
    rows = tl.cast(tile, tl.int64) * ROWS + tl.arange(0, ROWS)
    row_mask = rows < M
    return rows, row_mask, row_mask[:, None] & col_mask[None, :]


@triton.jit
def tile_offsets(rows, row_stride, cols):
    """The (rows, cols) offsets into a matrix of row stride ``row_stride`` and unit column stride."""
    return rows[:, None] * row_stride + cols[None, :]
