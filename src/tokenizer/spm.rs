//! SentencePiece BPE (`tokenizer.ggml.model` `llama`: Llama 2, Gemma), as
//! llama.cpp's `llm_tokenizer_spm_session` runs it: spaces become `▁`, then
//! the adjacent pair that forms the token with the highest
//! `tokenizer.ggml.scores` merges first, over and over; a character left
//! without a token falls back to its `<0xNN>` byte tokens.

use super::{merge_pairs, Fragment, Meta, TokenizerError, Vocab, ADD_SPACE_PREFIX, NO_TOKEN, SCORES};

/// SentencePiece BPE.
pub(super) struct Spm {
    scores: Vec<f32>,
    /// Put `▁` before text that starts the input or follows a special token.
    pub(super) add_space_prefix: bool,
    /// `<0xNN>` for each byte (llama.cpp's `byte_to_token`), or [`NO_TOKEN`].
    byte_tokens: [u32; 256],
}

impl Spm {
    /// Reads `tokenizer.ggml.scores` (one per token of the `n`) and
    /// `tokenizer.ggml.add_space_prefix`, and finds each byte's token in
    /// `vocab`.
    pub(super) fn from_meta<D: AsRef<[u8]>>(
        meta: &Meta<'_, D>,
        n: usize,
        vocab: &Vocab,
    ) -> Result<Spm, TokenizerError> {
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
        Ok(Spm { scores, add_space_prefix, byte_tokens })
    }

    /// The ids of `fragments` of `text`, each text escaped (spaces as `▁`)
    /// and encoded on its own.
    pub(super) fn encode(
        &self,
        vocab: &Vocab,
        unk: Option<u32>,
        text: &str,
        fragments: &[Fragment],
        out: &mut Vec<u32>,
    ) {
        // llama.cpp: the space prefix goes before the first text and
        // before each text that follows a special token.
        let mut after_special = true;
        let mut escaped = String::new();
        for f in fragments {
            match f {
                Fragment::Text(r) => {
                    escaped.clear();
                    if self.add_space_prefix && after_special {
                        escaped.push('▁');
                    }
                    for c in text[r.clone()].chars() {
                        escaped.push(if c == ' ' { '▁' } else { c });
                    }
                    self.encode_text(vocab, unk, &escaped, out);
                    after_special = false;
                }
                Fragment::Token(id) => {
                    out.push(*id);
                    after_special = true;
                }
            }
        }
    }

    /// llama.cpp's `llm_tokenizer_spm_session::tokenize` on `text`, its
    /// spaces already `▁`: one symbol per character, then the adjacent pair
    /// whose union is the highest-scoring token merges, leftmost on a tie,
    /// until no union is a token. A symbol that is no token falls back to
    /// byte tokens (or UNK, where the vocabulary lacks the byte too).
    fn encode_text(&self, vocab: &Vocab, unk: Option<u32>, text: &str, out: &mut Vec<u32>) {
        // Each symbol's byte range `(start, len)`: one per character at first.
        let mut syms: Vec<(usize, usize)> = text.char_indices().map(|(at, c)| (at, c.len_utf8())).collect();
        // Highest score first; the union's length tells a stale pair.
        let propose = |syms: &Vec<(usize, usize)>, left: usize, right: usize| {
            let union = &text[syms[left].0..syms[right].0 + syms[right].1];
            vocab.get(union).map(|id| (score_order(self.scores[id as usize]), union.len()))
        };
        let merge = |syms: &mut Vec<(usize, usize)>, left: usize, right: usize, len: usize| {
            let fresh = syms[left].1 + syms[right].1 == len;
            if fresh {
                syms[left].1 = len;
            }
            fresh
        };
        let n = syms.len();
        for i in merge_pairs(&mut syms, n, propose, merge) {
            let (start, len) = syms[i];
            let piece = &text[start..start + len];
            match vocab.get(piece) {
                Some(id) => out.push(id),
                None => {
                    for b in piece.bytes() {
                        match self.byte_tokens[b as usize] {
                            NO_TOKEN => out.extend(unk),
                            id => out.push(id),
                        }
                    }
                }
            }
        }
    }
}

/// `score`'s place in [`f32::total_cmp`]'s order, as an integer: a
/// [`merge_pairs`] priority.
fn score_order(score: f32) -> i64 {
    let bits = score.to_bits() as i32;
    // Negative floats order backwards by their bits: flip all but the sign.
    i64::from(bits ^ (((bits >> 31) as u32) >> 1) as i32)
}

/// The byte of a `<0xNN>` token.
pub(super) fn byte_token_value(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use crate::tokenizer::tests::{texts, tiny_spm};

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
}
