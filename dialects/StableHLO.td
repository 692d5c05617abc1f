// kiln's ODS subset of the StableHLO dialect: exactly the ops kiln emits.
//
// melior's `dialect!` macro turns these into typed Rust builders. The
// `stablehlo` namespace is not registered in kiln's MLIR context, so the
// module prints in generic form, which iree-compile parses. Operand,
// attribute and result names follow openxla/stablehlo `docs/spec.md`.
// Attributes that are StableHLO-specific (`#stablehlo.dot<...>`,
// `#stablehlo<comparison_direction ...>`) are `AnyAttr` here and parsed
// through the C API when built.

include "mlir/IR/OpBase.td"
include "mlir/IR/CommonAttrConstraints.td"

def StableHLO_Dialect : Dialect {
  let name = "stablehlo";
  let cppNamespace = "::kiln::stablehlo";
  let description = "The subset of StableHLO that kiln emits.";
}

class StableHLO_Op<string mnemonic, list<Trait> traits = []>
    : Op<StableHLO_Dialect, mnemonic, traits>;

class StableHLO_UnaryOp<string mnemonic> : StableHLO_Op<mnemonic> {
  let arguments = (ins AnyTensor:$operand);
  let results = (outs AnyTensor:$result);
}

class StableHLO_BinaryOp<string mnemonic> : StableHLO_Op<mnemonic> {
  let arguments = (ins AnyTensor:$lhs, AnyTensor:$rhs);
  let results = (outs AnyTensor:$result);
}

// Element-wise.
def StableHLO_AddOp : StableHLO_BinaryOp<"add">;
def StableHLO_SubtractOp : StableHLO_BinaryOp<"subtract">;
def StableHLO_MultiplyOp : StableHLO_BinaryOp<"multiply">;
def StableHLO_DivideOp : StableHLO_BinaryOp<"divide">;
def StableHLO_MaximumOp : StableHLO_BinaryOp<"maximum">;
def StableHLO_MinimumOp : StableHLO_BinaryOp<"minimum">;
def StableHLO_PowerOp : StableHLO_BinaryOp<"power">;

def StableHLO_NegateOp : StableHLO_UnaryOp<"negate">;
def StableHLO_ExpOp : StableHLO_UnaryOp<"exponential">;
def StableHLO_LogOp : StableHLO_UnaryOp<"log">;
def StableHLO_SqrtOp : StableHLO_UnaryOp<"sqrt">;
def StableHLO_RsqrtOp : StableHLO_UnaryOp<"rsqrt">;
def StableHLO_TanhOp : StableHLO_UnaryOp<"tanh">;
def StableHLO_LogisticOp : StableHLO_UnaryOp<"logistic">;
def StableHLO_AbsOp : StableHLO_UnaryOp<"abs">;
def StableHLO_SignOp : StableHLO_UnaryOp<"sign">;
def StableHLO_FloorOp : StableHLO_UnaryOp<"floor">;
def StableHLO_RoundNearestEvenOp : StableHLO_UnaryOp<"round_nearest_even">;
def StableHLO_CosineOp : StableHLO_UnaryOp<"cosine">;
def StableHLO_SineOp : StableHLO_UnaryOp<"sine">;
def StableHLO_ConvertOp : StableHLO_UnaryOp<"convert">;

// Bits.
def StableHLO_AndOp : StableHLO_BinaryOp<"and">;
def StableHLO_OrOp : StableHLO_BinaryOp<"or">;
def StableHLO_XorOp : StableHLO_BinaryOp<"xor">;
def StableHLO_NotOp : StableHLO_UnaryOp<"not">;
def StableHLO_ShiftLeftOp : StableHLO_BinaryOp<"shift_left">;
def StableHLO_ShiftRightLogicalOp : StableHLO_BinaryOp<"shift_right_logical">;
def StableHLO_ShiftRightArithmeticOp : StableHLO_BinaryOp<"shift_right_arithmetic">;
def StableHLO_BitcastConvertOp : StableHLO_UnaryOp<"bitcast_convert">;

def StableHLO_ClampOp : StableHLO_Op<"clamp"> {
  let arguments = (ins AnyTensor:$min, AnyTensor:$operand, AnyTensor:$max);
  let results = (outs AnyTensor:$result);
}

def StableHLO_CompareOp : StableHLO_Op<"compare"> {
  // `#stablehlo<comparison_direction LT>`
  let arguments = (ins AnyTensor:$lhs, AnyTensor:$rhs,
                   AnyAttr:$comparison_direction);
  let results = (outs AnyTensor:$result);
}

def StableHLO_SelectOp : StableHLO_Op<"select"> {
  let arguments = (ins AnyTensor:$pred, AnyTensor:$on_true, AnyTensor:$on_false);
  let results = (outs AnyTensor:$result);
}

// Constants.
def StableHLO_ConstantOp : StableHLO_Op<"constant"> {
  let arguments = (ins AnyAttr:$value);
  let results = (outs AnyTensor:$output);
}

def StableHLO_IotaOp : StableHLO_Op<"iota"> {
  let arguments = (ins AnyAttr:$iota_dimension);
  let results = (outs AnyTensor:$output);
}

// Shape.
def StableHLO_ReshapeOp : StableHLO_UnaryOp<"reshape">;

def StableHLO_TransposeOp : StableHLO_Op<"transpose"> {
  let arguments = (ins AnyTensor:$operand, DenseI64ArrayAttr:$permutation);
  let results = (outs AnyTensor:$result);
}

def StableHLO_ReverseOp : StableHLO_Op<"reverse"> {
  let arguments = (ins AnyTensor:$operand, DenseI64ArrayAttr:$dimensions);
  let results = (outs AnyTensor:$result);
}

def StableHLO_BroadcastInDimOp : StableHLO_Op<"broadcast_in_dim"> {
  let arguments = (ins AnyTensor:$operand,
                   DenseI64ArrayAttr:$broadcast_dimensions);
  let results = (outs AnyTensor:$result);
}

def StableHLO_ConcatenateOp : StableHLO_Op<"concatenate"> {
  let arguments = (ins Variadic<AnyTensor>:$inputs, AnyAttr:$dimension);
  let results = (outs AnyTensor:$result);
}

def StableHLO_SliceOp : StableHLO_Op<"slice"> {
  let arguments = (ins AnyTensor:$operand,
                   DenseI64ArrayAttr:$start_indices,
                   DenseI64ArrayAttr:$limit_indices,
                   DenseI64ArrayAttr:$strides);
  let results = (outs AnyTensor:$result);
}

def StableHLO_PadOp : StableHLO_Op<"pad"> {
  let arguments = (ins AnyTensor:$operand, AnyTensor:$padding_value,
                   DenseI64ArrayAttr:$edge_padding_low,
                   DenseI64ArrayAttr:$edge_padding_high,
                   DenseI64ArrayAttr:$interior_padding);
  let results = (outs AnyTensor:$result);
}

// Slices at runtime positions: one 0-d integer tensor per operand dim.
def StableHLO_DynamicSliceOp : StableHLO_Op<"dynamic_slice"> {
  let arguments = (ins AnyTensor:$operand, Variadic<AnyTensor>:$start_indices,
                   DenseI64ArrayAttr:$slice_sizes);
  let results = (outs AnyTensor:$result);
}

def StableHLO_DynamicUpdateSliceOp : StableHLO_Op<"dynamic_update_slice"> {
  let arguments = (ins AnyTensor:$operand, AnyTensor:$update,
                   Variadic<AnyTensor>:$start_indices);
  let results = (outs AnyTensor:$result);
}

// Dynamic shapes: a `?` dim's size is read with get_dimension_size, and
// ops whose result shape is not implied by their operands take it as a
// 1-d integer tensor (`output_shape`, `output_dimensions`).
def StableHLO_GetDimensionSizeOp : StableHLO_Op<"get_dimension_size"> {
  let arguments = (ins AnyTensor:$operand, AnyAttr:$dimension);
  let results = (outs AnyTensor:$result);
}

def StableHLO_DynamicIotaOp : StableHLO_Op<"dynamic_iota"> {
  let arguments = (ins AnyTensor:$output_shape, AnyAttr:$iota_dimension);
  let results = (outs AnyTensor:$result);
}

def StableHLO_DynamicReshapeOp : StableHLO_Op<"dynamic_reshape"> {
  let arguments = (ins AnyTensor:$operand, AnyTensor:$output_shape);
  let results = (outs AnyTensor:$result);
}

// The hints say which operand dims expand (size 1 to more) and which keep
// their size: iree-compile cannot legalize the op without them when an
// operand dim is `?` ("failed to legalize ... explicitly marked illegal").
def StableHLO_DynamicBroadcastInDimOp : StableHLO_Op<"dynamic_broadcast_in_dim"> {
  let arguments = (ins AnyTensor:$operand, AnyTensor:$output_dimensions,
                   DenseI64ArrayAttr:$broadcast_dimensions,
                   DenseI64ArrayAttr:$known_expanding_dimensions,
                   DenseI64ArrayAttr:$known_nonexpanding_dimensions);
  let results = (outs AnyTensor:$result);
}

def StableHLO_RealDynamicSliceOp : StableHLO_Op<"real_dynamic_slice"> {
  let arguments = (ins AnyTensor:$operand, AnyTensor:$start_indices,
                   AnyTensor:$limit_indices, AnyTensor:$strides);
  let results = (outs AnyTensor:$result);
}

// Contractions and indexing.
def StableHLO_DotGeneralOp : StableHLO_Op<"dot_general"> {
  // `#stablehlo.dot<lhs_batching_dimensions = ..., ...>`
  let arguments = (ins AnyTensor:$lhs, AnyTensor:$rhs,
                   AnyAttr:$dot_dimension_numbers);
  let results = (outs AnyTensor:$result);
}

def StableHLO_GatherOp : StableHLO_Op<"gather"> {
  // `#stablehlo.gather<offset_dims = ..., ...>`
  let arguments = (ins AnyTensor:$operand, AnyTensor:$start_indices,
                   AnyAttr:$dimension_numbers,
                   DenseI64ArrayAttr:$slice_sizes);
  let results = (outs AnyTensor:$result);
}

// Reductions: `inputs` and `init_values` are variadic with the same size,
// one result per input, reduced together by one body.
def StableHLO_ReduceOp : StableHLO_Op<"reduce", [SameVariadicOperandSize]> {
  let arguments = (ins Variadic<AnyTensor>:$inputs, Variadic<AnyTensor>:$init_values,
                   DenseI64ArrayAttr:$dimensions);
  let results = (outs Variadic<AnyTensor>:$results);
  let regions = (region AnyRegion:$body);
}

def StableHLO_ReturnOp : StableHLO_Op<"return", [Terminator]> {
  let arguments = (ins Variadic<AnyTensor>:$results);
}

// Control flow: `cond` yields a `tensor<i1>` from the loop-carried values,
// `body` yields their next values (both end with stablehlo.return).
def StableHLO_WhileOp : StableHLO_Op<"while"> {
  let arguments = (ins Variadic<AnyTensor>:$operand);
  let results = (outs Variadic<AnyTensor>:$results);
  let regions = (region AnyRegion:$cond, AnyRegion:$body);
}

// `true_branch` when `pred` (a `tensor<i1>`) holds, else `false_branch`;
// each ends with stablehlo.return of the results.
def StableHLO_IfOp : StableHLO_Op<"if"> {
  let arguments = (ins AnyTensor:$pred);
  let results = (outs Variadic<AnyTensor>:$results);
  let regions = (region AnyRegion:$true_branch, AnyRegion:$false_branch);
}
