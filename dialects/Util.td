// kiln's ODS subset of IREE's `util` dialect: globals that hold weights.
//
// A weight is `util.global private @name {initial_value = #flow.parameter.named<...>}`
// and is read where used with `util.global.load`. Names follow IREE's
// `compiler/src/iree/compiler/Dialect/Util/IR/UtilOps.td`.

include "mlir/IR/OpBase.td"
include "mlir/IR/CommonAttrConstraints.td"

def Util_Dialect : Dialect {
  let name = "util";
  let cppNamespace = "::kiln::util";
  let description = "The subset of IREE's util dialect that kiln emits.";
}

class Util_Op<string mnemonic, list<Trait> traits = []>
    : Op<Util_Dialect, mnemonic, traits>;

def Util_GlobalOp : Util_Op<"global"> {
  let arguments = (ins StrAttr:$sym_name,
                   StrAttr:$sym_visibility,
                   TypeAttr:$type,
                   AnyAttr:$initial_value);
}

def Util_GlobalLoadOp : Util_Op<"global.load"> {
  let arguments = (ins FlatSymbolRefAttr:$global);
  let results = (outs AnyType:$result);
}
