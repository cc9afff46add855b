//! How `inspect --semaphore` and `list` show a semaphore: its holders, how
//! many permits each holds, and the count stored on the server.

use dlock::inspect::{PermitHolder, SemaphoreInfo};

use crate::shown;

/// Who a holder is: its client name, else the server's session for it
/// (`pid 4711`, `connection 12`), else unnamed.
fn who(h: &PermitHolder) -> String {
    match (&h.holder, &h.session) {
        (Some(name), _) => shown::text(name),
        (None, Some(session)) => shown::text(session),
        (None, None) => "an unnamed holder".to_owned(),
    }
}

/// One semaphore as a line: `exports: 4 of 10 permits held (6 free) by
/// billing-7 (3), pid 4711 (1)`, or `exports: free`.
pub(crate) fn describe(name: &str, info: &SemaphoreInfo) -> String {
    if info.holders.is_empty() {
        return format!("{}: free", shown::text(name));
    }
    let by: Vec<String> = info
        .holders
        .iter()
        .map(|h| format!("{} ({})", who(h), h.count))
        .collect();
    let of = match (info.permits, info.available()) {
        (Some(permits), Some(free)) => format!(" of {permits} permits held ({free} free)"),
        _ => " permits held".to_owned(),
    };
    format!(
        "{}: {}{of} by {}",
        shown::text(name),
        info.held(),
        by.join(", ")
    )
}

/// One semaphore as JSON (`kind: "semaphore"`, `held: false` without holders).
pub(crate) fn json(name: &str, info: &SemaphoreInfo) -> serde_json::Value {
    let holders: Vec<_> = info
        .holders
        .iter()
        .map(|h| serde_json::json!({ "holder": h.holder, "session": h.session, "count": h.count }))
        .collect();
    serde_json::json!({
        "key": name,
        "kind": "semaphore",
        "held": !info.holders.is_empty(),
        "permits": info.permits,
        "available": info.available(),
        "holders": holders,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders_show_by_name_session_or_unnamed() {
        let info = SemaphoreInfo::new(
            Some(10),
            vec![
                PermitHolder::new(None, Some("pid 4711".into()), 1),
                PermitHolder::new(Some("billing\u{1b}7".into()), None, 3),
                PermitHolder::new(None, None, 1),
            ],
        );
        assert_eq!(
            describe("exports", &info),
            "exports: 5 of 10 permits held (5 free) by billing\\u{001B}7 (3), an unnamed holder (1), pid 4711 (1)"
        );
        assert_eq!(
            describe("e", &SemaphoreInfo::new(None, Vec::new())),
            "e: free"
        );
        let v = json("exports", &info);
        assert_eq!(
            (v["permits"].as_u64(), v["available"].as_u64()),
            (Some(10), Some(5))
        );
        assert_eq!(v["holders"][0]["count"], 3);
    }
}
