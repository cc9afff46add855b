//! Reading the server's answers: every result set of a multi-statement
//! request (`rows_of`, which also reads the error of a failed statement
//! that `mysql_async` reports one read late) and typed columns of a row.
//! Beneath the sessions and the table checks, which both read rows.

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Row};

/// Every result set of the (multi-statement) `sql`; the rows of the last
/// one that had rows, and the affected rows of the first. A statement that
/// fails ends the batch with its error, which `mysql_async` reports only at
/// one more `collect` after `is_empty()` says the batch is over (an error
/// answer is not counted as a further result): that `collect` is always
/// made, and costs nothing when the batch really is over.
pub(super) async fn rows_of(conn: &mut Conn, sql: String) -> Result<Answer, mysql_async::Error> {
    let mut result = conn.query_iter(sql).await?;
    let first_affected = result.affected_rows();
    let mut rows = Vec::new();
    loop {
        let done = result.is_empty();
        let set: Vec<Row> = result.collect().await?;
        if !set.is_empty() {
            rows = set;
        }
        if done {
            break;
        }
    }
    Ok(Answer {
        rows,
        affected: first_affected,
    })
}

/// `answer`, the outcome of a statement that may take locks before it
/// fails: after a server error, `undo` (which lets them go, harmless where
/// nothing is held) runs on `conn` before the error is reported.
pub(super) async fn undone_on_error<T>(
    conn: &mut Conn,
    answer: Result<T, mysql_async::Error>,
    undo: String,
) -> Result<T, mysql_async::Error> {
    if let Err(mysql_async::Error::Server(_)) = &answer {
        let _ = conn.query_drop(undo).await;
    }
    answer
}

/// What [`rows_of`] read.
#[derive(Debug)]
pub(super) struct Answer {
    pub(super) rows: Vec<Row>,
    pub(super) affected: u64,
}

/// Column `i` of `row` as an integer; `None` for NULL or a missing column.
pub(super) fn int(row: &Row, i: usize) -> Option<i64> {
    match row.as_ref(i)? {
        mysql_async::Value::NULL => None,
        mysql_async::Value::Int(v) => Some(*v),
        mysql_async::Value::UInt(v) => i64::try_from(*v).ok(),
        mysql_async::Value::Bytes(b) => std::str::from_utf8(b).ok()?.trim().parse().ok(),
        mysql_async::Value::Double(d) => Some(*d as i64),
        mysql_async::Value::Float(d) => Some(*d as i64),
        _ => None,
    }
}

/// Column `i` of `row` as bytes; `None` for NULL or a missing column.
pub(super) fn bytes(row: &Row, i: usize) -> Option<Vec<u8>> {
    match row.as_ref(i)? {
        mysql_async::Value::Bytes(b) => Some(b.clone()),
        _ => None,
    }
}
