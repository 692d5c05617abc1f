//! The compile matrix: a tiny export of each family, with packed weights
//! kept and dequantized, compiled for the host and for one target of each
//! GPU kind. Compile only: no GPU is needed, nor ROCm or CUDA.

use super::*;
use crate::iree::{Target, TEST_GPUS as GPUS};
use crate::models::synth::{self, Preset, SynthData};

/// What IREE 3.13 fails on, asserted so that a fix shows: (export, target,
/// a line of the error).
/// - Vulkan: the tiny gemma3n's embedding rows (hidden 32) fused into its
///   first norm, a single reduction at that width (`trace::nn`'s `mean`
///   sums rows of 64 or more in runs of 16, which Vulkan compiles); the
///   row index crosses the reduction, and SPIR-V has no workgroup buffer
///   of `index`.
///   The tiny mixtures of experts (hidden 32 too) fail so as well.
/// - Vulkan: the tiny gemma3's `fill_chunk` products, 4 rows times a bf16
///   weight 24 wide (`failed to legalize operation 'vector.bitcast'`,
///   vector<2xf32> to vector<4xbf16>, in the SPIR-V emulation of bf16):
///   one such product alone fails at 16x24 and 32x24 and compiles at 64x64,
///   640x1024 and 2048x2048, and with one row.
/// - CUDA: one of gemma3n's dispatches (`'func.func' op failed to
///   distribute`); gfx942 compiles it.
const KNOWN_FAILURES: [(&str, &str, &str); 5] = [
    ("gemma3", "vulkan:rdna3", "failed to legalize operation 'vector.bitcast'"),
    ("gemma3n", "vulkan:rdna3", VULKAN_ROW_INDEX),
    ("gemma3n", "cuda:sm_80", "'func.func' op failed to distribute"),
    ("qwen3moe-q8_0-keep", "vulkan:rdna3", VULKAN_ROW_INDEX),
    ("gpt-oss-mxfp4-keep", "vulkan:rdna3", VULKAN_ROW_INDEX),
];

/// Vulkan's failure on an embedding row 32 wide fused into a norm.
const VULKAN_ROW_INDEX: &str = "memref<1xindex, #spirv.storage_class<Workgroup>>";

/// Every export compiles for every target but the known failures, which
/// fail as known. Per export, one iree-compile builds a module with a
/// variant per GPU (the front half once); the host compiles the llama
/// exports here, and gemma3 and gemma3n in their end-to-end tests
/// (`transformers_tests`). The exports compile side by side.
#[test]
fn tiny_exports_compile_for_every_target() {
    let work = tempfile::tempdir().unwrap();
    let llama = work.path().join("tiny-llama.gguf");
    synth::write(&Preset::TinyLlama.config(), &llama, SynthData::Seeded(0)).unwrap();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("test/models/transformers");
    // Prompts past 4 tokens run the prompt graph, so that every graph is
    // compiled.
    let exports = [
        ("llama-q8_0-keep", llama.clone(), PackedPolicy::Keep, true),
        ("llama-q8_0-dequantize", llama, PackedPolicy::Dequantize(DType::F32), true),
        ("gemma3", fixtures.join("gemma3"), PackedPolicy::Fail, false),
        ("gemma3n", fixtures.join("gemma3n"), PackedPolicy::Fail, false),
        // The mixtures of experts, their stacks packed (Q8_0; MXFP4).
        ("qwen3moe-q8_0-keep", fixtures.join("qwen3moe/qwen3moe.gguf"), PackedPolicy::Keep, false),
        ("gpt-oss-mxfp4-keep", fixtures.join("gpt_oss/gpt_oss.gguf"), PackedPolicy::Keep, false),
        // An encoder: `embed`'s loop over the chunk and one-sentence graphs.
        ("bert", Path::new(env!("CARGO_MANIFEST_DIR")).join("test/models/bert/tiny"), PackedPolicy::Fail, false),
    ];
    let iree = Iree::for_tests();
    let failures: Vec<String> = std::thread::scope(|s| {
        let runs: Vec<_> = exports
            .iter()
            .map(|(name, model, packed, host)| {
                let (work, iree) = (work.path(), &iree);
                s.spawn(move || {
                    let dir = work.join(name);
                    let options = ExportOptions {
                        packed: *packed,
                        max_context: Some(16),
                        stepped_prefill: Some(4),
                        ..ExportOptions::default()
                    };
                    export(model, &dir, &options, &mut ()).unwrap_or_else(|e| panic!("{name}: export: {e}"));
                    let manifest = Manifest::read(&dir).unwrap();
                    let module = dir.join(&manifest.module);
                    let mut failed = Vec::new();
                    let compile = |what: &str, flags: Vec<String>| {
                        let start = Instant::now();
                        let result =
                            iree.compile_with_flags(&flags, &module, &dir.join("m.vmfb"), &manifest.compile_flags);
                        eprintln!("{name} for {what}: {:.1} s", start.elapsed().as_secs_f64());
                        result.err().map(|e| e.to_string())
                    };
                    if *host {
                        let spec = dir.join("host-tuning.mlir");
                        std::fs::write(&spec, crate::iree::HOST_TUNING_SPEC).unwrap();
                        if let Some(e) = compile("host", Target::Host.flags(&spec)) {
                            failed.push(format!("{name} for host: {e}"));
                        }
                    }
                    let known = |gpu: &str| KNOWN_FAILURES.iter().find(|(n, t, _)| n == name && *t == gpu);
                    let gpus: Vec<Target> =
                        GPUS.iter().filter(|g| known(g).is_none()).map(|g| g.parse().unwrap()).collect();
                    let what = gpus.iter().map(Target::to_string).collect::<Vec<_>>().join(" + ");
                    if let Some(e) = compile(&what, Target::gpu_flags(&gpus).unwrap()) {
                        failed.push(format!("{name} for {what}: {e}"));
                    }
                    for (_, gpu, error) in KNOWN_FAILURES.iter().filter(|(n, _, _)| n == name) {
                        match compile(gpu, gpu.parse::<Target>().unwrap().flags(Path::new(""))) {
                            Some(e) if e.contains(error) => {}
                            Some(e) => failed.push(format!("{name} for {gpu}: not the known failure ({error}): {e}")),
                            None => failed.push(format!("{name} for {gpu} compiles now: drop it from KNOWN_FAILURES")),
                        }
                    }
                    failed
                })
            })
            .collect();
        runs.into_iter().flat_map(|r| r.join().expect("a compile thread does not panic")).collect()
    });
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
