//! Hugging Face `config.json`, as written: `model_type`, `architectures`
//! and every other key as JSON. What the keys mean is the model
//! front-ends' business ([`crate::models::config::HfKeys`] reads each one
//! or refuses it); here the file is only parsed, so that an unsupported
//! model is named by its `model_type`, never by a serde message about a
//! key it spells differently.

use super::WeightsError;
use serde_json::{Map, Value};
use std::path::Path;

/// A parsed `config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct HfConfig {
    /// The family: `llama`, `qwen2`, `gemma3_text`, `gemma3`.
    pub model_type: String,
    /// Model classes: `["LlamaForCausalLM"]`; empty if absent.
    pub architectures: Vec<String>,
    /// Every key, as written.
    pub keys: Map<String, Value>,
}

impl HfConfig {
    /// Reads and parses a `config.json`.
    pub fn open(path: &Path) -> Result<HfConfig, WeightsError> {
        let text = std::fs::read_to_string(path).map_err(|error| WeightsError::Io { path: path.into(), error })?;
        Self::parse(&text).map_err(|message| WeightsError::Format { path: path.into(), message })
    }

    /// Parses `config.json` text: a JSON object with a string `model_type`.
    pub fn parse(text: &str) -> Result<HfConfig, String> {
        let keys = match serde_json::from_str(text) {
            Ok(Value::Object(keys)) => keys,
            Ok(_) => return Err("not a config.json: the file is not a JSON object".into()),
            Err(e) => return Err(format!("not a config.json: {e}")),
        };
        let model_type = match keys.get("model_type") {
            Some(Value::String(t)) => t.clone(),
            None => return Err("config.json has no model_type".into()),
            Some(other) => return Err(format!("config.json: model_type is {other}, not a string")),
        };
        let architectures = match keys.get("architectures") {
            None | Some(Value::Null) => vec![],
            Some(Value::Array(names)) => names.iter().map(|n| n.as_str().unwrap_or_default().to_string()).collect(),
            Some(other) => return Err(format!("config.json: architectures is {other}, not a list of class names")),
        };
        Ok(HfConfig { model_type, architectures, keys })
    }

    /// The text model's keys: a multimodal wrapper's `text_config`
    /// (Gemma 3's, Gemma 3n's), else the whole file.
    pub fn text_keys(&self) -> Option<&Map<String, Value>> {
        match self.keys.get("text_config") {
            Some(text) => text.as_object(),
            None => Some(&self.keys),
        }
    }

    /// Whether the output head is the token embedding: the key where the
    /// file has it (a wrapper's own first, then its text config's), else the
    /// family's default (true for Gemma and BERT, false otherwise).
    pub fn tie_word_embeddings(&self) -> bool {
        let read = |keys: &Map<String, Value>| keys.get("tie_word_embeddings").and_then(Value::as_bool);
        let default = matches!(self.model_type.as_str(), "gemma3" | "gemma3_text" | "bert");
        read(&self.keys).or_else(|| self.text_keys().and_then(read)).unwrap_or(default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_model_type_and_keeps_every_key() {
        let c = HfConfig::parse(
            r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152,
                "tie_word_embeddings": true, "torch_dtype": "bfloat16", "rope_scaling": null}"#,
        )
        .unwrap();
        assert_eq!(
            (c.model_type.as_str(), c.architectures.as_slice()),
            ("llama", &["LlamaForCausalLM".to_string()][..])
        );
        assert!(c.tie_word_embeddings());
        assert_eq!(c.keys["torch_dtype"], "bfloat16");
        assert_eq!(c.keys.len(), 6);
    }

    #[test]
    fn tie_defaults_per_family() {
        let tie = |text: &str| HfConfig::parse(text).unwrap().tie_word_embeddings();
        assert!(!tie(r#"{"model_type": "llama"}"#));
        assert!(tie(r#"{"model_type": "gemma3_text"}"#));
        assert!(!tie(r#"{"model_type": "gemma3", "text_config": {"tie_word_embeddings": false}}"#));
        assert!(tie(
            r#"{"model_type": "gemma3", "tie_word_embeddings": true, "text_config": {"tie_word_embeddings": false}}"#
        ));
    }

    #[test]
    fn malformed_files_say_what_is_wrong() {
        assert!(HfConfig::parse(r#"{"vocab_size": 3}"#).unwrap_err().contains("no model_type"));
        assert!(HfConfig::parse("[1]").unwrap_err().contains("not a JSON object"));
        assert!(HfConfig::parse("{").unwrap_err().starts_with("not a config.json"));
        // Gemma 3n's per-layer list parses: its model_type is what gets refused.
        let c = HfConfig::parse(r#"{"model_type": "gemma3n_text", "intermediate_size": [8, 8]}"#).unwrap();
        assert_eq!(c.model_type, "gemma3n_text");
    }

    #[test]
    fn a_wrappers_text_keys_are_its_text_config() {
        let keys = |text: &str| {
            let c = HfConfig::parse(text).unwrap();
            c.text_keys().and_then(|k| k.get("max_position_embeddings")).and_then(Value::as_u64)
        };
        let wrapper = r#"{"max_position_embeddings": 9, "text_config": {"max_position_embeddings": 64}}"#;
        for model_type in ["gemma3", "gemma3n"] {
            let text = format!(r#"{{"model_type": "{model_type}", {}"#, &wrapper[1..]);
            assert_eq!(keys(&text), Some(64), "{model_type}");
        }
        assert_eq!(keys(r#"{"model_type": "llama", "max_position_embeddings": 9}"#), Some(9));
    }
}
