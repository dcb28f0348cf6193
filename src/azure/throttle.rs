//! `Retry-After` gates: after a 429, no call of that class (reads or writes) goes out until the
//! deadline ARM gave. Sending earlier is not processed by ARM and renews the penalty, so the gate
//! fails calls locally instead. Time is tokio's, so tests drive it with a paused clock.

use parking_lot::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// The two classes ARM throttles separately.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallClass {
    /// GET, LIST, operation polling.
    Read,
    /// PUT, PATCH, DELETE, POST.
    Write,
}

impl CallClass {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            CallClass::Read => "read",
            CallClass::Write => "write",
        }
    }
}

/// Deadlines per class.
#[derive(Debug, Default)]
pub struct ThrottleGates {
    read_until: Mutex<Option<Instant>>,
    write_until: Mutex<Option<Instant>>,
}

impl ThrottleGates {
    /// Open gates.
    pub fn new() -> Self {
        Self::default()
    }

    fn slot(&self, class: CallClass) -> &Mutex<Option<Instant>> {
        match class {
            CallClass::Read => &self.read_until,
            CallClass::Write => &self.write_until,
        }
    }

    /// `Some(remaining)` while calls of `class` must not go out.
    pub fn closed_for(&self, class: CallClass, now: Instant) -> Option<Duration> {
        let until = (*self.slot(class).lock())?;
        (until > now).then(|| until - now)
    }

    /// Closes the gate for `retry_after` from `now` (never shortens an existing deadline).
    /// Returns how much the deadline moved forward.
    pub fn close(&self, class: CallClass, retry_after: Duration, now: Instant) -> Duration {
        let mut slot = self.slot(class).lock();
        let until = now + retry_after;
        match *slot {
            Some(existing) if existing >= until => Duration::ZERO,
            Some(existing) if existing > now => {
                *slot = Some(until);
                until - existing
            }
            _ => {
                *slot = Some(until);
                retry_after
            }
        }
    }
}

/// Parses the retry hints ARM and the Azure SDKs honour: `retry-after-ms`,
/// `x-ms-retry-after-ms` (milliseconds) and `retry-after` (seconds or an HTTP date).
pub fn parse_retry_after<'a>(
    mut header: impl FnMut(&str) -> Option<&'a str>,
    now: std::time::SystemTime,
) -> Option<Duration> {
    for name in ["retry-after-ms", "x-ms-retry-after-ms"] {
        if let Some(ms) = header(name).and_then(|v| v.trim().parse::<u64>().ok()) {
            return Some(Duration::from_millis(ms));
        }
    }
    let v = header("retry-after")?.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate_parse(v)?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

fn httpdate_parse(v: &str) -> Option<std::time::SystemTime> {
    let fmt = time::format_description::well_known::Rfc2822;
    let t = time::OffsetDateTime::parse(v, &fmt)
        .or_else(|_| time::OffsetDateTime::parse(&v.replace("GMT", "+0000"), &fmt))
        .ok()?;
    Some(std::time::SystemTime::from(t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_closed_gate_opens_when_retry_after_has_passed() {
        let gates = ThrottleGates::new();
        let now = Instant::now();
        gates.close(CallClass::Write, Duration::from_secs(17), now);
        assert_eq!(
            gates.closed_for(CallClass::Write, now),
            Some(Duration::from_secs(17))
        );
        assert_eq!(
            gates.closed_for(CallClass::Read, now),
            None,
            "reads are a separate class"
        );
        tokio::time::advance(Duration::from_secs(16)).await;
        assert!(gates.closed_for(CallClass::Write, Instant::now()).is_some());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(gates.closed_for(CallClass::Write, Instant::now()), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_shorter_retry_after_never_shortens_the_gate() {
        let gates = ThrottleGates::new();
        let now = Instant::now();
        assert_eq!(
            gates.close(CallClass::Read, Duration::from_secs(30), now),
            Duration::from_secs(30)
        );
        assert_eq!(
            gates.close(CallClass::Read, Duration::from_secs(5), now),
            Duration::ZERO
        );
        assert_eq!(
            gates.closed_for(CallClass::Read, now),
            Some(Duration::from_secs(30))
        );
    }

    #[test]
    fn retry_after_is_read_in_all_three_forms() {
        let now = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777);
        let h = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| *v)
        };
        assert_eq!(
            parse_retry_after(h(&[("retry-after", "17")]), now),
            Some(Duration::from_secs(17))
        );
        assert_eq!(
            parse_retry_after(h(&[("retry-after-ms", "250")]), now),
            Some(Duration::from_millis(250))
        );
        assert_eq!(
            parse_retry_after(h(&[("x-ms-retry-after-ms", "1500")]), now),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            parse_retry_after(h(&[("retry-after", "Sun, 06 Nov 1994 08:49:47 GMT")]), now),
            Some(Duration::from_secs(10))
        );
        assert_eq!(parse_retry_after(h(&[("retry-after", "soon")]), now), None);
    }
}
