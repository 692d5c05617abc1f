//! The graph's textual form: what `--emit=graph` prints and `kiln lower` reads.
//!
//! ```text
//! // comments run to the end of the line
//! func @main(%x: tensor<2x4xf32>, %ids: tensor<2xi32>) {
//!   %w = param {name = "token_embd.weight"} : tensor<10x4xf32>
//!   %e = gather %w, %ids : tensor<2x4xf32>
//!   %y = add %x, %e : tensor<2x4xf32>
//!   return %y
//! }
//! ```
//!
//! One statement per line. Every node states its result type; for ops
//! whose type follows from the operands the parser re-infers it and rejects
//! a mismatch, so the text cannot describe an ill-typed graph.

use super::ops::{AttrValue, Attrs};
use super::{Graph, GraphError, Op, TensorType};
use std::fmt::Write;

/// The graph's text form, which [`parse`] reads back to an equal graph.
pub fn print(graph: &Graph) -> String {
    let mut out = String::new();
    let args: Vec<String> = graph
        .inputs()
        .iter()
        .map(|&v| {
            let n = graph.node(v);
            format!("%{}: {}", n.name, n.ty)
        })
        .collect();
    let _ = writeln!(out, "func @{}({}) {{", graph.name, args.join(", "));
    for node in graph.nodes() {
        if matches!(node.op, Op::Input) {
            continue;
        }
        let _ = write!(out, "  %{} = {}", node.name, node.op.name());
        let operands: Vec<String> = node.operands.iter().map(|&v| format!("%{}", graph.node(v).name)).collect();
        if !operands.is_empty() {
            let _ = write!(out, " {}", operands.join(", "));
        }
        let attrs = node.op.attributes();
        if !attrs.is_empty() {
            let items: Vec<String> = attrs.iter().map(|(k, v)| format!("{k} = {v}")).collect();
            let _ = write!(out, " {{{}}}", items.join(", "));
        }
        let _ = writeln!(out, " : {}", node.ty);
    }
    let outs: Vec<String> = graph.outputs().iter().map(|&v| format!("%{}", graph.node(v).name)).collect();
    let _ = writeln!(out, "  return {}", outs.join(", "));
    out.push_str("}\n");
    out
}

/// Parses the text form, re-running every op's shape rule and rejecting a
/// declared type that differs from the inferred one.
pub fn parse(text: &str) -> Result<Graph, GraphError> {
    let mut graph: Option<Graph> = None;
    let mut done = false;
    for (index, raw) in text.lines().enumerate() {
        let line_no = index + 1;
        let err = |message: String| GraphError::Parse { line: line_no, message };
        let line = strip_comment(raw).trim();
        if line.is_empty() {
            continue;
        }
        if done {
            return Err(err(format!("unexpected text after the closing '}}': '{line}'")));
        }
        let Some(g) = graph.as_mut() else {
            graph = Some(parse_header(line).map_err(err)?);
            continue;
        };
        if line == "}" {
            if g.outputs().is_empty() {
                return Err(err("function ends without a 'return'".into()));
            }
            done = true;
        } else if let Some(rest) = line.strip_prefix("return") {
            let outputs = split_top(rest, ',')
                .iter()
                .map(|s| value_ref(g, s.trim(), "return", line_no))
                .collect::<Result<Vec<_>, _>>()?;
            g.set_outputs(outputs).map_err(|e| err(e.to_string()))?;
        } else {
            parse_node(g, line, line_no)?;
        }
    }
    match graph {
        Some(g) if done => Ok(g),
        Some(_) => Err(GraphError::Parse { line: text.lines().count(), message: "missing closing '}'".into() }),
        None => Err(GraphError::Parse { line: 1, message: "empty input: expected 'func @name(...) {'".into() }),
    }
}

fn strip_comment(line: &str) -> &str {
    let (mut in_str, mut escaped) = (false, false);
    let bytes = line.as_bytes();
    for i in 0..bytes.len() {
        match bytes[i] {
            _ if escaped => escaped = false,
            b'\\' if in_str => escaped = true,
            b'"' => in_str = !in_str,
            b'/' if !in_str && bytes.get(i + 1) == Some(&b'/') => return &line[..i],
            _ => {}
        }
    }
    line
}

/// `func @name(%a: tensor<...>, ...) {`
fn parse_header(line: &str) -> Result<Graph, String> {
    let rest = line.strip_prefix("func @").ok_or_else(|| format!("expected 'func @name(...) {{', found '{line}'"))?;
    let open = rest.find('(').ok_or("expected '(' after the function name")?;
    let close = rest.rfind(')').ok_or("expected ')' closing the argument list")?;
    if rest[close + 1..].trim() != "{" {
        return Err("expected '{' after the argument list".into());
    }
    let mut graph = Graph::new(&rest[..open]);
    for arg in split_top(&rest[open + 1..close], ',') {
        let arg = arg.trim();
        if arg.is_empty() {
            continue;
        }
        let (name, ty) =
            arg.split_once(':').ok_or_else(|| format!("argument '{arg}' needs a type: %name: tensor<...>"))?;
        let name = name.trim().strip_prefix('%').ok_or_else(|| format!("argument '{arg}' must start with '%'"))?;
        let ty: TensorType = ty.trim().parse()?;
        graph.add_node(name, Op::Input, vec![], Some(ty)).map_err(|e| e.to_string())?;
    }
    Ok(graph)
}

/// `%name = op %a, %b {k = v} : tensor<...>`
fn parse_node(graph: &mut Graph, line: &str, line_no: usize) -> Result<(), GraphError> {
    let err = |message: String| GraphError::Parse { line: line_no, message };
    let (lhs, rhs) = line.split_once('=').ok_or_else(|| err(format!("expected '%name = op ...', found '{line}'")))?;
    let name =
        lhs.trim().strip_prefix('%').ok_or_else(|| err(format!("value name must start with '%': '{}'", lhs.trim())))?;
    let rhs = rhs.trim();
    let (body, ty) = match rfind_top(rhs, ':') {
        Some(i) => (rhs[..i].trim(), Some(rhs[i + 1..].trim())),
        None => (rhs, None),
    };
    let ty = ty
        .ok_or_else(|| err(format!("%{name}: missing ': tensor<...>' result type")))?
        .parse::<TensorType>()
        .map_err(|m| err(format!("%{name}: {m}")))?;
    let (op_name, rest) = body.split_once(char::is_whitespace).unwrap_or((body, ""));
    let (operand_text, attr_text) = match rest.find('{') {
        Some(i) => {
            let a = rest[i..].trim();
            let inner = a.strip_prefix('{').and_then(|a| a.strip_suffix('}'));
            (&rest[..i], Some(inner.ok_or_else(|| err(format!("%{name}: unbalanced '{{' in attributes")))?))
        }
        None => (rest, None),
    };
    let attrs = match attr_text {
        Some(t) => parse_attrs(t).map_err(|m| err(format!("%{name} ({op_name}): {m}")))?,
        None => Attrs::default(),
    };
    let op = Op::from_parts(op_name, attrs).map_err(|m| err(format!("%{name}: {m}")))?;
    let mut operands = Vec::new();
    for (index, s) in split_top(operand_text, ',').iter().enumerate() {
        let s = s.trim();
        if s.is_empty() {
            continue;
        }
        let r = s
            .strip_prefix('%')
            .ok_or_else(|| err(format!("%{name} ({op_name}): operand {index} must be a %value, found '{s}'")))?;
        let v = graph.lookup(r).ok_or_else(|| {
            let missing = GraphError::MissingOperand {
                node: name.to_string(),
                op: op_name.to_string(),
                index,
                operand: r.to_string(),
            };
            err(missing.to_string())
        })?;
        operands.push(v);
    }
    let declared = op.takes_declared_type();
    let id = graph.add_node(name, op, operands, Some(ty.clone())).map_err(|e| err(e.to_string()))?;
    let inferred = &graph.node(id).ty;
    if !declared && *inferred != ty {
        return Err(err(format!(
            "%{name} ({op_name}): result type is written as {ty} but the operands give {inferred}"
        )));
    }
    Ok(())
}

fn value_ref(graph: &Graph, s: &str, what: &str, line: usize) -> Result<super::ValueId, GraphError> {
    let name = s
        .strip_prefix('%')
        .ok_or_else(|| GraphError::Parse { line, message: format!("{what}: expected a %value, found '{s}'") })?;
    graph.lookup(name).ok_or_else(|| GraphError::Parse { line, message: format!("{what}: %{name} is not defined") })
}

fn parse_attrs(text: &str) -> Result<Attrs, String> {
    let mut attrs = Vec::new();
    for item in split_top(text, ',') {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let (k, v) = item.split_once('=').ok_or_else(|| format!("attribute '{item}' must be 'key = value'"))?;
        let (k, v) = (k.trim(), v.trim());
        if attrs.iter().any(|(name, _): &(String, AttrValue)| name == k) {
            return Err(format!("attribute '{k}' is given twice"));
        }
        attrs.push((k.to_string(), parse_attr_value(v).map_err(|m| format!("attribute '{k}': {m}"))?));
    }
    Ok(Attrs(attrs))
}

fn parse_attr_value(v: &str) -> Result<AttrValue, String> {
    if let Some(inner) = v.strip_prefix('[') {
        let inner = inner.strip_suffix(']').ok_or("unclosed '['")?;
        let ints = inner
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| match s {
                // A `?` dim's limit in `slice`.
                "?" => Ok(super::DYNAMIC),
                _ => s
                    .parse::<usize>()
                    .ok()
                    .filter(|&i| i != super::DYNAMIC)
                    .ok_or_else(|| format!("'{s}' is not a non-negative integer")),
            })
            .collect::<Result<Vec<_>, _>>()?;
        return Ok(AttrValue::Ints(ints));
    }
    if let Some(inner) = v.strip_prefix('"') {
        inner.strip_suffix('"').ok_or("unclosed string")?;
        return serde_json::from_str::<String>(v).map(AttrValue::Str).map_err(|e| format!("bad string {v}: {e}"));
    }
    if let Ok(i) = v.parse::<usize>() {
        return Ok(AttrValue::Int(i));
    }
    let starts_numeric = v.starts_with(|c: char| c.is_ascii_digit() || c == '-' || c == '+' || c == '.');
    if starts_numeric || matches!(v, "inf" | "NaN") {
        return v.parse::<f64>().map(AttrValue::Float).map_err(|_| format!("'{v}' is not a number"));
    }
    if v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') && !v.is_empty() {
        return Ok(AttrValue::Ident(v.to_string()));
    }
    Err(format!("cannot read value '{v}'"))
}

/// Splits at `sep` outside brackets, braces, angle brackets and strings.
fn split_top(text: &str, sep: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut in_str, mut escaped, mut start) = (0i32, false, false, 0);
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if in_str => escaped = true,
            '"' => in_str = !in_str,
            '[' | '{' | '<' | '(' if !in_str => depth += 1,
            ']' | '}' | '>' | ')' if !in_str => depth -= 1,
            c if c == sep && depth == 0 && !in_str => {
                parts.push(&text[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

/// Last `sep` outside brackets and strings.
fn rfind_top(text: &str, sep: char) -> Option<usize> {
    let parts = split_top(text, sep);
    (parts.len() > 1).then(|| text.len() - parts.last().map_or(0, |p| p.len()) - sep.len_utf8())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"
// an embedding, a linear layer and a softmax-ish tail
func @main(%x: tensor<2x4xf32>, %ids: tensor<2xi32>) {
  %w = param {name = "token_embd.weight"} : tensor<10x4xf32>
  %e = gather %w, %ids : tensor<2x4xf32>
  %y = add %x, %e : tensor<2x4xf32>
  %z = dot_general %y, %w {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [1]} : tensor<2x10xf32>
  %m = reduce %z {kind = max, dimensions = [1]} : tensor<2xf32>
  %c = constant {value = 1e-5} : tensor<2xf32>
  %s = add %m, %c : tensor<2xf32>
  %p = compare %s, %c {comparison_direction = GT} : tensor<2xi1>
  %q = select %p, %s, %c : tensor<2xf32>
  return %q, %z
}
"#;

    #[test]
    fn prints_and_parses_back() {
        let g = parse(SAMPLE).unwrap();
        assert_eq!(g.nodes().len(), 11);
        assert_eq!(g.inputs().len(), 2);
        assert_eq!(g.outputs().len(), 2);
        let printed = print(&g);
        let again = parse(&printed).unwrap();
        assert_eq!(g, again);
        assert_eq!(printed, print(&again));
    }

    /// Pruning keeps the inputs and what the outputs read, in order.
    #[test]
    fn pruned_drops_what_the_outputs_do_not_read() {
        let g = parse(SAMPLE).unwrap();
        let z = g.outputs()[1];
        let mut only_z = g.clone();
        only_z.set_outputs(vec![z]).unwrap();
        let pruned = only_z.pruned();
        let expected = "func @main(%x: tensor<2x4xf32>, %ids: tensor<2xi32>) {\n  %w = param {name = \"token_embd.weight\"} : tensor<10x4xf32>\n  %e = gather %w, %ids : tensor<2x4xf32>\n  %y = add %x, %e : tensor<2x4xf32>\n  %z = dot_general %y, %w {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [1]} : tensor<2x10xf32>\n  return %z\n}\n";
        assert_eq!(print(&pruned), expected);
        assert_eq!(parse(expected).unwrap(), pruned);
        assert_eq!(g.pruned(), g, "a graph whose outputs read every node");
    }

    #[test]
    fn tied_param_is_one_node() {
        let text = "func @f(%i: tensor<2xi32>) {\n  %a = param {name = \"w\"} : tensor<3x2xf32>\n  %b = param {name = \"w\"} : tensor<3x2xf32>\n  return %a\n}\n";
        let g = parse(text.replace("return %a", "return %a, %b").as_str()).unwrap();
        assert_eq!(g.params().count(), 1);
        assert_eq!(g.outputs()[0], g.outputs()[1]);
    }

    #[test]
    fn names_with_quotes_and_slashes_round_trip() {
        let text = "func @f(%x: tensor<2xf32>) {\n  %w = param {name = \"a\\\"b//c\"} : tensor<2xf32> // tail\n  %y = add %x, %w : tensor<2xf32>\n  return %y\n}\n";
        let g = parse(text).unwrap();
        assert_eq!(g.params().next().unwrap().1, "a\"b//c");
        assert_eq!(parse(&print(&g)).unwrap(), g);
    }

    #[test]
    fn slicing_padding_bit_ops_and_dequantize_round_trip() {
        let text = r#"func @f(%cache: tensor<8x4xf16>, %row: tensor<1x4xf16>, %pos: tensor<i32>, %q: tensor<4x2xui8>, %raw: tensor<34xi8>) {
  %zero = constant {value = 0.0} : tensor<i32>
  %c = dynamic_update_slice %cache, %row, %pos, %zero : tensor<8x4xf16>
  %w = dynamic_slice %c, %pos, %zero {slice_sizes = [2, 4]} : tensor<2x4xf16>
  %v = constant {value = 0.0} : tensor<f16>
  %p = pad %w, %v {edge_padding_low = [1, 0], edge_padding_high = [0, 0], interior_padding = [0, 1]} : tensor<3x7xf16>
  %four = constant {value = 4.0} : tensor<4x2xui8>
  %hi = shift_right_logical %q, %four : tensor<4x2xui8>
  %lo = and %q, %four : tensor<4x2xui8>
  %n = not %lo : tensor<4x2xui8>
  %h = bitcast_convert %hi : tensor<4xf16>
  %e = erf %h : tensor<4xf16>
  %pw = power %e, %h : tensor<4xf16>
  %d = dequantize %raw {ggml_type = Q8_0} : tensor<32xf32>
  return %p, %n, %pw, %d
}
"#;
        let g = parse(text).unwrap();
        assert_eq!(print(&g), text);
        let bad = text.replace("slice_sizes = [2, 4]", "slice_sizes = [2, 4], strides = [1, 1]");
        let e = parse(&bad).unwrap_err().to_string();
        assert!(e.contains("op 'dynamic_slice' has no attribute 'strides'"), "{e}");
        let neg = text.replace("edge_padding_low = [1, 0]", "edge_padding_low = [-1, 0]");
        let e = parse(&neg).unwrap_err().to_string();
        assert!(e.contains("'-1' is not a non-negative integer"), "{e}");
    }

    #[test]
    fn a_real_dynamic_slice_gives_the_dynamic_size() {
        let text = r#"func @f(%cache: tensor<8x4xf32>, %bounds: tensor<2xi32>) {
  %ones = constant {value = 1.0} : tensor<2xi32>
  %filled = real_dynamic_slice %cache, %bounds, %bounds, %ones : tensor<?x4xf32>
  %i = iota {iota_dimension = 0} : tensor<?x4xf32>
  %y = add %filled, %i : tensor<?x4xf32>
  return %y
}
"#;
        let g = parse(text).unwrap();
        assert_eq!(print(&g), text);
        // Before the slice, nothing gives `?` a size.
        let early = text
            .replace("  %i = iota {iota_dimension = 0} : tensor<?x4xf32>\n", "")
            .replace("  %filled =", "  %i = iota {iota_dimension = 0} : tensor<?x4xf32>\n  %filled =");
        let e = parse(&early).unwrap_err().to_string();
        assert!(e.contains("node %i: its type tensor<?x4xf32> has a ? dim, but no function input"), "{e}");
    }

    #[test]
    fn errors_name_line_node_and_reason() {
        let cases = [
            ("func @f(%x: tensor<2xf32>) {\n  %y = add %x, %nope : tensor<2xf32>\n  return %y\n}", "%nope"),
            (
                "func @f(%x: tensor<2xf32>) {\n  %y = frobnicate %x : tensor<2xf32>\n  return %y\n}",
                "unknown op 'frobnicate'",
            ),
            (
                "func @f(%x: tensor<2xf32>) {\n  %y = add %x, %x : tensor<3xf32>\n  return %y\n}",
                "written as tensor<3xf32>",
            ),
            ("func @f(%x: tensor<2xf32>) {\n  %y = add %x, %x : tensor<2xf32>\n", "missing closing"),
            (
                "func @f(%x: tensor<2xf32>) {\n  %y = transpose %x {perm = [0]} : tensor<2xf32>\n  return %y\n}",
                "missing attribute 'permutation'",
            ),
        ];
        for (text, needle) in cases {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(needle), "error '{e}' should contain '{needle}'");
        }
    }
}
