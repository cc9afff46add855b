//! The key template: `"order:{id}"`, `"user:{user.id}"`, `"{self.tenant}"`.
//!
//! A template is parsed once, checked against the function's parameters, and
//! rendered as a `format!` call. Every error is spanned on the string literal
//! (stable Rust cannot point inside a literal).

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::{Ident, Index, LitStr, Member};

use crate::error::Errors;

/// `dlock::MAX_KEY_BYTES`, repeated because the macro knows only dlock's
/// public API and checks constant keys at compile time.
const MAX_KEY_BYTES: usize = 512;

/// A parsed key template.
#[derive(Debug)]
pub(crate) struct Template {
    span: Span,
    parts: Vec<Part>,
}

#[derive(Debug, PartialEq)]
enum Part {
    /// Literal text, with `{{` and `}}` already unescaped.
    Text(String),
    Placeholder(Placeholder),
}

/// `{root.field.sub}`.
#[derive(Debug, PartialEq)]
struct Placeholder {
    /// `self`, or a parameter name.
    root: String,
    /// Field names or tuple indices after the root.
    fields: Vec<String>,
}

impl Placeholder {
    fn is_self(&self) -> bool {
        self.root == "self"
    }

    fn text(&self) -> String {
        let mut text = self.root.clone();
        for field in &self.fields {
            text.push('.');
            text.push_str(field);
        }
        text
    }
}

/// What a template may refer to.
pub(crate) struct Scope<'a> {
    /// The names the parameters' patterns bind, in order.
    pub(crate) params: &'a [String],
    /// The function has a `self` receiver.
    pub(crate) has_receiver: bool,
    /// The `&LockGuard` parameter, which only exists once the lock is held.
    pub(crate) guard: Option<&'a str>,
}

impl Template {
    /// Parses the template's syntax: braces, placeholder paths.
    pub(crate) fn parse(lit: &LitStr) -> syn::Result<Template> {
        let span = lit.span();
        let parts = parse_parts(&lit.value()).map_err(|message| syn::Error::new(span, message))?;
        Ok(Template { span, parts })
    }

    /// Checks that the keys of a lock split into `segments` segments can be
    /// valid: each segment's key is the key plus `#<segment>`, so the fixed
    /// text must leave room for the longest suffix.
    pub(crate) fn check_segments(&self, segments: usize) -> syn::Result<()> {
        let suffix = format!("#{}", segments.saturating_sub(1)).len();
        let fixed = fixed_len(&self.parts);
        if fixed + suffix > MAX_KEY_BYTES {
            return Err(syn::Error::new(
                self.span,
                format!(
                    "the key's fixed text is {fixed} bytes; with `segments = {segments}` its segment keys (`<key>#{}`) are at least {} bytes, longer than dlock's {MAX_KEY_BYTES}-byte key limit (`dlock::MAX_KEY_BYTES`); shorten the key",
                    segments.saturating_sub(1),
                    fixed + suffix
                ),
            ));
        }
        Ok(())
    }

    /// Checks every placeholder against the function's parameters; all
    /// mistakes are reported together.
    pub(crate) fn check(&self, scope: &Scope) -> syn::Result<()> {
        let mut errors = Errors::default();
        for placeholder in self.placeholders() {
            if let Err(message) = check_placeholder(placeholder, scope) {
                errors.push(syn::Error::new(self.span, message));
            }
        }
        errors.finish()
    }

    /// The expression that builds the key: a `String`.
    ///
    /// Plain parameters are captured inline (`"order:{id}"`), as a person
    /// would write it; field paths become positional arguments. Both borrow,
    /// so rendering moves nothing out of the parameters.
    pub(crate) fn render(&self) -> TokenStream {
        let mut format = String::new();
        let mut args = Vec::new();
        for part in &self.parts {
            match part {
                Part::Text(text) => format.push_str(&text.replace('{', "{{").replace('}', "}}")),
                Part::Placeholder(p) if !p.is_self() && p.fields.is_empty() => {
                    format.push('{');
                    format.push_str(&p.root);
                    format.push('}');
                }
                Part::Placeholder(p) => {
                    format.push_str("{}");
                    args.push(self.path_expr(p));
                }
            }
        }
        let span = self.span;
        if self.placeholders().next().is_none() {
            // A constant key: no `format!` for clippy's `useless_format` to flag.
            let text = LitStr::new(&format.replace("{{", "{").replace("}}", "}"), span);
            return quote_spanned!(span=> ::std::string::String::from(#text));
        }
        let format = LitStr::new(&format, span);
        quote_spanned!(span=> ::std::format!(#format #(, #args)*))
    }

    fn placeholders(&self) -> impl Iterator<Item = &Placeholder> {
        self.parts.iter().filter_map(|part| match part {
            Part::Placeholder(p) => Some(p),
            Part::Text(_) => None,
        })
    }

    /// `self.a.0` as tokens spanned on the literal, so a field that does not
    /// exist is reported there.
    fn path_expr(&self, placeholder: &Placeholder) -> TokenStream {
        let span = self.span;
        let root = Ident::new(&placeholder.root, span);
        let fields = placeholder
            .fields
            .iter()
            .map(|field| match field.parse::<u32>() {
                Ok(index) => Member::Unnamed(Index { index, span }),
                Err(_) => Member::Named(Ident::new(field, span)),
            });
        quote!(#root #(.#fields)*)
    }
}

/// The characters `dlock::backend::invisible_char` names (repeated: the
/// macro cannot depend on dlock): bidirectional controls, zero-width
/// characters, line and paragraph separators. dlock refuses keys with them.
fn invisible(c: char) -> bool {
    matches!(
        c,
        '\u{061C}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2066}'..='\u{2069}'
            | '\u{2060}'
            | '\u{FEFF}'
            | '\u{2028}'
            | '\u{2029}'
    )
}

/// Splits the template into text and placeholders, or says what is wrong.
fn parse_parts(template: &str) -> Result<Vec<Part>, String> {
    if template.is_empty() {
        return Err("the key is empty; name the resource, e.g. `key = \"order:{id}\"`".into());
    }
    // dlock rejects such keys at run time (`LockError::InvalidKey`); the
    // literal part of a template can be checked now.
    if let Some(c) = template.chars().find(|c| c.is_control()) {
        return Err(format!(
            "the key contains the control character {c:?}; lock keys are printable text"
        ));
    }
    if let Some(c) = template.chars().find(|&c| invisible(c)) {
        return Err(format!(
            "the key contains U+{:04X}, a bidirectional or zero-width character that changes how the key prints without showing (two keys that print alike would be different locks); remove it",
            u32::from(c)
        ));
    }

    let mut parts = Vec::new();
    let mut text = String::new();
    let mut chars = template.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                text.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                text.push('}');
            }
            '}' => {
                return Err(format!(
                    "stray `}}` in key template `{template}`; write `}}}}` for a literal brace"
                ))
            }
            '{' => {
                let mut inner = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some('{') | None => {
                            return Err(format!(
                                "unterminated `{{` in key template `{template}`; close the placeholder with `}}`, or write `{{{{` for a literal brace"
                            ))
                        }
                        Some(c) => inner.push(c),
                    }
                }
                if !text.is_empty() {
                    parts.push(Part::Text(std::mem::take(&mut text)));
                }
                parts.push(Part::Placeholder(parse_placeholder(&inner)?));
            }
            c => text.push(c),
        }
    }
    if !text.is_empty() {
        parts.push(Part::Text(text));
    }
    let fixed = fixed_len(&parts);
    if fixed > MAX_KEY_BYTES {
        return Err(format!(
            "the key's fixed text is {fixed} bytes, longer than dlock's {MAX_KEY_BYTES}-byte key limit (`dlock::MAX_KEY_BYTES`); shorten it"
        ));
    }
    Ok(parts)
}

/// The literal text's length: a lower bound on every rendered key.
fn fixed_len(parts: &[Part]) -> usize {
    parts
        .iter()
        .map(|part| match part {
            Part::Text(text) => text.len(),
            Part::Placeholder(_) => 0,
        })
        .sum()
}

fn parse_placeholder(inner: &str) -> Result<Placeholder, String> {
    if inner.is_empty() {
        return Err(
            "empty placeholder `{}` in key template: name a parameter, e.g. `{id}`, or write `{{}}` for literal braces"
                .into(),
        );
    }
    if let Some((path, _spec)) = inner.split_once(':') {
        return Err(format!(
            "format specs are not supported in key templates: placeholders are rendered with `Display`; write `{{{path}}}`"
        ));
    }
    let invalid = || {
        format!(
            "invalid placeholder `{{{inner}}}` in key template; write `{{name}}`, `{{name.field}}` or `{{self.field}}` with a parameter's name"
        )
    };
    let mut segments = inner.split('.');
    let root = segments.next().unwrap_or_default();
    if root != "self" && !is_identifier(root) {
        return Err(invalid());
    }
    let fields: Vec<String> = segments.map(str::to_owned).collect();
    if fields
        .iter()
        .any(|f| !is_identifier(f) && !is_tuple_index(f))
    {
        return Err(invalid());
    }
    Ok(Placeholder {
        root: root.to_owned(),
        fields,
    })
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    let first_ok = matches!(chars.next(), Some(c) if c == '_' || c.is_alphabetic());
    first_ok && s != "_" && chars.all(|c| c == '_' || c.is_alphanumeric()) && !is_keyword(s)
}

/// Keywords that cannot name a field or parameter (so `Ident::new` would
/// reject them).
fn is_keyword(s: &str) -> bool {
    const KEYWORDS: &[&str] = &[
        "as", "async", "await", "break", "const", "continue", "crate", "dyn", "else", "enum",
        "extern", "false", "fn", "for", "if", "impl", "in", "let", "loop", "match", "mod", "move",
        "mut", "pub", "ref", "return", "self", "Self", "static", "struct", "super", "trait",
        "true", "type", "unsafe", "use", "where", "while", "abstract", "become", "box", "do",
        "final", "macro", "override", "priv", "typeof", "unsized", "virtual", "yield", "try",
        "gen",
    ];
    KEYWORDS.contains(&s)
}

fn is_tuple_index(s: &str) -> bool {
    !s.is_empty()
        && s.bytes().all(|b| b.is_ascii_digit())
        && (s == "0" || !s.starts_with('0'))
        && s.parse::<u32>().is_ok()
}

fn check_placeholder(placeholder: &Placeholder, scope: &Scope) -> Result<(), String> {
    let text = placeholder.text();
    if placeholder.is_self() {
        if scope.has_receiver {
            return Ok(());
        }
        return Err(format!(
            "`{{{text}}}` needs a method with a `self` receiver, and this function has none; {}",
            list_params(scope.params)
        ));
    }
    if scope.params.contains(&placeholder.root) {
        return Ok(());
    }
    if scope.guard == Some(placeholder.root.as_str()) {
        return Err(format!(
            "`{}` is the lock guard, which exists only once the key is locked; build the key from other parameters",
            placeholder.root
        ));
    }
    let mut message = format!(
        "no parameter binds `{}`; {}",
        placeholder.root,
        list_params(scope.params)
    );
    if scope.has_receiver {
        message.push_str("; for a field of `self`, write `{self.");
        message.push_str(&text);
        message.push_str("}`");
    }
    Err(message)
}

fn list_params(params: &[String]) -> String {
    if params.is_empty() {
        return "the function's parameters bind no names to build the key from".into();
    }
    let names: Vec<String> = params.iter().map(|p| format!("`{p}`")).collect();
    format!("the parameters bind: {}", names.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(template: &str) -> Vec<Part> {
        parse_parts(template).unwrap()
    }

    fn text(s: &str) -> Part {
        Part::Text(s.to_owned())
    }

    fn placeholder(root: &str, fields: &[&str]) -> Part {
        Part::Placeholder(Placeholder {
            root: root.to_owned(),
            fields: fields.iter().map(|f| f.to_string()).collect(),
        })
    }

    fn check(template: &str, params: &[&str], has_receiver: bool) -> Result<(), String> {
        let params: Vec<String> = params.iter().map(|p| p.to_string()).collect();
        let scope = Scope {
            params: &params,
            has_receiver,
            guard: Some("guard"),
        };
        let template = Template::parse(&LitStr::new(template, Span::call_site()))
            .map_err(|e| e.to_string())?;
        template.check(&scope).map_err(|e| {
            e.into_iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        })
    }

    fn render(template: &str) -> String {
        Template::parse(&LitStr::new(template, Span::call_site()))
            .unwrap()
            .render()
            .to_string()
    }

    #[test]
    fn parses_text_placeholders_and_escapes() {
        assert_eq!(
            parts("order:{id}"),
            vec![text("order:"), placeholder("id", &[])]
        );
        assert_eq!(
            parts("{user.profile.id}-{self.0}"),
            vec![
                placeholder("user", &["profile", "id"]),
                text("-"),
                placeholder("self", &["0"])
            ]
        );
        assert_eq!(parts("{{literal}}"), vec![text("{literal}")]);
        assert_eq!(
            parts("a{{{id}}}b"),
            vec![text("a{"), placeholder("id", &[]), text("}b")]
        );
    }

    #[test]
    fn syntax_errors() {
        let err = |t: &str| parse_parts(t).unwrap_err();
        assert!(err("order:{id").starts_with("unterminated `{`"));
        assert!(err("order:{a{b}").starts_with("unterminated `{`"));
        assert!(err("order:}").starts_with("stray `}`"));
        assert!(err("order:{}").starts_with("empty placeholder"));
        assert!(err("").starts_with("the key is empty"));
        assert!(err("{id:?}").starts_with("format specs are not supported"));
        assert!(err("{ id }").starts_with("invalid placeholder `{ id }`"));
        assert!(err("{a..b}").starts_with("invalid placeholder"));
        assert!(err("{1x}").starts_with("invalid placeholder"));
        assert!(err("{a.01}").starts_with("invalid placeholder"));
        assert!(err("{type}").starts_with("invalid placeholder"));
        assert!(err("a\tb").contains("control character '\\t'"));
        assert!(err("pay\u{202E}{id}").contains("U+202E"));
        assert!(err("a\u{200B}{id}").contains("U+200B"));
        assert!(err(&"k".repeat(513)).contains("512-byte"));
        assert!(parse_parts(&"k".repeat(512)).is_ok());
        assert!(parse_parts(&format!("{{{}}}", "k".repeat(600))).is_ok());
    }

    #[test]
    fn placeholders_must_name_parameters() {
        assert!(check("order:{id}", &["id"], false).is_ok());
        assert!(check("{user.name}", &["user"], false).is_ok());
        assert!(check("{self.tenant}:{id}", &["id"], true).is_ok());
        assert_eq!(
            check("order:{x}", &["id", "user"], false).unwrap_err(),
            "no parameter binds `x`; the parameters bind: `id`, `user`"
        );
        assert_eq!(
            check("{x}", &[], false).unwrap_err(),
            "no parameter binds `x`; the function's parameters bind no names to build the key from"
        );
        assert!(check("{tenant}", &[], true)
            .unwrap_err()
            .ends_with("for a field of `self`, write `{self.tenant}`"));
        assert!(check("{self.x}", &["id"], false)
            .unwrap_err()
            .starts_with("`{self.x}` needs a method with a `self` receiver"));
        assert!(check("{guard}", &["id"], false)
            .unwrap_err()
            .contains("is the lock guard"));
    }

    #[test]
    fn every_bad_placeholder_is_reported() {
        let err = check("{a}:{b}", &["id"], false).unwrap_err();
        assert!(err.contains("`a`") && err.contains("`b`"), "{err}");
    }

    #[test]
    fn renders_format_calls() {
        assert_eq!(render("order:{id}"), r#":: std :: format ! ("order:{id}")"#);
        assert_eq!(
            render("{self.a.0}/{id}/{{x}}"),
            r#":: std :: format ! ("{}/{id}/{{x}}" , self . a . 0)"#
        );
        assert_eq!(
            render("fixed{{1}}"),
            r#":: std :: string :: String :: from ("fixed{1}")"#
        );
    }
}
