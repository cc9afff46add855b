//! The settings that come as a literal checked at compile time or as an
//! expression evaluated at each call: `ttl`, `wait`, `hold_at_least` (a
//! `Duration`) and `backend` (a registered name).
//!
//! A string literal is parsed and checked here, as it always was, and
//! becomes a constant. Any other expression is handed to a
//! `::dlock::__private` function spanned on it, whose trait bound names the
//! type it takes: a wrong type is rustc's error on the user's expression,
//! worded by `#[diagnostic::on_unimplemented]` on the dlock side. Only
//! literals that can never be right (`ttl = 30`) are refused here.

use std::time::Duration;

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, Lit, LitStr};

/// A value and the span of the literal it came from, so generated code
/// points back at it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Located<T> {
    pub(crate) value: T,
    pub(crate) span: Span,
}

/// The shortest ttl `dlock` accepts (`dlock::MIN_TTL`). The macro only knows
/// `dlock`'s public API, so the value is repeated here to fail at compile
/// time rather than at the first acquisition.
const MIN_TTL: Duration = Duration::from_millis(30);

/// The longest ttl `dlock` accepts (`dlock::MAX_TTL`), repeated for the same reason.
pub(crate) const MAX_TTL: Duration = Duration::from_secs(365 * 86_400);

/// A setting's value: known at compile time, or computed at each call.
pub(crate) enum Setting<T> {
    Literal(Located<T>),
    /// Evaluated where the lock is built, before the body runs, in the
    /// function's scope (parameters and `self` included).
    Expr(Box<Expr>),
}

/// Which duration a setting is: its name, and the checks its literal gets.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum DurationArg {
    Ttl,
    Wait,
    HoldAtLeast,
}

impl DurationArg {
    fn name(self) -> &'static str {
        match self {
            DurationArg::Ttl => "ttl",
            DurationArg::Wait => "wait",
            DurationArg::HoldAtLeast => "hold_at_least",
        }
    }

    fn example(self) -> &'static str {
        match self {
            DurationArg::Ttl => "ttl = \"30s\"",
            DurationArg::Wait => "wait = \"5s\"",
            DurationArg::HoldAtLeast => "hold_at_least = \"50s\"",
        }
    }

    /// A configuration field it could come from, for the message.
    fn field(self) -> &'static str {
        match self {
            DurationArg::Ttl => "CONFIG.lock_ttl",
            DurationArg::Wait => "CONFIG.lock_wait",
            DurationArg::HoldAtLeast => "CONFIG.job_interval",
        }
    }
}

/// `ttl = "30s"` (parsed and checked now) or `ttl = CONFIG.lock_ttl` (any
/// expression of type `Duration`, checked by rustc and at the acquisition).
pub(crate) fn duration(arg: DurationArg, value: Expr) -> syn::Result<Setting<Duration>> {
    let lit = match value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => lit,
        Expr::Lit(other) => return Err(not_a_duration(arg, &other)),
        expr => return Ok(Setting::Expr(Box::new(expr))),
    };
    let parsed = parse_duration(arg.name(), &lit)?;
    match arg {
        DurationArg::Ttl => check_ttl(parsed.value, &lit)?,
        DurationArg::HoldAtLeast if parsed.value > MAX_TTL => {
            return Err(syn::Error::new_spanned(
                &lit,
                "`hold_at_least` is longer than dlock's maximum of 365 days (`dlock::MAX_TTL`)",
            ))
        }
        _ => {}
    }
    Ok(Setting::Literal(parsed))
}

/// `ttl = 30`, `wait = true`: a literal that is no duration whatever its
/// value; the message shows both forms that are.
fn not_a_duration(arg: DurationArg, lit: &ExprLit) -> syn::Error {
    syn::Error::new_spanned(
        lit,
        format!(
            "`{}` takes a string literal or a `std::time::Duration` expression: write `{}`, or e.g. `{} = Duration::from_secs(30)` or `{} = {}`",
            arg.name(),
            arg.example(),
            arg.name(),
            arg.name(),
            arg.field(),
        ),
    )
}

/// `backend = "etcd"` (checked now) or `backend = CONFIG.lock_backend`.
pub(crate) fn backend(value: Expr) -> syn::Result<Setting<LitStr>> {
    let lit = match value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => lit,
        Expr::Lit(other) => {
            return Err(syn::Error::new_spanned(
                other,
                "`backend` takes a string literal or a `&str`/`String` expression: write `backend = \"etcd\"`, or e.g. `backend = CONFIG.lock_backend`",
            ))
        }
        expr => return Ok(Setting::Expr(Box::new(expr))),
    };
    if lit.value().is_empty() {
        return Err(syn::Error::new(
            lit.span(),
            "`backend` is empty: name a registered backend, e.g. `backend = \"etcd\"`, or leave `backend` out to use the default",
        ));
    }
    let span = lit.span();
    Ok(Setting::Literal(Located { value: lit, span }))
}

impl<T> Setting<T> {
    /// Where an error about the setting as a whole points.
    pub(crate) fn span(&self) -> Span {
        match self {
            Setting::Literal(located) => located.span,
            Setting::Expr(expr) => expr.span(),
        }
    }
}

impl Setting<Duration> {
    /// The `Duration` argument of `.ttl(..)`, `.wait(..)`, `.hold_at_least(..)`.
    pub(crate) fn tokens(&self) -> TokenStream {
        match self {
            Setting::Literal(located) => constant(located.value, located.span),
            // Spanned on the expression: a wrong type is an error there.
            Setting::Expr(expr) => {
                quote_spanned!(expr.span()=> ::dlock::__private::duration_setting(#expr))
            }
        }
    }

    /// The compile-time value, for the unit tests.
    #[cfg(test)]
    pub(crate) fn literal(&self) -> Option<Duration> {
        match self {
            Setting::Literal(located) => Some(located.value),
            Setting::Expr(_) => None,
        }
    }
}

impl Setting<LitStr> {
    /// The argument of `.backend(..)`.
    pub(crate) fn tokens(&self) -> TokenStream {
        match self {
            Setting::Literal(located) => {
                let lit = &located.value;
                quote!(#lit)
            }
            Setting::Expr(expr) => {
                quote_spanned!(expr.span()=> ::dlock::__private::backend_setting(#expr))
            }
        }
    }
}

/// `::core::time::Duration::new(secs, nanos)`: a constant, no parsing at run time.
fn constant(value: Duration, span: Span) -> TokenStream {
    let secs = value.as_secs();
    let nanos = value.subsec_nanos();
    quote_spanned!(span=> ::core::time::Duration::new(#secs, #nanos))
}

/// Parses a humantime duration, re-spanning its error on the literal.
fn parse_duration(name: &str, lit: &LitStr) -> syn::Result<Located<Duration>> {
    let text = lit.value();
    match humantime::parse_duration(&text) {
        Ok(value) => Ok(Located {
            value,
            span: lit.span(),
        }),
        Err(e) => Err(syn::Error::new(
            lit.span(),
            format!("invalid duration `{text}` for `{name}`: {e}; write e.g. \"30s\" or \"500ms\""),
        )),
    }
}

fn check_ttl(ttl: Duration, lit: &LitStr) -> syn::Result<()> {
    if ttl.is_zero() {
        return Err(syn::Error::new(
            lit.span(),
            "`ttl` must be positive: a zero-length lease expires as soon as it is granted; write e.g. `ttl = \"30s\"`",
        ));
    }
    if ttl > MAX_TTL {
        return Err(syn::Error::new(
            lit.span(),
            format!(
                "`ttl` of {} is longer than dlock's maximum of 365 days (`dlock::MAX_TTL`); with renewal on, a ttl of `\"30s\"` keeps the lock for as long as the body runs",
                humantime::format_duration(ttl)
            ),
        ));
    }
    if ttl < MIN_TTL {
        return Err(syn::Error::new(
            lit.span(),
            format!(
                "`ttl` of {} is shorter than dlock's minimum of 30ms (`dlock::MIN_TTL`), below which renewal cannot keep the lease; write at least `ttl = \"30ms\"`, e.g. `ttl = \"30s\"`",
                humantime::format_duration(ttl)
            ),
        ));
    }
    Ok(())
}
