//! What one export makes of its params, decided once from the params mode,
//! each param's stored type and the packed policy: where each param's value
//! lives at run time, what goes into the archive and what into the module,
//! the `--parameters` bindings, the module's form and the compile flags.
//! Lowering, the archive writer, the module writer and the manifest all
//! read the [`Plan`]; none decides again.

use super::{ExportOptions, ParameterFile, ParamsMode, Result, ARCHIVE_FILE, ARCHIVE_SCOPE};
use crate::lower::{Emit, ParamInit, ParamInits};
use crate::models::PackedPolicy;
use crate::weights::archive::{self, DerivedParam, Source};
use crate::weights::ggml::GgmlType;
use std::borrow::Cow;
use std::path::PathBuf;

/// The ggml types IREE 3.13's GGUF parameter reader sizes as ggml does
/// (`runtime/src/iree/io/formats/gguf/gguf_parser.c`, `ggml_type_traits`).
/// Its table stops at id 18: a later id fails the whole file ("GGML tensor
/// type 30 not supported"); Q8_1 has its old 40-byte block there (36 in
/// ggml since), and ids 16–18 are I8, I16 and I32 (since given to IQ2_XXS,
/// IQ2_XS and IQ3_XXS), so those sizes are wrong. A GGUF holding any other
/// type cannot be bound with `--parameters` at all, whichever tensors the
/// module reads.
pub const IREE_GGUF_TYPES: [GgmlType; 13] = {
    use GgmlType as T;
    [T::F32, T::F16, T::Q4_0, T::Q4_1, T::Q5_0, T::Q5_1, T::Q8_0, T::Q2_K, T::Q3_K, T::Q4_K, T::Q5_K, T::Q6_K, T::Q8_K]
};

/// Where one param's value lives at run time.
#[derive(Clone, Debug, PartialEq)]
pub enum Home<'a> {
    /// The checkpoint itself, read as it is stored: named in the
    /// lowering's scope, `--parameters=model=CHECKPOINT`.
    Source,
    /// The export's `params.irpa`, under [`ARCHIVE_SCOPE`].
    Archive,
    /// A `dense_resource` blob in the module: the stored bytes, or the
    /// bytes derived from them.
    Inline(Cow<'a, [u8]>),
}

/// One param: how it is made from the checkpoint, and where it lives.
#[derive(Clone, Debug)]
pub struct Param<'a> {
    /// The stored tensor and the param's dtype.
    pub stored: DerivedParam<'a>,
    /// Where its value lives at run time.
    pub home: Home<'a>,
}

/// Everything an export decides about its params and its module.
#[derive(Clone, Debug)]
pub struct Plan<'a> {
    /// Where params' values come from, as the manifest records it:
    /// `archive` where `reference` was asked for and IREE cannot read the
    /// checkpoint.
    pub mode: ParamsMode,
    /// Why a `reference` export went to the archive instead: the
    /// checkpoint tensor IREE cannot read.
    pub unreferenced: Option<String>,
    /// What quantized tensors became, as the manifest records it.
    pub packed: PackedPolicy,
    /// Every param of the module, once, by name.
    pub params: Vec<Param<'a>>,
    /// The module's form.
    pub emit: Emit,
    /// iree-compile flags the module needs besides the target's.
    pub compile_flags: Vec<String>,
}

impl<'a> Plan<'a> {
    /// The plan for `stored`, each param of the traced graphs as the
    /// checkpoint makes it ([`crate::models::Checkpoint::stored`]). Inline
    /// params that must be derived (dequantized, re-typed) are derived here,
    /// into memory the plan owns. `unreadable` says why IREE cannot read
    /// the checkpoint as a parameter file ([`unreadable_gguf`]), if it
    /// cannot: then `reference` writes every param into the archive.
    pub fn new(options: &ExportOptions, stored: Vec<DerivedParam<'a>>, unreadable: Option<String>) -> Result<Plan<'a>> {
        let unreferenced = unreadable.filter(|_| options.params == ParamsMode::Reference);
        let mode = if unreferenced.is_some() { ParamsMode::Archive } else { options.params };
        let params = stored
            .into_iter()
            .map(|p| {
                let home = match mode {
                    ParamsMode::Reference if p.is_copy() => Home::Source,
                    ParamsMode::Reference | ParamsMode::Archive => Home::Archive,
                    ParamsMode::Inline => match p.in_place() {
                        Some(bytes) => Home::Inline(Cow::Borrowed(bytes)),
                        None => Home::Inline(Cow::Owned(archive::derive_to_vec(&p)?)),
                    },
                };
                Ok(Param { stored: p, home })
            })
            .collect::<Result<_>>()?;
        let inline = options.params == ParamsMode::Inline;
        Ok(Plan {
            mode,
            unreferenced,
            packed: options.packed,
            params,
            emit: options.emit.unwrap_or(if inline { Emit::Mlirbc } else { Emit::default() }),
            // Inline weights are constants: iree-compile would evaluate the
            // in-graph dequantization of all of them at compile time (over
            // 14 min for SmolLM2-135M, against 2 min without).
            compile_flags: match inline {
                true => vec!["--iree-opt-const-eval=false".into()],
                false => vec![],
            },
        })
    }

    /// The summary's account of the params: the mode, and why it is not
    /// the one asked for.
    pub fn description(&self) -> String {
        let mut described = format!("{}, packed {}", self.mode.name(), self.packed);
        if let Some(why) = &self.unreferenced {
            described += &format!(" (not reference: {why}; every param is written to {ARCHIVE_FILE})");
        }
        // Stacks no file holds: the checkpoint's experts joined, or transposed.
        let count = |joined: bool| {
            let kind = |s: &Source<'_>| {
                if joined {
                    matches!(s, Source::Joined(_))
                } else {
                    matches!(s, Source::Assembled(_))
                }
            };
            self.params.iter().filter(|p| kind(&p.stored.source)).count()
        };
        if self.mode == ParamsMode::Reference {
            for (n, how) in [(count(true), "joined"), (count(false), "assembled")] {
                if n > 0 {
                    described += &format!(
                        "; {n} expert stacks {how} into {ARCHIVE_FILE} (the checkpoint keeps experts {})",
                        if how == "joined" { "apart" } else { "transposed, or as HF's MXFP4 blocks" }
                    );
                }
            }
        }
        described
    }

    /// The params written into `params.irpa`, in order.
    pub fn archived(&self) -> Vec<DerivedParam<'a>> {
        self.params.iter().filter(|p| p.home == Home::Archive).map(|p| p.stored).collect()
    }

    /// Each global's initial value; params read from the checkpoint have
    /// none, so they are named in the lowering's scope.
    pub fn inits(&self) -> ParamInits<'_> {
        fn init<'p>(p: &'p Param<'_>) -> Option<(&'p str, ParamInit<'p>)> {
            let init = match &p.home {
                Home::Source => return None,
                Home::Archive => ParamInit::Named { scope: ARCHIVE_SCOPE.into(), key: p.stored.name.into() },
                Home::Inline(bytes) => ParamInit::Inline(bytes),
            };
            Some((p.stored.name, init))
        }
        self.params.iter().filter_map(init).collect()
    }

    /// The `--parameters` bindings: `scope` to each of the checkpoint's
    /// `tensor_files` if a param is read from it, then the archive's.
    pub fn parameters(&self, scope: &str, tensor_files: Vec<PathBuf>) -> Vec<ParameterFile> {
        let reads = |home: Home<'_>| self.params.iter().any(|p| p.home == home);
        let source = tensor_files.into_iter().filter(|_| reads(Home::Source));
        let source = source.map(|file| ParameterFile { scope: scope.into(), file });
        let archive =
            reads(Home::Archive).then(|| ParameterFile { scope: ARCHIVE_SCOPE.into(), file: ARCHIVE_FILE.into() });
        source.chain(archive).collect()
    }

    /// How many params the export writes, into the archive or the module.
    pub fn written(&self) -> usize {
        self.params.iter().filter(|p| p.home != Home::Source).count()
    }

    /// The module's file name in the export directory.
    pub fn module_file(&self) -> &'static str {
        match self.emit {
            Emit::Mlirbc => "model.mlirbc",
            Emit::Mlir { .. } => "model.mlir",
        }
    }

    /// Whether the module's text leaves inline weights out: for reading,
    /// not compiling.
    pub fn elided_resources(&self) -> bool {
        self.mode == ParamsMode::Inline && matches!(self.emit, Emit::Mlir { elide_resources_over: Some(_) })
    }
}

/// Why IREE's GGUF reader cannot take the file of `tensors` (name and
/// type) as a parameter file: the first tensor whose type is not in
/// [`IREE_GGUF_TYPES`].
pub fn unreadable_gguf<'t>(mut tensors: impl Iterator<Item = (&'t str, GgmlType)>) -> Option<String> {
    let (name, ty) = tensors.find(|(_, ty)| !IREE_GGUF_TYPES.contains(ty))?;
    Some(format!(
        "tensor \"{name}\" is {ty} (ggml type {}), which IREE 3.13's GGUF reader does not read, so it cannot bind the \
         checkpoint",
        ty.id()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::DType;
    use crate::weights::archive::Encoding;
    use std::path::Path;

    /// A norm stored as the param is, and Q8_0 blocks dequantized to f32.
    fn stored(blocks: &[u8]) -> Vec<DerivedParam<'_>> {
        const NORM: [u8; 8] = [0, 0, 128, 63, 0, 0, 0, 64];
        vec![
            DerivedParam {
                name: "norm",
                source: Source::Tensor(&NORM),
                encoding: Encoding::Dense(DType::F32),
                target: DType::F32,
            },
            DerivedParam {
                name: "w",
                source: Source::Tensor(blocks),
                encoding: Encoding::Ggml(GgmlType::Q8_0),
                target: DType::F32,
            },
        ]
    }

    fn plan(params: ParamsMode, emit: Option<Emit>, blocks: &[u8]) -> Plan<'_> {
        let options = ExportOptions { params, emit, ..ExportOptions::default() };
        Plan::new(&options, stored(blocks), None).unwrap()
    }

    #[test]
    fn each_mode_places_copies_and_derived_params() {
        let blocks = [[0u8, 60].as_slice(), &[1; 32]].concat();
        let homes = |p: &Plan<'_>| {
            let home = |p: &Param<'_>| match p.home {
                Home::Source => "source",
                Home::Archive => "archive",
                Home::Inline(_) => "inline",
            };
            p.params.iter().map(home).collect::<Vec<_>>()
        };
        let files = || vec![PathBuf::from("/m.gguf")];

        let reference = plan(ParamsMode::Reference, None, &blocks);
        assert_eq!(homes(&reference), ["source", "archive"]);
        assert_eq!(reference.archived().iter().map(|p| p.name).collect::<Vec<_>>(), ["w"]);
        let scopes = |p: &Plan<'_>| p.parameters("model", files()).into_iter().map(|b| b.scope).collect::<Vec<_>>();
        assert_eq!(scopes(&reference), ["model", ARCHIVE_SCOPE]);
        assert_eq!((reference.written(), reference.inits().len()), (1, 1));
        assert_eq!((reference.module_file(), reference.compile_flags.len()), ("model.mlir", 0));

        let archive = plan(ParamsMode::Archive, None, &blocks);
        assert_eq!(homes(&archive), ["archive", "archive"]);
        assert_eq!((scopes(&archive), archive.written()), (vec![ARCHIVE_SCOPE.to_string()], 2));

        let inline = plan(ParamsMode::Inline, None, &blocks);
        let Home::Inline(Cow::Owned(w)) = &inline.params[1].home else { panic!("w is derived into the plan") };
        assert_eq!(w.len(), 4 * 32, "32 f32 values");
        assert!(matches!(inline.params[0].home, Home::Inline(Cow::Borrowed(_))), "norm aliases the checkpoint");
        assert!(inline.parameters("model", files()).is_empty());
        assert_eq!(
            (inline.module_file(), inline.compile_flags.as_slice()),
            ("model.mlirbc", &["--iree-opt-const-eval=false".to_string()][..])
        );
        assert!(!inline.elided_resources());
        let elided = plan(ParamsMode::Inline, Some(Emit::Mlir { elide_resources_over: Some(1) }), &blocks);
        assert!(elided.elided_resources() && elided.module_file() == "model.mlir");
        let text = plan(ParamsMode::Reference, Some(Emit::Mlir { elide_resources_over: Some(1) }), &blocks);
        assert!(!text.elided_resources(), "nothing is inline to elide");
    }

    #[test]
    fn a_checkpoint_iree_cannot_read_goes_to_the_archive_whole() {
        let blocks = [[0u8, 60].as_slice(), &[1; 32]].concat();
        let tensors = [("norm", GgmlType::F32), ("w", GgmlType::Q8_0), ("v", GgmlType::BF16), ("u", GgmlType::Q8_1)];
        assert_eq!(unreadable_gguf(tensors[..2].iter().copied()), None);
        let why = unreadable_gguf(tensors.iter().copied()).unwrap();
        assert!(why.contains("\"v\" is BF16 (ggml type 30)"), "the first one: {why}");
        let options = ExportOptions::default();
        let plan = Plan::new(&options, stored(&blocks), Some(why.clone())).unwrap();
        assert_eq!(plan.mode, ParamsMode::Archive);
        assert!(plan.params.iter().all(|p| p.home == Home::Archive));
        assert_eq!(plan.parameters("model", vec![PathBuf::from("/m.gguf")]).len(), 1, "the archive only");
        assert!(
            plan.description().contains(&why) && plan.description().starts_with("archive, packed fail (not reference")
        );
        // Only `reference` reads the checkpoint at run time.
        let inline = ExportOptions { params: ParamsMode::Inline, ..ExportOptions::default() };
        let plan = Plan::new(&inline, stored(&blocks), Some(why)).unwrap();
        assert_eq!((plan.mode, plan.unreferenced.as_deref()), (ParamsMode::Inline, None));
    }

    /// [`IREE_GGUF_TYPES`] is what IREE 3.13 reads: a GGUF holding a
    /// `[4, 256]` tensor of each type, then an f32 one, through
    /// `iree-dump-parameters`. A type is read when the file opens and both
    /// tensors have their ggml byte lengths.
    #[test]
    fn iree_reads_exactly_the_listed_types() {
        use crate::weights::gguf_writer::{GgufWriter, TensorData};
        let dump = concat!(env!("CARGO_MANIFEST_DIR"), "/.venv/bin/iree-dump-parameters");
        assert!(Path::new(dump).is_file(), "{dump} is missing: run `make setup`");
        let work = tempfile::tempdir().unwrap();
        let mut mismatches = Vec::new();
        for ty in GgmlType::ALL {
            let path = work.path().join(format!("{ty}.gguf"));
            let mut w = GgufWriter::new(&path);
            w.add("general.architecture", "llama").unwrap();
            w.add_tensor("a", &[4, 256], ty).unwrap().add_tensor("b", &[64], GgmlType::F32).unwrap();
            w.write_data(|i| TensorData::Seeded(i as u64)).unwrap();
            let out =
                std::process::Command::new(dump).arg(format!("--parameters={}", path.display())).output().unwrap();
            // Rows end in `| LENGTH | `NAME``.
            let text = String::from_utf8_lossy(&out.stdout);
            let length = |name: &str| {
                let line = text.lines().find(|l| l.trim_end().ends_with(&format!("`{name}`")))?;
                line.split('|').rev().nth(1)?.trim().parse::<u64>().ok()
            };
            let read = out.status.success() && length("a") == ty.byte_len(1024) && length("b") == Some(256);
            if read != IREE_GGUF_TYPES.contains(&ty) {
                mismatches.push(format!("{ty}: read {read}, {}", String::from_utf8_lossy(&out.stderr).trim()));
            }
        }
        assert!(mismatches.is_empty(), "IREE_GGUF_TYPES is wrong for:\n{}", mismatches.join("\n"));
    }
}
