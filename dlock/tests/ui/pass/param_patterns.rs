// Placeholders name any binding of a parameter's pattern, as web handlers
// take their input (`Path(id): Path<u64>`, `Json(req): Json<PayRequest>`):
// tuple-struct, struct, tuple, nested, `ref` and `mut` bindings, and field
// paths on them.
use dlock::{distributed_lock, LockError, LockGuard};

struct Path<T>(T);
struct Json<T>(T);
struct State<T>(T);

struct PayRequest {
    order_id: u64,
    line: (u8, &'static str),
}

struct Point {
    x: i32,
    y: i32,
}

#[distributed_lock(key = "order:{id}:{req.order_id}:{req.line.1}:{app}")]
async fn pay(
    Path(id): Path<u64>,
    State(app): State<&'static str>,
    Json(req): Json<PayRequest>,
    guard: &LockGuard,
) -> Result<String, LockError> {
    Ok(format!("{}|{}", guard.key(), req.line.0))
}

#[distributed_lock(key = "{x}/{why}/{a}/{b}/{c}/{n}")]
async fn shapes(
    Point { x, y: mut why }: Point,
    (a, (b, ref c)): (u8, (u8, String)),
    mut n: u32,
    guard: &LockGuard,
) -> Result<String, LockError> {
    why += 1;
    n += 1;
    Ok(format!("{}|{why}|{n}|{c}", guard.key()))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), LockError> {
    dlock::registry().set_default(dlock::connect("memory://").await?);
    let req = PayRequest {
        order_id: 9,
        line: (2, "x"),
    };
    let paid = pay(Path(7), State("app"), Json(req)).await?;
    assert_eq!(paid, "order:7:9:x:app|2");
    let shaped = shapes(Point { x: 1, y: 2 }, (3, (4, "c".to_owned())), 5).await?;
    assert_eq!(shaped, "1/2/3/4/c/5|3|6|c");
    Ok(())
}
