"""The exact grid's point estimate, computed on the dense (query, offset) sums one block of query rows at a time.

On the exact grid every cell is one pair (i, d), and the accumulator keeps per unit a dense (H, T, W)
array of Σ s_{i,i−d} (0 where d > i). components.py would turn it into several per-cell float64 arrays
per layer (T·W/2 cells each); here every sum over cells is reduced per query row instead. With
  a_X(i, d) = Σ_{u ∈ X} S_u(i, d) / N_X     for X = all sequences, half A, half B,
  c_X(i) = mean over X of log Z_i + m(i),   r_X(i, d) = a_X(i, d) − g(d) − c_X(i),
the sums over the valid d of row i are
  Σ_d r_X r_Y = Σ a_X a_Y − Σ a_X g − Σ a_Y g − c_Y Σ a_X − c_X Σ a_Y + Σ g² + (c_X + c_Y) Σ g + n_i c_X c_Y,
  Σ_d r_X = Σ a_X − Σ g − n_i c_X,
and only Σ_d a_X a_Y, Σ_d a_X and, summed over a range's rows, Σ a_X g = Σ_d g(d) Σ_i a_X(i, d) need the
dense arrays: row dot products, row sums and column sums, in float64, in one pass that needs no g yet
(the terms are of the size of logits and r is smaller, so the expansion loses a few digits of sixteen).
Profiles come out per cell, or summed directly onto a coarser grid's cells for tables.
`components.components` computes the same numbers (it serves the bootstrap).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from posleak.measure.components import MAGNITUDES, LayerProfile, Units, mask_component
from posleak.measure.grid import CellLayout

# Elements of the float64 row block formed per unit group (all, A, B) at once.
_BLOCK_ELEMENTS = 1 << 22


@dataclass
class _Sums:
    """One pass over the dense sums, per head: per query row (H, T) Σ_d a_X for X in all, a, b, Σ_d a_a·a_b
    and Σ_d a_all²; per offset (H, W) Σ_i a_X over the rows of each range (`columns[range][X]`) and
    Σ_i a_all over every row (for g); and Σ a_all over each cell of the profile's layout (H, C)."""

    total: dict[str, torch.Tensor]
    a_times_b: torch.Tensor
    all_squared: torch.Tensor
    columns: dict[str, dict[str, torch.Tensor]]
    all_columns: torch.Tensor
    on_cells: torch.Tensor


def exact_profile(
    layer: int,
    cells: torch.Tensor,
    log_z: torch.Tensor,
    sink: torch.Tensor | None,
    sigmoid: bool,
    layout: CellLayout,
    units: Units,
    ranges: dict[str, tuple[int, int]],
    on: CellLayout,
) -> tuple[LayerProfile, dict[str, torch.Tensor]]:
    """The profile of one layer (on the cells of `on`: `layout` itself or a coarser grid's) and every
    magnitude of MAGNITUDES, each (H,), from the dense per-unit sums `cells` (U, H, T, W) and Σ log Z
    per unit `log_z` (U, H, T)."""
    seq_len, width = cells.shape[2:]
    groups = {"all": torch.ones_like(units.halves, dtype=torch.bool), "a": units.halves == 0, "b": units.halves == 1}
    counts = {name: units.sizes[members].sum() for name, members in groups.items()}
    sums = _one_pass(cells, groups, counts, ranges, layout, on)
    g = F.pad(sums.all_columns, (0, seq_len - width)) / layout.offset_count  # NaN beyond the window, as in components()
    m = mask_component(g, layout, sink, sigmoid)
    shift = {name: log_z[members].sum(0) / counts[name] + m for name, members in groups.items()}  # c_X(i)

    per_row = _PerRow.of(layout, g[:, :width], m, shift)
    out = {}
    for name, (lo, hi) in ranges.items():
        out |= per_row.magnitudes(sums, name, lo, hi)
    magnitudes = {name: out[name] for name in MAGNITUDES}
    return _profile_on(layer, on, layout, g, m, shift["all"], sums.on_cells), magnitudes


@dataclass
class _PerRow:
    """What the sums over each row's valid offsets need besides the dense sums, (H, T) or (T,)."""

    valid: torch.Tensor  # n_i, the valid offsets of query i
    m: torch.Tensor
    shift: dict[str, torch.Tensor]  # c_X(i)
    g_valid: torch.Tensor  # g on the offsets 0 ≤ d < W, (H, W)
    g_prefix: torch.Tensor  # Σ_{d ≤ max offset of i} g(d)
    g_square: torch.Tensor  # Σ_{d ≤ max offset of i} g(d)²

    @staticmethod
    def of(layout: CellLayout, g_valid: torch.Tensor, m: torch.Tensor, shift: dict[str, torch.Tensor]) -> _PerRow:
        reach = layout.max_offset + 1
        return _PerRow(
            valid=reach.double(),
            m=m,
            shift=shift,
            g_valid=g_valid,
            g_prefix=F.pad(g_valid.cumsum(-1), (1, 0))[:, reach],
            g_square=F.pad(g_valid.square().cumsum(-1), (1, 0))[:, reach],
        )

    def magnitudes(self, sums: _Sums, name: str, lo: int, hi: int) -> dict[str, torch.Tensor]:
        """The magnitudes of the range lo ≤ i < hi (`name` in `sums.columns`), each (H,)."""
        span = slice(lo, hi)
        n = self.valid[span].sum()
        with_g = {x: (column * self.g_valid).sum(-1) for x, column in sums.columns[name].items()}  # Σ_cells a_X·g

        def product(x: str, y: str, a_times_b: torch.Tensor) -> torch.Tensor:  # Σ_cells r_X·r_Y
            cx, cy = self.shift[x][:, span], self.shift[y][:, span]
            rows = (
                a_times_b[:, span]
                - cy * sums.total[x][:, span]
                - cx * sums.total[y][:, span]
                + self.g_square[:, span]
                + (cx + cy) * self.g_prefix[:, span]
                + self.valid[span] * cx * cy
            )
            return rows.sum(-1) - with_g[x] - with_g[y]

        def total(x: str) -> torch.Tensor:  # Σ_cells r_X
            return (sums.total[x] - self.g_prefix - self.valid * self.shift[x])[:, span].sum(-1)

        weighted_m = (self.valid * self.m)[:, span]
        mask = (weighted_m * self.m[:, span]).sum(-1) / n - (weighted_m.sum(-1) / n) ** 2
        raw = product("all", "all", sums.all_squared) / n - (total("all") / n) ** 2
        corrected = product("a", "b", sums.a_times_b) / n - total("a") * total("b") / n**2
        return {
            f"mask_{name}": mask.clamp(min=0).sqrt(),
            f"resid_{name}_raw": raw.clamp(min=0).sqrt(),
            f"resid_{name}": corrected.clamp(min=0).sqrt(),  # clamp keeps NaN (an empty half)
        }


def _one_pass(
    cells: torch.Tensor,
    groups: dict[str, torch.Tensor],
    counts: dict[str, torch.Tensor],
    ranges: dict[str, tuple[int, int]],
    layout: CellLayout,
    on: CellLayout,
) -> _Sums:
    """Everything `exact_profile` needs from the dense sums, in float64, one block of query rows at a time
    (`on` is the exact layout itself or a coarser grid's). Within the loop a group's sums S_X are not yet
    divided by N_X (one pass less over each block); column sums are kept at the ranges' row boundaries."""
    units, heads, seq_len, width = cells.shape
    rows = torch.zeros(heads, seq_len, dtype=torch.float64)
    total, a_times_b, all_squared = {x: rows.clone() for x in groups}, rows.clone(), rows.clone()
    running = {x: torch.zeros(heads, width, dtype=torch.float64) for x in groups}
    boundaries = sorted({0, seq_len} | {bound for span in ranges.values() for bound in span})
    prefix = {0: {x: column.clone() for x, column in running.items()}}  # row boundary b → Σ_{i<b} S_X(i, ·)
    on_cells = torch.zeros(heads, on.grid.num_bins, on.grid.num_bins, dtype=torch.float64)
    exact, per_cell = on is layout, []
    members = {x: members.nonzero().flatten() for x, members in groups.items()}
    block = max(1, _BLOCK_ELEMENTS // (units * heads * width))
    for i0 in range(0, seq_len, block):
        i1 = min(seq_len, i0 + block)
        chunk = cells[:, :, i0:i1].double()
        # a single unit is a view, several are summed (a boolean index would copy first)
        sums = {x: chunk[u[0]] if u.numel() == 1 else chunk[u].sum(0) for x, u in members.items()}
        for x, s in sums.items():
            total[x][:, i0:i1] = s.sum(-1) / counts[x]
        a_times_b[:, i0:i1] = torch.linalg.vecdot(sums["a"], sums["b"]) / (counts["a"] * counts["b"])
        all_squared[:, i0:i1] = torch.linalg.vecdot(sums["all"], sums["all"]) / counts["all"] ** 2
        for bound in (b for b in boundaries if i0 < b < i1):
            prefix[bound] = {x: running[x] + s[:, : bound - i0].sum(1) for x, s in sums.items()}
        for x, s in sums.items():
            running[x] += s.sum(1)
        if i1 in boundaries:
            prefix[i1] = {x: column.clone() for x, column in running.items()}
        if exact:
            per_cell.append(sums["all"][:, torch.arange(width) <= layout.max_offset[i0:i1, None]] / counts["all"])
        else:
            on.grid.add_binned(on_cells, sums["all"] / counts["all"], i0)
    return _Sums(
        total=total,
        a_times_b=a_times_b,
        all_squared=all_squared,
        columns={
            name: {x: (prefix[hi][x] - prefix[lo][x]) / counts[x] for x in groups} for name, (lo, hi) in ranges.items()
        },
        all_columns=prefix[seq_len]["all"] / counts["all"],
        on_cells=torch.cat(per_cell, dim=-1) if exact else on_cells.flatten(1)[:, on.storage_index],
    )


def _profile_on(
    layer: int,
    on: CellLayout,
    layout: CellLayout,
    g: torch.Tensor,
    m: torch.Tensor,
    shift_all: torch.Tensor,
    mean_s_sums: torch.Tensor,
) -> LayerProfile:
    """g, m, r and the offset map on the cells of `on`, from the sums of a_all (mean over n of s) over them."""
    mean_s = mean_s_sums / on.count
    if on is layout:
        g_cell = g[:, on.d_bin]
    else:  # Σ over each coarse cell's pairs of g(d): per query, prefix sums of g at the bin edges clipped to its pairs
        width = int(layout.max_offset.max()) + 1
        prefix = F.pad(g[:, :width].cumsum(-1), (1, 0))
        edges = torch.tensor(on.grid.edges)
        reach = layout.max_offset[:, None] + 1
        by_bin = prefix[:, torch.minimum(edges[None, 1:], reach)] - prefix[:, torch.minimum(edges[None, :-1], reach)]
        bins = on.grid.num_bins
        sums = torch.zeros(g.shape[0], bins, bins, dtype=torch.float64).index_add_(1, on.grid.bin_of_position, by_bin)
        g_cell = sums.flatten(1)[:, on.storage_index] / on.count
    return LayerProfile(
        layer=layer,
        layout=on,
        g=g,
        m=m,
        g_cell=g_cell,
        m_cell=on.to_cells(m),
        r=mean_s - g_cell - on.to_cells(shift_all),
        offset_map=(mean_s - g_cell).mean(0),
    )
