"""Writes a GGUF (with gguf-py) whose key, string value and tensor names hold
a newline, quotes, a tab and a terminal escape, for inspect-escape.test."""
import sys

import numpy as np
from gguf import GGUFWriter

writer = GGUFWriter(sys.argv[1], "llama")
writer.add_string('general.name"\nfake.key (STRING) = "x', 'value "with" quotes\nand a newline')
writer.add_tensor('evil\nname "quoted"', np.zeros((2, 3), dtype=np.float32))
writer.add_tensor("tab\there\x1b[31m", np.zeros(4, dtype=np.float32))
writer.add_tensor("plain.weight", np.zeros(4, dtype=np.float32))
writer.write_header_to_file()
writer.write_kv_data_to_file()
writer.write_tensors_to_file()
writer.close()
