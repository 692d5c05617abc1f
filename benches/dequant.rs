//! Dequantization throughput per ggml type on real checkpoints: GB/s of f32
//! output, single thread, median of several passes over every tensor of the
//! type.
//!
//!     cargo bench --bench dequant -- FILE.gguf...

use kiln::weights::ggml::GgmlType;
use kiln::weights::gguf::Gguf;
use kiln::weights::quant::dequantize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

const PASSES: usize = 5;

fn main() {
    let files: Vec<PathBuf> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).map(PathBuf::from).collect();
    if files.is_empty() {
        eprintln!("usage: cargo bench --bench dequant -- FILE.gguf...");
        std::process::exit(2);
    }
    println!(
        "{:<40} {:<7} {:>8} {:>12} {:>10} {:>8}",
        "checkpoint", "type", "tensors", "f32 out MB", "median ms", "GB/s"
    );
    for file in &files {
        let gguf = Gguf::open(file).unwrap_or_else(|e| panic!("{e}"));
        let mut by_type: BTreeMap<&str, (GgmlType, Vec<&[u8]>)> = BTreeMap::new();
        for t in gguf.tensors() {
            by_type.entry(t.ggml_type.name()).or_insert_with(|| (t.ggml_type, Vec::new())).1.push(t.data);
        }
        let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        for (type_name, (ty, tensors)) in by_type {
            let elements: Vec<usize> = tensors.iter().map(|d| d.len() / ty.type_size() * ty.block_size()).collect();
            let mut out = vec![0f32; elements.iter().copied().max().unwrap_or(0)];
            let mut times = Vec::with_capacity(PASSES);
            for _ in 0..PASSES {
                let start = Instant::now();
                for (data, &n) in tensors.iter().zip(&elements) {
                    dequantize(ty, data, &mut out[..n]).unwrap_or_else(|e| panic!("{e}"));
                }
                times.push(start.elapsed().as_secs_f64());
                std::hint::black_box(&out);
            }
            times.sort_by(f64::total_cmp);
            let median = times[PASSES / 2];
            let bytes_out = elements.iter().sum::<usize>() as f64 * 4.0;
            println!(
                "{:<40} {:<7} {:>8} {:>12.1} {:>10.2} {:>8.2}",
                name,
                type_name,
                tensors.len(),
                bytes_out / 1e6,
                median * 1e3,
                bytes_out / median / 1e9
            );
        }
    }
}
