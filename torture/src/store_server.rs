//! The fenced store as a server: one line protocol over loopback TCP, every closed write
//! interval appended to a log file.
//!
//! Requests and answers, one line each:
//!
//! | request | answer |
//! |---|---|
//! | `HELLO <worker>` (first line of a connection) | `OK` |
//! | `BEGIN <key> <fence or -> <limit>` | `OPEN <id> <value>` or `STALE <id>` |
//! | `COMMIT <id> <value>` | `ACCEPTED` or `REJECTED` |
//! | `ABORT <id>` | `OK` |
//! | `SHUTDOWN` | `BYE`; open intervals are closed as abandoned and the server stops |
//!
//! Anything else is answered `ERR <what is wrong>`. When a connection closes, the
//! intervals its worker left open are closed as abandoned (a killed worker).

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::clock::now_ns;
use crate::store::{Begin, Commit, Store, WriteRecord};

struct Shared {
    store: Store,
    log: BufWriter<File>,
}

impl Shared {
    fn log(&mut self, record: &WriteRecord) {
        // The log is the checker's input: a failed write must not pass silently.
        if let Err(e) = writeln!(self.log, "{record}").and_then(|()| self.log.flush()) {
            eprintln!("torture-store: cannot write the log: {e}");
            std::process::exit(3);
        }
    }
}

/// Serves the store on `listener` until a `SHUTDOWN` request, logging to `log`.
///
/// # Errors
/// The listener failed.
pub async fn serve(listener: TcpListener, log: File) -> io::Result<()> {
    let shared = Arc::new(Mutex::new(Shared {
        store: Store::default(),
        log: BufWriter::new(log),
    }));
    let (stop, mut stopped) = watch::channel(false);
    let stop = Arc::new(stop);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _) = accepted?;
                tokio::spawn(connection(stream, Arc::clone(&shared), Arc::clone(&stop)));
            }
            _ = stopped.changed() => return Ok(()),
        }
    }
}

async fn connection(stream: TcpStream, shared: Arc<Mutex<Shared>>, stop: Arc<watch::Sender<bool>>) {
    let _ = stream.set_nodelay(true);
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    let mut worker: Option<String> = None;
    while let Ok(Some(line)) = lines.next_line().await {
        let (answer, shutdown) = {
            let mut shared = shared.lock().unwrap_or_else(|e| e.into_inner());
            handle(&mut shared, &mut worker, &line)
        };
        if write
            .write_all(format!("{answer}\n").as_bytes())
            .await
            .is_err()
        {
            break;
        }
        if shutdown {
            stop.send_replace(true);
            return;
        }
    }
    if let Some(worker) = worker {
        let mut shared = shared.lock().unwrap_or_else(|e| e.into_inner());
        for record in shared.store.abandon(&worker, now_ns()) {
            shared.log(&record);
        }
    }
}

fn handle(shared: &mut Shared, worker: &mut Option<String>, line: &str) -> (String, bool) {
    let words: Vec<&str> = line.split_whitespace().collect();
    let now = now_ns();
    let answer = match (words.as_slice(), worker.as_deref()) {
        (["HELLO", name], None) => {
            *worker = Some((*name).to_string());
            "OK".to_string()
        }
        (["SHUTDOWN"], _) => {
            for record in shared.store.abandon_all(now) {
                shared.log(&record);
            }
            return ("BYE".to_string(), true);
        }
        (["BEGIN", key, fence, limit], Some(name)) => {
            let fence = match *fence {
                "-" => None,
                f => match f.parse() {
                    Ok(f) => Some(f),
                    Err(_) => return (format!("ERR bad fence `{f}`"), false),
                },
            };
            let Ok(limit) = limit.parse() else {
                return (format!("ERR bad limit `{limit}`"), false);
            };
            match shared.store.begin(key, name, fence, limit, now) {
                Begin::Open { id, value } => format!("OPEN {id} {value}"),
                Begin::Stale { record } => {
                    shared.log(&record);
                    format!("STALE {}", record.id)
                }
            }
        }
        (["COMMIT", id, value], Some(_)) => match (id.parse(), value.parse()) {
            (Ok(id), Ok(value)) => match shared.store.commit(id, value, now) {
                Ok(Commit::Accepted(record)) => {
                    shared.log(&record);
                    "ACCEPTED".to_string()
                }
                Ok(Commit::Rejected(record)) => {
                    shared.log(&record);
                    "REJECTED".to_string()
                }
                Err(e) => format!("ERR {e}"),
            },
            _ => format!("ERR bad COMMIT `{line}`"),
        },
        (["ABORT", id], Some(_)) => match id.parse().map(|id| shared.store.abort(id, now)) {
            Ok(Ok(record)) => {
                shared.log(&record);
                "OK".to_string()
            }
            Ok(Err(e)) => format!("ERR {e}"),
            Err(_) => format!("ERR bad ABORT `{line}`"),
        },
        (_, None) => format!("ERR say `HELLO <worker>` first, not `{line}`"),
        _ => format!("ERR unknown request `{line}`"),
    };
    (answer, false)
}
