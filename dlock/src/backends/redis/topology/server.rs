//! What a backend of one server talks to: that server's connection
//! (`connection.rs`), or the master a Sentinel deployment names now
//! (`sentinel.rs`), behind one `ConnectionLike`. Above both, so that
//! neither needs the other's type.

use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use crate::backends::redis::topology::sentinel::Sentinel;
use crate::backends::redis::transport::connection::Connection;

/// What a backend of one server talks to: that server, or the master a
/// Sentinel deployment names now (followed across failovers). Cheap to
/// clone: clones share the connection.
#[derive(Clone)]
pub(crate) enum Server {
    One(Connection),
    Followed(Sentinel),
}

impl ConnectionLike for Server {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Server::One(c) => c.req_packed_command(cmd),
            Server::Followed(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Server::One(c) => c.req_packed_commands(pipeline, offset, count),
            Server::Followed(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Server::One(c) => c.get_db(),
            Server::Followed(c) => c.get_db(),
        }
    }
}
