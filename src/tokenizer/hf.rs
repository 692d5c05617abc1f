//! A Hugging Face `tokenizer.json` (byte-level BPE) read as the GGUF
//! tokenizer metadata llama.cpp's `convert_hf_to_gguf.py` makes of it
//! (`_set_vocab_gpt2`, `gguf.SpecialVocab`), so one implementation serves
//! both kinds of checkpoint.
//!
//! - `tokenizer.ggml.tokens`: the vocabulary and the added tokens by id;
//!   ids neither names are `[PADn]`, unused.
//! - `token_type`: added tokens are control tokens when `special`, else
//!   user-defined; the rest are normal.
//! - `pre`: recognized from the `pre_tokenizer` object (GPT-2's
//!   `ByteLevel`, SmolLM's `Digits` + `ByteLevel`, Llama 3's and Qwen2's
//!   `Split` regex + `ByteLevel`).
//! - BOS, EOS, UNK and `add_bos_token` from `tokenizer_config.json`.

use super::pre::{LLAMA3_REGEX, QWEN2_REGEX};
use super::{Tokenizer, TokenizerError};
use crate::weights::gguf::Gguf;
use crate::weights::gguf_writer::{GgufWriter, Value};
use serde_json::Value as Json;
use std::collections::HashMap;
use std::path::Path;

impl Tokenizer {
    /// The tokenizer of a Hugging Face checkpoint directory:
    /// `tokenizer.json`, with `tokenizer_config.json` if present.
    pub fn from_hf_dir(dir: &Path) -> Result<Tokenizer, TokenizerError> {
        let path = dir.join("tokenizer.json");
        let fail = |message: String| TokenizerError::Hf { path: path.clone(), message };
        let tokenizer =
            read_json(&path)?.ok_or_else(|| fail("not found; kiln needs the checkpoint's tokenizer".into()))?;
        let config = read_json(&dir.join("tokenizer_config.json"))?.unwrap_or(Json::Null);
        let mut w = GgufWriter::new("<memory>");
        for (key, value) in gguf_metadata(&tokenizer, &config).map_err(fail)? {
            w.add(key, value).map_err(|e| fail(e.to_string()))?;
        }
        let bytes = w.metadata_only_bytes().expect("no tensors were declared");
        let gguf = Gguf::parse(bytes).map_err(|e| fail(format!("as GGUF metadata: {e}")))?;
        Tokenizer::from_gguf(&gguf).map_err(|e| fail(format!("as GGUF metadata: {e}")))
    }
}

/// The parsed file, or `None` if it does not exist.
fn read_json(path: &Path) -> Result<Option<Json>, TokenizerError> {
    let fail = |message: String| TokenizerError::Hf { path: path.to_path_buf(), message };
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(fail(e.to_string())),
    };
    serde_json::from_str(&text).map(Some).map_err(|e| fail(format!("not valid JSON: {e}")))
}

/// `tokenizer.ggml.*` for `tokenizer` (a `tokenizer.json`) and `config`
/// (a `tokenizer_config.json`, or null).
fn gguf_metadata(tokenizer: &Json, config: &Json) -> Result<Vec<(&'static str, Value)>, String> {
    let model = &tokenizer["model"];
    if model["type"] != "BPE" || tokenizer["decoder"]["type"] != "ByteLevel" {
        return Err(format!(
            "model {} with decoder {}: kiln reads byte-level BPE tokenizers (GPT-2, SmolLM, Llama 3, Qwen2); \
             for SentencePiece models use the GGUF",
            model["type"], tokenizer["decoder"]["type"]
        ));
    }
    let pre = pre_name(&tokenizer["pre_tokenizer"]).ok_or_else(|| {
        format!(
            "pre_tokenizer {} is not one kiln implements (GPT-2's ByteLevel, SmolLM's Digits + ByteLevel, \
             Llama 3's or Qwen2's Split regex + ByteLevel)",
            tokenizer["pre_tokenizer"]
        )
    })?;

    let vocab = model["vocab"].as_object().ok_or("model.vocab is not an object of token -> id")?;
    let mut entries: Vec<(u64, &str, i32)> = Vec::with_capacity(vocab.len());
    for (token, id) in vocab {
        let id = id.as_u64().ok_or_else(|| format!("model.vocab[{token:?}] is {id}, not a token id"))?;
        entries.push((id, token, NORMAL));
    }
    for added in tokenizer["added_tokens"].as_array().into_iter().flatten() {
        let (Some(id), Some(content)) = (added["id"].as_u64(), added["content"].as_str()) else {
            return Err(format!("added token {added} has no id or content"));
        };
        entries.push((id, content, if added["special"] == true { CONTROL } else { USER_DEFINED }));
    }
    let n = entries.iter().map(|e| e.0 + 1).max().unwrap_or(0);
    if n > u64::from(u32::MAX) || n > 4 * entries.len() as u64 {
        return Err(format!("token ids reach {n} for {} tokens", entries.len()));
    }
    let mut tokens: Vec<String> = (0..n).map(|i| format!("[PAD{i}]")).collect();
    let mut types = vec![UNUSED; n as usize];
    // Added tokens come last: they win over a vocabulary entry of their id.
    for &(id, text, ty) in &entries {
        tokens[id as usize] = text.to_string();
        types[id as usize] = ty;
    }

    let merges = model["merges"].as_array().ok_or("model.merges is not an array")?;
    let merges = merges
        .iter()
        .map(|m| match m {
            Json::String(s) => Some(s.clone()),
            Json::Array(pair) => match pair.as_slice() {
                [Json::String(a), Json::String(b)] => Some(format!("{a} {b}")),
                _ => None,
            },
            _ => None,
        })
        .collect::<Option<Vec<String>>>()
        .ok_or("model.merges holds an entry that is neither \"a b\" nor [\"a\", \"b\"]")?;

    let mut metadata = vec![
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.pre", Value::String(pre.into())),
        ("tokenizer.ggml.tokens", Value::strings(tokens.iter().cloned())),
        ("tokenizer.ggml.token_type", Value::i32s(types)),
        ("tokenizer.ggml.merges", Value::strings(merges)),
    ];
    let ids: HashMap<&str, u32> = tokens.iter().enumerate().map(|(i, t)| (t.as_str(), i as u32)).collect();
    for (field, key) in [
        ("bos_token", "tokenizer.ggml.bos_token_id"),
        ("eos_token", "tokenizer.ggml.eos_token_id"),
        ("unk_token", "tokenizer.ggml.unknown_token_id"),
    ] {
        // A string, or an AddedToken object.
        let text = config[field].as_str().or_else(|| config[field]["content"].as_str());
        if let Some(text) = text {
            let id = ids.get(text).ok_or_else(|| format!("tokenizer_config.json: {field} {text:?} is not a token"))?;
            metadata.push((key, Value::U32(*id)));
        }
    }
    if let Some(add_bos) = config["add_bos_token"].as_bool() {
        metadata.push(("tokenizer.ggml.add_bos_token", Value::Bool(add_bos)));
    }
    Ok(metadata)
}

// llama.cpp's `llama_token_type` values, as `tokenizer.ggml.token_type` holds them.
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;

/// The `tokenizer.ggml.pre` name of a `pre_tokenizer` object, if kiln
/// implements its split.
fn pre_name(pre: &Json) -> Option<&'static str> {
    // `add_prefix_space` would put a space before the text: not these models.
    let byte_level = |p: &Json, regex: bool| {
        p["type"] == "ByteLevel"
            && p["use_regex"].as_bool().unwrap_or(true) == regex
            && !p["add_prefix_space"].as_bool().unwrap_or(false)
    };
    let split = |p: &Json, regex: &str| p["type"] == "Split" && p["pattern"]["Regex"] == regex;
    if byte_level(pre, true) {
        return Some("gpt-2");
    }
    match pre["pretokenizers"].as_array()?.as_slice() {
        [digits, b] if digits["type"] == "Digits" && digits["individual_digits"] == true && byte_level(b, true) => {
            Some("smollm")
        }
        [s, b] if split(s, LLAMA3_REGEX) && byte_level(b, false) => Some("llama-bpe"),
        [s, b] if split(s, QWEN2_REGEX) && byte_level(b, false) => Some("qwen2"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A byte-level BPE over GPT-2's alphabet with a few merges, Llama 3's
    /// pre-tokenizer and two added tokens.
    fn llama3_like() -> (Json, Json) {
        let mut vocab: serde_json::Map<String, Json> =
            super::super::gpt2_alphabet().iter().enumerate().map(|(i, c)| (c.to_string(), json!(i))).collect();
        for (i, t) in ["he", "ll", "hell", "hello", "Ġw", "or", "Ġwor", "ld", "Ġworld"].iter().enumerate() {
            vocab.insert(t.to_string(), json!(256 + i));
        }
        let merges = json!(["h e", "l l", "he ll", ["hell", "o"], "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld"]);
        let tokenizer = json!({
            "added_tokens": [
                {"id": 300, "content": "<|begin_of_text|>", "special": true},
                {"id": 301, "content": "<|eot_id|>", "special": true},
            ],
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX}, "behavior": "Isolated", "invert": false},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
            ]},
            "decoder": {"type": "ByteLevel"},
            "model": {"type": "BPE", "vocab": vocab, "merges": merges},
        });
        let config =
            json!({"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|eot_id|>"}, "add_bos_token": true});
        (tokenizer, config)
    }

    fn write(dir: &Path, tokenizer: &Json, config: Option<&Json>) {
        std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
        if let Some(config) = config {
            std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
        }
    }

    #[test]
    fn byte_level_bpe_reads_as_its_gguf_conversion() {
        let dir = tempfile::tempdir().unwrap();
        let (tokenizer, config) = llama3_like();
        write(dir.path(), &tokenizer, Some(&config));
        let t = Tokenizer::from_hf_dir(dir.path()).unwrap();
        assert_eq!(t.vocab_size(), 302, "ids 265..300 are padding");
        assert_eq!((t.bos(), t.eos()), (Some(300), Some(301)));
        assert!(t.add_bos_token() && t.is_eog(301));
        // "hello world" merges to two tokens; the added token is cut out whole.
        assert_eq!(t.encode("hello world<|eot_id|>", true), [300, 259, 264, 301]);
        assert_eq!(t.decode(&[259, 264]), "hello world");
        assert_eq!(t.encode("123456", false).len(), 6, "one byte token per digit: no merges for them");
    }

    #[test]
    fn what_kiln_cannot_read_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let err = |tokenizer: &Json, config: Option<&Json>| {
            write(dir.path(), tokenizer, config);
            Tokenizer::from_hf_dir(dir.path()).unwrap_err().to_string()
        };
        let e = Tokenizer::from_hf_dir(&dir.path().join("nowhere")).unwrap_err().to_string();
        assert!(e.contains("tokenizer.json: not found"), "{e}");

        let (tokenizer, config) = llama3_like();
        let mut spm = tokenizer.clone();
        spm["decoder"] = json!({"type": "Sequence", "decoders": []});
        let e = err(&spm, None);
        assert!(e.contains("tokenizer.json") && e.contains("byte-level BPE") && e.contains("use the GGUF"), "{e}");

        let mut bert = tokenizer.clone();
        bert["pre_tokenizer"] = json!({"type": "BertPreTokenizer"});
        let e = err(&bert, None);
        assert!(e.contains("pre_tokenizer {\"type\":\"BertPreTokenizer\"} is not one kiln implements"), "{e}");

        let mut missing = config.clone();
        missing["bos_token"] = json!("<s>");
        let e = err(&tokenizer, Some(&missing));
        assert!(e.contains("bos_token \"<s>\" is not a token"), "{e}");

        std::fs::write(dir.path().join("tokenizer.json"), "{").unwrap();
        let e = Tokenizer::from_hf_dir(dir.path()).unwrap_err().to_string();
        assert!(e.contains("not valid JSON"), "{e}");
    }
}
