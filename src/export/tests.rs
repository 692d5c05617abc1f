//! End-to-end, per model family, on the real checkpoints `make setup`
//! installs: `export` → `compile` (iree-compile) → IREE's `prefill`,
//! `decode` and `generate` against the reference interpreter. Each test
//! compiles its module once and runs every check on it.

use super::*;
use crate::interp::{ParamSource, Value};
use crate::max_abs_diff;
use crate::models::testing::{gemma3_path, smollm2_path};
use std::collections::HashSet;
use std::sync::OnceLock;
use std::time::Instant;

const PROMPT: &str = "The capital of France is";
const NEW_TOKENS: usize = 16;
const MAX_CONTEXT: usize = 64;

fn options(params: ParamsMode, packed: PackedPolicy) -> ExportOptions {
    ExportOptions { params, packed, max_context: Some(MAX_CONTEXT), kv_dtype: DType::F32, ..ExportOptions::default() }
}

/// Exports and compiles `model`, reporting the figures.
pub(super) fn export_and_compile(model: &Path, options: &ExportOptions) -> (tempfile::TempDir, ExportSummary) {
    let dir = tempfile::tempdir().unwrap();
    let summary = export(model, dir.path(), options, &mut ()).unwrap_or_else(|e| panic!("export: {e}"));
    let start = Instant::now();
    compile(dir.path(), &Iree::for_tests(), &Target::Host).unwrap_or_else(|e| panic!("compile: {e}"));
    eprintln!(
        "{} ({}): export {:.2} s, {} ops, {} bytes written; iree-compile {:.0} s",
        model.display(),
        summary.params_description,
        summary.seconds,
        summary.ops,
        summary.bytes_written,
        start.elapsed().as_secs_f64()
    );
    (dir, summary)
}

/// Runs `function` of a compiled export on `inputs`; returns its outputs.
pub(super) fn run(dir: &Path, function: &str, inputs: &[Value], outputs: usize) -> Vec<Value> {
    let manifest = Manifest::read(dir).unwrap();
    let work = tempfile::tempdir().unwrap();
    let input_paths: Vec<PathBuf> = (0..inputs.len()).map(|i| work.path().join(format!("in{i}.npy"))).collect();
    for (path, value) in input_paths.iter().zip(inputs) {
        npy::write(path, value).unwrap();
    }
    let output_paths: Vec<PathBuf> = (0..outputs).map(|i| work.path().join(format!("out{i}.npy"))).collect();
    let parameters = manifest.parameter_paths(dir);
    let bindings: Vec<(&str, &Path)> = parameters.iter().map(|(s, p)| (s.as_str(), p.as_path())).collect();
    let vmfb = dir.join(Manifest::VMFB);
    Iree::for_tests().run(&vmfb, function, &input_paths, &bindings, &output_paths).unwrap();
    output_paths.iter().map(|p| npy::read(p).unwrap()).collect()
}

fn argmax_rows(logits: &[f64], vocab: usize) -> Vec<usize> {
    logits.chunks(vocab).map(|r| (0..vocab).fold(0, |b, i| if r[i] > r[b] { i } else { b })).collect()
}

/// The module's globals are exactly the params its functions load.
fn assert_no_unused_params(dir: &Path) {
    let text = std::fs::read_to_string(dir.join("model.mlir")).unwrap();
    let between = |line: &str, open: &str, close: char| {
        let start = line.find(open)? + open.len();
        Some(line[start..][..line[start..].find(close)?].to_string())
    };
    let globals: HashSet<String> = text
        .lines()
        .filter(|l| l.contains("\"util.global\"()"))
        .filter_map(|l| between(l, "sym_name = \"", '"'))
        .collect();
    let loaded: HashSet<String> = text
        .lines()
        .filter(|l| l.contains("\"util.global.load\"()"))
        .filter_map(|l| between(l, "global = @", '}'))
        .map(|s| s.trim().to_string())
        .collect();
    assert!(!globals.is_empty());
    assert_eq!(globals, loaded, "every global is loaded and every load has a global");
}

/// Checks on one compiled export of a GGUF: signatures, IREE prefill
/// logits against the interpreter's at every position, prefill + decode
/// against the whole prefill, and `generate` against `greedy` (the
/// interpreter's tokens, up to an end of generation). Returns the text.
fn check_export(
    model: &Path,
    dir: &Path,
    reference: &Serving,
    params: &dyn ParamSource,
    greedy: &[u32],
    transformers: &str,
) -> String {
    let manifest = Manifest::read(dir).unwrap();
    let names: Vec<&str> = manifest.functions.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["prefill", "decode", "generate"]);
    // Only the declared inputs: tokens, position and the two caches.
    assert_eq!(manifest.functions[0].inputs, ["tensor<1x?xi32>"]);
    assert_eq!(manifest.functions[1].inputs.len(), 4);
    // decode's caches are its new caches' storage; the other functions have none.
    let in_place: Vec<&[[usize; 2]]> = manifest.functions.iter().map(|f| f.in_place.as_slice()).collect();
    assert_eq!(in_place, [&[][..], &[[2, 1], [3, 2]], &[]]);
    assert_no_unused_params(dir);

    let tokenizer = Source::open(model).unwrap().tokenizer().unwrap();
    let ids = tokenizer.encode(PROMPT, tokenizer.add_bos_token());
    let n = ids.len();
    let start = Instant::now();
    let want = reference.prefill_reference(params, &ids).unwrap()[0].to_f64_vec();
    eprintln!("interpreter prefill of {n} tokens: {:.1} s", start.elapsed().as_secs_f64());
    // Prefill's logits are the last position's.
    let got = run(dir, "prefill", &[token_ids(&ids)], 3)[0].to_f64_vec();
    let vocab = got.len();
    let diff = max_abs_diff(&got, &want);
    eprintln!("{}: max |IREE - interpreter| after {n} positions: {diff:e}", model.display());
    assert!(diff <= 1e-3, "prefill logits differ by {diff}");
    assert_eq!(argmax_rows(&got, vocab), argmax_rows(&want, vocab), "argmax");
    matches_transformers_gguf(transformers, &ids, &got);

    let head = run(dir, "prefill", &[token_ids(&ids[..n - 1])], 3);
    let step =
        run(dir, "decode", &[token_ids(&ids[n - 1..]), scalar_i32(n as i32 - 1), head[1].clone(), head[2].clone()], 3);
    let diff = max_abs_diff(&step[0].to_f64_vec(), &got);
    eprintln!("prefill({}) + decode(1) vs prefill({n}) through IREE: {diff:e}", n - 1);
    assert!(diff <= 1e-4, "decode differs from the whole prefill by {diff}");

    let generated = generate(dir, PROMPT, NEW_TOKENS, &Iree::for_tests()).unwrap();
    eprintln!("IREE generate: {:?} ({} tokens in {:.2} s)", generated.text, generated.tokens.len(), generated.seconds);
    assert_eq!(generated.tokens, greedy, "IREE's greedy tokens differ from the interpreter's");
    generated.text
}

/// `last`, IREE's logits at the last position of `ids`, against
/// transformers' for the same GGUF (`from_pretrained(dir, gguf_file=...)`,
/// f32; test/models/transformers_reference.py): its top tokens and a
/// stride of the vocabulary, and the argmax.
fn matches_transformers_gguf(name: &str, ids: &[u32], last: &[f64]) {
    #[derive(Deserialize)]
    struct Reference {
        tokens: Vec<u32>,
        vocab: usize,
        argmax: usize,
        ids: Vec<usize>,
        logits: Vec<f64>,
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("test/models/transformers/gguf").join(format!("{name}.json"));
    let reference: Reference = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(ids, reference.tokens, "kiln's tokenizer encodes the prompt as transformers' does");
    assert_eq!(last.len(), reference.vocab);
    let got: Vec<f64> = reference.ids.iter().map(|&i| last[i]).collect();
    let diff = max_abs_diff(&got, &reference.logits);
    eprintln!("{name}: max |IREE - transformers| over {} last-position logits: {diff:e}", got.len());
    assert!(diff <= 1e-4, "{name}: logits differ from transformers' by {diff:e}");
    assert_eq!(argmax_rows(last, last.len()), [reference.argmax], "argmax differs from transformers'");
}

/// The interpreter's greedy continuation of [`PROMPT`] (up to an end of
/// generation) with host-dequantized weights: bit-identical to the
/// in-graph dequantization, and faster to interpret.
fn greedy_reference(gguf: &Gguf) -> Vec<u32> {
    let weights = GgufWeights::new(gguf, PackedPolicy::Dequantize(DType::F32)).unwrap();
    let serving = Serving::new(&Family::from_gguf(gguf).unwrap(), &weights, MAX_CONTEXT).unwrap();
    let tokenizer = Tokenizer::from_gguf(gguf).unwrap();
    let ids = tokenizer.encode(PROMPT, tokenizer.add_bos_token());
    let start = Instant::now();
    let mut tokens = serving.generate_reference(&weights, &ids, NEW_TOKENS).unwrap();
    eprintln!("interpreter greedy {NEW_TOKENS} tokens: {:.1} s", start.elapsed().as_secs_f64());
    if let Some(eog) = tokens.iter().position(|&t| tokenizer.is_eog(t)) {
        tokens.truncate(eog + 1);
    }
    tokens
}

/// SmolLM2 and its [`greedy_reference`], computed once for every test.
fn smollm2_reference() -> &'static (Gguf, Vec<u32>) {
    static REFERENCE: OnceLock<(Gguf, Vec<u32>)> = OnceLock::new();
    REFERENCE.get_or_init(|| {
        let gguf = Gguf::open(&smollm2_path()).unwrap_or_else(|e| panic!("{e} (run `make setup`)"));
        let tokens = greedy_reference(&gguf);
        (gguf, tokens)
    })
}

#[test]
fn smollm2_end_to_end() {
    let model = smollm2_path();
    let (dir, summary) = export_and_compile(&model, &options(ParamsMode::Reference, PackedPolicy::Keep));
    assert_eq!(summary.params_written, 0, "reference mode writes no weight");
    let gguf = Gguf::open(&model).unwrap();
    let weights = GgufWeights::new(&gguf, PackedPolicy::Keep).unwrap();
    let serving = Serving::new(&Family::from_gguf(&gguf).unwrap(), &weights, MAX_CONTEXT).unwrap();
    let text = check_export(&model, dir.path(), &serving, &weights, &smollm2_reference().1, "smollm2");
    assert!(text.starts_with(" Paris"), "{text:?}");
}

/// Every `--params` mode and packed policy gives the same greedy tokens.
fn smollm2_generates_the_same_tokens(params: ParamsMode, packed: PackedPolicy) {
    let (dir, summary) = export_and_compile(&smollm2_path(), &options(params, packed));
    let manifest = &summary.manifest;
    let scopes: Vec<&str> = manifest.parameters.iter().map(|p| p.scope.as_str()).collect();
    match (params, packed) {
        (ParamsMode::Reference, PackedPolicy::Dequantize(_)) => {
            assert_eq!(scopes, [lower::DEFAULT_PARAM_SCOPE, ARCHIVE_SCOPE])
        }
        (ParamsMode::Archive, _) => assert_eq!(scopes, [ARCHIVE_SCOPE]),
        (ParamsMode::Inline, _) => assert!(scopes.is_empty()),
        _ => unreachable!("the other combinations are tested elsewhere"),
    }
    let generated = generate(dir.path(), PROMPT, NEW_TOKENS, &Iree::for_tests()).unwrap();
    eprintln!("{}: {:?}", summary.params_description, generated.text);
    assert_eq!(generated.tokens, smollm2_reference().1);
}

#[test]
fn smollm2_archive_dequantized() {
    smollm2_generates_the_same_tokens(ParamsMode::Archive, PackedPolicy::Dequantize(DType::F32));
}

#[test]
fn smollm2_reference_dequantized() {
    smollm2_generates_the_same_tokens(ParamsMode::Reference, PackedPolicy::Dequantize(DType::F32));
}

#[test]
fn smollm2_inline_kept() {
    smollm2_generates_the_same_tokens(ParamsMode::Inline, PackedPolicy::Keep);
}

#[test]
fn gemma3_end_to_end() {
    let model = gemma3_path();
    let (dir, _) = export_and_compile(&model, &options(ParamsMode::Reference, PackedPolicy::Keep));
    let gguf = Gguf::open(&model).unwrap_or_else(|e| panic!("{e} (run `make setup`)"));
    let weights = GgufWeights::new(&gguf, PackedPolicy::Keep).unwrap();
    let serving = Serving::new(&Family::from_gguf(&gguf).unwrap(), &weights, MAX_CONTEXT).unwrap();
    check_export(&model, dir.path(), &serving, &weights, &greedy_reference(&gguf), "gemma3");
}

/// An HF checkpoint (safetensors + config.json, HF's rope layout, and
/// tokenizer.json) written from the SmolLM2 GGUF exports to a module whose
/// logits are the GGUF's, and `kiln run`'s path through it tokenizes and
/// generates as the GGUF does.
#[test]
fn smollm2_from_safetensors() {
    let hf = tempfile::tempdir().unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/test/models/gguf_to_hf.py");
    let python = concat!(env!("CARGO_MANIFEST_DIR"), "/.venv/bin/python");
    let out = std::process::Command::new(python).arg(script).arg(smollm2_path()).arg(hf.path()).output().unwrap();
    assert!(out.status.success(), "{script}: {}", String::from_utf8_lossy(&out.stderr));
    let (dir, summary) = export_and_compile(hf.path(), &options(ParamsMode::Reference, PackedPolicy::Fail));
    assert_eq!(summary.manifest.format, "safetensors");
    assert_eq!(summary.params_written, 0, "f32 safetensors are read in place");

    let (gguf, reference) = smollm2_reference();
    let weights = GgufWeights::new(gguf, PackedPolicy::Dequantize(DType::F32)).unwrap();
    let serving = Serving::new(&Family::from_gguf(gguf).unwrap(), &weights, MAX_CONTEXT).unwrap();
    let tokenizer = Tokenizer::from_gguf(gguf).unwrap();
    let ids = tokenizer.encode(PROMPT, tokenizer.add_bos_token());
    let want = serving.prefill_reference(&weights, &ids).unwrap()[0].to_f64_vec();
    let got = run(dir.path(), "prefill", &[token_ids(&ids)], 3)[0].to_f64_vec();
    let diff = max_abs_diff(&got, &want);
    eprintln!("safetensors export (IREE) vs GGUF (interpreter): max |diff| {diff:e}");
    assert!(diff <= 1e-3, "{diff}");
    assert_eq!(argmax_rows(&got, got.len()), argmax_rows(&want, want.len()));

    let from_json = Tokenizer::from_hf_dir(hf.path()).unwrap();
    for text in ["in  2024,   42 cats\n\n7 dogs", "<|im_start|>user\nHi<|im_end|>\n", "don't 3.14159 café"] {
        assert_eq!(from_json.encode(text, true), tokenizer.encode(text, true), "{text:?}");
    }
    let generation = generate(dir.path(), PROMPT, 8, &Iree::for_tests()).unwrap();
    assert_eq!(generation.prompt_tokens, ids, "tokenizer.json encodes as the GGUF's tokenizer does");
    assert_eq!(generation.tokens, reference[..8]);
    assert_eq!(generation.text, tokenizer.decode(&reference[..8]));
}

/// By default the cache holds the model's own context where the caches fit
/// in 1 GiB, else the largest power of two that does; the summary and the
/// manifest say what was chosen.
#[test]
fn default_capacity_is_the_models_context_within_the_budget() {
    // SmolLM2-135M: 30 layers x 3 KV heads x 64 dims, keys and values.
    let smollm2_position = |dtype_bytes: u64| 2 * 30 * 3 * 64 * dtype_bytes;
    assert_eq!(default_max_context(Some(8192), smollm2_position(2)), 8192);
    assert_eq!(default_max_context(None, smollm2_position(2)), FALLBACK_CONTEXT);
    // Llama-3.2-1B: 16 x 8 x 64; 2^30 / 32768 bytes = 32768 positions in f16.
    assert_eq!(default_max_context(Some(131072), 2 * 16 * 8 * 64 * 2), 32768);
    assert_eq!(default_max_context(Some(131072), 2 * 16 * 8 * 64 * 4), 16384);
    // Gemma-3-270M: 18 x 1 x 256, 32768 positions: 0.6 GB in f16, 1.2 GB in f32.
    assert_eq!(default_max_context(Some(32768), 2 * 18 * 256 * 2), 32768);
    assert_eq!(default_max_context(Some(32768), 2 * 18 * 256 * 4), 16384);

    let work = tempfile::tempdir().unwrap();
    let keep = ExportOptions { packed: PackedPolicy::Keep, ..ExportOptions::default() };
    let summary = export(&smollm2_path(), work.path(), &keep, &mut ()).unwrap();
    let m = &summary.manifest;
    assert_eq!((m.max_context, m.kv_dtype.as_deref().unwrap()), (8192, "f16"), "SmolLM2's llama.context_length, f16");
    assert_eq!(summary.cache_bytes, 8192 * smollm2_position(2));
    let decode = m.functions.iter().find(|f| f.name == "decode").unwrap();
    assert_eq!(decode.inputs[2..], ["tensor<30x3x8192x64xf16>", "tensor<30x3x8192x64xf16>"]);
}

/// Bad input stops the export with an error that names it, and leaves no
/// file behind.
#[test]
fn export_errors_name_the_culprit_and_leave_nothing() {
    use crate::models::synth::{self, Preset, SynthData};
    let work = tempfile::tempdir().unwrap();
    let model = work.path().join("tiny.gguf");
    synth::write(&Preset::TinyLlama.config(), &model, SynthData::Seeded(0)).unwrap();
    let out = work.path().join("out");
    let fail = |model: &Path, options: &ExportOptions| export(model, &out, options, &mut ()).unwrap_err().to_string();

    let e = fail(&model, &ExportOptions::default());
    assert!(e.contains("is packed as Q8_0") && e.contains("--packed dequantize") && e.contains("--packed keep"), "{e}");
    let e = fail(&work.path().join("model.bin"), &ExportOptions::default());
    assert!(e.contains("a .gguf file or an HF directory"), "{e}");
    let e = fail(work.path(), &ExportOptions::default());
    assert!(e.contains("config.json"), "{e}");
    let keep = options(ParamsMode::Reference, PackedPolicy::Keep);
    let e = fail(&model, &ExportOptions { kv_dtype: DType::I8, ..keep.clone() });
    assert!(e.contains("a KV cache holds f32, f16, bf16, not i8"), "{e}");
    let e = fail(&model, &ExportOptions { max_context: Some(0), ..keep });
    assert!(e.contains("a KV cache of 0 positions"), "{e}");
    let mut truncated = std::fs::read(&model).unwrap();
    truncated.truncate(truncated.len() / 2);
    std::fs::write(work.path().join("cut.gguf"), truncated).unwrap();
    let e = fail(&work.path().join("cut.gguf"), &options(ParamsMode::Reference, PackedPolicy::Keep));
    assert!(e.contains("cut.gguf"), "{e}");
    assert!(!out.exists(), "a failed export leaves no directory behind");

    let e = generate(&out, PROMPT, 1, &Iree::for_tests()).unwrap_err().to_string();
    assert!(e.contains("not a kiln export") && e.contains("kiln export MODEL -o DIR"), "{e}");
    let summary = export(&model, &out, &options(ParamsMode::Archive, PackedPolicy::Keep), &mut ()).unwrap();
    assert_eq!(summary.manifest.parameters.len(), 1, "archive mode binds the archive only");
    let e = generate(&out, PROMPT, 1, &Iree::for_tests()).unwrap_err().to_string();
    assert!(e.contains("not compiled; run `kiln compile DIR`") && !e.contains("not a kiln export"), "{e}");

    // Text with elided weights is for reading; compiling it is refused.
    let elided = ExportOptions {
        emit: Some(Emit::Mlir { elide_resources_over: Some(16) }),
        ..options(ParamsMode::Inline, PackedPolicy::Keep)
    };
    export(&model, &out, &elided, &mut ()).unwrap();
    let text = std::fs::read_to_string(out.join("model.mlir")).unwrap();
    // A printed blob is one line of hex in the resources section (`name:
    // "0x…"`), as long as twice its bytes (argmax's index range, a
    // constant, prints as hex too).
    let longest = text.lines().filter(|l| l.contains(": \"0x")).map(str::len).max().unwrap_or(0);
    assert!(text.contains("dense_resource<") && longest < 1000, "blobs are elided: a {longest}-byte line");
    let e = compile(&out, &Iree::for_tests(), &Target::Host).unwrap_err().to_string();
    assert!(e.contains("--emit mlirbc") && e.contains("--full-resources"), "{e}");
}

/// One tiny llama per ggml type kiln reads as weights (every matrix, head
/// and embedding of that type), exported with the default `--params
/// reference`: `--packed keep` where the graph dequantizes the type,
/// `dequantize` where it does not. A checkpoint IREE's GGUF reader can bind
/// is referenced, any other goes to the archive whole; either way IREE's
/// prefill matches the interpreter's. Exports whose module text is the same
/// (the dequantized ones) share one compile.
#[test]
fn every_ggml_type_runs_from_its_gguf() {
    use crate::models::config::Dims;
    use crate::models::synth::{self, Preset, Quant, SynthConfig, SynthData};
    use crate::trace::dequant;
    use crate::weights::ggml::GgmlType;
    use std::collections::HashMap;

    let work = tempfile::tempdir().unwrap();
    let ids = [1, 2, 3, 5, 8];
    // Rows of 256 values: a whole number of blocks of every type.
    let dims = Dims {
        block_count: 1,
        embedding_length: 256,
        head_count: 4,
        head_count_kv: 2,
        head_dim: 64,
        vocab_size: 256,
        rms_norm_eps: 1e-5,
    };
    let dense = [GgmlType::F32, GgmlType::F16, GgmlType::BF16];
    let types = GgmlType::ALL.into_iter().filter(|t| t.is_quantized() || dense.contains(t));
    let mut compiled: HashMap<Vec<u8>, PathBuf> = HashMap::new();
    let mut rows = Vec::new();
    for ty in types {
        let config = SynthConfig {
            name: format!("tiny-{ty}"),
            dims,
            feed_forward_length: 256,
            quant: Quant::Uniform(ty),
            ..Preset::TinyLlama.config()
        };
        let model = work.path().join(format!("{ty}.gguf"));
        synth::write(&config, &model, SynthData::Seeded(ty.id() as u64)).unwrap();
        let packed = match ty {
            _ if !ty.is_quantized() => PackedPolicy::Fail,
            _ if dequant::supported(ty) => PackedPolicy::Keep,
            _ => PackedPolicy::Dequantize(DType::F32),
        };
        let dir = work.path().join(ty.name());
        let options = ExportOptions { packed, max_context: Some(16), kv_dtype: DType::F32, ..ExportOptions::default() };
        let summary = export(&model, &dir, &options, &mut ()).unwrap_or_else(|e| panic!("{ty}: export: {e}"));
        let readable = plan::IREE_GGUF_TYPES.contains(&ty);
        let mode = summary.manifest.params;
        assert_eq!(mode == ParamsMode::Reference, readable, "{ty}: {}", summary.params_description);
        if !readable {
            assert!(summary.params_description.contains(&format!("is {ty} (ggml type {})", ty.id())));
            assert_eq!(summary.params_written, summary.params, "{ty}: every param is archived");
        }

        let text = std::fs::read(dir.join(&summary.manifest.module)).unwrap();
        let vmfb = dir.join(Manifest::VMFB);
        match compiled.get(&text) {
            Some(done) => drop(std::fs::copy(done, &vmfb).unwrap()),
            None => {
                compile(&dir, &Iree::for_tests(), &Target::Host).unwrap_or_else(|e| panic!("{ty}: compile: {e}"));
                compiled.insert(text, vmfb);
            }
        }

        let gguf = Gguf::open(&model).unwrap();
        let weights = GgufWeights::new(&gguf, packed).unwrap();
        let serving = Serving::new(&Family::from_gguf(&gguf).unwrap(), &weights, 16).unwrap();
        let want = serving.prefill_reference(&weights, &ids).unwrap()[0].to_f64_vec();
        let got = run(&dir, "prefill", &[token_ids(&ids)], 3)[0].to_f64_vec();
        let scale = want.iter().fold(1.0f64, |m, x| m.max(x.abs()));
        let diff = max_abs_diff(&got, &want);
        rows.push(format!("{ty:>7}: params {:<9} packed {:<20} |IREE - interpreter| {diff:.1e}", mode.name(), packed));
        assert!(
            diff <= 1e-4 * scale,
            "{ty}: IREE's prefill differs from the interpreter's by {diff:e} (scale {scale})"
        );
    }
    eprintln!("{} types, {} compiles:\n{}", rows.len(), compiled.len(), rows.join("\n"));
}
