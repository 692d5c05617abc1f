//! GGUF header, metadata and tensor-info parsing on arbitrary bytes.
#![no_main]
use kiln::weights::gguf::Gguf;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(gguf) = Gguf::parse(data) {
        // Walk every view the parser hands out: they must stay in bounds.
        for (_, value) in gguf.metadata() {
            if let Some(array) = value.as_array() {
                array.iter().for_each(drop);
            }
        }
        for t in gguf.tensors() {
            assert_eq!(t.ggml_type.byte_len(t.n_elements()), Some(t.data.len() as u64));
        }
    }
});
