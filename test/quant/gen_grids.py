#!/usr/bin/env python3
"""Writes src/weights/quant/grids.rs, the i-quant lookup tables, from gguf-py.

    gen_grids.py > src/weights/quant/grids.rs

gguf-py (`gguf/quants.py`) holds ggml's grids packed as hex strings of 2- or
3-bit indices into a short list of levels (`grid_hex`, `grid_map`); its
`init_grid` unpacks them to float32. This script unpacks them the same way
and prints them in ggml C's own form (`ggml-common.h`): each grid row as the
little-endian bytes of one `uint64_t` (8 values) or `uint32_t` (4 values), so
that the Rust tables read like, and can be compared with, the C ones.
`src/weights/quant/mod.rs` runs this script and checks the committed file is
exactly its output.
"""

import numpy as np
from gguf import quants

HEADER = """\
//! Lookup tables of the i-quants, TQ and MXFP4, as ggml C defines them in
//! llama.cpp's `ggml/src/ggml-common.h` (`iq2xxs_grid`, `iq2xs_grid`,
//! `iq2s_grid`, `iq3xxs_grid`, `iq3s_grid`, `iq1s_grid`, `ksigns_iq2xs`,
//! `kvalues_mxfp4`, `IQ1S_DELTA`, `IQ1M_DELTA`). gguf-py's `quants.py`
//! holds the same grids, packed; this file is generated from it by
//! `test/quant/gen_grids.py` (do not edit: rerun the script), and a test in
//! `quant/mod.rs` checks it still is the script's output.
//!
//! A grid row is the little-endian bytes of one C `uint64_t` (8 values) or
//! `uint32_t` (4 values), one value per byte: C reads a row through a
//! `const uint8_t *`, so value `j` is byte `j`.
"""


def grid(cls):
    """gguf-py's float32 grid of `cls`, as `(rows, values per row)`."""
    cls.init_grid()
    return cls.grid.reshape(cls.grid_shape)


def rows(values, dtype):
    """Each row's values as bytes (int8 for negative levels), read as one
    little-endian integer of `dtype`."""
    as_bytes = values.astype(np.int8 if values.min() < 0 else np.uint8).view(np.uint8)
    return np.ascontiguousarray(as_bytes).view(np.dtype(dtype).newbyteorder("<")).reshape(-1)


def table(doc, name, rust_type, values, per_line, fmt):
    lines = [f"/// {line}" for line in doc] + ["#[rustfmt::skip]", f"pub(super) const {name}: [{rust_type}; {len(values)}] = ["]
    for i in range(0, len(values), per_line):
        lines.append("    " + " ".join(fmt(v) + "," for v in values[i:i + per_line]))
    lines.append("];")
    return "\n".join(lines)


def hex64(v):
    return f"0x{int(v):016x}"


def hex32(v):
    return f"0x{int(v):08x}"


def main():
    ksigns = np.frombuffer(quants.IQ2_XXS.ksigns, dtype=np.uint8)
    # ksigns_iq2xs[i]: 7 sign bits i and, as bit 7, their parity (an even
    # number of minus signs per 8 values).
    assert all(bin(int(k)).count("1") % 2 == 0 and k & 0x7F == i for i, k in enumerate(ksigns))
    mxfp4 = np.array(quants.MXFP4.kvalues, dtype=np.int8)
    assert quants.IQ1_S.delta == quants.IQ1_M.delta == np.float32(0.125)
    tables = [
        table(["`iq2xxs_grid`: IQ2_XXS rows of 8 levels from {8, 25, 43}."],
              "IQ2XXS_GRID", "u64", rows(grid(quants.IQ2_XXS), np.uint64), 4, hex64),
        table(["`iq2xs_grid`: IQ2_XS rows of 8 levels from {8, 25, 43}."],
              "IQ2XS_GRID", "u64", rows(grid(quants.IQ2_XS), np.uint64), 4, hex64),
        table(["`iq2s_grid`: IQ2_S rows of 8 levels from {8, 25, 43}."],
              "IQ2S_GRID", "u64", rows(grid(quants.IQ2_S), np.uint64), 4, hex64),
        table(["`iq3xxs_grid`: IQ3_XXS rows of 4 levels from {4, 12, .., 52, 62}."],
              "IQ3XXS_GRID", "u32", rows(grid(quants.IQ3_XXS), np.uint32), 8, hex32),
        table(["`iq3s_grid`: IQ3_S rows of 4 odd levels from 1 to 15."],
              "IQ3S_GRID", "u32", rows(grid(quants.IQ3_S), np.uint32), 8, hex32),
        table(["`iq1s_grid`: IQ1_S and IQ1_M rows of 8 int8 levels from {-1, 0, 1}."],
              "IQ1S_GRID", "u64", rows(grid(quants.IQ1_S), np.uint64), 4, hex64),
        table(["`ksigns_iq2xs`: 7 sign bits and their parity as bit 7; bit `j` set",
               "negates value `j` of a group of 8."],
              "KSIGNS_IQ2XS", "u8", ksigns, 16, lambda v: f"{int(v):3}"),
        table(["`kvalues_mxfp4`: the 16 e2m1 values, doubled (the scale is halved to",
               "match, `ggml_e8m0_to_fp32_half`)."],
              "KVALUES_MXFP4", "i8", mxfp4, 16, lambda v: f"{int(v)}"),
    ]
    deltas = [
        "/// `IQ1S_DELTA` and `IQ1M_DELTA`: the shift of an IQ1 group's levels, added",
        "/// with the sign its `qh` bit gives.",
        "pub(super) const IQ1_DELTA: f32 = 0.125;",
    ]
    print(HEADER)
    print("\n\n".join(tables + ["\n".join(deltas)]))


if __name__ == "__main__":
    main()
