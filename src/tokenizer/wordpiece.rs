//! WordPiece, BERT's tokenizer, as Hugging Face `tokenizers` runs it
//! (`BertNormalizer`, `BertPreTokenizer`, `WordPiece`, the `[CLS] … [SEP]`
//! template), read from a `tokenizer.json` or from the GGUF vocabulary
//! llama.cpp's converter writes (`tokenizer.ggml.model = "bert"`).
//!
//! 1. Added tokens (`[CLS]`, `[MASK]`, ...) are cut out of the raw text
//!    where they occur verbatim, longest first.
//! 2. Normalizer: control characters dropped, whitespace made a space;
//!    CJK ideographs spaced apart; with lower-casing, accents stripped
//!    (NFD, then no nonspacing marks) and the text lower-cased.
//! 3. Pre-tokenizer: split at whitespace (dropped) and at punctuation
//!    (each mark its own word).
//! 4. WordPiece: each word greedily as the longest vocabulary prefix, then
//!    the longest `##`-prefixed continuation, and so on; a word with a part
//!    that matches nothing, or over 100 chars, is `[UNK]`.
//!
//! Reference: `tokenizers/src/normalizers/bert.rs`,
//! `pre_tokenizers/bert.rs`, `models/wordpiece/mod.rs`.

use super::TokenizerError;
use crate::weights::gguf::{Gguf, ValueType};
use finl_unicode::categories::CharacterCategories;
use serde_json::Value as Json;
use std::collections::HashMap;
use std::path::Path;
use unicode_normalization::UnicodeNormalization;

/// A WordPiece tokenizer with BERT's normalization and template.
#[derive(Clone, Debug)]
pub struct WordPiece {
    vocab: HashMap<String, u32>,
    prefix: String,
    max_input_chars_per_word: usize,
    unk: u32,
    cls: u32,
    sep: u32,
    pad: u32,
    lowercase: bool,
    strip_accents: bool,
    /// Added tokens matched verbatim in the raw text, longest first.
    added: Vec<(String, u32)>,
}

impl WordPiece {
    /// The tokenizer of an HF checkpoint directory: `dir/tokenizer.json`,
    /// whose model must be WordPiece with BERT's normalizer and
    /// pre-tokenizer.
    pub fn from_hf_dir(dir: &Path) -> Result<WordPiece, TokenizerError> {
        let path = dir.join("tokenizer.json");
        let fail = |message: String| TokenizerError::Hf { path: path.clone(), message };
        let text = std::fs::read_to_string(&path).map_err(|e| fail(e.to_string()))?;
        let json: Json = serde_json::from_str(&text).map_err(|e| fail(format!("not valid JSON: {e}")))?;
        Self::from_json(&json).map_err(fail)
    }

    fn from_json(json: &Json) -> Result<WordPiece, String> {
        let model = &json["model"];
        if model["type"] != "WordPiece" {
            return Err(format!("model type {}: kiln's encoders read WordPiece tokenizers only", model["type"]));
        }
        let normalizer = &json["normalizer"];
        if normalizer["type"] != "BertNormalizer" {
            return Err(format!("normalizer {}: kiln reads BertNormalizer only", normalizer["type"]));
        }
        for key in ["clean_text", "handle_chinese_chars"] {
            if normalizer[key] == false {
                return Err(format!("normalizer.{key} = false: kiln's BertNormalizer always does it"));
            }
        }
        if json["pre_tokenizer"]["type"] != "BertPreTokenizer" {
            return Err(format!("pre_tokenizer {}: kiln reads BertPreTokenizer only", json["pre_tokenizer"]["type"]));
        }
        let lowercase = normalizer["lowercase"].as_bool().unwrap_or(true);
        let strip_accents = normalizer["strip_accents"].as_bool().unwrap_or(lowercase);
        let vocab: HashMap<String, u32> = model["vocab"]
            .as_object()
            .ok_or("model.vocab is not an object")?
            .iter()
            .map(|(k, v)| Ok((k.clone(), v.as_u64().ok_or(format!("model.vocab[{k:?}] is not an id"))? as u32)))
            .collect::<Result<_, String>>()?;
        let id = |token: &str| vocab.get(token).copied().ok_or(format!("{token} is not in the vocabulary"));
        let unk = id(model["unk_token"].as_str().unwrap_or("[UNK]"))?;
        let (cls, sep) = template(&json["post_processor"], &id)?;
        let pad = json["padding"]["pad_id"].as_u64().map(|p| p as u32).map_or_else(|| id("[PAD]"), Ok)?;
        let mut added: Vec<(String, u32)> = json["added_tokens"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| Some((t["content"].as_str()?.to_string(), t["id"].as_u64()? as u32)))
            .collect();
        added.sort_by_key(|(text, _)| std::cmp::Reverse(text.len()));
        Ok(WordPiece {
            vocab,
            prefix: model["continuing_subword_prefix"].as_str().unwrap_or("##").to_string(),
            max_input_chars_per_word: model["max_input_chars_per_word"].as_u64().unwrap_or(100) as usize,
            unk,
            cls,
            sep,
            pad,
            lowercase,
            strip_accents,
            added,
        })
    }

    /// The vocabulary of a GGUF of `tokenizer.ggml.model = "bert"`, as
    /// llama.cpp's converter spells it: a word-initial piece `x` as `▁x`,
    /// a continuation `##x` as `x`, `[...]` tokens as they are. llama.cpp
    /// lower-cases and strips accents whatever the model (uncased BERTs).
    pub fn from_gguf<D: AsRef<[u8]>>(gguf: &Gguf<D>) -> Result<WordPiece, TokenizerError> {
        let path = || gguf.path().to_path_buf();
        let invalid = |key: &'static str, message: String| TokenizerError::Invalid { path: path(), key, message };
        let model = gguf.get("tokenizer.ggml.model").and_then(|v| v.as_str().map(str::to_string));
        match model.as_deref() {
            Some("bert") => {}
            Some(other) => {
                return Err(invalid(
                    "tokenizer.ggml.model",
                    format!("is \"{other}\"; kiln's encoders read \"bert\" (WordPiece)"),
                ))
            }
            None => return Err(TokenizerError::Missing { path: path(), key: "tokenizer.ggml.model" }),
        }
        let tokens = gguf
            .get("tokenizer.ggml.tokens")
            .and_then(|v| v.as_array().filter(|a| a.elem_type() == ValueType::String))
            .ok_or(TokenizerError::Missing { path: path(), key: "tokenizer.ggml.tokens" })?;
        let mut vocab = HashMap::new();
        for (i, token) in tokens.iter().enumerate() {
            let token = token.as_str().unwrap_or_default();
            let piece = match token.strip_prefix('\u{2581}') {
                Some(word) => word.to_string(),
                None if token.starts_with('[') && token.ends_with(']') => token.to_string(),
                None => format!("##{token}"),
            };
            vocab.entry(piece).or_insert(i as u32);
        }
        let id = |key: &'static str, fallback: &str| -> Result<u32, TokenizerError> {
            match gguf.get(key).and_then(|v| v.as_u64()) {
                Some(id) if (id as usize) < tokens.len() => Ok(id as u32),
                Some(id) => Err(invalid(key, format!("{id} is past the {} tokens", tokens.len()))),
                None => vocab.get(fallback).copied().ok_or(TokenizerError::Missing { path: path(), key }),
            }
        };
        let added = ["[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]"]
            .iter()
            .filter_map(|t| Some((t.to_string(), *vocab.get(*t)?)))
            .collect();
        Ok(WordPiece {
            unk: id("tokenizer.ggml.unknown_token_id", "[UNK]")?,
            cls: id("tokenizer.ggml.bos_token_id", "[CLS]")?,
            sep: id("tokenizer.ggml.eos_token_id", "[SEP]")?,
            pad: id("tokenizer.ggml.padding_token_id", "[PAD]")?,
            vocab,
            prefix: "##".into(),
            max_input_chars_per_word: 100,
            lowercase: true,
            strip_accents: true,
            added,
        })
    }

    /// `[CLS] tokens [SEP]`, the tokens cut so that the whole is at most
    /// `max_length` ids (at least the two specials).
    pub fn encode(&self, text: &str, max_length: usize) -> Vec<u32> {
        let mut ids = vec![self.cls];
        ids.extend(self.tokenize(text).into_iter().take(max_length.saturating_sub(2)));
        ids.push(self.sep);
        ids
    }

    /// The id padding positions take.
    pub fn pad(&self) -> u32 {
        self.pad
    }

    /// The ids of `text`, without `[CLS]` and `[SEP]`.
    pub fn tokenize(&self, text: &str) -> Vec<u32> {
        let mut ids = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            // The leftmost added token, the longest there.
            let next = self
                .added
                .iter()
                .filter_map(|(t, id)| Some((rest.find(t.as_str())?, t.len(), *id)))
                .min_by_key(|&(at, len, _)| (at, std::cmp::Reverse(len)));
            let (plain, added) = match next {
                Some((at, len, id)) => (&rest[..at], Some((len + at, id))),
                None => (rest, None),
            };
            for word in pre_tokenize(&self.normalize(plain)) {
                self.word(&word, &mut ids);
            }
            match added {
                Some((end, id)) => {
                    ids.push(id);
                    rest = &rest[end..];
                }
                None => break,
            }
        }
        ids
    }

    /// BertNormalizer: clean, space CJK, strip accents, lower-case.
    fn normalize(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        for c in text.chars() {
            if c == '\0' || c == '\u{fffd}' || is_control(c) {
                continue;
            }
            if is_whitespace(c) {
                out.push(' ');
            } else if is_chinese_char(c) {
                out.extend([' ', c, ' ']);
            } else {
                out.push(c);
            }
        }
        if self.strip_accents {
            out = out.nfd().filter(|c| !c.is_mark_nonspacing()).collect();
        }
        if self.lowercase {
            out = out.to_lowercase();
        }
        out
    }

    /// WordPiece of one word, appended to `ids`.
    fn word(&self, word: &str, ids: &mut Vec<u32>) {
        if word.chars().count() > self.max_input_chars_per_word {
            ids.push(self.unk);
            return;
        }
        let first = ids.len();
        let mut start = 0;
        let mut piece = String::new();
        while start < word.len() {
            let mut end = word.len();
            let found = loop {
                piece.clear();
                if start > 0 {
                    piece.push_str(&self.prefix);
                }
                piece.push_str(&word[start..end]);
                if let Some(&id) = self.vocab.get(&piece) {
                    break Some(id);
                }
                end = match word[start..end].char_indices().next_back() {
                    Some((i, _)) if i > 0 => start + i,
                    _ => break None,
                };
            };
            match found {
                Some(id) => ids.push(id),
                None => {
                    ids.truncate(first);
                    ids.push(self.unk);
                    return;
                }
            }
            start = end;
        }
    }
}

/// The `[CLS]` and `[SEP]` ids of a `TemplateProcessing` (`$A` between
/// two special tokens) or `BertProcessing` post-processor.
fn template(post: &Json, id: &dyn Fn(&str) -> Result<u32, String>) -> Result<(u32, u32), String> {
    match post["type"].as_str() {
        Some("BertProcessing") => {
            let pick =
                |key: &str| post[key][1].as_u64().map(|i| i as u32).ok_or(format!("post_processor.{key} has no id"));
            Ok((pick("cls")?, pick("sep")?))
        }
        Some("TemplateProcessing") => {
            let single = post["single"].as_array().ok_or("post_processor.single is not a list")?;
            let special = |item: &Json| -> Result<u32, String> {
                let name =
                    item["SpecialToken"]["id"].as_str().ok_or("post_processor.single: kiln reads [CLS] $A [SEP]")?;
                match post["special_tokens"][name]["ids"][0].as_u64() {
                    Some(i) => Ok(i as u32),
                    None => id(name),
                }
            };
            match &single[..] {
                [cls, a, sep] if a.get("Sequence").is_some() => Ok((special(cls)?, special(sep)?)),
                _ => Err("post_processor.single: kiln reads the template [CLS] $A [SEP]".into()),
            }
        }
        other => Err(format!("post_processor {other:?}: kiln reads BertProcessing or TemplateProcessing")),
    }
}

/// `tokenizers`' BERT whitespace: `\t`, `\n`, `\r` and Unicode White_Space.
fn is_whitespace(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r') || c.is_whitespace()
}

/// `tokenizers`' BERT control: general category C, but tab and newlines.
fn is_control(c: char) -> bool {
    !matches!(c, '\t' | '\n' | '\r') && c.is_other()
}

/// `tokenizers`' BERT punctuation: ASCII punctuation and category P.
fn is_punctuation(c: char) -> bool {
    c.is_ascii_punctuation() || c.is_punctuation()
}

/// The CJK Unified Ideographs blocks BERT spaces apart.
fn is_chinese_char(c: char) -> bool {
    matches!(c as u32,
        0x4E00..=0x9FFF | 0x3400..=0x4DBF | 0x20000..=0x2A6DF | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F | 0x2B920..=0x2CEAF | 0xF900..=0xFAFF | 0x2F800..=0x2FA1F)
}

/// BertPreTokenizer: words split at whitespace (dropped) and punctuation
/// (kept, one mark a word).
fn pre_tokenize(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    for c in text.chars() {
        if c.is_whitespace() || is_punctuation(c) {
            if !word.is_empty() {
                words.push(std::mem::take(&mut word));
            }
            if !c.is_whitespace() {
                words.push(c.to_string());
            }
        } else {
            word.push(c);
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> WordPiece {
        let json = serde_json::json!({
            "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                      "max_input_chars_per_word": 100,
                      "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "un": 4, "##aff": 5,
                                "##able": 6, "cafe": 7, ",": 8, "日": 9, "本": 10}},
            "normalizer": {"type": "BertNormalizer", "lowercase": true},
            "pre_tokenizer": {"type": "BertPreTokenizer"},
            "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]},
            "added_tokens": [{"id": 3, "content": "[SEP]"}],
        });
        WordPiece::from_json(&json).unwrap()
    }

    #[test]
    fn greedy_longest_pieces_accents_cjk_and_unknown_words() {
        let t = tiny();
        assert_eq!(t.encode("Unaffable, CAFÉ", 16), [2, 4, 5, 6, 8, 7, 3]);
        assert_eq!(t.tokenize("日本x"), [9, 10, 1], "CJK spaced apart, x unknown");
        assert_eq!(t.tokenize("unaffx"), [1], "a word with an unmatched part is one [UNK]");
        assert_eq!(t.tokenize("cafe[SEP]cafe"), [7, 3, 7], "added tokens cut out verbatim");
        assert_eq!(t.encode("cafe cafe cafe", 4), [2, 7, 7, 3], "truncated to 4 with the specials");
    }

    #[test]
    fn other_models_are_refused_by_name() {
        let json = serde_json::json!({"model": {"type": "BPE"}});
        let err = WordPiece::from_json(&json).unwrap_err();
        assert!(err.contains("BPE") && err.contains("WordPiece"), "{err}");
    }
}
