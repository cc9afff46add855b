use super::*;

const BOTH: [SqlDialect; 2] = [SqlDialect::Postgres, SqlDialect::MySql];

fn orders() -> FencedUpdate {
    FencedUpdate::new("orders", "id").set("status")
}

/// The error's message, for every dialect (the input checks do not depend
/// on it unless a test says so).
fn refused(update: &FencedUpdate) -> Vec<String> {
    BOTH.iter()
        .map(|&d| {
            let update_err = update.sql(d).unwrap_err().to_string();
            let upsert_err = update.upsert_sql(d).unwrap_err().to_string();
            assert_eq!(update_err, upsert_err, "{d:?}");
            update_err
        })
        .collect()
}

#[test]
fn odd_names_are_quoted_with_their_quote_doubled() {
    let update = FencedUpdate::new("Order \"Book\" `x`", "Order ID")
        .schema("my shop")
        .set("Status")
        .set("paid at")
        .fence_column("Fence");
    assert_eq!(
        update.postgres().unwrap(),
        r#"UPDATE "my shop"."Order ""Book"" `x`" SET "Status" = $1, "paid at" = $2, "Fence" = $4 WHERE "Order ID" = $3 AND ("Fence" IS NULL OR "Fence" <= $4)"#
    );
    assert_eq!(
        update.mysql().unwrap(),
        "UPDATE `my shop`.`Order \"Book\" ``x``` SET `Status` = ?, `paid at` = ?, `Fence` = ? WHERE `Order ID` = ? AND (`Fence` IS NULL OR `Fence` <= ?)"
    );
}

#[test]
fn a_dot_in_the_table_name_is_part_of_the_name() {
    let sql = FencedUpdate::new("a.b", "id").set("v").postgres().unwrap();
    assert!(sql.starts_with(r#"UPDATE "a.b" SET"#), "{sql}");
}

#[test]
fn the_mysql_upsert_writes_the_fence_last() {
    let sql = orders().upsert_sql(SqlDialect::MySql).unwrap();
    let newer = "`fence` IS NULL OR `fence` <= VALUES(`fence`)";
    assert_eq!(
        sql,
        format!(
            "INSERT INTO `orders` (`status`, `id`, `fence`) VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE \
             `status` = IF({newer}, VALUES(`status`), `status`), `fence` = IF({newer}, VALUES(`fence`), `fence`)"
        )
    );
}

#[test]
fn arguments_follow_each_dialects_placeholders() {
    let update = orders().set("note");
    assert_eq!(
        update
            .arguments(SqlDialect::Postgres, ["paid", "card"], "42", "7")
            .unwrap(),
        ["paid", "card", "42", "7"]
    );
    assert_eq!(
        update
            .arguments(SqlDialect::MySql, ["paid", "card"], "42", "7")
            .unwrap(),
        ["paid", "card", "7", "42", "7"]
    );
    let err = update
        .arguments(SqlDialect::MySql, ["paid"], "42", "7")
        .unwrap_err();
    assert!(
        matches!(
            err,
            FenceError::ValueCount {
                columns: 2,
                values: 1
            }
        ),
        "{err}"
    );
}

#[test]
fn empty_names_are_refused_naming_the_input() {
    let cases = [
        (FencedUpdate::new("", "id").set("v"), "invalid table \"\""),
        (orders().schema(""), "invalid schema \"\""),
        (
            FencedUpdate::new("t", "").set("v"),
            "invalid key column \"\"",
        ),
        (orders().set(""), "invalid set column \"\""),
        (orders().fence_column(""), "invalid fence column \"\""),
    ];
    for (update, says) in cases {
        for err in refused(&update) {
            assert!(err.contains(says) && err.contains("empty"), "{err}");
        }
    }
}

#[test]
fn a_nul_in_a_name_is_refused() {
    for err in refused(&orders().set("no\0te")) {
        assert!(
            err.contains("invalid set column \"no\\0te\"") && err.contains("NUL"),
            "{err}"
        );
    }
}

#[test]
fn names_the_server_would_truncate_or_refuse_are_refused() {
    let long = "c".repeat(64);
    let err = orders().set(&long).postgres().unwrap_err().to_string();
    assert!(err.contains("63"), "{err}");
    assert!(orders().set(&long).mysql().is_ok(), "64 fit MySQL");
    let err = orders().set(format!("{long}c")).mysql().unwrap_err();
    assert!(err.to_string().contains("64"), "{err}");
    let err = orders().set("note ").mysql().unwrap_err();
    assert!(err.to_string().contains("end with a space"), "{err}");
    assert!(orders().set("note ").postgres().is_ok());
}

#[test]
fn no_columns_to_set_is_refused() {
    for err in refused(&FencedUpdate::new("orders", "id")) {
        assert!(err.contains("\"orders\" sets no column"), "{err}");
    }
}

#[test]
fn the_fence_or_key_column_among_the_set_ones_is_refused() {
    for err in refused(&orders().set("fence")) {
        assert!(
            err.contains("\"fence\"") && err.contains("the fence column"),
            "{err}"
        );
    }
    for err in refused(&orders().set("id")) {
        assert!(
            err.contains("\"id\"") && err.contains("key column"),
            "{err}"
        );
    }
    for err in refused(&FencedUpdate::new("t", "id").set("v").fence_column("id")) {
        assert!(err.contains("the fence column is the key column"), "{err}");
    }
}

#[test]
fn a_column_set_twice_is_refused_case_blind_on_mysql() {
    for err in refused(&orders().set("note").set("status")) {
        assert!(
            err.contains("\"status\"") && err.contains("set twice"),
            "{err}"
        );
    }
    // Quoted PostgreSQL names are case-sensitive: two columns; MySQL's are not.
    let update = orders().set("Status");
    assert!(update.postgres().is_ok());
    let err = update.mysql().unwrap_err().to_string();
    assert!(
        err.contains("\"Status\"") && err.contains("set twice"),
        "{err}"
    );
    let err = orders()
        .fence_column("FENCE")
        .set("Fence")
        .mysql()
        .unwrap_err();
    assert!(err.to_string().contains("the fence column"), "{err}");
}
