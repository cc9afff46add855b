//! What a tracing subscriber writes, kept in memory for the test to read:
//! for the tests that check what dlock logs (an event's fields, or that no
//! secret shows).

use std::sync::{Arc, Mutex};

use tracing_subscriber::fmt::MakeWriter;

/// A log buffer: give a clone to `tracing_subscriber::fmt().with_writer`,
/// read it with [`text`](Self::text).
#[derive(Clone, Debug, Default)]
pub struct CapturedLog(Arc<Mutex<Vec<u8>>>);

impl CapturedLog {
    /// A buffer that records this thread's events at `level` and above
    /// (no colours) until the returned guard is dropped.
    pub fn at_level(level: tracing::Level) -> (Self, tracing::subscriber::DefaultGuard) {
        let captured = Self::default();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(level)
            .with_ansi(false)
            .with_writer(captured.clone())
            .finish();
        let guard = tracing::subscriber::set_default(subscriber);
        (captured, guard)
    }

    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for CapturedLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for CapturedLog {
    type Writer = CapturedLog;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}
