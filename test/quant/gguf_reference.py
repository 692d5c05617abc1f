#!/usr/bin/env python3
"""Random ggml blocks and their f32 values per gguf-py, for kiln's bit-exact
dequantizer tests (src/weights/quant/mod.rs).

    gguf_reference.py OUT_DIR SEED N_BLOCKS TYPE [TYPE ...]

For each TYPE (a GGMLQuantizationType name) writes OUT_DIR/TYPE/blocks.bin
(N_BLOCKS random blocks), OUT_DIR/TYPE/expected.f32 (little-endian f32) and
OUT_DIR/TYPE/source.txt: "gguf-py" when `gguf.quants.dequantize` handles the
type, else "numpy" for the few types gguf-py lacks (Q8_1, Q8_K, F64, I8..I64),
computed here with numpy after ggml C's formula.

Blocks are random bytes, except that float fields (f16 scales, plain floats,
IQ1_M's f16 spread over four nibbles, MXFP4's e8m0 exponent) are redrawn
finite, subnormals included, so that no NaN or inf appears.
"""

import sys
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf import quants

# Byte offsets of the f16 fields in each block, in ggml's struct order.
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2],
    T.Q8_0: [0], T.Q8_1: [0, 2],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2],
    T.Q6_K: [208], T.IQ4_NL: [0], T.IQ4_XS: [0],
    T.IQ2_XXS: [0], T.IQ2_XS: [0], T.IQ2_S: [0], T.IQ3_XXS: [0], T.IQ3_S: [0],
    T.IQ1_S: [0], T.TQ1_0: [52], T.TQ2_0: [64],
}


# Block sizes as kiln's table (src/weights/ggml.rs) and ggml C have them.
# gguf-py's GGML_QUANT_SIZES gives Q8_1 as (32, 4 + 4 + 32), the old layout
# with f32 d and s; ggml's block_q8_1 has had f16 d and s (36 bytes) since.
SIZES = {**GGML_QUANT_SIZES, T.Q8_1: (32, 2 + 2 + 32)}


def finite_f16(rng, n):
    """f16 bit patterns with exponent field 0..20: subnormals up to ~64."""
    sign = rng.integers(0, 2, n, dtype=np.uint16) << 15
    exp = rng.integers(0, 21, n, dtype=np.uint16) << 10
    man = rng.integers(0, 1 << 10, n, dtype=np.uint16)
    return (sign | exp | man).view(np.float16)


def finite_bits(rng, n, dtype, exp_mask):
    """Random bit patterns of an IEEE type, with all-ones exponents cleared."""
    bits = rng.integers(0, np.iinfo(dtype).max, n, dtype=dtype, endpoint=True)
    return np.where(bits & exp_mask == exp_mask, bits ^ exp_mask, bits)


def random_blocks(rng, qtype, n):
    block_size, type_size = SIZES[qtype]
    if qtype == T.F32:
        return finite_bits(rng, n, np.uint32, 0x7F800000).view(np.uint8)
    if qtype == T.F16:
        return finite_bits(rng, n, np.uint16, 0x7C00).view(np.uint8)
    if qtype == T.BF16:
        return finite_bits(rng, n, np.uint16, 0x7F80).view(np.uint8)
    if qtype == T.F64:
        # Magnitudes across f32's whole range, past both ends: rounding,
        # subnormals, underflow to zero and overflow to inf.
        x = rng.standard_normal(n) * 10.0 ** rng.uniform(-50, 42, n)
        return x.view(np.uint8)
    blocks = rng.integers(0, 256, (n, type_size), dtype=np.uint8)
    if qtype == T.Q8_K:
        d = (rng.standard_normal(n) * 10.0 ** rng.uniform(-8, 1, n)).astype(np.float32)
        blocks[:, :4] = d.view(np.uint8).reshape(n, 4)
    for off in F16_FIELDS.get(qtype, []):
        blocks[:, off:off + 2] = finite_f16(rng, n).view(np.uint8).reshape(n, 2)
    if qtype == T.IQ1_M:
        # qs[32], qh[16], scales[8]: d's nibbles are the top nibbles of the
        # four u16 scales (bytes 49, 51, 53, 55), lowest nibble first.
        d = finite_f16(rng, n).view(np.uint16)
        for k in range(4):
            nib = ((d >> (4 * k)) & 0xF).astype(np.uint8)
            blocks[:, 49 + 2 * k] = (blocks[:, 49 + 2 * k] & 0x0F) | (nib << 4)
    if qtype == T.MXFP4:
        # e (e8m0): the scale is 2^(e - 128) times values up to 12, so e up to
        # 252 stays finite; 0 and 1 are the subnormal scales.
        blocks[:, 0] = rng.integers(0, 253, n, dtype=np.uint8)
    return blocks.reshape(-1)


def numpy_reference(qtype, data):
    """Types gguf-py cannot dequantize, after ggml C (see the Rust docs)."""
    ints = {T.I8: np.int8, T.I16: np.int16, T.I32: np.int32, T.I64: np.int64}
    if qtype in ints:
        return data.view(ints[qtype]).astype(np.float32)
    if qtype == T.F64:
        with np.errstate(over="ignore"):
            return data.view(np.float64).astype(np.float32)
    _, type_size = SIZES[qtype]
    blocks = data.reshape(-1, type_size)
    if qtype == T.Q8_1:  # d, s, qs[32]; s = d * sum(qs) is not needed
        d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
        return (d * blocks[:, 4:].view(np.int8).astype(np.float32)).reshape(-1)
    if qtype == T.Q8_K:  # dequantize_row_q8_K: d (f32), qs[256], bsums[16]
        d = blocks[:, :4].copy().view(np.float32)
        return (d * blocks[:, 4:260].view(np.int8).astype(np.float32)).reshape(-1)
    raise NotImplementedError(qtype.name)


def main():
    out_dir, seed, n_blocks, names = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
    for name in names:
        qtype = T[name]
        # One stream per type, so adding a type never changes another's blocks.
        rng = np.random.default_rng([seed, int(qtype)])
        data = random_blocks(rng, qtype, n_blocks)
        try:
            expected, source = quants.dequantize(data, qtype), "gguf-py"
        except NotImplementedError:
            expected, source = numpy_reference(qtype, data), "numpy"
        assert expected.dtype == np.float32 and expected.size == n_blocks * SIZES[qtype][0]
        d = out_dir / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "blocks.bin").write_bytes(data.tobytes())
        (d / "expected.f32").write_bytes(expected.astype("<f4").tobytes())
        (d / "source.txt").write_text(source)


if __name__ == "__main__":
    main()
