//! The spans and events operators see, captured by a `tracing` layer: their
//! names, fields and outcomes, and the `dlock.held` span that tags every log
//! line written inside a `#[distributed_lock]` body with its key and fence.
//!
//! The subscriber is global (renewals run on dlock's own thread), so one test
//! runs the whole sequence, on keys of its own.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock::backends::memory::MemoryBackend;
use dlock::{distributed_lock, Lock, LockError, LockGuard, RwLock};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// Field values as text.
#[derive(Debug, Default, Clone)]
struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

/// A closed span: its name, every field it was given, and its parent's name.
#[derive(Debug, Clone)]
struct SpanRecord {
    name: &'static str,
    fields: Fields,
    parent: Option<&'static str>,
}

/// An event: its level, fields, and the spans it was inside of.
#[derive(Debug, Clone)]
struct EventRecord {
    level: Level,
    fields: Fields,
    scope: Vec<SpanRecord>,
}

#[derive(Default, Clone)]
struct Captured {
    spans: Arc<Mutex<Vec<SpanRecord>>>,
    events: Arc<Mutex<Vec<EventRecord>>>,
}

struct Capture(Captured);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(fields) = span.extensions_mut().get_mut::<Fields>()
        {
            values.record(fields);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let scope = ctx
            .event_scope(event)
            .map(|scope| {
                scope
                    .map(|span| SpanRecord {
                        name: span.name(),
                        parent: span.parent().map(|p| p.name()),
                        fields: span
                            .extensions()
                            .get::<Fields>()
                            .cloned()
                            .unwrap_or_default(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        self.0.events.lock().unwrap().push(EventRecord {
            level: *event.metadata().level(),
            fields,
            scope,
        });
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(&id) {
            let fields = span
                .extensions()
                .get::<Fields>()
                .cloned()
                .unwrap_or_default();
            self.0.spans.lock().unwrap().push(SpanRecord {
                name: span.name(),
                parent: span.parent().map(|p| p.name()),
                fields,
            });
        }
    }
}

impl Captured {
    /// Closed spans named `name` whose `key` field is `key`.
    fn spans(&self, name: &str, key: &str) -> Vec<SpanRecord> {
        self.spans
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.name == name && s.fields.0.get("key").map(String::as_str) == Some(key))
            .cloned()
            .collect()
    }

    fn outcomes(&self, key: &str) -> Vec<String> {
        self.spans("dlock.acquire", key)
            .iter()
            .map(|s| s.fields.0.get("outcome").cloned().unwrap_or_default())
            .collect()
    }
}

#[distributed_lock(key = "traced:{id}", backend = "tracing")]
async fn traced(id: u32, guard: &LockGuard) -> Result<Option<u64>, LockError> {
    tracing::info!(step = "inside", "writing the order");
    Ok(guard.fencing_token())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_and_events_name_the_lock() {
    let captured = Captured::default();
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry().with(Capture(captured.clone())),
    )
    .expect("the only subscriber of this test binary");
    let backend = Arc::new(MemoryBackend::new());
    dlock::registry().register("tracing", backend.clone());
    let lock = Lock::new("spanned").backend("tracing");

    // dlock.acquire: acquired, reentered, busy, timeout, error.
    let held = lock.acquire().await.unwrap();
    let fence = held.fencing_token().unwrap();
    let inner = held.scope(lock.acquire()).await.unwrap();
    drop(inner);
    let busy = tokio::spawn({
        let lock = lock.clone();
        async move { lock.try_acquire().await }
    });
    assert!(busy.await.unwrap().unwrap().is_none());
    let timed_out = tokio::spawn({
        let lock = lock.clone().wait(Duration::from_millis(100));
        async move { lock.acquire().await }
    });
    assert!(timed_out.await.unwrap().is_err());
    held.release().await.unwrap();
    assert!(Lock::new("").backend("tracing").acquire().await.is_err());

    let mut outcomes = captured.outcomes("spanned");
    outcomes.sort();
    assert_eq!(outcomes, ["acquired", "busy", "reentered", "timeout"]);
    assert_eq!(captured.outcomes(""), ["error"]);
    let acquired = captured
        .spans("dlock.acquire", "spanned")
        .into_iter()
        .find(|s| s.fields.0.get("outcome").map(String::as_str) == Some("acquired"))
        .unwrap();
    let fields = &acquired.fields.0;
    assert_eq!(fields.get("backend").map(String::as_str), Some("tracing"));
    assert_eq!(fields.get("kind").map(String::as_str), Some("lock"));
    assert_eq!(fields.get("ttl_ms").map(String::as_str), Some("30000"));
    assert_eq!(fields.get("fence"), Some(&fence.to_string()));
    assert!(fields.contains_key("waited_us"), "{fields:?}");
    // No wait was set: the field is absent rather than a made-up number.
    assert!(!fields.contains_key("wait_ms"), "{fields:?}");

    // dlock.acquire_all: the parent of one dlock.acquire per key; a timeout
    // names the key it waited on.
    let blocker = Lock::new("multi:b")
        .backend("tracing")
        .acquire()
        .await
        .unwrap();
    let multi = dlock::MultiLock::new(["multi:b", "multi:a"])
        .backend("tracing")
        .wait(Duration::from_millis(100));
    assert!(multi.acquire().await.is_err());
    blocker.release().await.unwrap();
    multi.acquire().await.unwrap().release().await.unwrap();
    let all: Vec<SpanRecord> = captured
        .spans
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.name == "dlock.acquire_all")
        .cloned()
        .collect();
    assert_eq!(all.len(), 2, "{all:?}");
    let timed_out = &all[0].fields.0;
    assert_eq!(
        timed_out.get("keys").map(String::as_str),
        Some("multi:a, multi:b")
    );
    assert_eq!(
        timed_out.get("outcome").map(String::as_str),
        Some("timeout")
    );
    assert_eq!(
        timed_out.get("blocked_on").map(String::as_str),
        Some("multi:b")
    );
    assert_eq!(
        all[1].fields.0.get("outcome").map(String::as_str),
        Some("acquired")
    );
    // The blocker's own acquire of `multi:b` has no parent; the multi-lock's
    // two attempts on each key are inside its `dlock.acquire_all`.
    for key in ["multi:a", "multi:b"] {
        let under_all = captured
            .spans("dlock.acquire", key)
            .into_iter()
            .filter(|s| s.parent == Some("dlock.acquire_all"))
            .count();
        assert_eq!(under_all, 2, "{key}");
    }
    assert_eq!(captured.outcomes("multi:a"), ["acquired", "acquired"]);
    assert_eq!(
        captured.outcomes("multi:b"),
        ["acquired", "timeout", "acquired"]
    );

    // dlock.release.
    let releases = captured.spans("dlock.release", "spanned");
    assert_eq!(releases.len(), 1, "{releases:?}");
    assert_eq!(
        releases[0].fields.0.get("outcome").map(String::as_str),
        Some("released")
    );

    // An RwLock's spans say which side they took: kind `read` or `write`.
    let prices = RwLock::new("prices").backend("tracing");
    prices.read().await.unwrap().release().await.unwrap();
    prices.write().await.unwrap().release().await.unwrap();
    let kinds = |name: &str| -> Vec<String> {
        captured
            .spans(name, "prices")
            .iter()
            .map(|s| s.fields.0.get("kind").cloned().unwrap_or_default())
            .collect()
    };
    assert_eq!(kinds("dlock.acquire"), ["read", "write"]);
    assert_eq!(kinds("dlock.release"), ["read", "write"]);

    // dlock.renew, and the WARN event of a lost lease.
    let ttl = Duration::from_millis(300);
    let doomed = Lock::new("doomed")
        .backend("tracing")
        .ttl(ttl)
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(ttl / 2).await;
    assert!(backend.force_expire("doomed"));
    tokio::time::timeout(Duration::from_secs(2), doomed.lost())
        .await
        .unwrap();
    let renewals: Vec<SpanRecord> = captured
        .spans
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.name == "dlock.renew")
        .cloned()
        .collect();
    assert!(!renewals.is_empty(), "no dlock.renew span");
    let renew = &renewals[0].fields.0;
    for field in ["backend", "leases", "renewed", "failed"] {
        assert!(
            renew.contains_key(field),
            "dlock.renew without {field}: {renew:?}"
        );
    }
    let lost: Vec<EventRecord> = captured
        .events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| {
            e.level == Level::WARN && e.fields.0.get("key").map(String::as_str) == Some("doomed")
        })
        .cloned()
        .collect();
    assert_eq!(lost.len(), 1, "{lost:?}");
    let lost = &lost[0].fields.0;
    assert_eq!(lost.get("reason").map(String::as_str), Some("refused"));
    for field in ["fence", "held_for_ms", "backend"] {
        assert!(
            lost.contains_key(field),
            "lost event without {field}: {lost:?}"
        );
    }
    drop(doomed);

    // dlock.held: a log line inside the body carries the key and the fence.
    let fence = traced(7).await.unwrap().unwrap();
    let inside: Vec<EventRecord> = captured
        .events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e.fields.0.get("step").map(String::as_str) == Some("inside"))
        .cloned()
        .collect();
    assert_eq!(inside.len(), 1);
    let held_span = inside[0]
        .scope
        .iter()
        .find(|s| s.name == "dlock.held")
        .expect("the body's event is inside dlock.held");
    assert_eq!(
        held_span.fields.0.get("key").map(String::as_str),
        Some("traced:7")
    );
    assert_eq!(held_span.fields.0.get("fence"), Some(&fence.to_string()));

    // dlock.campaign: the election, its outcome and term; the elected,
    // resigned and lost events.
    let backend = Arc::new(MemoryBackend::new());
    let election = dlock::Election::new("traced-election").with_backend(backend.clone());
    let leadership = election.campaign("node-a").await.unwrap();
    let term = leadership.term();
    leadership.resign().await.unwrap();
    let doomed = election
        .clone()
        .ttl(Duration::from_millis(300))
        .campaign("node-b")
        .await
        .unwrap();
    backend.force_expire("traced-election");
    tokio::time::timeout(Duration::from_secs(5), doomed.lost())
        .await
        .unwrap();
    let campaigns: Vec<SpanRecord> = captured
        .spans
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.name == "dlock.campaign")
        .cloned()
        .collect();
    assert_eq!(campaigns.len(), 2, "{campaigns:?}");
    let first = &campaigns[0].fields.0;
    assert_eq!(
        first.get("election").map(String::as_str),
        Some("traced-election")
    );
    assert_eq!(first.get("outcome").map(String::as_str), Some("elected"));
    assert_eq!(first.get("term"), Some(&term.to_string()));
    assert!(first.contains_key("backend"), "{first:?}");
    let events = |message: &str| -> Vec<EventRecord> {
        captured
            .events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| {
                e.fields.0.get("election").map(String::as_str) == Some("traced-election")
                    && e.fields
                        .0
                        .get("message")
                        .is_some_and(|m| m.contains(message))
            })
            .cloned()
            .collect()
    };
    assert_eq!(events("elected leader").len(), 2);
    let ended = events("leadership ended");
    assert_eq!(ended.len(), 1, "{ended:?}");
    assert_eq!(
        ended[0].fields.0.get("reason").map(String::as_str),
        Some("resigned")
    );
    let lost = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let lost = events("leadership lost");
            if !lost.is_empty() {
                return lost;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("a leadership lost event");
    assert_eq!(lost[0].level, Level::WARN);
    drop(doomed);
}
