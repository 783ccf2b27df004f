//! The server assembled: the core, the transport, and the protocols on their ports. The
//! one place that knows all of them (the layers below import none of the ones beside).

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::Notify;
use zipcache::ZipCache;

use crate::core::{Core, ServerInfo, ServerOptions};
use crate::memcache::Memcached;
use crate::metrics_http;
use crate::resp::Resp;
use crate::transport::tls::Tls;
use crate::transport::{Bound, Running, Services, Transport};

/// Every part of a server over one engine, before or without any port: what the ports
/// serve, and what sessions outside a listening server (fuzzing, tests) run against.
pub struct Parts {
    pub core: Arc<Core>,
    pub transport: Arc<Transport>,
    pub memcached: Arc<Memcached>,
    pub resp: Arc<Resp>,
}

impl Parts {
    fn new(
        cache: Arc<ZipCache>,
        info: ServerInfo,
        tls: Option<Tls>,
        options: &ServerOptions,
    ) -> Parts {
        let core = Arc::new(Core::new(cache, info, options));
        let transport = Arc::new(Transport::new(core.clone(), tls, options));
        let memcached = Arc::new(Memcached::new(transport.clone(), options));
        let resp = Arc::new(Resp::new(transport.clone(), options));
        Parts {
            core,
            transport,
            memcached,
            resp,
        }
    }

    /// The parts of a server that listens nowhere (fuzzing, property tests).
    pub fn detached(cache: Arc<ZipCache>, options: &ServerOptions) -> Parts {
        Parts::new(cache, ServerInfo::detached(), None, options)
    }

    /// SIGHUP, as memcached: the auth files and the TLS files read again. One line per
    /// file set, saying how it went; one that fails to load leaves what was loaded before.
    pub fn reload_files(&self) -> Vec<String> {
        let metrics = self.core.metrics_access.reload_users();
        let mut said: Vec<String> = (self.core.access.reload_users().into_iter())
            .chain(metrics.map(|said| format!("metrics {said}")))
            .chain(self.core.cluster.reload_config())
            .collect();
        match self.transport.refresh_certs() {
            Ok(false) => {}
            Ok(true) => said.push("TLS certificates reloaded".into()),
            Err(e) => said.push(format!(
                "TLS certificates not reloaded, the old ones stay: {e}"
            )),
        }
        said
    }
}

/// A running server: its bound addresses, and `shutdown` to stop it.
pub struct ServerHandle {
    pub memcached_addr: Option<SocketAddr>,
    pub resp_addr: Option<SocketAddr>,
    pub metrics_addr: Option<SocketAddr>,
    /// The unix-domain socket memcached's protocols are served on.
    pub unix_socket: Option<PathBuf>,
    parts: Parts,
    running: Running,
}

impl ServerHandle {
    /// Stops accepting, lets every connection finish the requests it has read, waits for
    /// the threads (at most a few seconds for stuck clients), stops what runs beside
    /// them (a crawl; a delayed `flush_all` fires now) and returns the engine, which no
    /// part of the server holds any more once `self` is gone.
    pub fn shutdown(self) -> Arc<ZipCache> {
        self.parts
            .transport
            .accepting
            .store(false, Ordering::Relaxed);
        // The runtimes end here: the tasks they ran (connections, scrapes, timers) are
        // dropped with whatever they held.
        self.running.stop();
        self.parts.memcached.stop();
        self.parts.core.cluster.stop_sweeping();
        self.parts.core.keys.engine().clone()
    }

    /// Notified when a client asks the server to stop (memcached's `shutdown`, with
    /// `shutdown_enabled`); stopping is the owner's job: `shutdown`.
    pub fn shutdown_requests(&self) -> Arc<Notify> {
        self.parts.core.shutdown_requested.clone()
    }

    /// Reads the auth file and the TLS files again (SIGHUP): [`Parts::reload_files`].
    pub fn reload_files(&self) -> Vec<String> {
        self.parts.reload_files()
    }

    /// Open client connections each runtime serves (one entry with `Runtime::Shared`).
    pub fn connections_per_runtime(&self) -> Vec<usize> {
        self.running.runtimes.connections()
    }

    /// The line `run` prints once serving, which scripts and tests parse:
    /// `listening memcached=ADDR resp=ADDR metrics=ADDR`, `off` for a port that is off,
    /// then ` unix=PATH` when memcached is served on a unix socket too.
    pub fn listening(&self) -> String {
        let addr = |a: Option<SocketAddr>| a.map_or("off".to_string(), |a| a.to_string());
        let unix = self.unix_socket.as_ref();
        let unix = unix.map_or(String::new(), |path| format!(" unix={}", path.display()));
        format!(
            "listening memcached={} resp={} metrics={}{unix}",
            addr(self.memcached_addr),
            addr(self.resp_addr),
            addr(self.metrics_addr)
        )
    }

    pub fn connections(&self) -> u64 {
        let counters = &self.parts.core.counters;
        counters.curr_connections.load(Ordering::Relaxed)
    }
}

/// Binds the ports and serves `cache` on them: [`Bound::new`], then [`serve`].
pub fn start(cache: Arc<ZipCache>, options: ServerOptions) -> io::Result<ServerHandle> {
    serve(Bound::new(options)?, cache)
}

/// Serves `cache` on the ports `bound` holds. On an error no thread of the server is
/// left and the server holds no reference to `cache`: its owner can close it cleanly.
pub fn serve(mut bound: Bound, cache: Arc<ZipCache>) -> io::Result<ServerHandle> {
    let options = bound.options().clone();
    let (memcached_addr, resp_addr, metrics_addr) =
        (bound.memcached_addr, bound.resp_addr, bound.metrics_addr);
    let info = ServerInfo {
        listen: options.listen,
        memcached_port: memcached_addr.map_or(0, |a| a.port()),
        resp_port: resp_addr.map_or(0, |a| a.port()),
        unix_socket: bound.unix_socket.clone(),
        unix_socket_mode: options.unix_socket_mode,
        threads: options.threads.max(1),
        max_connections: options.max_connections,
    };
    let parts = Parts::new(cache, info, bound.take_tls(), &options);
    let services = Services {
        memcached: parts.memcached.clone(),
        resp: parts.resp.clone(),
        metrics: metrics_http::Endpoint::new(parts.transport.clone()).into_direct(),
    };
    let running = bound.serve(parts.transport.clone(), services)?;
    parts
        .core
        .keys
        .engine()
        .set_eviction_listener(parts.memcached.logger.clone());
    Ok(ServerHandle {
        memcached_addr,
        resp_addr,
        metrics_addr,
        unix_socket: parts.core.info.unix_socket.clone(),
        parts,
        running,
    })
}
