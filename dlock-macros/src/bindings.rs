//! The names a key template may use: every binding of every parameter's
//! pattern, so `Path(id): Path<u64>` binds `id` and `Json(req): Json<Pay>`
//! binds `req` (then `{req.order_id}`), as web handlers take their input.

use syn::{FnArg, Pat, Signature};

/// Every name bound by the patterns of `sig`'s parameters but the guard's
/// (at `guard`), in order of appearance, each once.
pub(crate) fn bound_names(sig: &Signature, guard: Option<usize>) -> Vec<String> {
    let mut names = Vec::new();
    for (index, input) in sig.inputs.iter().enumerate() {
        if Some(index) == guard {
            continue;
        }
        if let FnArg::Typed(arg) = input {
            collect(&arg.pat, &mut names);
        }
    }
    names
}

/// Adds the names `pat` binds: `x`, `mut x`, `ref x`, `x @ ..` and whatever
/// nested tuple, tuple-struct, struct, slice, reference and or-patterns
/// bind (the alternatives of an or-pattern bind the same names).
fn collect(pat: &Pat, names: &mut Vec<String>) {
    let mut push = |name: String| {
        if !names.contains(&name) {
            names.push(name);
        }
    };
    match pat {
        Pat::Ident(ident) => {
            push(ident.ident.to_string());
            if let Some((_, sub)) = &ident.subpat {
                collect(sub, names);
            }
        }
        Pat::Tuple(tuple) => tuple.elems.iter().for_each(|p| collect(p, names)),
        Pat::TupleStruct(tuple) => tuple.elems.iter().for_each(|p| collect(p, names)),
        Pat::Struct(strukt) => strukt.fields.iter().for_each(|f| collect(&f.pat, names)),
        Pat::Slice(slice) => slice.elems.iter().for_each(|p| collect(p, names)),
        Pat::Reference(reference) => collect(&reference.pat, names),
        Pat::Paren(paren) => collect(&paren.pat, names),
        Pat::Type(typed) => collect(&typed.pat, names),
        Pat::Or(or) => {
            if let Some(first) = or.cases.first() {
                collect(first, names);
            }
        }
        // Literals, ranges, paths, `_`, `..`, macros: they bind nothing.
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(sig: &str) -> Vec<String> {
        let sig: Signature = syn::parse_str(sig).unwrap();
        bound_names(&sig, None)
    }

    #[test]
    fn every_kind_of_pattern_binds_its_names() {
        assert_eq!(
            names("async fn pay(Path(id): Path<u64>, State(s): State<App>, plain: u8)"),
            ["id", "s", "plain"]
        );
        assert_eq!(
            names("fn f(Point { x, y: mut why, .. }: Point, (a, (b, ref c)): T, [d, _]: [u8; 2])"),
            ["x", "why", "a", "b", "c", "d"]
        );
        assert_eq!(
            names("fn f(&(n, _): &(u8, u8), whole @ Wrap(inner): Wrap, _: u8)"),
            ["n", "whole", "inner"]
        );
        assert!(names("fn f(_: u8, (): ())").is_empty());
    }
}
