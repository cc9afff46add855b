//! The attribute's settings given as expressions (`ttl = CONFIG.lock_ttl`):
//! each goes through one of these functions, spanned on the expression, so
//! a value of the wrong type is an error there that says what to write.

use std::sync::Arc;
use std::time::Duration;

/// A value `ttl`, `wait` and `hold_at_least` accept as an expression.
#[diagnostic::on_unimplemented(
    message = "`#[distributed_lock]` takes `ttl`, `wait` and `hold_at_least` as a `std::time::Duration`; found `{Self}`",
    label = "expected a `std::time::Duration` here",
    note = "write a `Duration` expression (`Duration::from_secs(30)`, `CONFIG.lock_ttl`, `self.settings.ttl()`), or a string literal such as `\"30s\"`, checked at compile time"
)]
pub trait DurationSetting {
    /// The duration.
    fn into_duration(self) -> Duration;
}

impl DurationSetting for Duration {
    fn into_duration(self) -> Duration {
        self
    }
}

impl DurationSetting for &Duration {
    fn into_duration(self) -> Duration {
        *self
    }
}

/// `ttl = <expr>`, `wait = <expr>`, `hold_at_least = <expr>`: checked by
/// the builder's own methods at the acquisition (a ttl out of range is
/// `LockError::InvalidOption` then, as with `Lock::ttl`).
pub fn duration_setting<T: DurationSetting>(value: T) -> Duration {
    value.into_duration()
}

/// A value `backend` accepts as an expression: a registered backend's name.
#[diagnostic::on_unimplemented(
    message = "`#[distributed_lock]` takes `backend` as a name (`&str` or `String`); found `{Self}`",
    label = "expected the name of a registered backend here",
    note = "write a `&str` or `String` expression (`CONFIG.lock_backend.as_str()`), or a string literal such as `\"etcd\"`"
)]
pub trait BackendSetting {
    /// The name.
    fn into_name(self) -> String;
}

impl BackendSetting for &str {
    fn into_name(self) -> String {
        self.to_owned()
    }
}

impl BackendSetting for String {
    fn into_name(self) -> String {
        self
    }
}

impl BackendSetting for &String {
    fn into_name(self) -> String {
        self.clone()
    }
}

impl BackendSetting for Arc<str> {
    fn into_name(self) -> String {
        self.as_ref().to_owned()
    }
}

impl BackendSetting for &Arc<str> {
    fn into_name(self) -> String {
        self.as_ref().to_owned()
    }
}

/// `backend = <expr>`: a name not registered is `LockError::NoBackend` at
/// the acquisition, as with `Lock::backend`.
pub fn backend_setting<T: BackendSetting>(name: T) -> String {
    name.into_name()
}
