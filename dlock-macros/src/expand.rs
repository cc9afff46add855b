//! Code generation: check the function, then wrap its body in
//! acquire → run with the lease held → release.
//!
//! The user's signature, attributes, generics and `where` clause are kept
//! as written; only the body is replaced (and the `&LockGuard` parameter,
//! if any, removed, since callers do not pass it).

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{Ident, ItemFn, Type};

use crate::args::{Args, Mode, OnLost};
use crate::bindings::bound_names;
use crate::error::Errors;
use crate::guard_param::{find_guard, remove_param};
use crate::key::{Scope, Template};
use crate::shape::{async_trait_block, Shape};

/// The attribute's entry point: the expanded function, or the errors
/// together with the function as callers see it (see [`stand_in`]), so the
/// user sees our error, not a cascade of "cannot find function" at every
/// call site or "not a `Handler`" where it is routed.
pub(crate) fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    match expand(args, &item) {
        Ok(expanded) => expanded,
        Err(errors) => {
            let mut output = errors.to_compile_error();
            output.extend(stand_in(item));
            output
        }
    }
}

/// The function beside a compile error: its signature as the expansion
/// would have it (the `&LockGuard` parameter removed: callers do not pass
/// it, and axum would say it is no extractor), its body unchanged behind a
/// `let guard: &LockGuard = unreachable!()`, so the body's own errors still
/// show but none of ours repeats. Anything the macro cannot read is
/// emitted as written.
fn stand_in(item: TokenStream) -> TokenStream {
    let Ok(mut func) = syn::parse2::<ItemFn>(item.clone()) else {
        return item;
    };
    let Ok(Some(guard)) = find_guard(&func.sig) else {
        return item;
    };
    remove_param(&mut func.sig, &guard);
    let pat = &guard.pat;
    let guard_type = &guard.guard_type;
    let stmts = &func.block.stmts;
    *func.block = syn::parse_quote!({
        let #pat: &#guard_type = ::core::unreachable!();
        #(#stmts)*
    });
    func.attrs
        .push(syn::parse_quote!(#[allow(unreachable_code, unused_variables, unused_mut)]));
    func.into_token_stream()
}

fn expand(args: TokenStream, item: &TokenStream) -> syn::Result<TokenStream> {
    let mut errors = Errors::default();
    let args = Args::parse(args, &mut errors);
    let Ok(mut func) = syn::parse2::<ItemFn>(item.clone()) else {
        return Err(errors.with(not_a_function(item.clone())));
    };
    let shape = errors.keep(Shape::of(&func));
    let guard = errors.keep(find_guard(&func.sig));
    // One template for `key`, one per element of `keys`; every one is
    // parsed and checked, so all mistakes show up in one build.
    let multi = args.keys.is_some();
    let lits: Vec<&syn::LitStr> = match (&args.keys, &args.key) {
        (Some(keys), _) => keys.iter().collect(),
        (None, Some(key)) => vec![key],
        (None, None) => Vec::new(),
    };
    let parsed: Vec<Option<Template>> = lits
        .iter()
        .map(|lit| errors.keep(Template::parse(lit)))
        .collect();
    if let Some(Some(guard)) = &guard {
        errors.keep(guard.fits(multi));
    }
    if let Some(guard) = &guard {
        let params = bound_names(&func.sig, guard.as_ref().map(|g| g.index));
        let guard_name = guard
            .as_ref()
            .and_then(|g| g.name.as_ref())
            .map(Ident::to_string);
        let scope = Scope {
            params: &params,
            has_receiver: func.sig.receiver().is_some(),
            guard: guard_name.as_deref(),
        };
        for template in parsed.iter().flatten() {
            errors.keep(template.check(&scope));
        }
    }
    if let ([Some(template)], Some(segments)) = (parsed.as_slice(), &args.segments) {
        errors.keep(template.check_segments(segments.value));
    }
    errors.finish()?;
    let templates: Option<Vec<Template>> = parsed.into_iter().collect();
    let (Some(shape), Some(guard), Some(templates)) = (shape, guard, templates) else {
        // Every `None` above pushed an error, so this is not reached; it
        // spares an `unwrap` (the macro never panics on user input).
        return unreachable_ok();
    };
    if templates.is_empty() {
        // `Args::parse` pushed "missing `key`"; not reached either.
        return unreachable_ok();
    }

    let locals = Locals::new();
    let guard_binding = guard.as_ref().map(|g| g.binding(&locals.guard));
    if let Some(guard) = &guard {
        remove_param(&mut func.sig, guard);
    }
    let lock = Lock {
        args: &args,
        keys: templates.iter().map(Template::render).collect(),
        multi,
        guard_binding,
        locals,
    };
    match shape {
        Shape::Async { output } => {
            let stmts = &func.block.stmts;
            let body = lock.wrap(&output, quote!(#(#stmts)*));
            *func.block = syn::parse_quote!({ #body });
        }
        Shape::AsyncTrait { output } => {
            // `Box::pin(async move { <async-trait's body> })`: lock inside
            // the outer async block, run async-trait's body as ours.
            // `Shape::of` found this block; never emit the function unlocked.
            let Some(block) = async_trait_block(&mut func) else {
                return unreachable_ok();
            };
            let stmts = &block.block.stmts;
            let body = lock.wrap(&output, quote!(#(#stmts)*));
            block.block = syn::parse_quote!({ #body });
        }
    }
    Ok(func.into_token_stream())
}

/// For `let-else` arms that the checks above make impossible, without a
/// panic in the macro.
fn unreachable_ok<T>() -> syn::Result<T> {
    Err(syn::Error::new(
        Span::call_site(),
        "#[distributed_lock] could not expand this function",
    ))
}

fn not_a_function(item: TokenStream) -> syn::Error {
    let message = if syn::parse2::<syn::TraitItemFn>(item.clone()).is_ok() {
        "#[distributed_lock] needs a function body: put it on the method in the `impl`, not on the trait's declaration"
    } else {
        "#[distributed_lock] goes on an `async fn` that returns `Result<T, E>`"
    };
    match item.into_iter().next() {
        Some(first) => syn::Error::new(first.span(), message),
        None => syn::Error::new(Span::call_site(), message),
    }
}

/// Everything the generated body needs.
struct Lock<'a> {
    args: &'a Args,
    /// One rendered key, or (`multi`) one per element of `keys`.
    keys: Vec<TokenStream>,
    /// `keys = [..]`: a `MultiLock`, run by its own `run_*`/`finish_*`.
    multi: bool,
    guard_binding: Option<TokenStream>,
    locals: Locals,
}

/// The generated body's own variables. Their mixed-site span makes them
/// invisible to the user's code: they can neither shadow nor be shadowed by
/// the user's names. The user's tokens (body, key, guard pattern) keep theirs.
struct Locals {
    fail: Ident,
    lock: Ident,
    guard: Ident,
    output: Ident,
    ret: Ident,
    held: Ident,
    error: Ident,
}

impl Locals {
    fn new() -> Self {
        let local = |name: &str| Ident::new(name, Span::mixed_site());
        Locals {
            fail: local("__dlock_fail"),
            lock: local("__dlock_lock"),
            guard: local("__dlock_guard"),
            output: local("__dlock_output"),
            ret: local("__dlock_ret"),
            held: local("guard"),
            error: local("error"),
        }
    }
}

impl Lock<'_> {
    /// The locked body: build the lock, acquire, run `body` with the lease
    /// held, release, return the body's result.
    ///
    /// The body's async block is told its output type before the body, so
    /// `?` and `return` inside it know their type (async-trait's body does
    /// this too; a hand-written `Box::pin(async move { .. })` may not). The
    /// body's statements stay the block's own statements, so lints see them
    /// as the user wrote them; wrapping them in `let ret: T = { .. };` would
    /// turn a final `return x;` into clippy's `diverging_sub_expression`.
    fn wrap(&self, output: &Type, body: TokenStream) -> TokenStream {
        let mut output = output.clone();
        ImplTraitToInfer.visit_type_mut(&mut output);
        // Spanned on the return type, so "must return `Result<T, E>` where
        // `E: From<dlock::LockError>`" points at it.
        let fail = quote_spanned!(output.span()=>
            ::dlock::__private::fail_with::<#output>()
        );
        let keys = &self.keys;
        let key = &keys[0];
        let constructor = match &self.args.segments {
            None if self.multi => quote!(::dlock::__private::MultiLock::new([#(#keys),*])),
            Some(segments) => {
                let n = segments.value;
                quote_spanned!(segments.span=> ::dlock::__private::SegmentedLock::new(#key, #n))
            }
            None if self.args.mode.is_some() => quote!(::dlock::__private::RwLock::new(#key)),
            None => quote!(::dlock::__private::Lock::new(#key)),
        };
        // A read-write lock takes its lease with `read()` or `write()`.
        let acquire = match &self.args.mode {
            Some(mode) => match mode.value {
                Mode::Read => quote_spanned!(mode.span=> read),
                Mode::Write => quote_spanned!(mode.span=> write),
            },
            None => quote!(acquire),
        };
        let options = self.options();
        let on_lost = match self.args.on_lost {
            OnLost::Cancel => quote!(::dlock::__private::OnLost::Cancel),
            OnLost::Continue => quote!(::dlock::__private::OnLost::Continue),
        };
        let Locals {
            fail: fail_fn,
            lock,
            guard,
            output: result,
            ret,
            held,
            error,
        } = &self.locals;
        let body = quote! {
            if let ::core::option::Option::Some(#ret) = ::core::option::Option::None::<#output> {
                #[allow(unreachable_code)]
                return #ret;
            }
            #body
        };
        let guard_binding = &self.guard_binding;
        quote! {
            let #fail_fn = #fail;
            let #lock = #constructor #options;
            let #guard = match #lock.#acquire().await {
                ::core::result::Result::Ok(#held) => #held,
                ::core::result::Result::Err(#error) => return #fail_fn(#error),
            };
            let #result = {
                #guard_binding
                ::dlock::__private::run_body(&#guard, #on_lost, #fail_fn, async move {
                    #body
                })
                .await
            };
            ::dlock::__private::finish(#guard, #result).await
        }
    }

    /// `.ttl(..).wait(..).renew(..).backend(..)`, for the options given:
    /// constants for literals, the user's expressions (evaluated here, at
    /// each call) otherwise.
    fn options(&self) -> TokenStream {
        let args = self.args;
        let mut options = TokenStream::new();
        if let Some(ttl) = &args.ttl {
            let ttl = ttl.tokens();
            options.extend(quote!(.ttl(#ttl)));
        }
        if let Some(wait) = &args.wait {
            let wait = wait.tokens();
            options.extend(quote!(.wait(#wait)));
        }
        if let Some(renew) = &args.renew {
            options.extend(quote!(.renew(#renew)));
        }
        if let Some(backend) = &args.backend {
            let backend = backend.tokens();
            options.extend(quote!(.backend(#backend)));
        }
        if let Some(at_least) = &args.hold_at_least {
            let at_least = at_least.tokens();
            options.extend(quote!(.hold_at_least(#at_least)));
        }
        options
    }
}

/// `impl Trait` cannot be named in a turbofish or a `let` type; `_` lets
/// inference fill it in from the body.
struct ImplTraitToInfer;

impl VisitMut for ImplTraitToInfer {
    fn visit_type_mut(&mut self, ty: &mut Type) {
        if let Type::ImplTrait(impl_trait) = ty {
            *ty = Type::Infer(syn::TypeInfer {
                underscore_token: syn::Token![_](impl_trait.impl_token.span),
            });
            return;
        }
        syn::visit_mut::visit_type_mut(self, ty);
    }
}

#[cfg(test)]
mod tests {
    use quote::quote;

    fn expand(args: proc_macro2::TokenStream, item: proc_macro2::TokenStream) -> String {
        let out = super::distributed_lock(args, item).to_string();
        out.split_whitespace().collect::<Vec<_>>().join("")
    }

    fn compact(tokens: &str) -> String {
        tokens.split_whitespace().collect()
    }

    #[test]
    fn expands_as_the_crate_docs_show() {
        let out = expand(
            quote!(key = "order:{id}", ttl = "30s", wait = "5s"),
            quote!(
                async fn pay(id: u64, guard: &LockGuard) -> Result<Receipt, AppError> {
                    Ok(Receipt { id })
                }
            ),
        );
        for expected in [
            "asyncfnpay(id:u64)->Result<Receipt,AppError>{",
            "::dlock::__private::fail_with::<Result<Receipt,AppError>>()",
            "::dlock::__private::Lock::new(::std::format!(\"order:{id}\"))",
            ".ttl(::core::time::Duration::new(30u64,0u32)).wait(::core::time::Duration::new(5u64,0u32));",
            "letguard:&LockGuard=&__dlock_guard;",
            "::dlock::__private::OnLost::Cancel",
            "::core::option::Option::None::<Result<Receipt,AppError>>",
            "Ok(Receipt{id})})",
            "::dlock::__private::finish(__dlock_guard,__dlock_output).await}",
        ] {
            assert!(out.contains(&compact(expected)), "missing {expected}\nin {out}");
        }
    }

    #[test]
    fn segments_expand_to_a_segmented_lock() {
        let out = expand(
            quote!(key = "stock:{sku}", segments = 5, wait = "1s"),
            quote!(
                async fn buy(sku: u64, guard: &LockGuard) -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert!(
            out.contains(&compact(
                "::dlock::__private::SegmentedLock::new(::std::format!(\"stock:{sku}\"),5usize).wait("
            )),
            "{out}"
        );
    }

    #[test]
    fn keys_expand_to_a_multi_lock_run_in_its_guard() {
        let out = expand(
            quote!(keys = ["account:{from}", "account:{to}"], ttl = "30s"),
            quote!(
                async fn transfer(from: u64, to: u64, guard: &MultiGuard) -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        for expected in [
            "asyncfntransfer(from:u64,to:u64)->Result<(),E>{",
            "::dlock::__private::MultiLock::new([::std::format!(\"account:{from}\"),::std::format!(\"account:{to}\")]).ttl(",
            "letguard:&MultiGuard=&__dlock_guard;",
            "::dlock::__private::run_body(&__dlock_guard,",
            "::dlock::__private::finish(__dlock_guard,__dlock_output).await}",
        ] {
            assert!(out.contains(&compact(expected)), "missing {expected}\nin {out}");
        }
    }

    #[test]
    fn mode_expands_to_one_side_of_a_read_write_lock() {
        for (mode, method) in [("read", ".read().await"), ("write", ".write().await")] {
            let out = expand(
                quote!(key = "prices:{region}", mode = #mode),
                quote!(
                    async fn quote(region: u32, guard: &LockGuard) -> Result<(), E> {
                        Ok(())
                    }
                ),
            );
            for expected in [
                "::dlock::__private::RwLock::new(::std::format!(\"prices:{region}\"));",
                method,
                "::dlock::__private::run_body(&__dlock_guard,",
            ] {
                assert!(
                    out.contains(&compact(expected)),
                    "missing {expected}\nin {out}"
                );
            }
        }
    }

    #[test]
    fn errors_come_with_the_function_unchanged() {
        let item = quote!(
            fn pay(id: u64) -> Result<u64, E> {
                Ok(id)
            }
        );
        let out = expand(quote!(key = "{id}", tll = "1s"), item.clone());
        assert!(out.starts_with("::core::compile_error!"), "{out}");
        assert!(out.contains("unknownargument`tll`"), "{out}");
        assert!(out.contains("needsan`asyncfn`"), "{out}");
        assert!(out.ends_with(&compact(&item.to_string())), "{out}");
    }

    #[test]
    fn impl_trait_in_the_return_type_becomes_inferred() {
        let out = expand(
            quote!(key = "k"),
            quote!(
                async fn f() -> Result<impl Display, E> {
                    Ok(1)
                }
            ),
        );
        assert!(out.contains("fail_with::<Result<_,E>>()"), "{out}");
        assert!(out.contains("->Result<implDisplay,E>{"), "{out}");
    }
}
