//! The `kiln` command line: a thin layer over the library.

use anyhow::{Context as _, Result};
use clap::builder::{PossibleValuesParser, TypedValueParser as _};
use clap::{Parser, Subcommand, ValueEnum};
use kiln::check::{self, CheckOptions};
use kiln::export::{self, EmbedOptions, ExportOptions, ParamsMode};
use kiln::graph::text;
use kiln::graph::DType;
use kiln::iree::{Iree, Target};
use kiln::lower::{self, Emit, LowerOptions};
use kiln::models::bert::{EmbedChoice, Pooling};
use kiln::models::synth::{self, Preset, SynthData};
use kiln::models::PackedPolicy;
use kiln::weights::ggml::GgmlType;
use std::path::{Path, PathBuf};

#[derive(Parser)]
#[command(name = "kiln", version, about = "Export ML models to StableHLO for the IREE compiler")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Lower a graph text file to a verified StableHLO module.
    Lower {
        /// Graph in kiln's textual form (`-` for stdin).
        graph: PathBuf,
        /// Output `.mlir` or `.mlirbc` file; prints to stdout when absent.
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Scope name of `#flow.parameter.named` (`--parameters=SCOPE=FILE`).
        #[arg(long, default_value = lower::DEFAULT_PARAM_SCOPE)]
        param_scope: String,
        /// Output form; by default bytecode for a `.mlirbc` output, else text.
        #[arg(long, value_enum)]
        emit: Option<EmitForm>,
    },
    /// Show what a .gguf, .safetensors, safetensors index or .irpa file holds
    /// (read from headers only).
    Inspect {
        file: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print the graph of a built-in example (`kiln example --list`): one
    /// per composite NN op, for lit tests and for reading.
    Example {
        name: Option<String>,
        #[arg(long)]
        list: bool,
    },
    /// Compile a graph with IREE and compare its outputs with kiln's reference
    /// interpreter on seeded inputs and params. Exits 1 on a mismatch.
    Check {
        graph: PathBuf,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Relative tolerance for float outputs.
        #[arg(long, default_value_t = 1e-5)]
        rtol: f64,
        /// Absolute tolerance for float outputs.
        #[arg(long, default_value_t = 1e-6)]
        atol: f64,
        /// Also print the values of both sides.
        #[arg(long)]
        show: bool,
        /// Keep the work files (params, module, vmfb, npy) in this folder.
        #[arg(long)]
        keep: Option<PathBuf>,
        /// Run-time sizes for the graph's `?` dims: one run per size, one compile.
        #[arg(long = "dynamic-size", value_delimiter = ',', default_values_t = [2, 5])]
        dynamic_sizes: Vec<usize>,
    },
    /// Export a checkpoint to a directory: the StableHLO module with
    /// `prefill`, `decode` and `generate`, any params archive, and
    /// manifest.json.
    Export {
        /// A .gguf file, or a Hugging Face directory: config.json with
        /// model.safetensors or model.safetensors.index.json and its shards.
        model: PathBuf,
        /// The directory to write (created if needed).
        #[arg(short, long)]
        output: PathBuf,
        /// Where params come from: the checkpoint itself, an .irpa archive,
        /// or the module.
        #[arg(long, default_value = ParamsMode::default().name(),
              value_parser = PossibleValuesParser::new(ParamsMode::ALL.map(|m| m.name())).try_map(|s| s.parse::<ParamsMode>()))]
        params: ParamsMode,
        /// What quantized tensors become.
        #[arg(long, value_enum, default_value_t = PackedArg::Fail)]
        packed: PackedArg,
        /// Dtype of dequantized params, and of every dense param with
        /// `--params archive`.
        #[arg(long, value_parser = ["f32", "f16", "bf16"], default_value = "f32")]
        dtype: String,
        /// KV cache positions: prompt plus generated tokens. By default the
        /// model's own context length, capped so that the two caches fit
        /// in 1 GiB (the summary prints the capacity and the caches' bytes).
        #[arg(long)]
        max_context: Option<usize>,
        /// Element type of the KV cache: rows are rounded to it when
        /// written and read back as f32 (f16, as llama.cpp's, takes half
        /// f32's memory at the same decode speed).
        #[arg(long, value_parser = ["f32", "f16", "bf16"], default_value = "f16")]
        kv_dtype: String,
        /// `prefill` runs prompts of at most this many tokens as decode
        /// steps, which stream the packed weights, instead of the prompt's
        /// graph, which dequantizes them all at each call (slower for a few
        /// tokens); 0: never; `--max-context` or more: every prompt, with no
        /// prompt graph in the module. By default 32, or every prompt for a
        /// mixture of experts whose tokens use an eighth of its experts or
        /// less (the prompt graph runs every expert).
        #[arg(long)]
        stepped_prefill: Option<usize>,
        /// Module form; by default bytecode with `--params inline`, else text.
        #[arg(long, value_enum)]
        emit: Option<EmitForm>,
        /// With `--emit mlir`, print inline weights in full (hex) instead
        /// of eliding those over 1 MiB: the text then compiles.
        #[arg(long)]
        full_resources: bool,
        /// Encoders: `embed` takes any number of sentences and runs them
        /// this many at a time (then one at a time for what is left).
        #[arg(long, default_value_t = EmbedOptions::default().chunk)]
        chunk: usize,
        /// Encoders: pooling where the checkpoint does not say (no
        /// sentence-transformers modules.json, a GGUF without pooling_type).
        #[arg(long, value_parser = PossibleValuesParser::new(Pooling::ALL.map(|p| p.name())).try_map(|s| s.parse::<Pooling>()))]
        pooling: Option<Pooling>,
        /// Encoders: L2-normalize the vectors where the checkpoint does not
        /// say (default: true).
        #[arg(long)]
        normalize: Option<bool>,
    },
    /// Compile an export with iree-compile (writes DIR/model.vmfb).
    Compile {
        dir: PathBuf,
        /// What to compile for: host (this CPU), rocm:<arch> (gfx942, gfx1100),
        /// cuda:<arch> (sm_80, sm_89; sm_89 for Hopper), vulkan:<target> (rdna3).
        #[arg(long, default_value = "host")]
        target: Target,
    },
    /// Embed sentences with a compiled encoder export's `embed`, through
    /// IREE: one vector per line, or their cosine similarities.
    Embed {
        dir: PathBuf,
        /// A sentence; repeat for more.
        #[arg(long = "text", required = true)]
        texts: Vec<String>,
        /// Print the cosine similarity matrix instead of the vectors.
        #[arg(long)]
        similarity: bool,
    },
    /// Continue a prompt with a compiled export's `generate`, through IREE.
    Run {
        dir: PathBuf,
        #[arg(long)]
        prompt: String,
        #[arg(long, default_value_t = 16)]
        max_new_tokens: usize,
        /// Also print the decode rate, from a second call with one new token
        /// (its module load and prefill subtracted): one more load and
        /// prefill, so off by default.
        #[arg(long)]
        decode_rate: bool,
    },
    /// Developer tools.
    Dev {
        #[command(subcommand)]
        command: DevCommand,
    },
}

#[derive(Subcommand)]
enum DevCommand {
    /// Write a synthetic GGUF checkpoint with a real model's names, shapes,
    /// types and metadata (llama.cpp's Q4_K_M mix) but made-up data, in
    /// bounded memory.
    Synth {
        #[arg(value_parser = PossibleValuesParser::new(Preset::ALL.map(|p| p.name())).try_map(|s| s.parse::<Preset>()))]
        preset: Preset,
        /// The .gguf to write (replaced atomically).
        #[arg(short, long)]
        output: PathBuf,
        /// `zeros` leaves holes (a sparse file); `seeded` writes valid
        /// pseudo-random blocks.
        #[arg(long, value_enum, default_value_t = Data::Zeros)]
        data: Data,
        /// Seed of `--data seeded`.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Every matrix (head and embedding included) of this ggml type
        /// instead of the preset's mix: `BF16`, `IQ4_XS`, ...
        #[arg(long = "type")]
        ggml_type: Option<GgmlType>,
        /// Experts per layer of a mixture-of-experts preset instead of its
        /// own, each token using as many as before: decode's cost against
        /// the number of experts.
        #[arg(long)]
        experts: Option<usize>,
        /// The preset's first this many layers only: a model's shape at a
        /// fraction of its size, for measurements per layer.
        #[arg(long)]
        layers: Option<usize>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Data {
    Zeros,
    Seeded,
}

#[derive(Clone, Copy, ValueEnum)]
enum PackedArg {
    Fail,
    Dequantize,
    Keep,
}

/// `kiln lower --emit`.
#[derive(Clone, Copy, clap::ValueEnum)]
enum EmitForm {
    /// MLIR text.
    Mlir,
    /// MLIR bytecode.
    Mlirbc,
}

fn read_graph(path: &Path) -> Result<kiln::graph::Graph> {
    let source = if path == Path::new("-") {
        std::io::read_to_string(std::io::stdin()).context("reading graph from stdin")?
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?
    };
    text::parse(&source).with_context(|| format!("{}", path.display()))
}

fn main() -> std::process::ExitCode {
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line: the context chain joined with ": ", no backtrace.
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Lower { graph, output, param_scope, emit: form } => {
            let graph = read_graph(&graph)?;
            let session = lower::Session::new();
            let module = session.lower(&graph, &LowerOptions { param_scope })?;
            let form = match (form, &output) {
                (Some(EmitForm::Mlir), _) => Emit::default(),
                (Some(EmitForm::Mlirbc), _) => Emit::Mlirbc,
                (None, Some(path)) => Emit::for_path(path),
                (None, None) => Emit::default(),
            };
            match output {
                Some(path) => lower::write_module_to_path(&module, form, &path)?,
                None => ignore_broken_pipe(lower::write_module(&module, form, &mut std::io::stdout().lock()))?,
            }
        }
        Command::Inspect { file, json } => {
            let report = kiln::inspect::inspect(&file)?;
            if json {
                emit(&(serde_json::to_string_pretty(&report)? + "\n"))?;
            } else {
                emit(&report.to_string())?;
            }
        }
        Command::Example { name, list } => {
            let examples = kiln::trace::nn::examples();
            let names: Vec<&str> = examples.iter().map(|(n, _)| *n).collect();
            match name {
                Some(name) if !list => {
                    let (_, graph) = examples
                        .iter()
                        .find(|(n, _)| *n == name)
                        .with_context(|| format!("no example named {name}; try one of: {}", names.join(", ")))?;
                    emit(&text::print(graph))?;
                }
                _ => emit(&(names.join("\n") + "\n"))?,
            }
        }
        Command::Check { graph, seed, rtol, atol, show, keep, dynamic_sizes } => {
            let graph = read_graph(&graph)?;
            let iree = Iree::locate()?;
            let tmp = tempfile::tempdir().context("creating a work folder")?;
            let workdir = match &keep {
                Some(dir) => {
                    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
                    dir.as_path()
                }
                None => tmp.path(),
            };
            let report = check::check_graph(&graph, &iree, workdir, &CheckOptions { seed, rtol, atol, dynamic_sizes })?;
            for out in &report.outputs {
                println!("{out}");
                if show {
                    println!("  reference: {}", format_values(&out.reference.to_f64_vec()));
                    println!("  iree:      {}", format_values(&out.iree.to_f64_vec()));
                }
            }
            if !report.ok() {
                anyhow::bail!("IREE's results differ from the reference interpreter (rtol {rtol}, atol {atol})");
            }
        }
        Command::Export {
            model,
            output,
            params,
            packed,
            dtype,
            max_context,
            kv_dtype,
            stepped_prefill,
            emit: form,
            full_resources,
            chunk,
            pooling,
            normalize,
        } => {
            let dtype: DType = dtype.parse().map_err(|e| anyhow::anyhow!("--dtype: {e}"))?;
            let kv_dtype: DType = kv_dtype.parse().map_err(|e| anyhow::anyhow!("--kv-dtype: {e}"))?;
            let options = ExportOptions {
                params,
                packed: match packed {
                    PackedArg::Fail => PackedPolicy::Fail,
                    PackedArg::Dequantize => PackedPolicy::Dequantize(dtype),
                    PackedArg::Keep => PackedPolicy::Keep,
                },
                dtype,
                max_context,
                kv_dtype,
                stepped_prefill,
                emit: form.map(|f| match f {
                    EmitForm::Mlir if full_resources => Emit::default(),
                    EmitForm::Mlir => Emit::Mlir { elide_resources_over: Some(1 << 20) },
                    EmitForm::Mlirbc => Emit::Mlirbc,
                }),
                embed: EmbedOptions { chunk, choice: EmbedChoice { pooling, normalize } },
            };
            let mut progress = Bars::default();
            let result = export::export(&model, &output, &options, &mut progress);
            progress.finish();
            let s = result.with_context(|| format!("exporting {}", model.display()))?;
            let m = &s.manifest;
            println!(
                "exported {} ({}) -> {}: {}, params {}",
                m.architecture,
                model.display(),
                output.display(),
                m.functions.iter().map(|f| f.name.as_str()).collect::<Vec<_>>().join(", "),
                s.params_description,
            );
            println!(
                "  {} ops, {} params ({:.1}M elements, {} of them written), {} bytes written, {:.2} s, peak RSS {}",
                s.ops,
                s.params,
                s.param_elements as f64 / 1e6,
                s.params_written,
                s.bytes_written,
                s.seconds,
                s.peak_rss.map_or("unknown".into(), |b| format!("{:.1} MB", b as f64 / 1e6)),
            );
            if let Some(e) = &m.embedding {
                println!(
                    "  embed: any number of sentences ({} at a time), up to {} tokens each, {} pooling{}, {} features",
                    e.chunk,
                    e.max_length,
                    e.pooling.name(),
                    if e.normalize { " then L2" } else { "" },
                    e.dim
                );
            } else {
                println!(
                    "  KV cache: {} positions of {}, {} bytes ({:.1} MB) for keys and values",
                    m.max_context,
                    m.kv_dtype.as_deref().unwrap_or("?"),
                    s.cache_bytes,
                    s.cache_bytes as f64 / 1e6
                );
            }
            if s.tiled_bytes > 0 {
                println!(
                    "  decode's packed weights tiled by rows at load: {} bytes ({:.1} MB) of memory",
                    s.tiled_bytes,
                    s.tiled_bytes as f64 / 1e6
                );
            }
            if let Some((bytes, seconds)) = s.archive {
                println!("  archive: {bytes} bytes in {seconds:.2} s ({:.0} MB/s)", bytes as f64 / seconds / 1e6);
            }
            if let (n @ 1.., bytes) = s.stale_temps {
                println!("  removed {n} temporary file(s) of a killed kiln from {} ({bytes} bytes)", output.display());
            }
        }
        Command::Compile { dir, target } => {
            let iree = Iree::locate()?;
            let start = std::time::Instant::now();
            // iree-compile takes minutes and prints nothing until it is done.
            let spinner = Bars::spinner("iree-compile");
            let compiled = export::compile(&dir, &iree, &target);
            spinner.finish_and_clear();
            let c = compiled?;
            println!(
                "compiled {} for {target} in {:.1} s (iree-compile {:.1} s, peak RSS {:.1} MB)",
                c.vmfb.display(),
                start.elapsed().as_secs_f64(),
                c.iree_compile.seconds,
                c.iree_compile.peak_rss as f64 / 1e6
            );
        }
        Command::Embed { dir, texts, similarity } => {
            let iree = Iree::locate()?;
            let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
            let e = export::embed(&dir, &texts, &iree)?;
            let rows = match similarity {
                true => e.cosine_similarities(),
                false => e.vectors.clone(),
            };
            let mut out = String::new();
            for row in rows {
                let row: Vec<String> = row.iter().map(|v| format!("{v:.6}")).collect();
                out += &format!("{}\n", row.join(" "));
            }
            emit(&out)?;
            eprintln!(
                "{} sentences ({} tokens), {:.2} s (including the module's load)",
                texts.len(),
                e.tokens.iter().map(Vec::len).sum::<usize>(),
                e.seconds
            );
        }
        Command::Run { dir, prompt, max_new_tokens, decode_rate } => {
            let iree = Iree::locate()?;
            let g = export::generate(&dir, &prompt, max_new_tokens, &iree)?;
            println!("{prompt}{}", g.text);
            eprintln!(
                "{} prompt tokens, {} new tokens in {:.2} s ({:.1} tokens/s, including module load and prefill)",
                g.prompt_tokens.len(),
                g.tokens.len(),
                g.seconds,
                g.tokens.len() as f64 / g.seconds
            );
            // The decode rate: the same call with one new token takes the
            // load, the prefill and the first token; the rest is decode.
            if decode_rate && g.tokens.len() > 1 {
                let first = export::generate(&dir, &prompt, 1, &iree)?;
                let decode = g.seconds - first.seconds;
                if decode > 0.0 {
                    eprintln!(
                        "decode: {:.1} tokens/s ({} tokens in {:.3} s, less a 1-token run's {:.2} s)",
                        (g.tokens.len() - 1) as f64 / decode,
                        g.tokens.len() - 1,
                        decode,
                        first.seconds
                    );
                }
            }
        }
        Command::Dev { command: DevCommand::Synth { preset, output, data, seed, ggml_type, experts, layers } } => {
            let start = std::time::Instant::now();
            let (data, described) = match data {
                Data::Zeros => (SynthData::Zeros, "zeros".to_string()),
                Data::Seeded => (SynthData::Seeded(seed), format!("seeded({seed})")),
            };
            let mut config = preset.config();
            if let Some(ty) = ggml_type {
                config.quant = synth::Quant::Uniform(ty);
            }
            if let Some(n) = layers {
                config.first_layers(n).map_err(|e| anyhow::anyhow!("--layers {n}: {e}"))?;
            }
            if let Some(n) = experts {
                config.arch = config.arch.with_experts(n).map_err(|e| anyhow::anyhow!("--experts {n}: {e}"))?;
            }
            let s = synth::write(&config, &output, data)?;
            println!(
                "{preset}: {} params ({:.2}B), {} bytes ({:.2} GiB), {} tensors, {described} data, {:.1}s -> {}",
                s.elements,
                s.elements as f64 / 1e9,
                s.file_size,
                s.file_size as f64 / (1u64 << 30) as f64,
                s.tensors,
                start.elapsed().as_secs_f64(),
                output.display()
            );
        }
    }
    Ok(())
}

/// At most 16 values, 6 significant digits.
fn format_values(values: &[f64]) -> String {
    let shown: Vec<String> = values.iter().take(16).map(|v| format!("{v:.6}")).collect();
    let more = if values.len() > 16 { format!(", ... ({} values)", values.len()) } else { String::new() };
    format!("[{}{more}]", shown.join(", "))
}

/// Writes to stdout; a closed pipe (`kiln inspect F | head`) is not an error.
fn emit(text: &str) -> Result<()> {
    use std::io::Write;
    ignore_broken_pipe(std::io::stdout().lock().write_all(text.as_bytes()))
}

fn ignore_broken_pipe(result: std::io::Result<()>) -> Result<()> {
    match result {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// indicatif bars for `kiln export`: a spinner per stage, a byte bar while
/// params are written.
#[derive(Default)]
struct Bars {
    bar: Option<indicatif::ProgressBar>,
}

impl Bars {
    /// A spinner with `name` and the seconds since it started, on stderr
    /// when that is a terminal (indicatif draws nothing otherwise).
    fn spinner(name: &str) -> indicatif::ProgressBar {
        let style = indicatif::ProgressStyle::with_template("{spinner} {msg} {elapsed}").expect("a valid template");
        let bar = indicatif::ProgressBar::new_spinner().with_style(style).with_message(name.to_string());
        bar.enable_steady_tick(std::time::Duration::from_millis(120));
        bar
    }

    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

impl export::Progress for Bars {
    fn stage(&mut self, name: &str) {
        self.finish();
        self.bar = Some(Bars::spinner(name));
    }

    fn start_bytes(&mut self, total: u64) {
        self.finish();
        let style = indicatif::ProgressStyle::with_template(
            "writing params {bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("a valid template");
        self.bar = Some(indicatif::ProgressBar::new(total).with_style(style));
    }

    fn advance(&mut self, n: u64) {
        if let Some(bar) = &self.bar {
            bar.inc(n);
        }
    }
}
