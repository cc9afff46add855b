//! The worker's side of the fenced store's line protocol (see [`crate::store_server`]).

use std::io;
use std::net::SocketAddr;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

/// What `begin` got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opened {
    /// Interval `id` is open; the key holds `value`.
    Open {
        /// The interval.
        id: u64,
        /// The value read.
        value: u64,
    },
    /// The fence was refused as stale.
    Stale,
}

/// One connection to the store, named after its worker.
#[derive(Debug)]
pub struct StoreClient {
    lines: Lines<BufReader<OwnedReadHalf>>,
    write: OwnedWriteHalf,
}

impl StoreClient {
    /// Connects to the store at `addr` as `worker` (`<worker>.<incarnation>`).
    ///
    /// # Errors
    /// The store cannot be reached or refused the greeting.
    pub async fn connect(addr: SocketAddr, worker: &str) -> io::Result<Self> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (read, write) = stream.into_split();
        let mut client = Self {
            lines: BufReader::new(read).lines(),
            write,
        };
        client.expect(&format!("HELLO {worker}"), "OK").await?;
        Ok(client)
    }

    /// Opens a write interval on `key` with `fence` (`limit` holders allowed at once).
    ///
    /// # Errors
    /// The connection failed or the store answered something unexpected.
    pub async fn begin(
        &mut self,
        key: &str,
        fence: Option<u64>,
        limit: usize,
    ) -> io::Result<Opened> {
        let fence = fence.map_or("-".to_string(), |f| f.to_string());
        let answer = self
            .request(&format!("BEGIN {key} {fence} {limit}"))
            .await?;
        let words: Vec<&str> = answer.split_whitespace().collect();
        match words.as_slice() {
            ["OPEN", id, value] => match (id.parse(), value.parse()) {
                (Ok(id), Ok(value)) => Ok(Opened::Open { id, value }),
                _ => Err(unexpected(&answer)),
            },
            ["STALE", _] => Ok(Opened::Stale),
            _ => Err(unexpected(&answer)),
        }
    }

    /// Writes `value` in interval `id`; `true` if the store accepted it.
    ///
    /// # Errors
    /// As [`StoreClient::begin`].
    pub async fn commit(&mut self, id: u64, value: u64) -> io::Result<bool> {
        let answer = self.request(&format!("COMMIT {id} {value}")).await?;
        match answer.as_str() {
            "ACCEPTED" => Ok(true),
            "REJECTED" => Ok(false),
            _ => Err(unexpected(&answer)),
        }
    }

    /// Closes interval `id` without writing.
    ///
    /// # Errors
    /// As [`StoreClient::begin`].
    pub async fn abort(&mut self, id: u64) -> io::Result<()> {
        self.expect(&format!("ABORT {id}"), "OK").await
    }

    /// Asks the store to close every open interval, flush its log and stop.
    ///
    /// # Errors
    /// As [`StoreClient::begin`].
    pub async fn shutdown(&mut self) -> io::Result<()> {
        self.expect("SHUTDOWN", "BYE").await
    }

    async fn expect(&mut self, request: &str, wanted: &str) -> io::Result<()> {
        let answer = self.request(request).await?;
        if answer == wanted {
            Ok(())
        } else {
            Err(unexpected(&answer))
        }
    }

    async fn request(&mut self, line: &str) -> io::Result<String> {
        self.write.write_all(format!("{line}\n").as_bytes()).await?;
        self.lines.next_line().await?.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the store closed the connection",
            )
        })
    }
}

fn unexpected(answer: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("unexpected answer from the store: `{answer}`"),
    )
}
