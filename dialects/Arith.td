// kiln's ODS subset of MLIR's `arith` dialect: the `index` constants that
// `tensor.dim` takes (see Tensor.td).

include "mlir/IR/OpBase.td"

def Arith_Dialect : Dialect {
  let name = "arith";
  let cppNamespace = "::kiln::arith";
  let description = "The subset of the arith dialect that kiln emits.";
}

def Arith_ConstantOp : Op<Arith_Dialect, "constant"> {
  let arguments = (ins AnyAttr:$value);
  let results = (outs AnyType:$result);
}

def Arith_IndexCastOp : Op<Arith_Dialect, "index_cast"> {
  let arguments = (ins AnyType:$in);
  let results = (outs AnyType:$out);
}
