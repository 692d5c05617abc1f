// llvm-cpu configs of kiln's packed products, applied by tag at compile time
// (`iree-compile --iree-codegen-tuning-spec-path=THIS`; `kiln compile
// --target host` and KilnExport.cmake pass it). The lowering tags each
// packed generic `kiln.kernel = "packed_matvec_t<T>"`: T tiles of 16 rows
// per workgroup, one tile (16 rows in the lanes) per vector step, one block
// per reduction step (why: src/lower/packed_matvec.rs). GPU targets get no spec and
// choose their own configs.
module attributes {transform.with_named_sequence} {
  transform.named_sequence @main(%root: !transform.any_op {transform.readonly}) -> !transform.any_op
      attributes {iree_codegen.tuning_spec_entrypoint} {
    %packed_matvec_t1 = transform.structured.match ops{["linalg.generic"]} attributes {kiln.kernel = "packed_matvec_t1"} in %root
      : (!transform.any_op) -> !transform.any_op
    %packed_matvec_t1_config = transform.param.constant #iree_codegen.compilation_info<
      lowering_config = #iree_cpu.lowering_config<distribution = [1, 16, 0], vector_common_parallel = [1, 16, 0], vector_reduction = [0, 0, 1]>,
      translation_info = #iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<DoubleTilingExpert>>> -> !transform.any_param
    transform.annotate %packed_matvec_t1 "compilation_info" = %packed_matvec_t1_config : !transform.any_op, !transform.any_param
    %packed_matvec_t4 = transform.structured.match ops{["linalg.generic"]} attributes {kiln.kernel = "packed_matvec_t4"} in %root
      : (!transform.any_op) -> !transform.any_op
    %packed_matvec_t4_config = transform.param.constant #iree_codegen.compilation_info<
      lowering_config = #iree_cpu.lowering_config<distribution = [4, 16, 0], vector_common_parallel = [1, 16, 0], vector_reduction = [0, 0, 1]>,
      translation_info = #iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<DoubleTilingExpert>>> -> !transform.any_param
    transform.annotate %packed_matvec_t4 "compilation_info" = %packed_matvec_t4_config : !transform.any_op, !transform.any_param
    transform.yield %root : !transform.any_op
  }
}
