//! The optional `&LockGuard` (or `&MultiGuard`) parameter: finding it,
//! checking it, binding it to the held guard, and removing it from the
//! signature callers see.

use proc_macro2::TokenStream;
use quote::quote;
use syn::punctuated::Punctuated;
use syn::{FnArg, GenericParam, Ident, Pat, Signature, Type, WherePredicate};

use crate::error::Errors;

/// The `&LockGuard` parameter.
pub(crate) struct GuardParam {
    /// Its position in `sig.inputs`.
    pub(crate) index: usize,
    /// The name it binds; `None` for `_`.
    pub(crate) name: Option<Ident>,
    pub(crate) pat: Pat,
    /// The referenced type as written: `LockGuard`, `dlock::LockGuard`.
    pub(crate) guard_type: Type,
    /// The lifetime async-trait gave it (`&'life1 LockGuard`), which must go
    /// with the parameter.
    lifetime: Option<syn::Lifetime>,
    /// It names `MultiGuard` (the guard of `keys = [..]`), not `LockGuard`.
    names_multi: bool,
}

impl GuardParam {
    /// A `key` function takes `&LockGuard`, a `keys` function `&MultiGuard`.
    pub(crate) fn fits(&self, multi: bool) -> syn::Result<()> {
        match (multi, self.names_multi) {
            (true, false) => Err(syn::Error::new_spanned(
                &self.guard_type,
                "with `keys = [..]` the guard parameter is `&MultiGuard` (it holds every key); write `guard: &MultiGuard`",
            )),
            (false, true) => Err(syn::Error::new_spanned(
                &self.guard_type,
                "`&MultiGuard` is the guard of `keys = [..]`; with `key = ..` write `guard: &LockGuard`",
            )),
            _ => Ok(()),
        }
    }

    /// `let guard: &LockGuard = &__dlock_guard;` with the user's pattern
    /// (so `mut guard` or `_guard` stay as written) and the user's path to
    /// `LockGuard` (so their import stays used), minus any lifetime.
    pub(crate) fn binding(&self, held: &Ident) -> TokenStream {
        let pat = &self.pat;
        let guard_type = &self.guard_type;
        quote!(let #pat: &#guard_type = &#held;)
    }
}

/// Finds the optional `&LockGuard` parameter; a second one is an error.
pub(crate) fn find_guard(sig: &Signature) -> syn::Result<Option<GuardParam>> {
    let mut errors = Errors::default();
    let mut found: Option<GuardParam> = None;
    for (index, input) in sig.inputs.iter().enumerate() {
        let FnArg::Typed(arg) = input else { continue };
        let Type::Reference(reference) = strip(&arg.ty) else {
            if guard_kind(&arg.ty).is_some() {
                errors.push(syn::Error::new_spanned(
                    &arg.ty,
                    "take the guard by reference: `&LockGuard` (the function releases the lock itself when the body ends)",
                ));
            }
            continue;
        };
        let Some(names_multi) = guard_kind(&reference.elem) else {
            continue;
        };
        if let Some(mutability) = reference.mutability {
            errors.push(syn::Error::new_spanned(
                mutability,
                "the guard parameter is `&LockGuard`, not `&mut LockGuard`; remove `mut`",
            ));
            continue;
        }
        let name = match &*arg.pat {
            Pat::Ident(ident) if ident.by_ref.is_none() && ident.subpat.is_none() => {
                Some(ident.ident.clone())
            }
            Pat::Wild(_) => None,
            other => {
                errors.push(syn::Error::new_spanned(
                    other,
                    "bind the guard to a name, e.g. `guard: &LockGuard`",
                ));
                continue;
            }
        };
        if let Some(first) = &found {
            let first = first
                .name
                .as_ref()
                .map_or_else(|| "`_`".to_owned(), |n| format!("`{n}`"));
            errors.push(syn::Error::new_spanned(
                arg,
                format!(
                    "only one `&LockGuard` parameter is allowed; this function already takes the guard as {first}; remove this one"
                ),
            ));
            continue;
        }
        found = Some(GuardParam {
            index,
            name,
            pat: (*arg.pat).clone(),
            guard_type: (*reference.elem).clone(),
            lifetime: reference.lifetime.clone(),
            names_multi,
        });
    }
    errors.finish()?;
    Ok(found)
}

fn strip(ty: &Type) -> &Type {
    match ty {
        Type::Group(group) => strip(&group.elem),
        Type::Paren(paren) => strip(&paren.elem),
        other => other,
    }
}

/// `LockGuard`, `dlock::LockGuard`, `::dlock::MultiGuard`, ...: any path
/// whose last segment is `LockGuard` (`Some(false)`) or `MultiGuard`
/// (`Some(true)`); the macro cannot resolve imports.
fn guard_kind(ty: &Type) -> Option<bool> {
    let Type::Path(path) = strip(ty) else {
        return None;
    };
    let last = path.path.segments.last()?;
    if path.qself.is_some() || !last.arguments.is_none() {
        return None;
    }
    if last.ident == "LockGuard" {
        Some(false)
    } else if last.ident == "MultiGuard" {
        Some(true)
    } else {
        None
    }
}

/// Removes the guard parameter (and async-trait's lifetime for it, which
/// the trait's own signature does not have).
pub(crate) fn remove_param(sig: &mut Signature, guard: &GuardParam) {
    // Collecting values (not pairs) re-punctuates: no trailing comma is
    // left behind when the guard was the last parameter.
    sig.inputs = std::mem::take(&mut sig.inputs)
        .into_iter()
        .enumerate()
        .filter(|(index, _)| *index != guard.index)
        .map(|(_, input)| input)
        .collect();
    let Some(lifetime) = &guard.lifetime else {
        return;
    };
    if sig.asyncness.is_some() || !lifetime.ident.to_string().starts_with("life") {
        // A lifetime the user wrote: they may use it elsewhere; an unused
        // lifetime parameter is harmless on a function.
        return;
    }
    sig.generics.params = std::mem::take(&mut sig.generics.params)
        .into_pairs()
        .filter(
            |pair| !matches!(pair.value(), GenericParam::Lifetime(l) if l.lifetime == *lifetime),
        )
        .collect();
    if let Some(where_clause) = &mut sig.generics.where_clause {
        where_clause.predicates = std::mem::take(&mut where_clause.predicates)
            .into_pairs()
            .filter(|pair| !matches!(pair.value(), WherePredicate::Lifetime(p) if p.lifetime == *lifetime))
            .collect::<Punctuated<_, _>>();
    }
}
