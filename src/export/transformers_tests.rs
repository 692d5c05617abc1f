//! kiln against transformers itself: tiny checkpoints that transformers
//! 5.24 wrote (`save_pretrained`, random weights moved off their init) for
//! every HF family and variant kiln reads, with transformers' own f32
//! logits (test/models/transformers_reference.py, run by hand with torch;
//! its outputs are committed under test/models/transformers). Each is
//! exported as `kiln export DIR` would, compiled once, and run through
//! IREE: prefills of several lengths (each returns its last position's
//! logits), and shorter prefills followed by decode steps (with the
//! sliding windows filling and full), each within 1e-4 of transformers.
//!
//! The interpreter-vs-IREE tests elsewhere share kiln's reading of the
//! config; these do not, so a config read wrong (a rope theta left at its
//! default, a norm read as `w` instead of `1 + w`) fails here.

use super::tests::{export_and_compile, run};
use super::*;
use crate::interp::Value;
use crate::max_abs_diff;
use crate::models::{scalar_i32, token_ids};
use crate::weights::safetensors::StDType;
use std::time::Instant;

/// The prompt of transformers_reference.py: longer than every sliding window.
const PROMPT: [u32; 12] = [1, 7, 3, 12, 5, 9, 2, 14, 6, 11, 4, 13];
/// Decode steps after a prefill of the rest.
const DECODE_STEPS: usize = 3;
const TOLERANCE: f64 = 1e-4;
/// |kiln - transformers| with an f16 KV cache: each key and value rounded
/// to 11 significant bits (relative error up to 2^-11) moves the logits by
/// up to 1.3e-2 on these checkpoints.
const F16_TOLERANCE: f64 = 3e-2;
/// With a bf16 cache (8 significant bits, 8x f16's rounding): up to 9.9e-2.
const BF16_TOLERANCE: f64 = 2e-1;
/// `prefill` runs prompts of up to 4 tokens as decode steps: [`steps`]'
/// first prefill and first split take that path, the others the prompt's
/// graph.
const STEPPED_PREFILL: usize = 4;

fn case_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("test/models/transformers").join(name)
}

/// Exports and compiles the checkpoint `name`, then checks prefill and
/// prefill + decode against transformers' logits; returns the largest
/// difference.
fn matches_transformers(name: &str) -> f64 {
    matches_transformers_from(&case_dir(name), name)
}

/// [`matches_transformers`] of the checkpoint at `model` (a directory or a
/// GGUF file) against the logits of case `name`.
fn matches_transformers_from(model: &Path, name: &str) -> f64 {
    matches_transformers_packed(model, name, PackedPolicy::Fail)
}

/// [`matches_transformers_from`], packed tensors read under `packed`.
fn matches_transformers_packed(model: &Path, name: &str, packed: PackedPolicy) -> f64 {
    matches_transformers_writing(model, name, packed, 0)
}

/// [`matches_transformers_packed`] of an export that writes `written`
/// params into `params.irpa` (expert stacks that HF keeps apart).
fn matches_transformers_writing(model: &Path, name: &str, packed: PackedPolicy, written: usize) -> f64 {
    iree_against_transformers(model, name, DType::F32, packed, written, STEPPED_PREFILL, TOLERANCE).0
}

/// Case `name`'s reference logits, `[PROMPT.len() * vocab]`, and `vocab`.
fn reference(name: &str) -> (Vec<f64>, usize) {
    let reference = npy::read(&case_dir(name).join("reference.npy")).unwrap();
    let (n, vocab) = (reference.ty.shape[0], reference.ty.shape[1]);
    assert_eq!(n, PROMPT.len());
    (reference.to_f64_vec(), vocab)
}

/// Exports the checkpoint at `model` with a `kv_dtype` cache (packed
/// tensors under `packed`, prompts of up to `stepped_prefill` tokens as
/// decode steps), checks that it wrote `written` params (the rest read in
/// place), compiles it and runs [`steps`] through IREE: the largest |kiln
/// - transformers|, at most `tolerance`, and the export's directory.
///
/// Past `tolerance` it panics after telling a wrong module from a flaky
/// run: it runs the calls again, exports the checkpoint again, and keeps
/// the export's directory.
fn iree_against_transformers(
    model: &Path,
    name: &str,
    kv_dtype: DType,
    packed: PackedPolicy,
    written: usize,
    stepped_prefill: usize,
    tolerance: f64,
) -> (f64, tempfile::TempDir) {
    let (want, vocab) = reference(name);
    let options = ExportOptions {
        params: ParamsMode::Reference,
        packed,
        max_context: Some(16),
        kv_dtype,
        stepped_prefill: Some(stepped_prefill),
        ..ExportOptions::default()
    };
    let (dir, summary) = export_and_compile(model, &options);
    assert_eq!(summary.params_written, written, "{name}: params written ({})", summary.params_description);
    let against_transformers = |dir: &Path| {
        steps(name, &mut |function, inputs| run(dir, function, inputs, 3), |logits, at| {
            max_abs_diff(logits, &want[at * vocab..(at + 1) * vocab])
        })
    };
    let start = Instant::now();
    let (worst, call) = against_transformers(dir.path());
    eprintln!("{name}: runs {:.1} s; max |kiln - transformers| {worst:e}", start.elapsed().as_secs_f64());
    if worst > tolerance {
        let (again, again_call) = against_transformers(dir.path());
        let (other, _) = export_and_compile(model, &options);
        let module = |dir: &Path| std::fs::read(dir.join("model.mlir")).unwrap();
        let exports = if module(dir.path()) == module(other.path()) { "the same" } else { "different" };
        panic!(
            "{name}: logits differ from transformers' by {worst:e} ({call}); the same calls again: {again:e} \
             ({again_call}); a second export's module is {exports}; the export is kept in {}",
            dir.keep().display()
        );
    }
    (worst, dir)
}

/// The checks of a case, each function call by `call` (IREE or the
/// interpreter): prefills of several lengths (each returns its last
/// position's logits), within and past the sliding windows; decode steps
/// after a prefill of 2 tokens (a sliding window still filling) and of all
/// but the last steps (windows full). `diff(logits, position)` compares
/// the logits of one position; returns the largest and the call that gave
/// it.
fn steps(
    name: &str,
    call: &mut dyn FnMut(&str, &[Value]) -> Vec<Value>,
    mut diff: impl FnMut(&[f64], usize) -> f64,
) -> (f64, String) {
    let n = PROMPT.len();
    let mut worst = (0.0f64, String::new());
    let mut note = |d: f64, what: String| {
        eprintln!("{name}: {what}: max |diff| {d:e}");
        if d >= worst.0 {
            worst = (d, what);
        }
    };
    for len in [1, 5, n] {
        note(
            diff(&call("prefill", &[token_ids(&PROMPT[..len])])[0].to_f64_vec(), len - 1),
            format!("prefill of {len}"),
        );
    }
    for split in [2, n - DECODE_STEPS] {
        let mut state = call("prefill", &[token_ids(&PROMPT[..split])]);
        note(diff(&state[0].to_f64_vec(), split - 1), format!("prefill of {split}"));
        for pos in split..split + DECODE_STEPS {
            let (keys, values) = (state.remove(1), state.remove(1));
            state = call("decode", &[token_ids(&PROMPT[pos..pos + 1]), scalar_i32(pos as i32), keys, values]);
            note(diff(&state[0].to_f64_vec(), pos), format!("decode at {pos} after a prefill of {split}"));
        }
    }
    worst
}

/// [`steps`] of case `name` by the reference interpreter, with a
/// `kv_dtype` cache, each call's logits compared by `diff`.
fn interpreter_steps(name: &str, kv_dtype: DType, diff: impl FnMut(&[f64], usize) -> f64) -> f64 {
    let source = Source::open(&case_dir(name)).unwrap();
    let weights = source.weights(PackedPolicy::Fail, None).unwrap();
    let cache = CacheSpec::new(16, kv_dtype).unwrap();
    let serving = Serving::stepped(&source.family().unwrap(), &*weights, cache, STEPPED_PREFILL).unwrap();
    let params = crate::interp::CachedParams::new(&*weights);
    let mut call = |function: &str, inputs: &[Value]| match function {
        "prefill" => {
            let ids: Vec<u32> = inputs[0].to_f64_vec().iter().map(|&id| id as u32).collect();
            serving.prefill_reference(&params, &ids).unwrap()
        }
        _ => serving.decode_reference(&params, inputs).unwrap(),
    };
    steps(name, &mut call, diff).0
}

#[test]
fn llama_tied_matches_transformers() {
    matches_transformers("llama");
}

#[test]
fn llama3_rope_scaling_matches_transformers() {
    matches_transformers("llama3_scaled");
}

#[test]
fn linear_rope_scaling_in_4x_spelling_matches_transformers() {
    matches_transformers("linear_scaled_v4");
}

#[test]
fn mistral_sliding_window_matches_transformers() {
    matches_transformers("mistral");
}

#[test]
fn qwen2_bias_matches_transformers() {
    matches_transformers("qwen2_bias");
}

#[test]
fn qwen2_yarn_matches_transformers() {
    matches_transformers("qwen2_yarn");
    matches_transformers("qwen2_yarn_v4");
}

#[test]
fn qwen3_matches_transformers() {
    matches_transformers("qwen3");
}

#[test]
fn gemma3_text_matches_transformers() {
    matches_transformers("gemma3");
    matches_transformers("gemma3_v4");
}

#[test]
fn gemma3_multimodal_text_part_matches_transformers() {
    matches_transformers("gemma3_multimodal");
}

/// Gemma 3n from its HF checkpoint and from the GGUF that llama.cpp's
/// converter would write of it (test/models/gemma3n_to_gguf.py).
#[test]
fn gemma3n_matches_transformers() {
    matches_transformers("gemma3n");
    matches_transformers_from(&case_dir("gemma3n").join("gemma3n.gguf"), "gemma3n");
}

/// Qwen3-MoE from the GGUF that llama.cpp's converter would write of it
/// (test/models/moe_to_gguf.py): its experts stacked and Q8_0, kept
/// packed, so that decode slices the chosen experts' blocks out of the
/// stacks. The routing sends the prompt's tokens to different experts in
/// each layer.
#[test]
fn qwen3moe_gguf_matches_transformers() {
    let gguf = case_dir("qwen3moe").join("qwen3moe.gguf");
    matches_transformers_packed(&gguf, "qwen3moe", PackedPolicy::Keep);
}

/// The same GGUF with every prompt run as decode steps (`--stepped-prefill`
/// at the capacity, what a mixture of many experts gets by default): the
/// module has no prompt graph, and `prefill` no choice to make.
#[test]
fn qwen3moe_every_prompt_stepped_matches_transformers() {
    let gguf = case_dir("qwen3moe").join("qwen3moe.gguf");
    let (_, dir) = iree_against_transformers(&gguf, "qwen3moe", DType::F32, PackedPolicy::Keep, 0, 16, TOLERANCE);
    let module = std::fs::read_to_string(dir.path().join("model.mlir")).unwrap();
    let prefill = &module[module.find("func.func @prefill(").unwrap()..module.find("func.func @generate(").unwrap()];
    assert!(!module.contains("prefill_prompt") && !prefill.contains("stablehlo.if"), "no prompt graph");
    assert_eq!(Manifest::read(dir.path()).unwrap().stepped_prefill, Some(16));
}

/// The same Qwen3-MoE as transformers saved it, one tensor per expert, and
/// in transformers 5's fused form (`gate_up_proj`, `down_proj` stacks):
/// the stacks HF does not hold as such (per expert: 3 per layer; fused:
/// gate and up, the two halves of `gate_up_proj`) are joined into
/// `params.irpa`, the rest read in place.
#[test]
fn qwen3moe_matches_transformers() {
    matches_transformers_writing(&case_dir("qwen3moe"), "qwen3moe", PackedPolicy::Fail, 2 * 3);
    matches_transformers_writing(&case_dir("qwen3moe_fused"), "qwen3moe_fused", PackedPolicy::Fail, 2 * 2);
}

/// Mixtral from transformers' checkpoint (`block_sparse_moe.experts.E.w1`,
/// ...), its fused form (router under `mlp.`), and the GGUF llama.cpp's
/// converter writes of it: arch `llama` with expert keys, Q/K permuted,
/// Q8_0 expert stacks kept packed.
#[test]
fn mixtral_matches_transformers() {
    matches_transformers_writing(&case_dir("mixtral"), "mixtral", PackedPolicy::Fail, 2 * 3);
    matches_transformers_writing(&case_dir("mixtral_fused"), "mixtral_fused", PackedPolicy::Fail, 2 * 2);
    matches_transformers_packed(&case_dir("mixtral").join("mixtral.gguf"), "mixtral", PackedPolicy::Keep);
}

/// gpt-oss from the GGUF llama.cpp's converter writes of transformers'
/// checkpoint: sinks, q/k/v/o and expert biases, sliding and full layers,
/// yarn, the clamped SwiGLU (some values past its limit), the MXFP4 experts
/// kept packed (written to params.irpa: IREE's GGUF reader has no MXFP4).
/// From the GGUF, prompts past [`STEPPED_PREFILL`] run the prompt graph;
/// from the others, every prompt runs as decode steps (gpt-oss's default,
/// [`crate::models::default_stepped_prefill`]). From transformers'
/// checkpoint too: its transposed experts (gate and up
/// interleaved in `gate_up_proj`, `down_proj`) and their biases assembled
/// into params.irpa (5 stacks a layer), the rest read in place; and stored
/// as OpenAI's are, the experts HF's MXFP4 blocks and scales (repacked as
/// ggml's at export), kept packed and dequantized.
#[test]
fn gpt_oss_matches_transformers() {
    let gguf = case_dir("gpt_oss").join("gpt_oss.gguf");
    let mxfp4 = case_dir("gpt_oss_mxfp4");
    for (model, packed, written, stepped_prefill) in [
        (gguf, PackedPolicy::Keep, 41, STEPPED_PREFILL),
        (case_dir("gpt_oss"), PackedPolicy::Fail, 2 * 5, 16),
        (mxfp4.clone(), PackedPolicy::Keep, 2 * 5, 16),
        (mxfp4, PackedPolicy::Dequantize(DType::F32), 2 * 5, 16),
    ] {
        iree_against_transformers(&model, "gpt_oss", DType::F32, packed, written, stepped_prefill, TOLERANCE);
    }
}

/// The text part of Gemma3nForConditionalGeneration, whose per-layer table
/// is shorter than the vocabulary (token 14 of the prompt reads row 0).
#[test]
fn gemma3n_multimodal_text_part_matches_transformers() {
    matches_transformers("gemma3n_multimodal");
}

/// The checkpoints' configs with one key changed are refused, naming it.
#[test]
fn changed_configs_are_refused_by_name() {
    let work = tempfile::tempdir().unwrap();
    let refused = |case: &str, edit: &dyn Fn(&mut serde_json::Value)| {
        let dir = work.path().join(case);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(case_dir(case).join("model.safetensors"), dir.join("model.safetensors")).unwrap();
        let mut config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(case_dir(case).join("config.json")).unwrap()).unwrap();
        edit(&mut config);
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
        let e = export(&dir, &work.path().join("out"), &ExportOptions::default(), &mut ()).unwrap_err().to_string();
        eprintln!("{case}: {e}");
        e
    };
    let e = refused("llama3_scaled", &|c| c["rope_parameters"]["rope_type"] = "dynamic".into());
    assert!(e.contains("rope_parameters.rope_type = \"dynamic\": kiln implements the rope types"), "{e}");
    let e = refused("gemma3", &|c| {
        c["model_type"] = "gemma4_text".into();
        c["architectures"] = serde_json::json!(["Gemma4ForCausalLM"]);
    });
    assert!(e.contains("model_type \"gemma4_text\" (architectures[0] \"Gemma4ForCausalLM\") is not supported"), "{e}");
    let e = refused("gemma3", &|c| c["attn_logit_softcapping"] = 50.0.into());
    assert!(e.contains("attn_logit_softcapping = 50.0"), "{e}");
    let e = refused("gemma3_multimodal", &|c| c["text_config"]["final_logit_softcapping"] = 30.0.into());
    assert!(e.contains("config.json text_config: final_logit_softcapping = 30.0"), "{e}");
    let e = refused("qwen2_bias", &|c| c["rms_norm_eps"] = (-1.0).into());
    assert!(e.contains("rms_norm_eps = -1.0: must be positive"), "{e}");
    let e = refused("gemma3n", &|c| c["num_kv_shared_layers"] = 5.into());
    assert!(e.contains("num_kv_shared_layers = 5: layer 1 (global) has no global layer before the shared ones"), "{e}");
    let e = refused("gemma3n", &|c| c["activation_sparsity_pattern"] = serde_json::json!([0.95]));
    assert!(e.contains("activation_sparsity_pattern = [0.95]: must have 6 entries, one per layer"), "{e}");
    let e = refused("gpt_oss", &|c| c["quantization_config"] = serde_json::json!({"quant_method": "fp8"}));
    assert!(e.contains("quantization_config = {\"quant_method\":\"fp8\"}: kiln reads dense or MXFP4"), "{e}");
    let e = refused("gpt_oss", &|c| c["experts_per_token"] = 3.into());
    assert!(e.contains("experts_per_token = 3: differs from num_experts_per_tok 2"), "{e}");
    let e = refused("gemma3n_multimodal", &|c| c["text_config"]["altup_correct_scale"] = false.into());
    assert!(e.contains("config.json text_config: altup_correct_scale = false: kiln supports only true"), "{e}");
}

/// A tensor of the decoder that kiln does not read stops the export; the
/// vision tower of a multimodal checkpoint is not the decoder's.
#[test]
fn unused_tensors_are_refused_but_not_the_vision_tower() {
    use crate::weights::safetensors::{self, SafeTensors};
    let work = tempfile::tempdir().unwrap();
    let with_extra = |case: &str, extra: &str| {
        let dir = work.path().join(case);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(case_dir(case).join("config.json"), dir.join("config.json")).unwrap();
        let stored = SafeTensors::open(&case_dir(case).join("model.safetensors")).unwrap();
        let zeros = [0u8; 4 * 16];
        let mut tensors: Vec<_> = stored.tensors().map(|t| (t.name, t.dtype, t.shape, t.data)).collect();
        tensors.push((extra, StDType::F32, &[16][..], &zeros[..]));
        safetensors::write(&dir.join("model.safetensors"), &tensors, &Default::default()).unwrap();
        export(&dir, &work.path().join("out"), &ExportOptions::default(), &mut ())
    };
    let e = with_extra("qwen3", "model.layers.1.self_attn.o_proj.bias").expect_err("refused").to_string();
    assert!(
        e.contains("tensor \"model.layers.1.self_attn.o_proj.bias\" is in the checkpoint but kiln's qwen3 front-end does not use it"),
        "{e}"
    );
    with_extra("gemma3_multimodal", "vision_tower.extra.bias").unwrap();
    let e = with_extra("gemma3n", "model.layers.2.laurel.extra.weight").expect_err("refused").to_string();
    assert!(
        e.contains("\"model.layers.2.laurel.extra.weight\" is in the checkpoint but kiln's gemma3n front-end"),
        "{e}"
    );
    with_extra("gemma3n_multimodal", "model.audio_tower.extra.bias").unwrap();
    // What transformers 4.x saved for the shared layers, and 5.x ignores.
    with_extra("gemma3n", "model.layers.5.self_attn.k_norm.weight").unwrap();
}

/// Every case by the interpreter with f32, f16 and bf16 KV caches: the
/// largest |kiln - transformers| of each, within [`TOLERANCE`],
/// [`F16_TOLERANCE`] and [`BF16_TOLERANCE`]. Measured: f32 1e-6 to 1.5e-5,
/// f16 1.9e-3 to 1.3e-2, bf16 9.7e-3 to 9.9e-2 (Qwen2 the largest), with
/// logits of magnitude 3 to 9.
#[test]
fn kv_dtypes_against_transformers() {
    let cases = [
        "llama",
        "llama3_scaled",
        "linear_scaled_v4",
        "mistral",
        "qwen2_bias",
        "qwen2_yarn",
        "qwen2_yarn_v4",
        "qwen3",
        "gemma3",
        "gemma3_v4",
        "gemma3_multimodal",
        "gemma3n",
        "gemma3n_multimodal",
    ];
    for name in cases {
        let (want, vocab) = reference(name);
        let diff = |logits: &[f64], at: usize| max_abs_diff(logits, &want[at * vocab..(at + 1) * vocab]);
        let errors = CacheSpec::DTYPES.map(|d| interpreter_steps(name, d, diff));
        let largest = want.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        println!(
            "{name}: max |kiln - transformers| with an f32 KV cache {:.1e}, f16 {:.1e}, bf16 {:.1e} (max |logit| {largest:.1})",
            errors[0], errors[1], errors[2]
        );
        for (error, tolerance) in errors.iter().zip([TOLERANCE, F16_TOLERANCE, BF16_TOLERANCE]) {
            assert!(*error <= tolerance, "{name}: {errors:?} passes {tolerance:e}");
        }
    }
}

/// A Gemma 3 with an f16 KV cache (its sliding layers read a window of the
/// cache, the global ones the filled prefix) through IREE: the interpreter's
/// logits within [`TOLERANCE`], transformers' within [`F16_TOLERANCE`].
#[test]
fn f16_kv_cache_matches_interpreter_and_transformers() {
    let (_, dir) = iree_against_transformers(
        &case_dir("gemma3"),
        "gemma3",
        DType::F16,
        PackedPolicy::Fail,
        0,
        STEPPED_PREFILL,
        F16_TOLERANCE,
    );
    let manifest = Manifest::read(dir.path()).unwrap();
    assert_eq!(manifest.kv_dtype.as_deref(), Some("f16"));
    let decode = manifest.functions.iter().find(|f| f.name == "decode").unwrap();
    assert!(decode.inputs[2].ends_with("xf16>"), "{:?}", decode.inputs);
    // The same calls again, IREE's logits against the interpreter's.
    let mut iree = vec![];
    steps("gemma3", &mut |function, inputs| run(dir.path(), function, inputs, 3), |logits, _| {
        iree.push(logits.to_vec());
        0.0
    });
    let mut iree = iree.into_iter();
    let worst = interpreter_steps("gemma3", DType::F16, |logits, _| max_abs_diff(logits, &iree.next().unwrap()));
    eprintln!("gemma3 with an f16 KV cache: max |IREE - interpreter| {worst:e}");
    assert!(worst <= TOLERANCE, "gemma3: IREE and the interpreter differ by {worst:e}");
}
