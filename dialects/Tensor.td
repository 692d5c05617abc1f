// kiln's ODS subset of MLIR's `tensor` and `arith` dialects: what a reshape
// with a `?` dim lowers to. iree-compile 3.13 cannot legalize
// `stablehlo.dynamic_reshape` ("failed to legalize operation ... explicitly
// marked illegal") but handles `tensor.collapse_shape`/`expand_shape` with
// dynamic dims natively. Unregistered in kiln's context, like `stablehlo`.

include "mlir/IR/OpBase.td"

def Tensor_Dialect : Dialect {
  let name = "tensor";
  let cppNamespace = "::kiln::tensor";
  let description = "The subset of the tensor dialect that kiln emits.";
}

class Tensor_Op<string mnemonic, list<Trait> traits = []>
    : Op<Tensor_Dialect, mnemonic, traits>;

// The size of dim `index` of `source`, as an `index`.
def Tensor_DimOp : Tensor_Op<"dim"> {
  let arguments = (ins AnyTensor:$source, Index:$index);
  let results = (outs Index:$result);
}

// `reassociation`: `[[0, 1], [2]]`, the source dims each result dim merges.
def Tensor_CollapseShapeOp : Tensor_Op<"collapse_shape"> {
  let arguments = (ins AnyTensor:$src, AnyAttr:$reassociation);
  let results = (outs AnyTensor:$result);
}

// `static_output_shape` holds i64::MIN for each `?`, whose size is the
// matching `output_shape` operand.
def Tensor_ExpandShapeOp : Tensor_Op<"expand_shape"> {
  let arguments = (ins AnyTensor:$src, Variadic<Index>:$output_shape,
                   AnyAttr:$reassociation,
                   DenseI64ArrayAttr:$static_output_shape);
  let results = (outs AnyTensor:$result);
}

// A ranked tensor of the given scalars: the `?` size as `tensor<1xi64>`.
def Tensor_FromElementsOp : Tensor_Op<"from_elements"> {
  let arguments = (ins Variadic<AnyType>:$elements);
  let results = (outs AnyTensor:$result);
}
