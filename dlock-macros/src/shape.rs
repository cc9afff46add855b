//! What kind of function the attribute sits on: an `async fn`, or a method
//! `#[async_trait]` already rewrote into `Box::pin(async move { .. })`.

use quote::ToTokens;
use syn::{Expr, ExprAsync, GenericArgument, ItemFn, PathArguments, ReturnType, Stmt, Type};

/// What kind of function the attribute sits on.
pub(crate) enum Shape {
    /// `async fn ... -> Output`.
    Async { output: Type },
    /// A method already rewritten by `#[async_trait]` (which runs first, as
    /// the attribute of the enclosing `impl`): `fn ... -> Pin<Box<dyn
    /// Future<Output = Output> + ...>>` whose body is `Box::pin(async move { .. })`.
    AsyncTrait { output: Type },
}

impl Shape {
    pub(crate) fn of(func: &ItemFn) -> syn::Result<Shape> {
        let sig = &func.sig;
        if sig.asyncness.is_none() {
            if let (Some(output), true) = (future_output(&sig.output), is_async_trait_body(func)) {
                return Ok(Shape::AsyncTrait { output });
            }
            return Err(syn::Error::new_spanned(
                sig.fn_token,
                "#[distributed_lock] needs an `async fn`; add `async`",
            ));
        }
        match &sig.output {
            ReturnType::Type(_, ty) => Ok(Shape::Async {
                output: (**ty).clone(),
            }),
            ReturnType::Default => {
                let mut name_and_params = sig.ident.to_token_stream();
                sig.paren_token
                    .surround(&mut name_and_params, |tokens| sig.inputs.to_tokens(tokens));
                Err(syn::Error::new_spanned(
                    name_and_params,
                    "#[distributed_lock] needs a return type `-> Result<T, E>` with `E: From<dlock::LockError>`, to report a lock that could not be taken; add e.g. `-> Result<(), dlock::LockError>`",
                ))
            }
        }
    }
}

/// `Output` in `Pin<Box<dyn Future<Output = Output> + Send + 'async_trait>>`.
fn future_output(output: &ReturnType) -> Option<Type> {
    let ReturnType::Type(_, ty) = output else {
        return None;
    };
    find_output(ty)
}

fn find_output(ty: &Type) -> Option<Type> {
    match ty {
        Type::Path(path) => path.path.segments.iter().find_map(|segment| {
            let PathArguments::AngleBracketed(args) = &segment.arguments else {
                return None;
            };
            args.args.iter().find_map(|arg| match arg {
                GenericArgument::AssocType(assoc) if assoc.ident == "Output" => {
                    Some(assoc.ty.clone())
                }
                GenericArgument::Type(inner) => find_output(inner),
                _ => None,
            })
        }),
        Type::TraitObject(object) => object.bounds.iter().find_map(|bound| match bound {
            syn::TypeParamBound::Trait(t) => find_output(&Type::Path(syn::TypePath {
                qself: None,
                path: t.path.clone(),
            })),
            _ => None,
        }),
        Type::Group(group) => find_output(&group.elem),
        Type::Paren(paren) => find_output(&paren.elem),
        _ => None,
    }
}

fn is_async_trait_body(func: &ItemFn) -> bool {
    let mut func = func.clone();
    async_trait_block(&mut func).is_some()
}

/// The `async move` block in async-trait's `Box::pin(async move { .. })`.
pub(crate) fn async_trait_block(func: &mut ItemFn) -> Option<&mut ExprAsync> {
    let Some(Stmt::Expr(Expr::Call(call), None)) = func.block.stmts.last_mut() else {
        return None;
    };
    let Expr::Path(path) = &*call.func else {
        return None;
    };
    let is_box_pin = path.path.segments.len() >= 2
        && path
            .path
            .segments
            .iter()
            .rev()
            .take(2)
            .map(|s| s.ident.to_string())
            .eq(["pin", "Box"]);
    if !is_box_pin || call.args.len() != 1 {
        return None;
    }
    match call.args.first_mut() {
        Some(Expr::Async(block)) if block.capture.is_some() => Some(block),
        _ => None,
    }
}
