// kiln's ODS subset of CHLO ("client HLO"): ops StableHLO lacks that
// iree-compile accepts with `--iree-input-type=stablehlo` and decomposes.
// Like `stablehlo`, the `chlo` namespace is unregistered in kiln's context,
// so the ops print in generic form.

include "mlir/IR/OpBase.td"

def CHLO_Dialect : Dialect {
  let name = "chlo";
  let cppNamespace = "::kiln::chlo";
  let description = "The subset of CHLO that kiln emits.";
}

class CHLO_Op<string mnemonic, list<Trait> traits = []>
    : Op<CHLO_Dialect, mnemonic, traits>;

// The Gauss error function, element-wise on floats.
def CHLO_ErfOp : CHLO_Op<"erf"> {
  let arguments = (ins AnyTensor:$operand);
  let results = (outs AnyTensor:$result);
}
