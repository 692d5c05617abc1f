//! The families kiln exports, one row each in [`FAMILIES`]: the GGUF
//! `general.architecture`s and HF `model_type`s (with their model classes)
//! it reads, where an HF checkpoint keeps its tensors, and its config
//! readers, which make a decoder's [`Family`] (whose loader traces it) or
//! the encoder's config. Every dispatch on a checkpoint's family, the
//! supported-architectures messages and the README's table read it; adding
//! a family is its file and its row.

use super::bert::{self, EmbedChoice};
use super::checkpoint::Checkpoint;
use super::decoder::{Decoder, DecoderConfig};
use super::hf::HfNames;
use super::{gemma3, gemma3n, gpt_oss, llama, ModelError, Result};
use crate::trace::Tracer;
use crate::weights::gguf::Gguf;
use crate::weights::hf_config::HfConfig;
use std::path::Path;

/// Whether an HF checkpoint stores a tensor of this name.
pub type Stores<'a> = &'a dyn Fn(&str) -> bool;

/// A GGUF over any bytes (a memory map, a buffer): what a row's reader takes.
pub type AnyGguf<'d> = Gguf<dyn AsRef<[u8]> + 'd>;

/// An HF model kind a family reads: a `model_type` and the classes
/// (`architectures[0]`) it may name. A checkpoint that names another class
/// (`LlamaForSequenceClassification`) has another head: it is refused.
#[derive(Debug)]
pub struct HfModel {
    /// `model_type`.
    pub model_type: &'static str,
    /// The classes read; a config without `architectures` is read too.
    pub classes: &'static [&'static str],
    /// A multimodal wrapper, of which kiln exports the text model only.
    pub text_only: bool,
}

/// A family's config readers, and what they make.
#[derive(Debug)]
pub enum Reader {
    /// A decoder: its [`Family`], traced into the serving entry points.
    Decoder {
        /// From GGUF metadata.
        gguf: fn(&AnyGguf<'_>) -> Result<Family>,
        /// From `config.json`.
        hf: fn(&HfConfig) -> Result<Family>,
    },
    /// The encoder: one `embed` function ([`bert::embed`]), `EmbedChoice`
    /// filling in what the checkpoint does not say.
    Encoder {
        /// From GGUF metadata.
        gguf: fn(&AnyGguf<'_>, EmbedChoice) -> Result<bert::Config>,
        /// From `config.json` and the sentence-transformers files of the
        /// checkpoint's directory.
        hf: fn(&HfConfig, &Path, EmbedChoice) -> Result<bert::Config>,
    },
}

/// One family: what it is called in checkpoints, where its HF tensors are,
/// and how its config is read.
#[derive(Debug)]
pub struct Row {
    /// The family's name, as messages and the README's table say it.
    pub name: &'static str,
    /// The `general.architecture`s it reads.
    pub gguf: &'static [&'static str],
    /// The HF models it reads.
    pub hf: &'static [HfModel],
    /// Where an HF checkpoint of this family keeps its tensors (the
    /// GGUF-to-HF name tables and prefixes), from its config and whether
    /// it stores a tensor of a given name.
    pub hf_names: fn(&HfConfig, Stores<'_>) -> HfNames,
    /// Its config readers.
    pub reader: Reader,
}

/// Every family kiln exports, decoders first.
pub const FAMILIES: &[Row] = &[
    Row {
        name: "llama",
        gguf: &["llama", "qwen2", "qwen3"],
        hf: &[
            HfModel { model_type: "llama", classes: &["LlamaForCausalLM"], text_only: false },
            HfModel { model_type: "mistral", classes: &["MistralForCausalLM"], text_only: false },
            HfModel { model_type: "qwen2", classes: &["Qwen2ForCausalLM"], text_only: false },
            HfModel { model_type: "qwen3", classes: &["Qwen3ForCausalLM"], text_only: false },
        ],
        hf_names: |_, _| llama::HF_NAMES,
        reader: Reader::Decoder {
            gguf: |gguf| Ok(Family::new(llama::Config::from_gguf(gguf)?)),
            hf: |hf| Ok(Family::new(llama::Config::from_hf(hf)?)),
        },
    },
    // Qwen3's attention with a mixture-of-experts feed-forward, read by
    // llama's front-end.
    Row {
        name: "qwen3moe",
        gguf: &["qwen3moe"],
        hf: &[HfModel { model_type: "qwen3_moe", classes: &["Qwen3MoeForCausalLM"], text_only: false }],
        hf_names: |_, _| llama::QWEN3MOE_HF_NAMES,
        reader: Reader::Decoder {
            gguf: |gguf| Ok(Family::new(llama::Config::from_gguf(gguf)?)),
            hf: |hf| Ok(Family::new(llama::Config::from_hf(hf)?)),
        },
    },
    // Mixtral: Mistral's attention, every layer's feed-forward a mixture of
    // experts. Its GGUFs are `llama` with expert keys (the llama row).
    Row {
        name: "mixtral",
        gguf: &[],
        hf: &[HfModel { model_type: "mixtral", classes: &["MixtralForCausalLM"], text_only: false }],
        hf_names: |_, has| llama::mixtral_hf_names(has),
        reader: Reader::Decoder {
            gguf: |gguf| Ok(Family::new(llama::Config::from_gguf(gguf)?)),
            hf: |hf| Ok(Family::new(llama::Config::from_hf(hf)?)),
        },
    },
    Row {
        name: "gpt-oss",
        gguf: &["gpt-oss"],
        hf: &[HfModel { model_type: "gpt_oss", classes: &["GptOssForCausalLM"], text_only: false }],
        hf_names: |_, _| gpt_oss::HF_NAMES,
        reader: Reader::Decoder {
            gguf: |gguf| Ok(Family::new(gpt_oss::Config::from_gguf(gguf)?)),
            hf: |hf| Ok(Family::new(gpt_oss::Config::from_hf(hf)?)),
        },
    },
    Row {
        name: "gemma3",
        gguf: &["gemma3"],
        hf: &[
            HfModel { model_type: "gemma3_text", classes: &["Gemma3ForCausalLM"], text_only: false },
            HfModel { model_type: "gemma3", classes: &["Gemma3ForConditionalGeneration"], text_only: true },
        ],
        hf_names: gemma3::hf_names,
        reader: Reader::Decoder {
            gguf: |gguf| Ok(Family::new(gemma3::Config::from_gguf(gguf)?)),
            hf: |hf| Ok(Family::new(gemma3::Config::from_hf(hf)?)),
        },
    },
    Row {
        name: "gemma3n",
        gguf: &["gemma3n"],
        hf: &[
            HfModel { model_type: "gemma3n_text", classes: &["Gemma3nForCausalLM"], text_only: false },
            HfModel { model_type: "gemma3n", classes: &["Gemma3nForConditionalGeneration"], text_only: true },
        ],
        hf_names: gemma3n::hf_names,
        reader: Reader::Decoder {
            gguf: |gguf| Ok(Family::new(gemma3n::Config::from_gguf(gguf)?)),
            hf: |hf| Ok(Family::new(gemma3n::Config::from_hf(hf)?)),
        },
    },
    Row {
        name: "bert",
        gguf: &["bert"],
        hf: &[HfModel { model_type: "bert", classes: &["BertModel", "BertForMaskedLM"], text_only: false }],
        hf_names: bert::hf_names,
        reader: Reader::Encoder {
            gguf: |gguf, choice| bert::Config::from_gguf(gguf, choice),
            hf: bert::Config::from_hf,
        },
    },
];

/// The row that reads `general.architecture = arch`.
pub fn by_gguf_architecture(arch: &str) -> Result<&'static Row> {
    FAMILIES.iter().find(|row| row.gguf.contains(&arch)).ok_or_else(|| ModelError::UnknownArchitecture(arch.into()))
}

/// The row that reads `model_type`, if one does (its HF tensor names,
/// before the class is checked), with that model.
pub fn by_model_type(model_type: &str) -> Option<(&'static Row, &'static HfModel)> {
    FAMILIES.iter().flat_map(|row| row.hf.iter().map(move |m| (row, m))).find(|(_, m)| m.model_type == model_type)
}

/// The row that reads `config`: its `model_type`, and `architectures[0]`
/// (where given) one of that model's classes.
pub fn by_hf(config: &HfConfig) -> Result<&'static Row> {
    let unknown = || ModelError::UnknownModelType {
        model_type: config.model_type.clone(),
        architecture: match config.architectures.first() {
            Some(a) => format!("architectures[0] \"{a}\""),
            None => "no architectures".into(),
        },
    };
    let (row, model) = by_model_type(&config.model_type).ok_or_else(unknown)?;
    // A head other than the one kiln computes (`LlamaForSequenceClassification`) is another model.
    if config.architectures.first().is_some_and(|a| !model.classes.contains(&a.as_str())) {
        return Err(unknown());
    }
    Ok(row)
}

/// The GGUF architectures read, for messages: `llama, qwen2, ...; bert as
/// an encoder`.
pub fn gguf_architectures() -> String {
    let list = |encoder: bool| {
        let rows = FAMILIES.iter().filter(|row| matches!(row.reader, Reader::Encoder { .. }) == encoder);
        rows.flat_map(|row| row.gguf.iter().copied()).collect::<Vec<_>>().join(", ")
    };
    format!("{}; {} as an encoder", list(false), list(true))
}

/// The HF models read, for messages: `llama (LlamaForCausalLM), ...,
/// gemma3 (Gemma3ForConditionalGeneration, text only), ...`.
pub fn hf_models() -> String {
    let model = |row: &Row, m: &HfModel| {
        let mut notes = vec![m.classes.join(" or ")];
        notes.extend(m.text_only.then(|| "text only".to_string()));
        notes.extend(matches!(row.reader, Reader::Encoder { .. }).then(|| "an encoder".to_string()));
        format!("{} ({})", m.model_type, notes.join(", "))
    };
    FAMILIES.iter().flat_map(|row| row.hf.iter().map(move |m| model(row, m))).collect::<Vec<_>>().join(", ")
}

/// The encoder's config when `gguf`'s architecture is an encoder's, `None`
/// when it is a decoder's.
pub fn gguf_encoder<D: AsRef<[u8]>>(gguf: &Gguf<D>, choice: EmbedChoice) -> Result<Option<bert::Config>> {
    let any: &AnyGguf<'_> = gguf;
    match by_gguf_architecture(gguf.get_str("general.architecture")?)?.reader {
        Reader::Encoder { gguf, .. } => Ok(Some(gguf(any, choice)?)),
        Reader::Decoder { .. } => Ok(None),
    }
}

/// The encoder's config when the HF checkpoint in `dir` (`config`, read
/// already) is an encoder, `None` when it is a decoder.
pub fn hf_encoder(config: &HfConfig, dir: &Path, choice: EmbedChoice) -> Result<Option<bert::Config>> {
    match by_hf(config)?.reader {
        Reader::Encoder { hf, .. } => Ok(Some(hf(config, dir, choice)?)),
        Reader::Decoder { .. } => Ok(None),
    }
}

/// A decoder family with its hyper-parameters: what a checkpoint holds.
#[derive(Debug)]
pub struct Family(Box<dyn DecoderConfig>);

impl Family {
    /// A family of `config`'s hyper-parameters.
    pub fn new(config: impl DecoderConfig) -> Family {
        Family(Box::new(config))
    }

    /// From `general.architecture` and the family's metadata keys.
    pub fn from_gguf<D: AsRef<[u8]>>(gguf: &Gguf<D>) -> Result<Family> {
        let row = by_gguf_architecture(gguf.get_str("general.architecture")?)?;
        match row.reader {
            Reader::Decoder { gguf: read, .. } => read(gguf),
            Reader::Encoder { .. } => Err(row.encoder()),
        }
    }

    /// From a Hugging Face `config.json`'s `model_type`, `architectures` and
    /// keys, every one of which is read or refused ([`super::config::HfKeys`]).
    pub fn from_hf(config: &HfConfig) -> Result<Family> {
        let row = by_hf(config)?;
        match row.reader {
            Reader::Decoder { hf, .. } => hf(config),
            Reader::Encoder { .. } => Err(row.encoder()),
        }
    }

    /// The hyper-parameters, if they are of the family `C` (a family's
    /// `Config`).
    pub fn config<C: DecoderConfig>(&self) -> Option<&C> {
        (&*self.0 as &dyn std::any::Any).downcast_ref()
    }

    /// The architecture's name as in `general.architecture` (`model_type`
    /// for HF llama-family checkpoints).
    pub fn name(&self) -> &str {
        self.0.name()
    }

    /// Tensors a checkpoint of this family may hold that the reference
    /// implementation loads but never reads (GGUF names).
    pub fn unread_tensors(&self) -> Vec<String> {
        self.0.unread_tensors()
    }

    /// The widest mixture of experts of its layers, if it has any.
    pub fn experts(&self) -> Option<super::moe::MoeConfig> {
        self.0.experts()
    }

    /// Declares the weights in `t` and returns the model, ready to trace.
    pub fn load<'t>(&self, t: &'t Tracer, weights: &dyn Checkpoint) -> Result<Box<dyn Decoder<'t> + 't>> {
        self.0.load(t, weights)
    }
}

impl Row {
    /// Why an encoder's checkpoint has no decoder [`Family`].
    fn encoder(&self) -> ModelError {
        ModelError::Config(format!("{} is an encoder: it exports as `embed`, not as a decoder", self.name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The README's two lines of what kiln reads are the table's.
    #[test]
    fn readme_lists_the_table() {
        let readme = include_str!("../../README.md");
        for line in [
            format!("- GGUF `general.architecture`: {}\n", gguf_architectures()),
            format!("- HF `model_type` (`architectures[0]`): {}\n", hf_models()),
        ] {
            assert!(readme.contains(&line), "README.md lacks the line\n{line}");
        }
    }

    /// Every name a row reads is read by that row only.
    #[test]
    fn names_are_unique() {
        let gguf: Vec<&str> = FAMILIES.iter().flat_map(|row| row.gguf.iter().copied()).collect();
        let hf: Vec<&str> = FAMILIES.iter().flat_map(|row| row.hf.iter().map(|m| m.model_type)).collect();
        let names: Vec<&str> = FAMILIES.iter().map(|row| row.name).collect();
        for list in [gguf, hf, names] {
            let mut sorted = list.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(sorted.len(), list.len(), "{list:?}");
        }
    }

    /// A `model_type` with another class, or none of the table's, is
    /// refused naming what kiln reads; the encoder is no decoder family.
    #[test]
    fn hf_dispatch() {
        let config = |json: &str| HfConfig::parse(json).unwrap();
        assert_eq!(by_hf(&config(r#"{"model_type": "qwen3"}"#)).unwrap().name, "llama");
        let gemma3 = config(r#"{"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"]}"#);
        assert_eq!(by_hf(&gemma3).unwrap().name, "gemma3");
        let e = by_hf(&config(r#"{"model_type": "bert", "architectures": ["BertForSequenceClassification"]}"#));
        let e = e.unwrap_err().to_string();
        assert!(e.starts_with("config.json: model_type \"bert\" (architectures[0] \"BertForSequenceClassification\") is not supported; kiln exports llama (LlamaForCausalLM), "), "{e}");
        assert!(e.ends_with(", bert (BertModel or BertForMaskedLM, an encoder)"), "{e}");
        let e = Family::from_hf(&config(r#"{"model_type": "bert"}"#)).unwrap_err().to_string();
        assert_eq!(e, "config: bert is an encoder: it exports as `embed`, not as a decoder");
    }

    #[test]
    fn gguf_dispatch() {
        assert_eq!(by_gguf_architecture("qwen2").unwrap().name, "llama");
        assert_eq!(by_gguf_architecture("bert").unwrap().name, "bert");
        let e = by_gguf_architecture("falcon").unwrap_err().to_string();
        assert_eq!(
            e,
            "unknown general.architecture \"falcon\" (supported: llama, qwen2, qwen3, qwen3moe, gpt-oss, gemma3, gemma3n; bert as an encoder)"
        );
    }
}
