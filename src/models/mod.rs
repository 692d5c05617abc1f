//! Model front-ends: each architecture traces its forward pass from a
//! checkpoint's metadata and tensor table, one file per family
//! ([`llama`], [`gemma3`], [`gemma3n`], [`gpt_oss`]; the encoder [`bert`]) holding its
//! equations over shared blocks (`blocks.rs`: a block's tensors, the gated
//! feed-forward, attention, the head; [`moe`], the mixture-of-experts
//! feed-forward) and shared config readers
//! ([`config`]), with one row each in [`registry`]: the names it has in
//! checkpoints, its config readers and its HF tensor names, which every
//! dispatch reads. Below the families: what they stand on
//! ([`checkpoint`]: [`Checkpoint`], [`GgufWeights`] under a
//! [`PackedPolicy`], [`Weight`]), what they provide ([`decoder`]: the
//! [`Decoder`] trait and its config), and above them the graphs traced from
//! a family ([`serving`]). Hugging Face safetensors checkpoints are read
//! through [`hf`]; [`synth`] writes synthetic GGUFs of the families.
//!
//! Adding a family: its file here (config readers from GGUF and HF, its
//! HF tensor-name table, the model implementing [`Decoder`] and its
//! config [`decoder::DecoderConfig`]), its row in [`registry::FAMILIES`],
//! its tests, and its line in the README's table.

pub mod bert;
mod blocks;
mod cache;
pub mod checkpoint;
pub mod config;
pub mod decoder;
mod error;
pub mod gemma3;
pub mod gemma3n;
pub mod gpt_oss;
pub mod hf;
pub mod llama;
pub mod moe;
pub mod registry;
pub mod serving;
pub mod synth;
#[cfg(test)]
pub(crate) mod testing;

pub use cache::{Cache, CacheSpec, KvCache};
pub use checkpoint::{linear_each, streamed_together, Checkpoint, Declared, GgufWeights, PackedPolicy, Weight};
pub use decoder::{Decoder, Keys, Logits, Span};
pub use error::{ModelError, Result};
pub use registry::Family;
pub use serving::{
    cache_types, default_stepped_prefill, entry_points, greedy_pick, prefill, scalar_i32, token_ids, Serving,
};
