//! safetensors header validation on arbitrary bytes.
#![no_main]
use kiln::weights::safetensors::SafeTensors;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = SafeTensors::validate(data);
});
