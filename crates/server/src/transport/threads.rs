//! The runtime threads: thread 0 accepts on every port and hands each connection to the
//! thread serving the fewest ([`Runtimes`]); each thread serves its connections until
//! the stop ([`Running::stop`]), then waits a bounded time for them.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use super::client::{Accepted, Client, Handed};
use super::listen::{Accept, Bound, Listeners, Port};
use super::ring;
use super::{Services, Sessions, Transport};
use crate::core::Runtime;
use crate::core::stats::Counters;

/// How long shutdown waits for open connections to finish their current requests.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// A connection accepted on one runtime thread for another to serve.
struct Handoff {
    protocol: Arc<dyn Sessions>,
    client: Handed,
}

/// The runtimes serving connections: where to hand a new one, and how many each serves.
pub struct Runtimes {
    inboxes: Vec<mpsc::UnboundedSender<Handoff>>,
    serving: Vec<AtomicUsize>,
}

impl Runtimes {
    /// The runtime serving the fewest connections (the first of those tied).
    fn least_busy(&self) -> usize {
        (0..self.serving.len())
            .min_by_key(|&i| self.serving[i].load(Ordering::Relaxed))
            .unwrap_or(0)
    }

    /// Open client connections each runtime serves (one entry with `Runtime::Shared`).
    pub fn connections(&self) -> Vec<usize> {
        let serving = &self.serving;
        serving.iter().map(|n| n.load(Ordering::Relaxed)).collect()
    }
}

/// One runtime thread's entry in [`Runtimes`]: how many connections it serves.
#[derive(Clone)]
pub struct ThreadConnections {
    runtimes: Arc<Runtimes>,
    thread: usize,
}

impl ThreadConnections {
    pub(super) fn count(&self) -> &AtomicUsize {
        &self.runtimes.serving[self.thread]
    }
}

/// The threads serving the ports: stop them with [`Running::stop`].
pub struct Running {
    pub runtimes: Arc<Runtimes>,
    stop: watch::Sender<bool>,
    threads: Vec<JoinHandle<()>>,
}

impl Running {
    /// Stops accepting (a unix socket's file is removed then), lets every connection
    /// finish the requests it has read, and waits for the threads (at most a few seconds
    /// for stuck clients).
    pub fn stop(self) {
        let _ = self.stop.send(true);
        for thread in self.threads {
            let _ = thread.join();
        }
    }
}

impl Bound {
    /// Serves `services` on the bound ports. On an error no thread of the server is left
    /// and none holds a reference to `transport`.
    pub fn serve(self, transport: Arc<Transport>, services: Services) -> io::Result<Running> {
        let Bound {
            options,
            listeners,
            metrics,
            runtimes,
            ..
        } = self;
        let sessions = listeners
            .into_iter()
            .map(|(port, listener)| {
                let protocol = match port {
                    Port::Memcached | Port::MemcachedUnix => services.memcached.clone(),
                    Port::Resp => services.resp.clone(),
                };
                (protocol, listener)
            })
            .collect();
        let metrics = metrics.map(|listener| (services.metrics.clone(), listener));
        let (stop, stopped) = watch::channel(false);
        let (inboxes, receivers): (Vec<_>, Vec<_>) =
            runtimes.iter().map(|_| mpsc::unbounded_channel()).unzip();
        let serving_counts = runtimes.iter().map(|_| AtomicUsize::new(0)).collect();
        let runtimes_shared = Arc::new(Runtimes {
            inboxes,
            serving: serving_counts,
        });
        // Thread 0 accepts on every port and hands connections out.
        let mut listeners = Some(Listeners { sessions, metrics });
        // Tasks of a work-stealing runtime move between threads, and a ring's reads
        // complete only on the thread that submitted them: there, reads stay synchronous.
        let own_ring = options.runtime == Runtime::PerCore;
        let mut handles = Vec::new();
        for (i, (runtime, inbox)) in runtimes.into_iter().zip(receivers).enumerate() {
            let thread = Thread {
                transport: transport.clone(),
                stopped: stopped.clone(),
                runtimes: runtimes_shared.clone(),
            };
            let listeners = listeners.take().unwrap_or_default();
            let spawned = std::thread::Builder::new()
                .name(format!("zipcache-io-{i}"))
                .spawn(move || {
                    runtime.block_on(async move {
                        if own_ring
                            && let Some(eventfd) = ring::install_ssd_ring(ring::watch_eventfd)
                        {
                            tokio::spawn(ring::reap_ssd_reads(eventfd));
                        }
                        serve_thread(i, listeners, inbox, thread).await
                    })
                });
            match spawned {
                Ok(handle) => handles.push(handle),
                Err(e) => {
                    let _ = stop.send(true);
                    for handle in handles {
                        let _ = handle.join();
                    }
                    return Err(e);
                }
            }
        }
        Ok(Running {
            runtimes: runtimes_shared,
            stop,
            threads: handles,
        })
    }
}

/// What a runtime thread needs to accept and serve connections.
#[derive(Clone)]
struct Thread {
    transport: Arc<Transport>,
    stopped: watch::Receiver<bool>,
    runtimes: Arc<Runtimes>,
}

/// Runtime thread `me`: accepts on `listeners` (thread 0 has them all) and serves the
/// connections handed to it through `inbox` until shutdown, then waits for them.
async fn serve_thread(
    me: usize,
    listeners: Listeners,
    mut inbox: mpsc::UnboundedReceiver<Handoff>,
    thread: Thread,
) {
    // Each connection holds a sender; when all are dropped, `recv` returns None.
    let (alive, mut drained) = mpsc::channel::<()>(1);
    for (protocol, listener) in listeners.sessions {
        let Ok(listener) = listener.into_tokio() else {
            continue;
        };
        let (stopped, thread) = (thread.stopped.clone(), thread.clone());
        let admit = move |client| admit(&protocol, client, &thread);
        tokio::spawn(accept_until_stopped(listener, stopped, admit));
    }
    if let Some((answer, listener)) = listeners.metrics
        && let Ok(listener) = TcpListener::from_std(listener)
    {
        let answer = move |stream| answer(stream);
        tokio::spawn(accept_until_stopped(
            listener,
            thread.stopped.clone(),
            answer,
        ));
    }
    let mut stopped = thread.stopped.clone();
    loop {
        let handoff = tokio::select! {
            handoff = inbox.recv() => handoff,
            _ = stopped.wait_for(|stop| *stop) => break,
        };
        let Some(Handoff { protocol, client }) = handoff else {
            break;
        };
        let Thread {
            transport,
            stopped,
            runtimes,
        } = thread.clone();
        let alive = alive.clone();
        let here = ThreadConnections {
            runtimes,
            thread: me,
        };
        tokio::spawn(async move {
            if let Ok(client) = client.into_tokio() {
                let serving = protocol.serve(client, transport.clone(), stopped, here.clone());
                serving.await;
            }
            transport
                .core
                .counters
                .curr_connections
                .fetch_sub(1, Ordering::Relaxed);
            here.count().fetch_sub(1, Ordering::Relaxed);
            drop(alive);
        });
    }
    drop(alive);
    let _ = stopped.wait_for(|stop| *stop).await;
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, drained.recv()).await;
}

/// Accepts on `listener` until shutdown (then drops it), each client to `admit`.
async fn accept_until_stopped<L: Accept>(
    listener: L,
    mut stopped: watch::Receiver<bool>,
    admit: impl Fn(L::Client) + Send,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stopped.wait_for(|stop| *stop) => return,
        };
        match accepted {
            Ok(client) => admit(client),
            // Out of file descriptors and the like: back off instead of spinning.
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

/// Admits a client of `protocol` — TCP and unix-socket clients alike, under the one
/// connection limit — or tells it it is over the limit, and hands it to the runtime
/// serving the fewest.
fn admit(protocol: &Arc<dyn Sessions>, client: Accepted, thread: &Thread) {
    let Thread {
        transport,
        runtimes,
        ..
    } = thread;
    let counters = &transport.core.counters;
    let open = counters.curr_connections.fetch_add(1, Ordering::Relaxed);
    if open >= transport.core.info.max_connections as u64 {
        counters.curr_connections.fetch_sub(1, Ordering::Relaxed);
        Counters::bump(&counters.rejected_connections);
        client.reject(protocol.over_limit(), transport.tls.is_some());
        return;
    }
    Counters::bump(&counters.total_connections);
    if let Client::Tcp(stream, _) = &client {
        // Latency over batching: replies go out as soon as a read's requests are done.
        let _ = stream.set_nodelay(true);
    }
    let target = runtimes.least_busy();
    // Counted before the handoff: the connection may end before `send` returns.
    runtimes.serving[target].fetch_add(1, Ordering::Relaxed);
    let handed = client.into_std().ok().and_then(|client| {
        let handoff = Handoff {
            protocol: protocol.clone(),
            client,
        };
        runtimes.inboxes[target].send(handoff).ok()
    });
    if handed.is_none() {
        // The runtime is gone (shutting down): the connection closes unserved.
        runtimes.serving[target].fetch_sub(1, Ordering::Relaxed);
        counters.curr_connections.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtimes(serving: &[usize]) -> Runtimes {
        Runtimes {
            inboxes: Vec::new(),
            serving: serving.iter().map(|&n| AtomicUsize::new(n)).collect(),
        }
    }

    #[test]
    fn a_new_connection_goes_to_the_thread_serving_the_fewest_the_first_of_a_tie() {
        assert_eq!(runtimes(&[3, 1, 2]).least_busy(), 1);
        assert_eq!(runtimes(&[2, 0, 0]).least_busy(), 1);
        assert_eq!(runtimes(&[0]).least_busy(), 0);
        assert_eq!(runtimes(&[4, 4]).connections(), [4, 4]);
    }

    /// After the stop no thread is left and the ports are free for the next start.
    #[test]
    fn a_stop_ends_every_thread_and_frees_the_ports() {
        let server = crate::server::start(
            std::sync::Arc::new(zipcache::ZipCache::open(zipcache::Config::default()).unwrap()),
            crate::core::ServerOptions {
                listen: [127, 0, 0, 1].into(),
                memcached_port: Some(0),
                resp_port: Some(0),
                threads: 2,
                ..crate::core::ServerOptions::default()
            },
        )
        .unwrap();
        let ports = [server.memcached_addr.unwrap(), server.resp_addr.unwrap()];
        let client = std::net::TcpStream::connect(ports[0]).unwrap();
        let cache = server.shutdown();
        assert_eq!(
            std::sync::Arc::strong_count(&cache),
            1,
            "a thread still holds it"
        );
        for port in ports {
            std::net::TcpListener::bind(port).expect("the port is free after the stop");
        }
        drop(client);
    }
}
