//! Byte-level BPE (`tokenizer.ggml.model` `gpt2`: GPT-2, SmolLM,
//! StarCoder, Llama 3, Qwen2), as llama.cpp's `llm_tokenizer_bpe_session`
//! runs it: the pre-tokenizer cuts the text into words ([`super::pre`]);
//! each word's UTF-8 bytes are spelled in GPT-2's byte alphabet, one symbol
//! per byte, and adjacent symbols merge in the order of
//! `tokenizer.ggml.merges`.

use super::pre::PreTokenizer;
use super::{merge_pairs, Meta, TokenizerError, Vocab, MERGES, NO_TOKEN};
use crate::weights::gguf::ValueType;
use std::collections::HashMap;

/// Byte-level BPE.
pub(super) struct Bpe {
    pub(super) pre: PreTokenizer,
    /// `(left, right)` → `(rank, merged)`: the merges whose two halves and
    /// union are all tokens, by token id.
    pub(super) merges: HashMap<(u32, u32), (u32, u32)>,
    /// The token of each byte's GPT-2 spelling, or [`NO_TOKEN`].
    byte_tokens: [u32; 256],
}

impl Bpe {
    /// Reads `tokenizer.ggml.merges`, keeping the merges whose two halves
    /// and union are all tokens of `vocab`.
    pub(super) fn from_meta<D: AsRef<[u8]>>(
        meta: &Meta<'_, D>,
        pre: PreTokenizer,
        vocab: &Vocab,
    ) -> Result<Bpe, TokenizerError> {
        let merges = meta
            .required(MERGES, "an ARRAY of STRING", |v| v.as_array().filter(|a| a.elem_type() == ValueType::String))?;
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
        let byte_tokens = gpt2_alphabet().map(|c| vocab.get(c.encode_utf8(&mut [0; 4])).unwrap_or(NO_TOKEN));
        Ok(Bpe { pre, merges: table, byte_tokens })
    }

    /// llama.cpp's `llm_tokenizer_bpe_session::tokenize` on a text without
    /// special tokens.
    pub(super) fn encode(&self, text: &str, out: &mut Vec<u32>) {
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
        let mut ids: Vec<u32> = word.iter().map(|&b| self.byte_tokens[b as usize]).collect();
        // Lowest rank first; the two tokens tell a stale pair.
        let propose = |ids: &Vec<u32>, left: usize, right: usize| {
            let pair = (ids[left], ids[right]);
            self.merges.get(&pair).map(|&(rank, merged)| (-i64::from(rank), (pair, merged)))
        };
        let merge = |ids: &mut Vec<u32>, left: usize, right: usize, (pair, merged): ((u32, u32), u32)| {
            let fresh = (ids[left], ids[right]) == pair;
            if fresh {
                ids[left] = merged;
            }
            fresh
        };
        for i in merge_pairs(&mut ids, word.len(), propose, merge) {
            if ids[i] != NO_TOKEN {
                out.push(ids[i]);
            }
        }
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
pub(super) fn gpt2_byte(c: char) -> Option<u8> {
    match c as u32 {
        v @ 0..=0xFF => Some(v as u8).filter(|&b| gpt2_printable(b)),
        v @ 0x100..=0x143 => Some(GPT2_SHIFTED[(v - 0x100) as usize]),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::tests::{texts, tiny_bpe};

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
}
