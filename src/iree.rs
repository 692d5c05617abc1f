//! Drives IREE's command-line tools: `iree-compile` and `iree-run-module`.
//!
//! The tools come from PyPI (`iree-base-compiler`, `iree-base-runtime`),
//! which `make setup` installs into the project's `.venv`. They are found
//! in `$KILN_IREE_BIN` if set, else in the `.venv/bin` of the project whose
//! `target/` folder holds the running program (`kiln`, an example, a test),
//! else on `PATH`.

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::Instant;
use thiserror::Error;

/// Why an IREE tool could not be found or did not succeed.
#[derive(Debug, Error)]
pub enum IreeError {
    /// A tool is in none of the folders searched.
    #[error("cannot find `{tool}` (looked in {searched}); run `make setup` to install IREE into .venv, or set KILN_IREE_BIN to the folder holding it")]
    NotFound {
        /// The executable's name.
        tool: &'static str,
        /// The folders searched, `:`-separated.
        searched: String,
    },
    /// A tool could not be started.
    #[error("cannot start {tool}: {error}")]
    Spawn {
        /// The executable's path.
        tool: String,
        /// Why it did not start.
        error: std::io::Error,
    },
    /// A tool exited with a failure.
    #[error("{tool} failed ({status}):\n{stderr}")]
    Failed {
        /// The executable's path.
        tool: String,
        /// Its exit status.
        status: String,
        /// Its standard error, which holds IREE's diagnostics.
        stderr: String,
    },
    /// The compiled module could not be written.
    #[error("{context}: {error}")]
    Io {
        /// What was being done.
        context: String,
        /// The I/O error.
        error: std::io::Error,
    },
}

/// Flags that make `iree-compile` read StableHLO and target this host's CPU,
/// optimized; chosen by measurement on SmolLM2-135M Q4_1 (`--packed keep`):
/// - iree-compile's default level is O0; O3 with data tiling took decode
///   from 6.4 to 30.5 tok/s and compile from 111 to 85 s (same tokens).
///   Data tiling now pays in `prefill` only: serving modules mark `decode`
///   untiled (`lower::Session::lower_serving`).
/// - No const-expr hoisting: packed weights stream from the checkpoint's
///   bytes in fused matvecs (`models::Weight::linear`). Hoisting would
///   write copies of them at load (unpacked, or dequantized to f32 in
///   data-tiled layout for the prefill matmuls), which took
///   `iree-run-module`'s peak RSS from 227 MB to 728 MB and up to 1 GB for
///   no faster decode (one core: 61.6 vs 64.7 ms a token), and would hold
///   an f32 copy of every weight of an 8B model.
/// - No const-eval: with nothing hoisted it has nothing to evaluate, but its
///   analysis of the whole program still ran for minutes on the Gemma 3n
///   E2B shape (1966 s -> 628 s to compile; the same vmfb, byte for byte,
///   there and on SmolLM2).
pub const COMPILE_FLAGS: &[&str] = &[
    "--iree-input-type=stablehlo",
    "--iree-hal-target-device=local",
    "--iree-hal-local-target-device-backends=llvm-cpu",
    "--iree-llvmcpu-target-cpu=host",
    "--iree-opt-level=O3",
    "--iree-opt-data-tiling",
    "--iree-opt-const-expr-hoisting=false",
    "--iree-opt-const-eval=false",
];

/// [`COMPILE_FLAGS`]' counterpart for GPU targets, before the device's
/// ([`Target::flags`]): O3 like the host; no `--iree-opt-data-tiling`, which
/// IREE 3.13 does not finish for GPUs (it fails a one-op `x·Wᵀ` for
/// gfx942); no const-expr hoisting nor const-eval, for the reasons
/// [`COMPILE_FLAGS`] gives.
pub const GPU_COMPILE_FLAGS: &[&str] = &[
    "--iree-input-type=stablehlo",
    "--iree-opt-level=O3",
    "--iree-opt-const-expr-hoisting=false",
    "--iree-opt-const-eval=false",
];

/// The spec `iree-compile` applies for [`Target::Host`]
/// (`--iree-codegen-tuning-spec-path`): llvm-cpu's configs for the ops the
/// lowering tags `kiln.kernel = "..."` (kiln's packed products). Configs
/// live here, not on the ops, because an op's `compilation_info` applies to
/// every target and fails every GPU one; a tag is ignored where no spec
/// matches it, so one export compiles for every target.
pub const HOST_TUNING_SPEC: &str = include_str!("../cmake/kiln-host-tuning.mlir");

/// One GPU of each kind the tests compile for: gfx942 (MI300), sm_80
/// (A100) and rdna3 (any Vulkan GPU of that kind). Compile only: no GPU,
/// ROCm or CUDA is needed.
#[cfg(test)]
pub(crate) const TEST_GPUS: [&str; 3] = ["rocm:gfx942", "cuda:sm_80", "vulkan:rdna3"];

/// Why a `--target` cannot be compiled for.
#[derive(Debug, Error, PartialEq)]
pub enum TargetError {
    /// Not `host` nor `KIND:ARCH` with a known kind.
    #[error("unknown target `{0}`: expected host, rocm:<arch> (gfx942, gfx1100, ...), cuda:<arch> (sm_80, sm_89, ...) or vulkan:<target> (rdna3, ampere, valhall4, ...)")]
    Unknown(String),
    /// A GPU kind without its arch.
    #[error("target `{0}` needs an arch after `:`: rocm:gfx942, cuda:sm_80, vulkan:rdna3")]
    NoArch(String),
    /// An arch IREE 3.13 has no codegen target for.
    #[error("IREE 3.13 has no target `{target}`; {hint}")]
    UnknownArch {
        /// What was asked for.
        target: String,
        /// What to pass instead.
        hint: String,
    },
}

/// NVIDIA archs in IREE 3.13's GPU target table (`getNVIDIAGPUTargetDetails`).
const CUDA_ARCHS: &[&str] =
    &["sm_60", "sm_61", "sm_62", "sm_70", "sm_72", "sm_75", "sm_80", "sm_86", "sm_87", "sm_89", "sm_120", "sm_121"];

/// What `iree-compile` generates code for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Target {
    /// This machine's CPU (llvm-cpu).
    #[default]
    Host,
    /// An AMD GPU through HIP: a gfx arch (`gfx942` for MI300) or a product
    /// name IREE knows (`mi300x`).
    Rocm(String),
    /// An NVIDIA GPU: an `sm_NN` arch in IREE's table.
    Cuda(String),
    /// Any Vulkan GPU: an IREE Vulkan target (`rdna3`, `ampere`, `valhall4`).
    Vulkan(String),
}

impl std::str::FromStr for Target {
    type Err = TargetError;

    fn from_str(s: &str) -> Result<Target, TargetError> {
        if s == "host" {
            return Ok(Target::Host);
        }
        let Some((kind, arch)) = s.split_once(':') else {
            return Err(match s {
                "rocm" | "cuda" | "vulkan" => TargetError::NoArch(s.into()),
                _ => TargetError::Unknown(s.into()),
            });
        };
        if arch.is_empty() {
            return Err(TargetError::NoArch(s.into()));
        }
        let unknown = |hint: &str| Err(TargetError::UnknownArch { target: s.into(), hint: hint.into() });
        match kind {
            // The help text lists these, iree-compile rejects them.
            "rocm" if matches!(arch, "cdna3" | "rdna3" | "cdna2" | "rdna2") => {
                unknown("pass the chip's gfx arch: rocm:gfx942 (MI300), rocm:gfx90a (MI200), rocm:gfx1100 (RX 7900)")
            }
            "rocm" => Ok(Target::Rocm(arch.into())),
            "cuda" if CUDA_ARCHS.contains(&arch) => Ok(Target::Cuda(arch.into())),
            "cuda" if arch.starts_with("sm_9") || arch.starts_with("sm_10") || matches!(arch, "hopper" | "h100" | "h200") => {
                unknown("for Hopper (H100, H200) and newer pass cuda:sm_89: IREE embeds PTX, which the driver JIT-compiles for the GPU at load")
            }
            "cuda" => unknown(&format!("pass one of {}", CUDA_ARCHS.iter().map(|a| format!("cuda:{a}")).collect::<Vec<_>>().join(", "))),
            "vulkan" => Ok(Target::Vulkan(arch.into())),
            _ => Err(TargetError::Unknown(s.into())),
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Host => f.write_str("host"),
            Target::Rocm(arch) => write!(f, "rocm:{arch}"),
            Target::Cuda(arch) => write!(f, "cuda:{arch}"),
            Target::Vulkan(arch) => write!(f, "vulkan:{arch}"),
        }
    }
}

impl Target {
    /// `iree-compile`'s flags for this target, the host's tuning spec
    /// being at `host_spec` ([`HOST_TUNING_SPEC`]).
    /// GPUs: [`GPU_COMPILE_FLAGS`], then the device and its arch.
    pub fn flags(&self, host_spec: &Path) -> Vec<String> {
        let device = |device: &str, arch_flag: &str, arch: &str| {
            GPU_COMPILE_FLAGS
                .iter()
                .map(|f| f.to_string())
                .chain([format!("--iree-hal-target-device={device}"), format!("--{arch_flag}={arch}")])
                .collect()
        };
        match self {
            Target::Host => COMPILE_FLAGS
                .iter()
                .map(|f| f.to_string())
                .chain([format!("--iree-codegen-tuning-spec-path={}", host_spec.display())])
                .collect(),
            Target::Rocm(arch) => device("hip", "iree-rocm-target", arch),
            Target::Cuda(arch) => device("cuda", "iree-cuda-target", arch),
            Target::Vulkan(arch) => device("vulkan", "iree-vulkan-target", arch),
        }
    }

    /// Flags for one module holding a variant for each of `gpus` (IREE
    /// picks the one the device at hand takes): the devices in one
    /// `--iree-hal-target-device` list, then each one's arch flag.
    /// [`TargetError::Unknown`] for the host, whose flags (data tiling) the
    /// GPUs do not take, or for an empty list.
    pub fn gpu_flags(gpus: &[Target]) -> Result<Vec<String>, TargetError> {
        let dummy = Path::new("");
        let mut devices = Vec::new();
        let mut archs = Vec::new();
        for gpu in gpus {
            if *gpu == Target::Host {
                return Err(TargetError::Unknown("host among GPU targets".into()));
            }
            for flag in gpu.flags(dummy).into_iter().skip(GPU_COMPILE_FLAGS.len()) {
                match flag.strip_prefix("--iree-hal-target-device=") {
                    Some(device) => devices.push(device.to_string()),
                    None => archs.push(flag),
                }
            }
        }
        if devices.is_empty() {
            return Err(TargetError::Unknown("no GPU target".into()));
        }
        let device = format!("--iree-hal-target-device={}", devices.join(","));
        Ok(GPU_COMPILE_FLAGS.iter().map(|f| f.to_string()).chain([device]).chain(archs).collect())
    }

    /// The `--device` of `iree-run-module` for a module compiled for it.
    pub fn device(&self) -> &'static str {
        match self {
            Target::Host => "local-task",
            Target::Rocm(_) => "hip",
            Target::Cuda(_) => "cuda",
            Target::Vulkan(_) => "vulkan",
        }
    }
}

/// What one run of a tool took; its caller reports it (`kiln compile`
/// prints iree-compile's).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ToolStats {
    /// Wall time from start to exit, in seconds.
    pub seconds: f64,
    /// Peak resident memory in bytes of the tool, or of a process it ran
    /// and waited for if that one's was larger (`ru_maxrss` of `wait4`, as
    /// `/usr/bin/time` reports it). Linux counts the memory the tool's
    /// process had before its `exec` too, which is the caller's (kiln's
    /// own peak, a few tens of MB for the CLI): the figure is at least that.
    pub peak_rss: u64,
}

/// The IREE tools kiln runs.
#[derive(Clone, Debug)]
pub struct Iree {
    /// `iree-compile`.
    pub compile: PathBuf,
    /// `iree-run-module`.
    pub run_module: PathBuf,
}

impl Iree {
    /// Finds the tools in `$KILN_IREE_BIN`, then in the `.venv/bin` next to the
    /// project's `target/` folder that holds the running program, then in
    /// `$VIRTUAL_ENV/bin`, then in the `.venv/bin` of kiln's own checkout,
    /// then on `PATH`.
    pub fn locate() -> Result<Iree, IreeError> {
        let mut dirs: Vec<PathBuf> = Vec::new();
        if let Some(d) = std::env::var_os("KILN_IREE_BIN") {
            dirs.push(d.into());
        }
        // `<repo>/target/debug/kiln`, `<repo>/target/debug/examples/NAME`,
        // ... → `<repo>/.venv/bin`.
        if let Ok(exe) = std::env::current_exe() {
            let target = exe.ancestors().skip(1).find(|a| a.file_name().is_some_and(|n| n == "target"));
            if let Some(repo) = target.and_then(Path::parent) {
                dirs.push(repo.join(".venv/bin"));
            }
        }
        if let Some(venv) = std::env::var_os("VIRTUAL_ENV") {
            dirs.push(PathBuf::from(venv).join("bin"));
        }
        dirs.push(Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin"));
        dirs.dedup();
        dirs.extend(
            std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect::<Vec<_>>()).unwrap_or_default(),
        );
        let find = |tool: &'static str| {
            dirs.iter().map(|d| d.join(tool)).find(|p| p.is_file()).ok_or_else(|| IreeError::NotFound {
                tool,
                searched: dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(":"),
            })
        };
        Ok(Iree { compile: find("iree-compile")?, run_module: find("iree-run-module")? })
    }

    /// The project's `.venv/bin` tools, for the crate's own tests; fails (never
    /// skips) with a message to run `make setup` when they are missing.
    #[cfg(test)]
    pub(crate) fn for_tests() -> Iree {
        let bin = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin");
        let iree = Iree { compile: bin.join("iree-compile"), run_module: bin.join("iree-run-module") };
        assert!(
            iree.compile.is_file() && iree.run_module.is_file(),
            "IREE tools are missing from {}: run `make setup`",
            bin.display()
        );
        iree
    }

    /// Compiles for one GPU of each kind ([`TEST_GPUS`]), one module with a
    /// variant each: what the crate's tests check every target takes.
    #[cfg(test)]
    pub(crate) fn compile_for_test_gpus(&self, mlir: &Path, vmfb: &Path) -> Result<ToolStats, IreeError> {
        let gpus: Vec<Target> = TEST_GPUS.iter().map(|g| g.parse().expect("a known target")).collect();
        self.compile_with_flags(&Target::gpu_flags(&gpus).expect("GPU targets"), mlir, vmfb, &[])
    }

    /// Compiles an `.mlir`/`.mlirbc` file for the host CPU into `vmfb`,
    /// written atomically; returns what iree-compile took.
    pub fn compile(&self, mlir: &Path, vmfb: &Path) -> Result<ToolStats, IreeError> {
        self.compile_for(&Target::Host, mlir, vmfb, &[])
    }

    /// Compiles for `target`, with `extra` flags after the target's.
    pub fn compile_for(
        &self,
        target: &Target,
        mlir: &Path,
        vmfb: &Path,
        extra: &[String],
    ) -> Result<ToolStats, IreeError> {
        let io = |error| IreeError::Io { context: format!("writing {}", vmfb.display()), error };
        let spec = tempfile::Builder::new().prefix("kiln-host-tuning").suffix(".mlir").tempfile().map_err(io)?;
        std::fs::write(spec.path(), HOST_TUNING_SPEC).map_err(io)?;
        self.compile_with_flags(&target.flags(spec.path()), mlir, vmfb, extra)
    }

    /// Compiles with the target flags `flags` ([`Target::flags`],
    /// [`Target::gpu_flags`]), then `extra`.
    pub fn compile_with_flags(
        &self,
        flags: &[String],
        mlir: &Path,
        vmfb: &Path,
        extra: &[String],
    ) -> Result<ToolStats, IreeError> {
        let io = |error| IreeError::Io { context: format!("writing {}", vmfb.display()), error };
        // iree-compile writes the file by name.
        let tmp = crate::AtomicFile::create_named(vmfb).map_err(io)?;
        let mut cmd = Command::new(&self.compile);
        cmd.args(flags).args(extra).arg(mlir).arg("-o").arg(tmp.temp_path().expect("a named file"));
        let (_, stats) = run_tool(cmd)?;
        tmp.commit().map_err(io)?;
        Ok(stats)
    }

    /// Runs `function` of a module compiled for the host; inputs and
    /// outputs are `.npy` files; each of `parameters` binds a scope to a
    /// parameter file.
    pub fn run(
        &self,
        vmfb: &Path,
        function: &str,
        inputs: &[PathBuf],
        parameters: &[(&str, &Path)],
        outputs: &[PathBuf],
    ) -> Result<String, IreeError> {
        self.run_on(Target::Host.device(), vmfb, function, inputs, parameters, outputs)
    }

    /// [`Iree::run`] on `device` ([`Target::device`]).
    pub fn run_on(
        &self,
        device: &str,
        vmfb: &Path,
        function: &str,
        inputs: &[PathBuf],
        parameters: &[(&str, &Path)],
        outputs: &[PathBuf],
    ) -> Result<String, IreeError> {
        let mut cmd = Command::new(&self.run_module);
        cmd.arg(format!("--device={device}"))
            .arg(format!("--module={}", vmfb.display()))
            .arg(format!("--function={function}"));
        for (scope, file) in parameters {
            cmd.arg(format!("--parameters={scope}={}", file.display()));
        }
        for i in inputs {
            cmd.arg(format!("--input=@{}", i.display()));
        }
        for o in outputs {
            cmd.arg(format!("--output=@{}", o.display()));
        }
        run_tool(cmd).map(|(stdout, _)| stdout)
    }
}

/// Runs `cmd` as `Command::output` does (stdin closed, stdout and stderr
/// captured), timing it and reaping it with `wait4` for its peak memory.
fn run_tool(mut cmd: Command) -> Result<(String, ToolStats), IreeError> {
    let tool = cmd.get_program().to_string_lossy().into_owned();
    let failed = |error| IreeError::Spawn { tool: tool.clone(), error };
    let start = Instant::now();
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().map_err(failed)?;
    // Both pipes are drained at once: a tool blocked on a full stderr pipe
    // would never close its stdout.
    let mut stderr_pipe = child.stderr.take().expect("stderr is piped");
    let stderr_reader = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        stderr_pipe.read_to_end(&mut bytes).map(|_| bytes)
    });
    let mut stdout = Vec::new();
    let read = child.stdout.take().expect("stdout is piped").read_to_end(&mut stdout);
    let stderr = stderr_reader.join().expect("the stderr reader does not panic");
    // Reaped whatever the reads did, so no zombie is left behind.
    let (status, peak_rss) =
        wait_with_peak_rss(&child).map_err(|error| IreeError::Io { context: format!("waiting for {tool}"), error })?;
    let stats = ToolStats { seconds: start.elapsed().as_secs_f64(), peak_rss };
    let unread = |error| IreeError::Io { context: format!("reading the output of {tool}"), error };
    let stderr = stderr.map_err(unread)?;
    read.map_err(unread)?;
    if !status.success() {
        return Err(IreeError::Failed {
            tool,
            status: describe_exit(status, stats.peak_rss),
            stderr: String::from_utf8_lossy(&stderr).trim_end().to_string(),
        });
    }
    Ok((String::from_utf8_lossy(&stdout).into_owned(), stats))
}

/// `status` as std spells it, and for a SIGKILL what most likely sent it.
/// `.venv/bin/iree-compile` is a Python wrapper that exits with its
/// compiler's negated signal: 247 (-9) is a SIGKILL too, as is 137 from a
/// shell.
fn describe_exit(status: ExitStatus, peak_rss: u64) -> String {
    let killed = status.signal() == Some(libc::SIGKILL) || matches!(status.code(), Some(137 | 247));
    if !killed {
        return status.to_string();
    }
    format!(
        "{status}: killed, most likely by the kernel's out-of-memory killer at {:.1} GB peak resident memory; \
         free memory (other compiles, caches) or compile on a machine with more",
        peak_rss as f64 / 1e9
    )
}

/// Waits for `child` with `wait4`, which also returns its resource use
/// (std's `Child::wait` does not); `child` must not be waited for again.
/// Its peak resident memory in bytes: `ru_maxrss` is in KiB on Linux, the
/// only OS kiln builds for (`O_TMPFILE`, `/proc`).
fn wait_with_peak_rss(child: &std::process::Child) -> std::io::Result<(ExitStatus, u64)> {
    let pid = libc::pid_t::try_from(child.id()).expect("a pid fits pid_t");
    let mut status = 0;
    // SAFETY: rusage is plain integers, for which all zeros is valid.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: both pointers are to live locals of the right types.
        if unsafe { libc::wait4(pid, &mut status, 0, &mut usage) } == pid {
            let kib = u64::try_from(usage.ru_maxrss).unwrap_or(0);
            return Ok((ExitStatus::from_raw(status), kib * 1024));
        }
        let error = std::io::Error::last_os_error();
        if error.kind() != std::io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The figures are the child's own: dd's 64 MiB buffer shows in its
    /// peak RSS, and not in that of `sh` run after it (which
    /// `getrusage(RUSAGE_CHILDREN)`, the largest child so far, would give),
    /// whose figure is at most this process's own peak, which Linux counts
    /// up to the child's `exec`.
    #[test]
    fn a_tool_run_reports_its_own_wall_time_and_peak_memory() {
        let mut dd = Command::new("dd");
        dd.args(["if=/dev/zero", "of=/dev/null", "bs=64M", "count=1", "status=none"]);
        let start = Instant::now();
        let (_, big) = run_tool(dd).unwrap();
        assert!(big.seconds > 0.0 && big.seconds <= start.elapsed().as_secs_f64(), "{big:?}");
        assert!(big.peak_rss >= 64 << 20, "{big:?}");
        let mut echo = Command::new("sh");
        echo.args(["-c", "echo kiln"]);
        let (stdout, small) = run_tool(echo).unwrap();
        assert_eq!(stdout, "kiln\n");
        let own = crate::peak_rss().expect("/proc/self/status has VmHWM");
        assert!(small.peak_rss > 0 && small.peak_rss <= own.max(16 << 20), "{small:?}, this process's peak {own}");
    }

    /// A tool that fails is an error holding its status and its stderr.
    #[test]
    fn a_failing_tool_s_stderr_is_the_error() {
        let mut sh = Command::new("sh");
        sh.args(["-c", "echo partial; echo 'error: no such op' >&2; exit 3"]);
        match run_tool(sh) {
            Err(IreeError::Failed { tool, status, stderr }) => {
                assert_eq!((tool.as_str(), stderr.as_str()), ("sh", "error: no such op"));
                assert!(status.contains('3'), "{status}");
            }
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    /// A tool killed by SIGKILL, itself or through a wrapper that exits
    /// with the signal (Python's -9, a shell's 137), is said to be killed.
    #[test]
    fn a_killed_tool_is_said_to_be_killed() {
        for script in ["kill -9 $$", "exit 247", "exit 137"] {
            let mut sh = Command::new("sh");
            sh.args(["-c", script]);
            match run_tool(sh) {
                Err(IreeError::Failed { status, .. }) => {
                    assert!(status.contains("out-of-memory killer"), "{script}: {status}")
                }
                other => panic!("{script}: expected a failure, got {other:?}"),
            }
        }
    }

    /// `kiln_compile` in cmake/KilnExport.cmake passes what `kiln compile` does.
    #[test]
    fn cmake_module_compiles_with_the_same_flags() {
        let cmake = include_str!("../cmake/KilnExport.cmake");
        for (var, expected) in
            [("KILN_IREE_COMPILE_FLAGS", COMPILE_FLAGS), ("KILN_IREE_GPU_COMPILE_FLAGS", GPU_COMPILE_FLAGS)]
        {
            let start = cmake.find(&format!("set({var}\n")).unwrap_or_else(|| panic!("{var} is set"));
            let end = start + cmake[start..].find("CACHE STRING").expect("as a cache variable");
            let flags: Vec<&str> = cmake[start..end].split('"').skip(1).step_by(2).collect();
            assert_eq!(flags, expected, "{var}");
        }
    }

    /// Each kind of target parses to its device and arch flags, prints back
    /// as given, and an arch IREE 3.13 lacks says what to pass instead.
    #[test]
    fn targets_parse_to_their_flags_and_unknown_archs_say_what_to_pass() {
        let spec = Path::new("/s.mlir");
        for (text, device, arch_flag) in [
            ("rocm:gfx942", "hip", "--iree-rocm-target=gfx942"),
            ("cuda:sm_80", "cuda", "--iree-cuda-target=sm_80"),
            ("vulkan:rdna3", "vulkan", "--iree-vulkan-target=rdna3"),
        ] {
            let target: Target = text.parse().unwrap();
            assert_eq!((target.to_string().as_str(), target.device()), (text, device));
            let flags = target.flags(spec);
            assert!(
                flags.contains(&format!("--iree-hal-target-device={device}")) && flags.contains(&arch_flag.to_string()),
                "{flags:?}"
            );
            assert!(
                !flags.iter().any(|f| f.contains("llvmcpu") || f.contains("data-tiling") || f.contains("tuning-spec")),
                "{flags:?}"
            );
        }
        let host = "host".parse::<Target>().unwrap().flags(spec);
        assert_eq!(&host[..COMPILE_FLAGS.len()], COMPILE_FLAGS);
        assert_eq!(host[COMPILE_FLAGS.len()..], ["--iree-codegen-tuning-spec-path=/s.mlir"]);
        let hopper = "cuda:sm_90".parse::<Target>().unwrap_err().to_string();
        assert!(hopper.contains("cuda:sm_89") && hopper.contains("JIT"), "{hopper}");
        let listed = "cuda:sm_50".parse::<Target>().unwrap_err().to_string();
        assert!(listed.contains("cuda:sm_80"), "{listed}");
        assert!("rocm:cdna3".parse::<Target>().unwrap_err().to_string().contains("rocm:gfx942"));
        assert_eq!("rocm".parse::<Target>(), Err(TargetError::NoArch("rocm".into())));
        assert_eq!("tpu:v5".parse::<Target>(), Err(TargetError::Unknown("tpu:v5".into())));
        let both = Target::gpu_flags(&["rocm:gfx942".parse().unwrap(), "vulkan:rdna3".parse().unwrap()]).unwrap();
        assert_eq!(&both[..GPU_COMPILE_FLAGS.len()], GPU_COMPILE_FLAGS);
        assert_eq!(
            both[GPU_COMPILE_FLAGS.len()..],
            ["--iree-hal-target-device=hip,vulkan", "--iree-rocm-target=gfx942", "--iree-vulkan-target=rdna3"]
        );
        assert!(Target::gpu_flags(&[Target::Host]).is_err() && Target::gpu_flags(&[]).is_err());
    }

    /// The host spec tags every config the lowering asks for by name: the
    /// spec parses as a transform module with one match per tag.
    #[test]
    fn host_tuning_spec_matches_each_packed_tag() {
        for tiles in [1, 4] {
            let tag = format!("kiln.kernel = \"packed_matvec_t{tiles}\"");
            assert_eq!(HOST_TUNING_SPEC.matches(&tag).count(), 1, "{tag}");
            let config = format!("distribution = [{tiles}, 16, 0], vector_common_parallel = [1, 16, 0]");
            assert_eq!(HOST_TUNING_SPEC.matches(&config).count(), 1, "{config}");
        }
    }
}
