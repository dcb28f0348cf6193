//! Fencing: the last check before every Azure write.
//!
//! With leader election on, only the replica that holds the Lease may write, and only while its
//! last renewal is younger than the renew deadline on the monotonic clock: a replica that was
//! frozen (SIGSTOP, a long GC-like pause, a partition from the API server) and wakes up after
//! another replica took over must not send a single write. The reconciler asks the fence
//! immediately before each capacity write or instance deletion, not once per pass, because a pass
//! can outlive a lease.
//!
//! Admission is not the last step: between it and the bytes leaving there may be a token to
//! fetch (the SDK fetches one per request) and a connection to open. So a write is sent inside
//! [`sending`], and the HTTP layer calls [`last_check`] immediately before the request goes out:
//! the fence is asked once more, and the request gets a deadline of the lease's remaining
//! validity ([`WriteFence::valid_for`]) so that no answer is awaited (and no connection opened)
//! past the moment a standby may take over. A request cut by that deadline has an unknown
//! outcome and is treated as such.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// Kept off the lease's validity when bounding a write's request: time for Azure to act on a
/// request it received just before the deadline, and for scheduling noise on this side.
pub const VALIDITY_MARGIN: Duration = Duration::from_secs(2);

tokio::task_local! {
    /// The fence of the write being sent by this task (see [`sending`]).
    static SENDING: Arc<dyn WriteFence>;
}

/// Runs `send`, one write's request, with `fence` as the fence the HTTP layer asks last
/// ([`last_check`]).
pub async fn sending<F: Future>(fence: Arc<dyn WriteFence>, send: F) -> F::Output {
    SENDING.scope(fence, send).await
}

/// Asked by the HTTP layer immediately before a write's request leaves: `Err` if the fence of the
/// write being sent closed since it was admitted; else how long the request may take at most
/// (`None`: no bound, or not inside [`sending`]).
pub fn last_check() -> Result<Option<Duration>, FenceHold> {
    SENDING
        .try_with(|fence| {
            fence.check()?;
            Ok(fence.valid_for())
        })
        .unwrap_or(Ok(None))
}

/// The error the HTTP layer returns for a write [`last_check`] stopped: nothing was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the write was not sent: {0}")]
pub struct FencedAtSend(pub FenceHold);

/// Why a write was not sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FenceHold {
    /// Another replica holds the Lease (or nobody does and we have not acquired it).
    NotLeader,
    /// We held the Lease, but the last successful renewal is older than the renew deadline.
    RenewalStale,
}

impl FenceHold {
    /// The `reason` label of `writes_held_total`.
    pub fn metric_label(self) -> &'static str {
        match self {
            FenceHold::NotLeader => "not_leader",
            FenceHold::RenewalStale => "lease_stale",
        }
    }
}

impl std::fmt::Display for FenceHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FenceHold::NotLeader => "this replica is not the leader",
            FenceHold::RenewalStale => "the lease renewal is older than the renew deadline",
        })
    }
}

/// Asked just before every Azure write. Must be cheap and must not block.
pub trait WriteFence: Send + Sync + std::fmt::Debug {
    /// `Ok(())` if this replica may write to Azure now.
    fn check(&self) -> Result<(), FenceHold>;

    /// How much longer a write sent now may be out before another replica may have taken over
    /// (the lease's remaining validity less [`VALIDITY_MARGIN`]); `None` when unbounded (no
    /// leader election).
    fn valid_for(&self) -> Option<Duration> {
        None
    }

    /// [`check`](Self::check), and if the write may go, a permit to hold until its response is
    /// in. A leader that lets go of its Lease first closes the fence, then waits for the permits
    /// out to come back, and only then clears the holder: a write that passed the fence a moment
    /// before shutdown lands while the Lease still names this replica, never after a successor
    /// took over.
    fn admit(&self) -> Result<WritePermit, FenceHold> {
        self.check().map(|()| WritePermit { _in_flight: None })
    }
}

/// A write the fence let through; dropping it when the response is in returns it.
#[must_use = "hold the permit until the write's response is in"]
#[derive(Debug)]
pub struct WritePermit {
    _in_flight: Option<InFlightGuard>,
}

/// Writes admitted and not yet answered, which a releasing leader waits for.
#[derive(Debug, Default)]
pub struct InFlight {
    count: AtomicUsize,
    idle: Notify,
}

/// One admitted write, counted in [`InFlight`] until dropped.
#[derive(Debug)]
pub struct InFlightGuard(Arc<InFlight>);

impl InFlight {
    /// Counts a write before the fence is asked, so that a release which closed the fence
    /// either sees this write counted or this write sees the fence closed (both sides use
    /// sequentially consistent order).
    pub fn enter(self: &Arc<Self>) -> InFlightGuard {
        self.count.fetch_add(1, Ordering::SeqCst);
        InFlightGuard(self.clone())
    }

    /// A permit for a write counted by `guard`.
    pub fn permit(guard: InFlightGuard) -> WritePermit {
        WritePermit {
            _in_flight: Some(guard),
        }
    }

    /// Writes out now.
    pub fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// Waits until no admitted write is out, for at most `within`. `false` if some still were.
    pub async fn drained(&self, within: Duration) -> bool {
        let wait = async {
            loop {
                let idle = self.idle.notified();
                if self.count() == 0 {
                    return;
                }
                idle.await;
            }
        };
        tokio::time::timeout(within, wait).await.is_ok()
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// No leader election: every write may go (the single-replica behaviour of round 1).
#[derive(Debug, Default, Clone, Copy)]
pub struct Unfenced;

impl WriteFence for Unfenced {
    fn check(&self) -> Result<(), FenceHold> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn drained_waits_for_the_last_admitted_write_and_no_longer() {
        let in_flight = Arc::new(InFlight::default());
        assert!(
            in_flight.drained(Duration::from_secs(1)).await,
            "nothing out"
        );
        let guard = in_flight.enter();
        let waiter = {
            let in_flight = in_flight.clone();
            tokio::spawn(async move { in_flight.drained(Duration::from_secs(10)).await })
        };
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(!waiter.is_finished(), "returned while a write was out");
        drop(guard);
        assert!(waiter.await.unwrap(), "the last permit came back");
    }

    #[derive(Debug)]
    struct Fixed(Result<(), FenceHold>, Option<Duration>);

    impl WriteFence for Fixed {
        fn check(&self) -> Result<(), FenceHold> {
            self.0
        }
        fn valid_for(&self) -> Option<Duration> {
            self.1
        }
    }

    #[tokio::test]
    async fn the_last_check_asks_the_fence_of_the_write_being_sent_and_only_inside_its_send() {
        assert_eq!(last_check(), Ok(None), "a read, or no fenced write");
        let open = Arc::new(Fixed(Ok(()), Some(Duration::from_secs(3))));
        assert_eq!(
            sending(open, async { last_check() }).await,
            Ok(Some(Duration::from_secs(3)))
        );
        let closed = Arc::new(Fixed(Err(FenceHold::RenewalStale), None));
        assert_eq!(
            sending(closed, async { last_check() }).await,
            Err(FenceHold::RenewalStale)
        );
        assert_eq!(last_check(), Ok(None), "the scope ended with the send");
    }

    #[tokio::test(start_paused = true)]
    async fn drained_gives_up_after_its_bound_when_a_write_never_returns() {
        let in_flight = Arc::new(InFlight::default());
        let _stuck = in_flight.enter();
        assert!(!in_flight.drained(Duration::from_secs(5)).await);
    }
}
