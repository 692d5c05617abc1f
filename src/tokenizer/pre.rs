//! Pre-tokenizers: how byte-level BPE cuts a text into words before
//! merging (llama.cpp's `regex_exprs` per `LLAMA_VOCAB_PRE_TYPE_*`), each
//! regex written out by hand as llama.cpp's `unicode_regex_split_custom_*`
//! are.

use std::cmp::Ordering;
use std::ops::Range;

/// Llama 3's pre-tokenizer regex, as its `tokenizer.json` has it.
pub(super) const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's: Llama 3's with one digit per word.
pub(super) const QWEN2_REGEX: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How byte-level BPE cuts text into words (llama.cpp's `regex_exprs` per
/// `LLAMA_VOCAB_PRE_TYPE_*`), written out by hand as llama.cpp's
/// `unicode_regex_split_custom_gpt2` is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PreTokenizer {
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
    pub(super) const NAMES: &'static str = "\"gpt-2\", \"phi-2\", \"mpt\", \"olmo\", \"smollm\", \"starcoder\", \"refact\", \"codeshell\", \"command-r\", \"llama-bpe\", \"llama3\", \"llama-v3\", \"falcon3\", \"pixtral\", \"qwen2\", \"deepseek-r1-qwen\"";

    pub(super) fn from_name(pre: &str) -> Option<PreTokenizer> {
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
    pub(super) fn split(self, text: &str) -> Vec<Range<usize>> {
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
    use crate::tokenizer::tests::{PYTHON, TEXTS};
    use std::io::Write;
    use std::process::{Command, Stdio};

    fn words(pre: PreTokenizer, text: &str) -> Vec<&str> {
        pre.split(text).into_iter().map(|r| &text[r]).collect()
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
}
