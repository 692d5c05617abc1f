//! Reading a checkpoint's hyper-parameters totally: every key of an HF
//! `config.json` ([`HfKeys`]) or of the family's GGUF metadata
//! ([`GgufKeys`]) is read by the front-end, listed as not changing the
//! forward pass, accepted only at the value kiln computes, or refused. A key
//! nobody asked for is an error at [`HfKeys::finish`] / [`GgufKeys::finish`]
//! (for HF, unless it is null), so that a config kiln does not understand
//! never exports a module that computes something else.
//!
//! Rope parameters are read here too, in transformers 4.x spellings
//! (`rope_theta`, `rope_scaling`) and 5.x ones (`rope_parameters`, flat or
//! per layer type), as `transformers/modeling_rope_utils.py` reads them.

use super::{ModelError, Result};
use crate::trace::nn::RopeScaling;
use crate::weights::gguf::{Gguf, MetadataValue};
use crate::weights::hf_config::HfConfig;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use std::cell::RefCell;
use std::collections::BTreeSet;

/// Keys of any transformers `PreTrainedConfig` (and of 4.x generation
/// settings kept in config.json) that do not change a causal LM's logits.
pub const HF_NO_EFFECT: &[&str] = &[
    "_name_or_path",
    "architectures",
    "model_type",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "use_cache",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "sep_token_id",
    "decoder_start_token_id",
    "initializer_range",
    "attention_dropout",
    "output_hidden_states",
    "output_attentions",
    "return_dict",
    "torchscript",
    "chunk_size_feed_forward",
    "id2label",
    "label2id",
    "num_labels",
    "problem_type",
    "finetuning_task",
    "tokenizer_class",
    "prefix",
    "task_specific_params",
    "pruned_heads",
    "tie_encoder_decoder",
    "cross_attention_hidden_size",
    "use_return_dict",
    // Generation settings that transformers 4 kept in config.json.
    "max_length",
    "min_length",
    "do_sample",
    "early_stopping",
    "num_beams",
    "num_beam_groups",
    "diversity_penalty",
    "temperature",
    "top_k",
    "top_p",
    "typical_p",
    "repetition_penalty",
    "length_penalty",
    "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size",
    "bad_words_ids",
    "num_return_sequences",
    "output_scores",
    "return_dict_in_generate",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "remove_invalid_values",
    "exponential_decay_length_penalty",
    "suppress_tokens",
    "begin_suppress_tokens",
    // transformers.js's settings.
    "transformers.js_config",
];

/// Keys transformers accepts only at this value for a decoder-only causal
/// LM (anything else is another model): the key and the value kiln computes.
pub const HF_FIXED: &[(&str, &str)] =
    &[("is_encoder_decoder", "false"), ("is_decoder", "false"), ("add_cross_attention", "false")];

/// The sizes every decoder family has, under llama.cpp's GGUF key names
/// (`config.json` spells them `num_hidden_layers`, `hidden_size`, ...):
/// what the shared blocks (`blocks.rs`) and the synthetic checkpoints
/// ([`super::synth`]) are shaped by.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dims {
    /// `{arch}.block_count`
    pub block_count: usize,
    /// `{arch}.embedding_length`
    pub embedding_length: usize,
    /// `{arch}.attention.head_count`
    pub head_count: usize,
    /// `{arch}.attention.head_count_kv` (defaults to `head_count`)
    pub head_count_kv: usize,
    /// `{arch}.attention.key_length` (defaults to `embedding_length / head_count`)
    pub head_dim: usize,
    /// `{arch}.vocab_size`, else the rows of `token_embd.weight`
    pub vocab_size: usize,
    /// `{arch}.attention.layer_norm_rms_epsilon`
    pub rms_norm_eps: f64,
}

/// How a value is shown in messages: JSON, strings quoted.
fn show(value: &Value) -> String {
    value.to_string()
}

/// The keys of one `config.json` object (the whole file, or its
/// `text_config`), each marked as it is read.
pub struct HfKeys<'a> {
    /// Where the keys are, for messages: `config.json`, `config.json text_config`.
    pub file: String,
    /// The model_type, for messages.
    pub model_type: String,
    map: &'a Map<String, Value>,
    seen: RefCell<BTreeSet<String>>,
}

impl<'a> HfKeys<'a> {
    /// The keys of `map`, read for `model_type`.
    pub fn new(file: impl Into<String>, model_type: &str, map: &'a Map<String, Value>) -> Self {
        HfKeys { file: file.into(), model_type: model_type.to_string(), map, seen: RefCell::new(BTreeSet::new()) }
    }

    /// An error about `key`, whose value is `value`.
    pub fn error(&self, key: &str, value: &Value, message: impl Into<String>) -> ModelError {
        ModelError::ConfigKey {
            file: self.file.clone(),
            key: key.to_string(),
            value: show(value),
            message: message.into(),
        }
    }

    /// Whether `key` is in the file, null or not (marked as read).
    pub fn has(&self, key: &str) -> bool {
        self.seen.borrow_mut().insert(key.to_string());
        self.map.contains_key(key)
    }

    /// The raw value of `key`, marked as read; `None` if absent or null.
    pub fn raw(&self, key: &str) -> Option<&'a Value> {
        self.seen.borrow_mut().insert(key.to_string());
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// `key` as a `T`, `None` if absent or null; a value of another type is
    /// an error naming the key and the value.
    pub fn get<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>> {
        match self.raw(key) {
            None => Ok(None),
            Some(v) => serde_json::from_value(v.clone()).map(Some).map_err(|e| self.error(key, v, e.to_string())),
        }
    }

    /// `key`, which must be present.
    pub fn required<T: DeserializeOwned>(&self, key: &str) -> Result<T> {
        self.get(key)?.ok_or_else(|| ModelError::MissingConfigKey { file: self.file.clone(), key: key.to_string() })
    }

    /// `key`, or `default` when absent or null.
    pub fn or<T: DeserializeOwned>(&self, key: &str, default: T) -> Result<T> {
        Ok(self.get(key)?.unwrap_or(default))
    }

    /// A positive integer.
    pub fn count(&self, key: &str) -> Result<usize> {
        let n: usize = self.required(key)?;
        self.positive(key, n)
    }

    /// A positive integer, `default` when absent or null (the model class's
    /// default: shipped config.json files leave those out).
    pub fn count_or(&self, key: &str, default: usize) -> Result<usize> {
        self.positive(key, self.or(key, default)?)
    }

    /// `n` (the value of `key`) if it is not zero.
    pub fn positive(&self, key: &str, n: usize) -> Result<usize> {
        match n {
            0 => Err(self.error(key, &Value::from(0), "must be positive")),
            n => Ok(n),
        }
    }

    /// A finite positive float (an epsilon, a scale).
    pub fn positive_f64(&self, key: &str, default: Option<f64>) -> Result<f64> {
        let x: f64 = match default {
            Some(d) => self.or(key, d)?,
            None => self.required(key)?,
        };
        if !(x > 0.0 && x.is_finite()) {
            return Err(self.error(key, &serde_json::json!(x), "must be positive and finite"));
        }
        Ok(x)
    }

    /// Marks `keys` as read: they do not change the forward pass.
    pub fn ignore(&self, keys: &[&str]) {
        self.seen.borrow_mut().extend(keys.iter().map(|k| k.to_string()));
    }

    /// Accepts `key` only absent, null or equal to `supported` (JSON text);
    /// `what` says why another value is refused.
    pub fn fixed(&self, key: &str, supported: &str, what: &str) -> Result<()> {
        let want: Value = serde_json::from_str(supported).expect("a JSON literal");
        match self.raw(key) {
            Some(v) if *v != want => Err(self.error(key, v, format!("kiln supports only {supported} ({what})"))),
            _ => Ok(()),
        }
    }

    /// Every key not read yet is an error unless it is null: kiln cannot
    /// know what it would change.
    pub fn finish(&self) -> Result<()> {
        self.ignore(HF_NO_EFFECT);
        for (key, supported) in HF_FIXED {
            self.fixed(key, supported, "a decoder-only causal LM")?;
        }
        let seen = self.seen.borrow();
        match self.map.iter().find(|(k, v)| !seen.contains(*k) && !v.is_null()) {
            Some((key, value)) => Err(self.error(
                key,
                value,
                format!(
                    "kiln does not know this key for model_type {}, so cannot tell whether it changes the model; \
                     remove it from config.json if transformers ignores it too",
                    self.model_type
                ),
            )),
            None => Ok(()),
        }
    }
}

/// The `{arch}.*` keys of a GGUF file, each marked as it is read; other
/// keys (`general.*`, `tokenizer.*`) are not the model's hyper-parameters.
pub struct GgufKeys<'g, D: AsRef<[u8]> + ?Sized> {
    /// The file.
    pub gguf: &'g Gguf<D>,
    /// `general.architecture`: the prefix of the keys read.
    pub arch: String,
    seen: RefCell<BTreeSet<String>>,
}

impl<'g, D: AsRef<[u8]> + ?Sized> GgufKeys<'g, D> {
    /// The keys of `gguf`'s architecture.
    pub fn new(gguf: &'g Gguf<D>) -> Result<Self> {
        let arch = gguf.get_str("general.architecture")?.to_string();
        Ok(GgufKeys { gguf, arch, seen: RefCell::new(BTreeSet::new()) })
    }

    /// The keys of `gguf`, which must be of architecture `arch`: its
    /// context length does not change the logits, and mixture-of-experts
    /// keys are refused.
    pub fn of_arch(gguf: &'g Gguf<D>, arch: &str) -> Result<Self> {
        let keys = GgufKeys::new(gguf)?;
        if keys.arch != arch {
            return Err(ModelError::UnknownArchitecture(keys.arch.clone()));
        }
        keys.ignore(&["context_length"]);
        refuse_experts(&keys)?;
        Ok(keys)
    }

    /// `{arch}.{name}`.
    pub fn key(&self, name: &str) -> String {
        format!("{}.{name}", self.arch)
    }

    /// An error about `{arch}.{name}`, whose value is `value`.
    pub fn error(&self, name: &str, value: impl std::fmt::Display, message: impl Into<String>) -> ModelError {
        ModelError::ConfigKey {
            file: "GGUF metadata".into(),
            key: self.key(name),
            value: value.to_string(),
            message: message.into(),
        }
    }

    /// The value of `{arch}.{name}`, marked as read.
    pub fn get(&self, name: &str) -> Option<MetadataValue<'g>> {
        let key = self.key(name);
        let value = self.gguf.get(&key);
        self.seen.borrow_mut().insert(key);
        value
    }

    /// An integer, which must be present.
    pub fn int(&self, name: &str) -> Result<usize> {
        self.get(name);
        Ok(self.gguf.get_u64(&self.key(name))? as usize)
    }

    /// A positive integer, which must be present.
    pub fn count(&self, name: &str) -> Result<usize> {
        match self.int(name)? {
            0 => Err(self.error(name, 0, "must be positive")),
            n => Ok(n),
        }
    }

    /// An integer, or `default` when absent.
    pub fn int_or(&self, name: &str, default: usize) -> Result<usize> {
        match self.get(name) {
            Some(_) => self.int(name),
            None => Ok(default),
        }
    }

    /// A number, if present.
    pub fn float(&self, name: &str) -> Result<Option<f64>> {
        match self.get(name) {
            Some(_) => Ok(Some(self.gguf.get_f64(&self.key(name))?)),
            None => Ok(None),
        }
    }

    /// A finite positive number; `default` when absent (required if `None`).
    pub fn positive_f64(&self, name: &str, default: Option<f64>) -> Result<f64> {
        let x = match (self.float(name)?, default) {
            (Some(x), _) | (None, Some(x)) => x,
            (None, None) => {
                return Err(ModelError::MissingConfigKey { file: "GGUF metadata".into(), key: self.key(name) })
            }
        };
        if !(x > 0.0 && x.is_finite()) {
            return Err(self.error(name, x, "must be positive and finite"));
        }
        Ok(x)
    }

    /// A string, if present.
    pub fn str(&self, name: &str) -> Result<Option<&'g str>> {
        match self.get(name) {
            Some(_) => Ok(Some(self.gguf.get_str(&self.key(name))?)),
            None => Ok(None),
        }
    }

    /// Marks `names` as read: they do not change the forward pass.
    pub fn ignore(&self, names: &[&str]) {
        self.seen.borrow_mut().extend(names.iter().map(|n| self.key(n)));
    }

    /// Accepts the number `{arch}.{name}` only absent or equal to
    /// `supported`; `what` says what another value would need.
    pub fn fixed(&self, name: &str, supported: f64, what: &str) -> Result<()> {
        match self.float(name)? {
            Some(x) if x != supported => Err(self.error(name, x, format!("kiln supports only {supported} ({what})"))),
            _ => Ok(()),
        }
    }

    /// Every `{arch}.*` key not read yet is an error: kiln cannot know what
    /// it would change.
    pub fn finish(&self) -> Result<()> {
        let seen = self.seen.borrow();
        let prefix = format!("{}.", self.arch);
        match self.gguf.metadata().find(|(k, _)| k.starts_with(&prefix) && !seen.contains(*k)) {
            Some((key, value)) => Err(ModelError::ConfigKey {
                file: "GGUF metadata".into(),
                key: key.to_string(),
                value: show_gguf(&value),
                message: format!(
                    "kiln does not know this key for architecture {}, so cannot tell whether it changes the model",
                    self.arch
                ),
            }),
            None => Ok(()),
        }
    }
}

/// A GGUF value for messages.
fn show_gguf(value: &MetadataValue<'_>) -> String {
    match value {
        MetadataValue::String(s) => format!("{s:?}"),
        MetadataValue::Array(a) => format!("[{} values]", a.len()),
        v => v.as_f64().map_or_else(|| format!("{v:?}"), |x| x.to_string()),
    }
}

/// Rope settings of one kind of layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeConfig {
    /// The base frequency.
    pub theta: f64,
    /// The frequency scaling.
    pub scaling: RopeScaling,
}

/// The keys each rope type may have besides `rope_type`/`type`, `rope_theta`
/// and `partial_rotary_factor` (transformers' `_validate_*_rope_parameters`).
const ROPE_KEYS: &[(&str, &[&str])] = &[
    ("default", &[]),
    ("linear", &["factor"]),
    ("llama3", &["factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"]),
    (
        "yarn",
        &[
            "factor",
            "original_max_position_embeddings",
            "attention_factor",
            "beta_fast",
            "beta_slow",
            "mscale",
            "mscale_all_dim",
            "truncate",
        ],
    ),
];

/// The rope types kiln computes, for messages.
pub const ROPE_TYPES: &str = "default, linear, llama3, yarn";

/// Where llama3 and yarn take the original context length from when
/// transformers' `standardize_rope_params` fills it in.
#[derive(Clone, Copy, Debug)]
pub struct OriginalContext {
    /// Top-level `original_max_position_embeddings` (Phi-3 style): wins
    /// over the dict's, for a flat `rope_parameters`.
    pub top_level: Option<usize>,
    /// `max_position_embeddings`: when neither says.
    pub max_position_embeddings: Option<usize>,
}

/// One rope parameter dict (`rope_parameters`, one of its per-layer-type
/// entries, or 4.x `rope_scaling`) as transformers 5.24 reads it:
/// `rope_theta` from the dict, else `theta` (top-level `rope_theta` or the
/// family's default); `original_max_position_embeddings` as `original` says.
pub fn rope_from_hf(
    keys: &HfKeys<'_>,
    path: &str,
    params: Option<&Value>,
    theta: f64,
    original: OriginalContext,
) -> Result<RopeConfig> {
    let empty = Map::new();
    let dict = match params {
        None => &empty,
        Some(Value::Object(dict)) => dict,
        Some(other) => return Err(keys.error(path, other, "must be an object")),
    };
    let at = |key: &str| format!("{path}.{key}");
    let kind = match dict.get("rope_type").or_else(|| dict.get("type")) {
        None => "default",
        Some(Value::String(kind)) => kind.as_str(),
        Some(other) => return Err(keys.error(&at("rope_type"), other, "must be a string")),
    };
    let Some((_, allowed)) = ROPE_KEYS.iter().find(|(k, _)| *k == kind) else {
        return Err(keys.error(
            &at("rope_type"),
            &Value::from(kind),
            format!("kiln implements the rope types {ROPE_TYPES}"),
        ));
    };
    for (key, value) in dict {
        let known = ["rope_type", "type", "rope_theta", "partial_rotary_factor"].contains(&key.as_str());
        if !known && !allowed.contains(&key.as_str()) && !value.is_null() {
            return Err(keys.error(&at(key), value, format!("not a parameter of rope_type {kind}")));
        }
    }
    let number = |key: &str| -> Result<Option<f64>> {
        match dict.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() => Ok(Some(x)),
                _ => Err(keys.error(&at(key), v, "must be a finite number")),
            },
        }
    };
    let positive = |key: &str| -> Result<f64> {
        match number(key)? {
            Some(x) if x > 0.0 => Ok(x),
            Some(x) => Err(keys.error(&at(key), &serde_json::json!(x), "must be positive")),
            None => Err(ModelError::MissingConfigKey { file: keys.file.clone(), key: at(key) }),
        }
    };
    if let Some(f) = number("partial_rotary_factor")?.filter(|&f| f != 1.0) {
        return Err(keys.error(
            &at("partial_rotary_factor"),
            &serde_json::json!(f),
            "kiln rotates whole heads only (1.0)",
        ));
    }
    let theta = number("rope_theta")?.unwrap_or(theta);
    if theta <= 1.0 {
        return Err(keys.error(&at("rope_theta"), &serde_json::json!(theta), "must be greater than 1"));
    }
    let original = || -> Result<usize> {
        let from_dict = number("original_max_position_embeddings")?;
        let value = match (original.top_level, from_dict, original.max_position_embeddings) {
            (Some(n), _, _) => Some(n as f64),
            (None, Some(x), _) => Some(x),
            (None, None, n) => n.map(|n| n as f64),
        };
        match value {
            Some(x) if x >= 1.0 && x.fract() == 0.0 => Ok(x as usize),
            Some(x) => Err(keys.error(
                &at("original_max_position_embeddings"),
                &serde_json::json!(x),
                "must be a positive integer",
            )),
            None => Err(ModelError::MissingConfigKey {
                file: keys.file.clone(),
                key: at("original_max_position_embeddings"),
            }),
        }
    };
    let scaling = match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: positive("factor")? },
        "llama3" => {
            let (low, high) = (positive("low_freq_factor")?, positive("high_freq_factor")?);
            if high <= low {
                return Err(keys.error(
                    &at("high_freq_factor"),
                    &serde_json::json!(high),
                    format!("must exceed low_freq_factor {low}"),
                ));
            }
            RopeScaling::Llama3 {
                factor: positive("factor")?,
                low_freq_factor: low,
                high_freq_factor: high,
                original_max_position_embeddings: original()?,
            }
        }
        "yarn" => {
            let factor = positive("factor")?;
            // transformers' get_mscale: 0.1 · mscale · ln(factor) + 1 for factor > 1.
            let mscale = |scale: f64| if factor <= 1.0 { 1.0 } else { 0.1 * scale * factor.ln() + 1.0 };
            let attention_factor = match (number("attention_factor")?, number("mscale")?, number("mscale_all_dim")?) {
                (Some(a), _, _) => a,
                (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => mscale(m) / mscale(all),
                _ => mscale(1.0),
            };
            let truncate = match dict.get("truncate") {
                None | Some(Value::Null) => true,
                Some(Value::Bool(t)) => *t,
                Some(other) => return Err(keys.error(&at("truncate"), other, "must be a boolean")),
            };
            // `or`: transformers treats 0 as unset.
            let beta =
                |key: &str, default: f64| -> Result<f64> { Ok(number(key)?.filter(|&b| b != 0.0).unwrap_or(default)) };
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: original()?,
                beta_fast: beta("beta_fast", 32.0)?,
                beta_slow: beta("beta_slow", 1.0)?,
                truncate,
                attention_factor,
            }
        }
        _ => unreachable!("ROPE_KEYS lists the rope types"),
    };
    Ok(RopeConfig { theta, scaling })
}

/// The rope of a model with one kind of layer, from `rope_parameters` (5.x)
/// or `rope_theta` + `rope_scaling` (4.x), as `convert_rope_params_to_dict`
/// merges them. `default_theta` is the family's.
pub fn rope_of(keys: &HfKeys<'_>, default_theta: f64) -> Result<RopeConfig> {
    let (path, params) = match (keys.raw("rope_scaling"), keys.raw("rope_parameters")) {
        (Some(scaling), _) => ("rope_scaling", Some(scaling)),
        (None, params) => ("rope_parameters", params),
    };
    let theta = keys.or("rope_theta", default_theta)?;
    let original = OriginalContext {
        top_level: keys.get("original_max_position_embeddings")?,
        max_position_embeddings: keys.get("max_position_embeddings")?,
    };
    partial_rotary_factor(keys)?;
    rope_from_hf(keys, path, params, theta, original)
}

/// Top-level `partial_rotary_factor`: 1.0 only.
pub fn partial_rotary_factor(keys: &HfKeys<'_>) -> Result<()> {
    match keys.get::<f64>("partial_rotary_factor")? {
        Some(f) if f != 1.0 => {
            Err(keys.error("partial_rotary_factor", &serde_json::json!(f), "kiln rotates whole heads only (1.0)"))
        }
        _ => Ok(()),
    }
}

/// GGUF `{arch}.rope.scaling.*` as a [`RopeScaling`]: none, linear or yarn,
/// as llama.cpp reads them (`llama_model::load_hparams`).
pub fn rope_from_gguf<D: AsRef<[u8]> + ?Sized>(keys: &GgufKeys<'_, D>) -> Result<RopeScaling> {
    keys.ignore(&["rope.scaling.finetuned"]);
    let kind = keys.str("rope.scaling.type")?;
    // llama.cpp: rope.scaling.factor, else the older rope.scale_linear; 0 means none.
    let factor = match keys.float("rope.scaling.factor")?.or(keys.float("rope.scale_linear")?) {
        Some(f) if f != 0.0 && f != 1.0 => Some(f),
        _ => None,
    };
    let original = keys.int_or("rope.scaling.original_context_length", 0)?;
    keys.fixed("rope.scaling.attn_factor", 1.0, "llama.cpp's attention factor on top of yarn's")?;
    for (name, default) in [("rope.scaling.yarn_log_multiplier", 0.0), ("rope.scaling.yarn_ext_factor", 1.0)] {
        keys.fixed(name, default, "only HF's yarn")?;
    }
    let positive = |name: &str, x: f64| match x > 0.0 && x.is_finite() {
        true => Ok(x),
        false => Err(keys.error(name, x, "must be positive and finite")),
    };
    Ok(match (kind.unwrap_or("linear"), factor) {
        ("none", _) | ("linear", None) => RopeScaling::None,
        ("linear", Some(f)) => RopeScaling::Linear { factor: positive("rope.scaling.factor", f)? },
        ("yarn", f) => {
            let factor = positive("rope.scaling.factor", f.unwrap_or(1.0))?;
            if original == 0 {
                return Err(keys.error("rope.scaling.original_context_length", 0, "yarn needs the original context"));
            }
            let beta = |name: &str, default: f64| -> Result<f64> {
                Ok(keys.float(name)?.filter(|&b| b != 0.0).unwrap_or(default))
            };
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: original,
                beta_fast: beta("rope.scaling.yarn_beta_fast", 32.0)?,
                beta_slow: beta("rope.scaling.yarn_beta_slow", 1.0)?,
                truncate: true,
                attention_factor: if factor <= 1.0 { 1.0 } else { 0.1 * factor.ln() + 1.0 },
            }
        }
        (other, _) => {
            return Err(keys.error("rope.scaling.type", format!("{other:?}"), "kiln implements none, linear and yarn"))
        }
    })
}

/// `{arch}.vocab_size`, else the rows of `token_embd.weight` (llama.cpp's
/// converters often leave the key out).
pub fn vocab_size<D: AsRef<[u8]> + ?Sized>(keys: &GgufKeys<'_, D>) -> Result<usize> {
    if keys.get("vocab_size").is_some() {
        return keys.count("vocab_size");
    }
    let embd =
        keys.gguf.tensor("token_embd.weight").ok_or_else(|| ModelError::MissingTensor("token_embd.weight".into()))?;
    Ok(embd.shape()[0])
}

/// `{arch}.{name}`, which defaults to `head_dim` and must equal it: kiln
/// implements no other layout; `refusal` says what it would take.
pub fn head_dim_only<D: AsRef<[u8]> + ?Sized>(
    keys: &GgufKeys<'_, D>,
    name: &str,
    head_dim: usize,
    refusal: &str,
) -> Result<()> {
    let n = keys.int_or(name, head_dim)?;
    if n != head_dim {
        return Err(keys.error(name, n, refusal));
    }
    Ok(())
}

/// `{arch}.rope.dimension_count`, which must be the whole head: kiln has no
/// partial rotary embeddings.
pub fn full_rotary<D: AsRef<[u8]> + ?Sized>(keys: &GgufKeys<'_, D>, head_dim: usize) -> Result<()> {
    let refusal = format!("partial rotary embeddings are not supported (kiln rotates the whole head of {head_dim})");
    head_dim_only(keys, "rope.dimension_count", head_dim, &refusal)
}

/// The head layout every family needs, from either source: kv heads that
/// divide the query heads, and an even head for the rotary pairs.
/// `head_dim_key` is the family's GGUF key for the head width; `error(key,
/// value, message)` names a GGUF key in the source's own spelling.
pub fn check_heads(dims: &Dims, head_dim_key: &str, error: &impl Fn(&str, usize, String) -> ModelError) -> Result<()> {
    let Dims { head_count, head_count_kv, head_dim, .. } = *dims;
    if head_count_kv == 0 || !head_count.is_multiple_of(head_count_kv) {
        return Err(error(
            "attention.head_count_kv",
            head_count_kv,
            format!("must divide the {head_count} query heads"),
        ));
    }
    if !head_dim.is_multiple_of(2) {
        return Err(error(head_dim_key, head_dim, "rotary embeddings need an even head".into()));
    }
    Ok(())
}

/// The config.json name of a GGUF key that a family's `Config::check` names.
pub fn hf_name(gguf_key: &str) -> &str {
    match gguf_key {
        "attention.head_count_kv" => "num_key_value_heads",
        "rope.dimension_count" | "attention.key_length" => "head_dim",
        other => other,
    }
}

/// The GGUF keys of mixture-of-experts models: refused while kiln has no MoE.
pub fn refuse_experts<D: AsRef<[u8]> + ?Sized>(keys: &GgufKeys<'_, D>) -> Result<()> {
    for name in ["expert_count", "expert_used_count", "expert_shared_count"] {
        let n = keys.int_or(name, 0)?;
        if n > 0 {
            return Err(keys.error(name, n, "mixture-of-experts models are not supported yet (dense only)"));
        }
    }
    Ok(())
}

/// How many experts a mixture-of-experts layer has and how many each token
/// goes to, from GGUF's `expert_count` and `expert_used_count`.
pub fn expert_counts_gguf<D: AsRef<[u8]> + ?Sized>(keys: &GgufKeys<'_, D>) -> Result<(usize, usize)> {
    let experts = keys.count("expert_count")?;
    let used = keys.count("expert_used_count")?;
    if used > experts {
        return Err(keys.error("expert_used_count", used, format!("is more than expert_count {experts}")));
    }
    Ok((experts, used))
}

/// [`expert_counts_gguf`] from `config.json`: transformers 5 writes
/// `num_local_experts`, Qwen's checkpoints `num_experts`.
pub fn expert_counts_hf(keys: &HfKeys<'_>) -> Result<(usize, usize)> {
    let experts = match keys.has("num_local_experts") {
        true => keys.count("num_local_experts")?,
        false => keys.count("num_experts")?,
    };
    let used = keys.count("num_experts_per_tok")?;
    if used > experts {
        return Err(keys.error("num_experts_per_tok", &used.into(), format!("is more than the {experts} experts")));
    }
    Ok((experts, used))
}

/// Every layer slides but each `every`-th, which attends globally (Gemma's
/// default layer pattern: every 6th in Gemma 3, every 5th in Gemma 3n).
pub fn every_nth_global(blocks: usize, every: usize) -> Vec<bool> {
    (0..blocks).map(|i| !(i + 1).is_multiple_of(every)).collect()
}

/// `{arch}.{name}` as one value per block: an array of `blocks` elements,
/// or one value (not an array) for every block, each read by `read`;
/// `None` when absent. `what` names the element for messages.
pub fn per_block<D: AsRef<[u8]> + ?Sized, T: Clone>(
    keys: &GgufKeys<'_, D>,
    name: &str,
    blocks: usize,
    what: &str,
    read: impl Fn(&MetadataValue<'_>) -> Option<T>,
) -> Result<Option<Vec<T>>> {
    let Some(value) = keys.get(name) else { return Ok(None) };
    let values: Option<Vec<T>> = match value.as_array() {
        Some(a) if a.len() == blocks => a.iter().map(|v| read(&v)).collect(),
        Some(_) => None,
        None => read(&value).map(|v| vec![v; blocks]),
    };
    values.map(Some).ok_or_else(|| {
        keys.error(name, show_gguf(&value), format!("must be {blocks} {what}, one per block, or one for all"))
    })
}

/// Which layers slide, from `{arch}.attention.sliding_window_pattern`: one
/// bool per layer (newer llama.cpp converters), or the period of the global
/// layers; absent, every `default_every`-th layer is global.
pub fn sliding_pattern<D: AsRef<[u8]> + ?Sized>(
    keys: &GgufKeys<'_, D>,
    blocks: usize,
    default_every: usize,
) -> Result<Vec<bool>> {
    const KEY: &str = "attention.sliding_window_pattern";
    match keys.get(KEY).map(|v| v.as_array().is_some()) {
        None => Ok(every_nth_global(blocks, default_every)),
        Some(true) => {
            Ok(per_block(keys, KEY, blocks, "booleans", |v: &MetadataValue<'_>| v.as_bool())?.expect("present"))
        }
        Some(false) => Ok(every_nth_global(blocks, keys.count(KEY)?)),
    }
}

/// The keys of a text model's `config.json`: the file itself, or, for the
/// multimodal `wrapper` model type, its `text_config` (then the wrapper's
/// own keys come second, for the caller to read and finish).
pub fn text_config<'a>(hf: &'a HfConfig, text: &str, wrapper: &str) -> Result<(HfKeys<'a>, Option<HfKeys<'a>>)> {
    if hf.model_type == text {
        return Ok((HfKeys::new("config.json", text, &hf.keys), None));
    }
    if hf.model_type != wrapper {
        return Err(ModelError::UnknownModelType { model_type: hf.model_type.clone(), architecture: String::new() });
    }
    let outer = HfKeys::new("config.json", wrapper, &hf.keys);
    let inner = match outer.raw("text_config") {
        Some(Value::Object(inner)) => inner,
        Some(other) => return Err(outer.error("text_config", other, "must be an object")),
        None => return Err(ModelError::MissingConfigKey { file: "config.json".into(), key: "text_config".into() }),
    };
    let keys = HfKeys::new("config.json text_config", text, inner);
    keys.fixed("model_type", &format!("\"{text}\""), "the wrapper's text model")?;
    Ok((keys, Some(outer)))
}

/// HF `layer_types` (transformers 5.x and Gemma 3n's 4.x configs): true
/// where a layer is `sliding_attention`; `None` when absent.
pub fn layer_types(keys: &HfKeys<'_>, blocks: usize) -> Result<Option<Vec<bool>>> {
    let Some(types) = keys.get::<Vec<String>>("layer_types")? else { return Ok(None) };
    if types.len() != blocks {
        return Err(keys.error(
            "layer_types",
            &serde_json::json!(types),
            format!("must name {blocks} layers, one per num_hidden_layers"),
        ));
    }
    types
        .iter()
        .map(|t| match t.as_str() {
            "sliding_attention" => Ok(true),
            "full_attention" => Ok(false),
            _ => Err(keys.error("layer_types", &serde_json::json!(t), "sliding_attention or full_attention")),
        })
        .collect::<Result<Vec<bool>>>()
        .map(Some)
}

/// The global and local layers' rope of a model with both (Gemma 3, Gemma
/// 3n), as their `convert_rope_params_to_dict` reads it:
/// `rope_parameters.{full_attention, sliding_attention}` (5.x), or
/// `rope_theta` (default `global_theta`) + `rope_scaling` for the global
/// layers and `rope_local_base_freq` (default `local_theta`) for the local
/// ones (4.x).
pub fn layer_type_ropes(keys: &HfKeys<'_>, global_theta: f64, local_theta: f64) -> Result<(RopeConfig, RopeConfig)> {
    partial_rotary_factor(keys)?;
    let params = match keys.raw("rope_parameters") {
        None => Map::new(),
        Some(Value::Object(p)) => p.clone(),
        Some(other) => return Err(keys.error("rope_parameters", other, "must be an object")),
    };
    if let Some(key) = params.keys().find(|k| !["full_attention", "sliding_attention"].contains(&k.as_str())) {
        return Err(keys.error(
            &format!("rope_parameters.{key}"),
            &params[key],
            "rope_parameters has one entry per layer type: full_attention and sliding_attention",
        ));
    }
    // 4.x rope_scaling updates the global layers' entry.
    let mut full = params.get("full_attention").cloned().unwrap_or(serde_json::json!({}));
    if let (Some(scaling), Some(full)) = (keys.raw("rope_scaling"), full.as_object_mut()) {
        match scaling.as_object() {
            Some(s) => full.extend(s.clone()),
            None => return Err(keys.error("rope_scaling", scaling, "must be an object")),
        }
    }
    let original = OriginalContext { top_level: None, max_position_embeddings: keys.get("max_position_embeddings")? };
    let global_theta = keys.or("rope_theta", global_theta)?;
    let local_theta = keys.or("rope_local_base_freq", local_theta)?;
    let global = rope_from_hf(keys, "rope_parameters.full_attention", Some(&full), global_theta, original)?;
    let local = rope_from_hf(
        keys,
        "rope_parameters.sliding_attention",
        params.get("sliding_attention"),
        local_theta,
        original,
    )?;
    Ok((global, local))
}
