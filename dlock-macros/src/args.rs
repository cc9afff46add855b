//! The attribute's arguments: `key` or `keys`, `ttl`, `wait`, `backend`,
//! `renew`, `on_lost`, `segments`, `mode`, `hold_at_least`.
//!
//! Parsing never stops at the first mistake: every argument is checked and
//! all errors are returned together, each spanned on the token to fix.

use std::time::Duration;

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Expr, ExprLit, Lit, LitBool, LitInt, LitStr, Meta, Token};

use crate::error::Errors;
use crate::setting::{self, DurationArg, Located, Setting};

/// Every argument the attribute accepts, in the order the docs list them.
pub(crate) const VALID: &[&str] = &[
    "key",
    "keys",
    "ttl",
    "wait",
    "backend",
    "renew",
    "on_lost",
    "segments",
    "mode",
    "hold_at_least",
];

/// The most segments (`dlock::SegmentedLock::MAX_SEGMENTS`). The macro only
/// knows `dlock`'s public API, so the value is repeated here to fail at
/// compile time rather than at the first acquisition.
const MAX_SEGMENTS: usize = 1024;

/// The parsed and validated arguments.
pub(crate) struct Args {
    /// The key template literal, parsed and checked in `key.rs`; `None`
    /// when missing or when `keys` is given.
    pub(crate) key: Option<LitStr>,
    /// `keys = [..]`: a `MultiLock` on every template; never empty.
    pub(crate) keys: Option<Vec<LitStr>>,
    /// `ttl`, `wait`, `hold_at_least` and `backend`: a literal checked now,
    /// or an expression evaluated at each call (see `setting.rs`).
    pub(crate) ttl: Option<Setting<Duration>>,
    pub(crate) wait: Option<Setting<Duration>>,
    pub(crate) backend: Option<Setting<LitStr>>,
    pub(crate) renew: Option<LitBool>,
    pub(crate) on_lost: OnLost,
    /// `segments = N`: a `SegmentedLock` of N segments instead of a `Lock`.
    pub(crate) segments: Option<Located<usize>>,
    /// `mode = "read" | "write"`: one side of an `RwLock` instead of a `Lock`.
    pub(crate) mode: Option<Located<Mode>>,
    /// `hold_at_least = "50s"`: the key stays taken that long after the
    /// acquisition, even when the body ends sooner.
    pub(crate) hold_at_least: Option<Setting<Duration>>,
}

/// Which side of a read-write lock the body holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Read,
    Write,
}

/// What happens when the lease is lost while the body runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnLost {
    Cancel,
    Continue,
}

/// The raw list: `name = value, ...`, accepting any `Meta` so that `renew`
/// without a value gets our message rather than syn's "expected `=`".
struct RawArgs(Punctuated<Meta, Token![,]>);

impl Parse for RawArgs {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        Punctuated::parse_terminated(input).map(RawArgs)
    }
}

/// Arguments seen so far; one setter per argument rejects duplicates.
#[derive(Default)]
struct Builder {
    key: Option<LitStr>,
    keys: Option<Located<Vec<LitStr>>>,
    /// The first `keys = [..]` as a whole, even with a bad value: for the
    /// error that it clashes with `key`.
    keys_whole: Option<TokenStream>,
    ttl: Option<Setting<Duration>>,
    wait: Option<Setting<Duration>>,
    backend: Option<Setting<LitStr>>,
    renew: Option<LitBool>,
    on_lost: Option<OnLost>,
    segments: Option<Located<usize>>,
    mode: Option<Located<Mode>>,
    hold_at_least: Option<Setting<Duration>>,
}

impl Args {
    /// Parses the attribute's tokens, pushing every mistake to `errors`.
    ///
    /// Whatever could be read is returned even when there are errors, so the
    /// key template is still checked and all mistakes show up in one build.
    pub(crate) fn parse(tokens: TokenStream, errors: &mut Errors) -> Args {
        let mut seen = Builder::default();
        match syn::parse2::<RawArgs>(tokens) {
            Ok(raw) => {
                for meta in raw.0 {
                    if let Err(e) = seen.add(meta) {
                        errors.push(e);
                    }
                }
                match (&seen.key, &seen.keys_whole) {
                    (None, None) => errors.push(missing_key()),
                    (Some(_), Some(keys)) => errors.push(syn::Error::new_spanned(
                        keys,
                        "`key` and `keys` together: write `key = \"..\"` for one lock, or `keys = [..]` for several keys held at once, not both",
                    )),
                    _ => {}
                }
                if let (Some(_), Some(segments)) = (&seen.keys, &seen.segments) {
                    errors.push(syn::Error::new(
                        segments.span,
                        "`segments` with `keys`: a multi-key lock holds every key, it has no segments; remove `segments`, or lock one `key` split into segments",
                    ));
                }
                if let (Some(_), Some(mode)) = (&seen.keys_whole, &seen.mode) {
                    errors.push(syn::Error::new(
                        mode.span,
                        "`mode` with `keys`: a multi-key lock takes every key as a plain lock; remove `mode`, or take one `key` in read or write mode",
                    ));
                }
                if let (Some(_), Some(at_least)) = (&seen.keys_whole, &seen.hold_at_least) {
                    errors.push(syn::Error::new(
                        at_least.span(),
                        "`hold_at_least` with `keys`: a multi-key lock has no minimum hold; remove it, or lock one `key`",
                    ));
                }
                if let (Some(_), Some(mode)) = (&seen.segments, &seen.mode) {
                    errors.push(syn::Error::new(
                        mode.span,
                        "`mode` with `segments`: a segmented lock has no read or write side; remove `mode`, or remove `segments` for a read-write lock on one key",
                    ));
                }
            }
            Err(e) => errors.push(e),
        }
        let keys = seen.keys.map(|keys| keys.value);
        Args {
            // With `keys` given, `key` was an error: generate for `keys`.
            key: if keys.is_some() { None } else { seen.key },
            keys,
            ttl: seen.ttl,
            wait: seen.wait,
            backend: seen.backend,
            renew: seen.renew,
            on_lost: seen.on_lost.unwrap_or(OnLost::Cancel),
            segments: seen.segments,
            mode: seen.mode,
            hold_at_least: seen.hold_at_least,
        }
    }
}

/// Spanned on the whole attribute: there is no token to point at.
fn missing_key() -> syn::Error {
    syn::Error::new(
        Span::call_site(),
        "missing `key`: write #[distributed_lock(key = \"resource:{id}\")], or `keys = [\"account:{from}\", \"account:{to}\"]` to hold several keys at once",
    )
}

impl Builder {
    fn add(&mut self, meta: Meta) -> syn::Result<()> {
        // `ttl = "10s"` as a whole: what a duplicate's error points at.
        let whole = meta.to_token_stream();
        let name = match meta.path().get_ident() {
            Some(ident) => ident.to_string(),
            None => return Err(unknown(&meta, &path_text(meta.path()))),
        };
        if !VALID.contains(&name.as_str()) {
            return Err(unknown(&meta, &name));
        }
        let value = match meta {
            Meta::NameValue(nv) => nv.value,
            Meta::Path(path) => {
                return Err(syn::Error::new_spanned(
                    path,
                    format!("`{name}` needs a value: write `{}`", example(&name)),
                ))
            }
            Meta::List(list) => {
                return Err(syn::Error::new_spanned(
                    list,
                    format!(
                        "`{name}` takes a value, not a list: write `{}`",
                        example(&name)
                    ),
                ))
            }
        };
        match name.as_str() {
            "key" => {
                let lit = string(&name, value)?;
                set(&mut self.key, lit, &name, &whole)
            }
            "keys" => {
                // Seen even when its value is wrong: then "missing `key`"
                // would only repeat the value's error.
                self.keys_whole.get_or_insert_with(|| whole.clone());
                let keys = keys(value)?;
                set(&mut self.keys, keys, &name, &whole)
            }
            "ttl" => {
                let ttl = setting::duration(DurationArg::Ttl, value)?;
                set(&mut self.ttl, ttl, &name, &whole)
            }
            "wait" => {
                let wait = setting::duration(DurationArg::Wait, value)?;
                set(&mut self.wait, wait, &name, &whole)
            }
            "hold_at_least" => {
                let at_least = setting::duration(DurationArg::HoldAtLeast, value)?;
                set(&mut self.hold_at_least, at_least, &name, &whole)
            }
            "backend" => {
                let backend = setting::backend(value)?;
                set(&mut self.backend, backend, &name, &whole)
            }
            "renew" => {
                let lit = match value {
                    Expr::Lit(ExprLit {
                        lit: Lit::Bool(b), ..
                    }) => b,
                    other => {
                        return Err(syn::Error::new_spanned(
                            other,
                            "`renew` takes `true` or `false` (without quotes)",
                        ))
                    }
                };
                set(&mut self.renew, lit, &name, &whole)
            }
            "on_lost" => {
                let lit = string(&name, value)?;
                let on_lost = match lit.value().as_str() {
                    "cancel" => OnLost::Cancel,
                    "continue" => OnLost::Continue,
                    other => {
                        return Err(syn::Error::new(
                            lit.span(),
                            format!(
                                "unknown `on_lost` value `{other}`; write `on_lost = \"cancel\"` (drop the body when the lease is lost, the default) or `on_lost = \"continue\"` (let it finish)"
                            ),
                        ))
                    }
                };
                set(&mut self.on_lost, on_lost, &name, &whole)
            }
            "segments" => {
                let segments = segments(value)?;
                set(&mut self.segments, segments, &name, &whole)
            }
            "mode" => {
                let lit = string(&name, value)?;
                let mode = match lit.value().as_str() {
                    "read" => Mode::Read,
                    "write" => Mode::Write,
                    other => {
                        return Err(syn::Error::new(
                            lit.span(),
                            format!(
                                "unknown `mode` value `{other}`; write `mode = \"read\"` (shared with other readers) or `mode = \"write\"` (exclusive), or leave `mode` out for a plain lock"
                            ),
                        ))
                    }
                };
                let mode = Located {
                    value: mode,
                    span: lit.span(),
                };
                set(&mut self.mode, mode, &name, &whole)
            }
            // VALID was checked above; this arm only keeps the match total.
            _ => Err(syn::Error::new_spanned(
                whole,
                format!("unknown argument `{name}`"),
            )),
        }
    }
}

/// Stores `value` unless the argument was already given.
fn set<T>(slot: &mut Option<T>, value: T, name: &str, whole: &TokenStream) -> syn::Result<()> {
    if slot.is_some() {
        // Spanned on the second occurrence: that is the one to delete.
        return Err(syn::Error::new_spanned(
            whole,
            format!("duplicate argument `{name}`"),
        ));
    }
    *slot = Some(value);
    Ok(())
}

fn example(name: &str) -> &'static str {
    match name {
        "key" => "key = \"order:{id}\"",
        "keys" => "keys = [\"account:{from}\", \"account:{to}\"]",
        "ttl" => "ttl = \"30s\"",
        "wait" => "wait = \"5s\"",
        "backend" => "backend = \"etcd\"",
        "renew" => "renew = false",
        "segments" => "segments = 5",
        "mode" => "mode = \"read\"",
        "hold_at_least" => "hold_at_least = \"50s\"",
        _ => "on_lost = \"continue\"",
    }
}

fn string(name: &str, value: Expr) -> syn::Result<LitStr> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => Ok(s),
        other => Err(syn::Error::new_spanned(
            other,
            format!("`{name}` takes a string literal: write `{}`", example(name)),
        )),
    }
}

/// `keys = ["..", ".."]`: a non-empty array of string literals.
fn keys(value: Expr) -> syn::Result<Located<Vec<LitStr>>> {
    let Expr::Array(array) = value else {
        return Err(syn::Error::new_spanned(
            value,
            "`keys` takes an array of key templates: write `keys = [\"account:{from}\", \"account:{to}\"]`",
        ));
    };
    if array.elems.is_empty() {
        return Err(syn::Error::new_spanned(
            &array,
            "`keys` is empty: name at least one key, e.g. `keys = [\"account:{from}\", \"account:{to}\"]`, or write `key = \"..\"` for one lock",
        ));
    }
    let mut errors = Errors::default();
    let mut keys = Vec::with_capacity(array.elems.len());
    for elem in &array.elems {
        match elem {
            Expr::Lit(ExprLit {
                lit: Lit::Str(s), ..
            }) => keys.push(s.clone()),
            other => errors.push(syn::Error::new_spanned(
                other,
                "each of `keys` is a key template string: write e.g. `\"account:{from}\"`",
            )),
        }
    }
    errors.finish()?;
    Ok(Located {
        value: keys,
        span: array.bracket_token.span.join(),
    })
}

/// `segments = N`: a positive integer literal without quotes.
fn segments(value: Expr) -> syn::Result<Located<usize>> {
    let lit: LitInt = match value {
        Expr::Lit(ExprLit {
            lit: Lit::Int(i), ..
        }) => i,
        other => return Err(syn::Error::new_spanned(
            other,
            "`segments` takes a positive integer literal (without quotes): write `segments = 5`",
        )),
    };
    let value: usize = lit.base10_parse().map_err(|_| {
        syn::Error::new(
            lit.span(),
            "`segments` must be a positive integer that fits in `usize`: write e.g. `segments = 5`",
        )
    })?;
    if value == 0 {
        return Err(syn::Error::new(
            lit.span(),
            "`segments` must be at least 1: a lock split into 0 segments cannot be held; write e.g. `segments = 5`, or leave `segments` out for one plain lock",
        ));
    }
    if value > MAX_SEGMENTS {
        return Err(syn::Error::new(
            lit.span(),
            format!("`segments` must be at most {MAX_SEGMENTS} (`dlock::SegmentedLock::MAX_SEGMENTS`): every acquire may try each segment once; write e.g. `segments = 5`"),
        ));
    }
    Ok(Located {
        value,
        span: lit.span(),
    })
}

fn path_text(path: &syn::Path) -> String {
    let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
    segments.join("::")
}

fn unknown(meta: &Meta, name: &str) -> syn::Error {
    let valid = VALID.join(", ");
    let message = match closest(name) {
        Some(best) => {
            format!("unknown argument `{name}`; did you mean `{best}`? valid arguments: {valid}")
        }
        None => format!("unknown argument `{name}`; valid arguments: {valid}"),
    };
    syn::Error::new_spanned(meta.path(), message)
}

/// The valid argument closest to `name`, if it is close enough to be a typo.
fn closest(name: &str) -> Option<&'static str> {
    VALID
        .iter()
        .map(|valid| (strsim::levenshtein(name, valid), *valid))
        // Two edits catch a swapped or doubled letter without suggesting
        // `key` for every three-letter word.
        .filter(|(distance, valid)| *distance <= 2 && *distance < valid.len())
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, valid)| valid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn parse(tokens: TokenStream) -> Result<Args, String> {
        let mut errors = Errors::default();
        let args = Args::parse(tokens, &mut errors);
        errors.finish().map(|()| args).map_err(|e| {
            e.into_iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        })
    }

    fn err(tokens: TokenStream) -> String {
        match parse(tokens) {
            Ok(_) => panic!("expected an error"),
            Err(e) => e,
        }
    }

    #[test]
    fn parses_every_argument() {
        let args = parse(quote!(
            key = "order:{id}",
            ttl = "1m 30s",
            wait = "250ms",
            backend = "etcd",
            renew = false,
            on_lost = "continue",
            segments = 5,
        ))
        .unwrap();
        assert_eq!(args.segments.unwrap().value, 5);
        assert_eq!(args.key.unwrap().value(), "order:{id}");
        assert_eq!(args.ttl.unwrap().literal(), Some(Duration::from_secs(90)));
        assert_eq!(
            args.wait.unwrap().literal(),
            Some(Duration::from_millis(250))
        );
        assert!(matches!(args.backend, Some(Setting::Literal(b)) if b.value.value() == "etcd"));
        assert!(!args.renew.unwrap().value);
        assert_eq!(args.on_lost, OnLost::Continue);
    }

    #[test]
    fn defaults() {
        let args = parse(quote!(key = "k")).unwrap();
        assert!(args.ttl.is_none() && args.wait.is_none() && args.backend.is_none());
        assert!(args.renew.is_none() && args.segments.is_none());
        assert_eq!(args.on_lost, OnLost::Cancel);
    }

    #[test]
    fn zero_wait_is_one_attempt_not_an_error() {
        let args = parse(quote!(key = "k", wait = "0s")).unwrap();
        assert_eq!(args.wait.unwrap().literal(), Some(Duration::ZERO));
    }

    #[test]
    fn missing_key() {
        assert!(err(quote!(ttl = "30s")).starts_with("missing `key`"));
        assert!(err(quote!()).starts_with("missing `key`"));
    }

    #[test]
    fn bad_durations() {
        let e = err(quote!(key = "k", ttl = "30 parsecs"));
        assert!(
            e.starts_with("invalid duration `30 parsecs` for `ttl`: "),
            "{e}"
        );
        assert!(e.ends_with("write e.g. \"30s\" or \"500ms\""), "{e}");
        assert!(err(quote!(key = "k", ttl = "0s")).contains("must be positive"));
        assert!(err(quote!(key = "k", ttl = "10ms")).contains("30ms"));
        assert!(err(quote!(key = "k", wait = 5)).contains("string literal"));
        assert!(err(quote!(key = "k", backend = "")).contains("`backend` is empty"));
    }

    #[test]
    fn expressions_are_evaluated_at_each_call() {
        let args = parse(quote!(
            key = "k",
            ttl = CONFIG.lock_ttl,
            wait = self.settings.wait(),
            hold_at_least = Duration::from_secs(50),
            backend = config.backend.as_str()
        ))
        .unwrap();
        assert!(matches!(args.ttl, Some(Setting::Expr(_))));
        assert!(matches!(args.wait, Some(Setting::Expr(_))));
        assert!(matches!(args.hold_at_least, Some(Setting::Expr(_))));
        assert!(matches!(args.backend, Some(Setting::Expr(_))));
        let e = err(quote!(key = "k", ttl = 30));
        assert!(
            e.contains("`ttl` takes a string literal or a `std::time::Duration` expression"),
            "{e}"
        );
        assert!(err(quote!(key = "k", backend = 7)).contains("`&str`/`String` expression"));
        assert!(err(quote!(key = "k", ttl = a, ttl = b)).contains("duplicate argument `ttl`"));
    }

    #[test]
    fn unknown_arguments_suggest_the_closest() {
        let e = err(quote!(key = "k", tll = "30s"));
        assert_eq!(
            e,
            "unknown argument `tll`; did you mean `ttl`? valid arguments: key, keys, ttl, wait, backend, renew, on_lost, segments, mode, hold_at_least"
        );
        assert!(err(quote!(key = "k", onlost = "cancel")).contains("did you mean `on_lost`?"));
        let e = err(quote!(key = "k", colour = "red"));
        assert!(!e.contains("did you mean"), "{e}");
    }

    #[test]
    fn duplicates_and_bad_values_are_all_reported() {
        let e = err(quote!(
            key = "k",
            ttl = "1s",
            ttl = "2s",
            on_lost = "panic",
            renew = "yes"
        ));
        assert!(e.contains("duplicate argument `ttl`"), "{e}");
        assert!(e.contains("unknown `on_lost` value `panic`"), "{e}");
        assert!(e.contains("`renew` takes `true` or `false`"), "{e}");
    }

    #[test]
    fn segments_must_be_a_positive_integer_literal() {
        assert!(err(quote!(key = "k", segments = 0)).contains("`segments` must be at least 1"));
        assert!(err(quote!(key = "k", segments = "5")).contains("positive integer literal"));
        let e = err(quote!(key = "k", segments = -1));
        assert!(e.contains("positive integer"), "{e}");
        assert!(err(quote!(key = "k", segments = 2, segments = 3))
            .contains("duplicate argument `segments`"));
    }

    #[test]
    fn keys_is_a_non_empty_array_of_templates_instead_of_key() {
        let args = parse(quote!(
            keys = ["account:{from}", "account:{to}"],
            ttl = "30s"
        ))
        .unwrap();
        let keys: Vec<String> = args.keys.unwrap().iter().map(LitStr::value).collect();
        assert_eq!(keys, ["account:{from}", "account:{to}"]);
        assert!(args.key.is_none());
        assert!(err(quote!(key = "k", keys = ["a"])).starts_with("`key` and `keys` together"));
        assert!(err(quote!(keys = [])).starts_with("`keys` is empty"));
        assert!(err(quote!(keys = "a")).contains("takes an array of key templates"));
        assert!(err(quote!(keys = ["a", 1])).contains("each of `keys` is a key template string"));
        assert!(err(quote!(keys = ["a"], segments = 2)).starts_with("`segments` with `keys`"));
        assert!(err(quote!(keys = ["a"], keys = ["b"])).contains("duplicate argument `keys`"));
    }

    #[test]
    fn mode_is_read_or_write_on_one_key() {
        let read = parse(quote!(key = "prices:{region}", mode = "read")).unwrap();
        assert_eq!(read.mode.unwrap().value, Mode::Read);
        let write = parse(quote!(key = "k", mode = "write")).unwrap();
        assert_eq!(write.mode.unwrap().value, Mode::Write);
        assert!(parse(quote!(key = "k")).unwrap().mode.is_none());
        let e = err(quote!(key = "k", mode = "shared"));
        assert!(e.starts_with("unknown `mode` value `shared`"), "{e}");
        assert!(err(quote!(key = "k", mode = read)).contains("`mode` takes a string literal"));
        assert!(err(quote!(keys = ["a"], mode = "read")).starts_with("`mode` with `keys`"));
        assert!(err(quote!(key = "k", segments = 2, mode = "read"))
            .starts_with("`mode` with `segments`"));
        assert!(err(quote!(key = "k", mode = "read", mode = "write"))
            .contains("duplicate argument `mode`"));
    }

    #[test]
    fn flags_need_values() {
        assert!(err(quote!(key = "k", renew)).contains("`renew` needs a value"));
    }

    #[test]
    fn typos_get_the_closest_argument() {
        assert_eq!(closest("kye"), Some("key"));
        assert_eq!(closest("wiat"), Some("wait"));
        assert_eq!(closest("id"), None);
        assert_eq!(closest("backnd"), Some("backend"));
    }
}
