//! One budget for the bytes every connection buffers, input and output together (Redis
//! 7's `maxmemory-clients`): each connection charges what it holds to its
//! [`ConnectionBuffers`]; when the total passes the budget, the connection holding the
//! most is told to close, whichever connection's charge passed it. What a connection may
//! do without, its SSD reads ahead of the request at the front, waits while the budget
//! is spent ([`ConnectionBuffers::budget_spent`]). A large object's read the front
//! request needs may pass the budget, by [`OVERDRAFT`] of it for all connections
//! together, then waits for room ([`ConnectionBuffers::room`]): a hundred connections
//! each starting one 1 MiB read past a spent 64 MiB budget went well past it
//! (`connections_reading_large_values_ahead_without_reading_replies`). A read of one SSD
//! block never waits (`transport/prefetch.rs`): when small reads waited too, a
//! well-behaved client's waited while readers that never read their replies held the
//! budget.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

/// What the reads front requests need may hold past the budget, as a share of it.
const OVERDRAFT: usize = 8;

/// The budget and the connections charging it.
pub struct BufferBudget {
    limit: usize,
    buffered: AtomicUsize,
    connections: Mutex<HashMap<u64, Arc<Held>>>,
    next_id: AtomicU64,
    /// Woken when the connections' buffers fall back within the overdraft.
    room: Notify,
}

/// What one connection holds, and whether the budget closed it.
#[derive(Default)]
struct Held {
    bytes: AtomicUsize,
    closed: AtomicBool,
    wake: Notify,
}

/// A connection's share of the budget: `charge` what it buffers, `release` what it
/// frees; dropping it releases the rest.
pub struct ConnectionBuffers {
    budget: Arc<BufferBudget>,
    id: u64,
    held: Arc<Held>,
}

impl BufferBudget {
    pub fn new(limit: usize) -> Arc<BufferBudget> {
        Arc::new(BufferBudget {
            limit,
            buffered: AtomicUsize::new(0),
            connections: Mutex::default(),
            next_id: AtomicU64::new(0),
            room: Notify::new(),
        })
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Past the budget and its overdraft.
    fn overdraft_limit(&self) -> usize {
        self.limit.saturating_add(self.limit / OVERDRAFT)
    }

    /// Bytes every connection buffers now.
    pub fn buffered(&self) -> usize {
        self.buffered.load(Ordering::Relaxed)
    }

    /// A new connection's share, holding nothing yet.
    pub fn register(self: &Arc<Self>) -> ConnectionBuffers {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let held = Arc::new(Held::default());
        self.connections().insert(id, held.clone());
        ConnectionBuffers {
            budget: self.clone(),
            id,
            held,
        }
    }

    /// The registry stays usable if a thread panicked holding it: every update of it is
    /// a single insert or remove.
    fn connections(&self) -> MutexGuard<'_, HashMap<u64, Arc<Held>>> {
        self.connections
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Over budget: the connection holding the most is told to close. Those told before
    /// and not gone yet count as freed: a burst of charges closes another only while
    /// the rest still do not fit. O(connections), on a rare event.
    fn close_biggest(&self) {
        let connections = self.connections();
        let closing: usize = connections
            .values()
            .filter(|held| held.closed.load(Ordering::Relaxed))
            .map(|held| held.bytes.load(Ordering::Relaxed))
            .sum();
        if self.buffered().saturating_sub(closing) <= self.limit {
            return;
        }
        let biggest = connections
            .values()
            .filter(|held| !held.closed.load(Ordering::Relaxed))
            .max_by_key(|held| held.bytes.load(Ordering::Relaxed));
        if let Some(held) = biggest {
            held.closed.store(true, Ordering::Relaxed);
            held.wake.notify_one();
        }
    }
}

impl ConnectionBuffers {
    /// This connection now holds `n` more bytes. Past the budget, the biggest connection
    /// is closed — this one, if it is the biggest ([`ConnectionBuffers::closed`]).
    pub fn charge(&self, n: usize) {
        self.held.bytes.fetch_add(n, Ordering::Relaxed);
        let total = self.budget.buffered.fetch_add(n, Ordering::Relaxed) + n;
        if total > self.budget.limit {
            self.budget.close_biggest();
        }
    }

    /// This connection freed `n` of the bytes it charged.
    pub fn release(&self, n: usize) {
        self.held.bytes.fetch_sub(n, Ordering::Relaxed);
        let was = self.budget.buffered.fetch_sub(n, Ordering::Relaxed);
        let overdrawn = self.budget.overdraft_limit();
        if was >= overdrawn && was - n < overdrawn {
            self.budget.room.notify_waiters();
        }
    }

    /// Charges or releases so that this connection is charged `now` bytes, from `was`.
    pub fn recharge(&self, was: usize, now: usize) {
        if now > was {
            self.charge(now - was);
        } else {
            self.release(was - now);
        }
    }

    /// Every connection together holds the whole budget or more.
    pub fn budget_spent(&self) -> bool {
        self.budget.buffered() >= self.budget.limit
    }

    /// Every connection together holds the budget and its overdraft, or more.
    pub fn overdrawn(&self) -> bool {
        self.budget.buffered() >= self.budget.overdraft_limit()
    }

    /// Resolves once every connection together holds less than the budget and its
    /// overdraft. The charges that passed the budget told the biggest to close; their
    /// going makes the room.
    pub async fn room(&self) {
        loop {
            let notified = self.budget.room.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the check: a release in between still wakes it.
            notified.as_mut().enable();
            if !self.overdrawn() {
                return;
            }
            self.budget.close_biggest();
            notified.await;
        }
    }

    /// The budget chose this connection to close.
    pub fn is_closed(&self) -> bool {
        self.held.closed.load(Ordering::Relaxed)
    }

    /// Resolves once the budget chooses this connection to close.
    pub async fn closed(&self) {
        while !self.is_closed() {
            self.held.wake.notified().await;
        }
    }
}

impl Drop for ConnectionBuffers {
    fn drop(&mut self) {
        self.release(self.held.bytes.load(Ordering::Relaxed));
        self.budget.connections().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_biggest_connection_is_closed_first() {
        let budget = BufferBudget::new(1000);
        let small = budget.register();
        let big = budget.register();
        let charging = budget.register();
        small.charge(100);
        big.charge(600);
        assert_eq!(budget.buffered(), 700);
        charging.charge(300);
        assert!(!big.is_closed(), "at the budget, not over it");
        charging.charge(1);
        assert!(big.is_closed());
        assert!(!small.is_closed() && !charging.is_closed());
        // Until the closed one has gone, further charges close no other.
        charging.charge(200);
        assert!(!small.is_closed() && !charging.is_closed());
        drop(big);
        assert_eq!(budget.buffered(), 601);
        charging.charge(400);
        assert!(charging.is_closed(), "now the biggest");
        assert!(!small.is_closed());
    }

    /// While one told to close is still going, charges that keep the others over the
    /// budget close the next biggest (the first version waited for the first to go, and
    /// 200 connections holding 1.2 MB each kept 218 MB against a 64 MiB budget).
    #[test]
    fn the_next_biggest_closes_while_the_others_do_not_fit() {
        let budget = BufferBudget::new(1000);
        let first = budget.register();
        let second = budget.register();
        let third = budget.register();
        first.charge(1500);
        assert!(first.is_closed());
        second.charge(600);
        assert!(!second.is_closed(), "600 fits");
        third.charge(500);
        assert!(second.is_closed(), "600 + 500 do not");
        assert!(!third.is_closed());
    }

    #[test]
    fn the_budget_is_spent_once_the_connections_hold_it_all() {
        let budget = BufferBudget::new(1000);
        let one = budget.register();
        let other = budget.register();
        one.charge(600);
        assert!(!other.budget_spent());
        other.charge(399);
        assert!(!one.budget_spent() && !other.budget_spent());
        other.charge(1);
        assert!(one.budget_spent() && other.budget_spent());
        one.release(1);
        assert!(!other.budget_spent());
    }

    #[test]
    fn recharge_follows_what_is_held_and_drop_releases_it() {
        let budget = BufferBudget::new(1 << 20);
        let buffers = budget.register();
        buffers.recharge(0, 4096);
        buffers.recharge(4096, 1024);
        assert_eq!(budget.buffered(), 1024);
        buffers.release(24);
        assert_eq!(budget.buffered(), 1000);
        drop(buffers);
        assert_eq!(budget.buffered(), 0);
        assert!(budget.connections().is_empty());
    }

    /// A read the front request needs may pass the budget by its overdraft (an eighth),
    /// then waits for room: for the connections the charges past the budget closed to go.
    #[tokio::test(flavor = "current_thread")]
    async fn room_is_the_overdraft_and_comes_back_as_the_closed_go() {
        let budget = BufferBudget::new(1000);
        let small = budget.register();
        let big = budget.register();
        let waiting = budget.register();
        small.charge(300);
        big.charge(700);
        assert!(small.budget_spent() && !small.overdrawn());
        waiting.room().await;
        big.charge(124);
        assert!(big.is_closed() && !small.is_closed());
        assert!(!waiting.overdrawn(), "1,124 of 1,000 + 125");
        waiting.room().await;
        small.charge(1);
        assert!(waiting.overdrawn());
        let wait = std::time::Duration::from_millis(50);
        assert!(tokio::time::timeout(wait, waiting.room()).await.is_err());
        let room = tokio::spawn(async move { waiting.room().await });
        tokio::task::yield_now().await;
        drop(big);
        let wait = std::time::Duration::from_secs(10);
        assert!(tokio::time::timeout(wait, room).await.is_ok());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn closed_wakes_the_chosen_connection() {
        let budget = BufferBudget::new(10);
        let victim = budget.register();
        let other = budget.register();
        victim.charge(8);
        let woken = tokio::spawn(async move {
            victim.closed().await;
            victim.is_closed()
        });
        tokio::task::yield_now().await;
        other.charge(5);
        let woken = tokio::time::timeout(std::time::Duration::from_secs(10), woken).await;
        assert!(matches!(woken, Ok(Ok(true))));
    }
}
