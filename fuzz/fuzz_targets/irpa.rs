//! IRPA archive parsing on arbitrary bytes.
#![no_main]
use kiln::weights::irpa::IrpaArchive;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = IrpaArchive::validate(data);
});
