//! A disruption budget's `schedule` and `duration`, as Karpenter reads them: a standard 5-field
//! cron expression (minute, hour, day of month, month, day of week; `*`, `?`, lists, ranges,
//! steps, month and weekday names) or one of the macros Karpenter's API accepts (`@yearly`,
//! `@annually`, `@monthly`, `@weekly`, `@daily`, `@midnight`, `@hourly`), always in UTC (Karpenter
//! prefixes `TZ=UTC` and refuses time zones), and a duration of hours and minutes. A budget is
//! active from each time the schedule fires until `duration` later: at `now` when the schedule
//! fired at some minute in `(now - duration, now]`, which is Karpenter's `Budget.IsActive`
//! (`schedule.Next(now - duration) <= now`). Day of month and day of week are cron's: when both
//! are restricted, a day matching either fires (robfig/cron, which Karpenter uses, does the
//! same). Pure: the time comes from the caller.

use std::time::Duration;
use time::{Date, OffsetDateTime, Time};

/// A parsed cron schedule: the minutes, hours, days, months and weekdays it fires at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CronSchedule {
    /// As written.
    text: String,
    minutes: u64,
    hours: u32,
    /// Bits 1..=31.
    days: u32,
    /// Bits 1..=12.
    months: u16,
    /// Bits 0..=6, Sunday = 0.
    weekdays: u8,
    /// The day-of-month field is `*` or `?` (then only the weekday restricts the day).
    any_day: bool,
    /// The day-of-week field is `*` or `?`.
    any_weekday: bool,
}

const MONTHS: [&str; 12] = [
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
const WEEKDAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

/// One field's bits, and whether it was a bare `*` / `?`.
fn field(
    text: &str,
    what: &str,
    min: u32,
    max: u32,
    names: &[&str],
    name_base: u32,
) -> Result<(u64, bool), String> {
    let value = |v: &str| -> Result<u32, String> {
        if let Some(i) = names.iter().position(|n| n.eq_ignore_ascii_case(v)) {
            return Ok(name_base + i as u32);
        }
        let n: u32 = v
            .parse()
            .map_err(|_| format!("{what} {v:?} is not a number{}", hint(names)))?;
        if n < min || n > max {
            return Err(format!("{what} {n} is out of range {min}-{max}"));
        }
        Ok(n)
    };
    let mut bits = 0u64;
    let mut star = false;
    for part in text.split(',') {
        if part.is_empty() {
            return Err(format!("{what} field {text:?} has an empty list item"));
        }
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => {
                let s: u32 = s
                    .parse()
                    .map_err(|_| format!("{what} step {s:?} is not a number"))?;
                if s == 0 {
                    return Err(format!("{what} step must be more than 0"));
                }
                (r, Some(s))
            }
            None => (part, None),
        };
        let (lo, hi) = if range == "*" || range == "?" {
            if step.is_none_or(|s| s == 1) {
                star = true;
            }
            (min, max)
        } else if let Some((a, b)) = range.split_once('-') {
            let (a, b) = (value(a)?, value(b)?);
            if a > b {
                return Err(format!("{what} range {range:?} runs backwards"));
            }
            (a, b)
        } else {
            let a = value(range)?;
            // `N/step` means `N-max/step`, as in robfig/cron.
            (a, if step.is_some() { max } else { a })
        };
        let step = step.unwrap_or(1);
        let mut v = lo;
        while v <= hi {
            bits |= 1 << v;
            v += step;
        }
    }
    Ok((bits, star))
}

fn hint(names: &[&str]) -> String {
    if names.is_empty() {
        String::new()
    } else {
        format!(" nor a name ({}..{})", names[0], names[names.len() - 1])
    }
}

/// Days in `month` (1-12) of a leap year: the most a schedule could ever find.
fn max_days(month: u32) -> u32 {
    match month {
        2 => 29,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

impl CronSchedule {
    /// Parses a 5-field cron expression or a macro; the error says what is wrong.
    pub fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim();
        let expanded = match t.to_ascii_lowercase().as_str() {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            m if m.starts_with('@') => {
                return Err(format!(
                    "unknown macro {t:?}; use @yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly"
                ))
            }
            _ => t,
        };
        if expanded.starts_with("TZ=") || expanded.starts_with("CRON_TZ=") {
            return Err("time zones are not accepted: schedules are in UTC".into());
        }
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        if fields.len() != 5 {
            return Err(format!(
                "{t:?} has {} fields; a schedule has 5 (minute hour day-of-month month day-of-week) or is a macro such as @daily",
                fields.len()
            ));
        }
        let (minutes, _) = field(fields[0], "minute", 0, 59, &[], 0)?;
        let (hours, _) = field(fields[1], "hour", 0, 23, &[], 0)?;
        let (days, any_day) = field(fields[2], "day of month", 1, 31, &[], 0)?;
        let (months, _) = field(fields[3], "month", 1, 12, &MONTHS, 1)?;
        let (weekdays, any_weekday) = field(fields[4], "day of week", 0, 6, &WEEKDAYS, 0)?;
        let s = CronSchedule {
            text: t.to_string(),
            minutes,
            hours: hours as u32,
            days: days as u32,
            months: months as u16,
            weekdays: weekdays as u8,
            any_day,
            any_weekday,
        };
        // Only a day-of-month restriction alone can name days no month has (`0 0 30 2 *`).
        if !any_day
            && any_weekday
            && !(1..=12).any(|m| s.month(m) && (s.days >> 1) & ((1u32 << max_days(m)) - 1) != 0)
        {
            return Err(format!(
                "{t:?} never fires: none of its months has any of its days"
            ));
        }
        Ok(s)
    }

    /// As written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    fn month(&self, m: u32) -> bool {
        self.months & (1 << m) != 0
    }

    /// Whether it fires on `date` (UTC).
    fn fires_on(&self, date: Date) -> bool {
        if !self.month(u32::from(u8::from(date.month()))) {
            return false;
        }
        let dom = self.days & (1 << date.day()) != 0;
        let dow = self.weekdays & (1 << date.weekday().number_days_from_sunday()) != 0;
        if self.any_day || self.any_weekday {
            dom && dow
        } else {
            dom || dow
        }
    }

    /// The last minute it fired at or before `at` (UTC), looking back at most to `since`
    /// (exclusive); `None` if it did not fire in `(since, at]`.
    pub fn last_fire(&self, at: OffsetDateTime, since: OffsetDateTime) -> Option<OffsetDateTime> {
        let at = at.to_offset(time::UtcOffset::UTC);
        let since = since.to_offset(time::UtcOffset::UTC);
        let mut date = at.date();
        loop {
            if self.fires_on(date) {
                let today = date == at.date();
                let top_hour = if today { at.hour() } else { 23 };
                for h in (0..=top_hour).rev() {
                    if self.hours & (1 << h) == 0 {
                        continue;
                    }
                    let top_minute = if today && h == at.hour() {
                        at.minute()
                    } else {
                        59
                    };
                    for m in (0..=top_minute).rev() {
                        if self.minutes & (1 << m) != 0 {
                            let t = date.with_time(Time::from_hms(h, m, 0).ok()?).assume_utc();
                            return (t > since).then_some(t);
                        }
                    }
                }
            }
            if date <= since.date() {
                return None;
            }
            date = date.previous_day()?;
        }
    }

    /// Whether a window of `duration` opened by this schedule covers `now`: it fired at some
    /// minute in `(now - duration, now]`.
    pub fn active(&self, now: OffsetDateTime, duration: Duration) -> bool {
        let since = now - duration;
        self.last_fire(now, since).is_some()
    }
}

/// A budget's `duration` as Karpenter's API accepts it: hours and minutes (`1h`, `30m`,
/// `1h30m`, optionally followed by `0s`), more than zero.
pub fn parse_budget_duration(text: &str) -> Result<Duration, String> {
    let bad =
        || format!("{text:?} is not a duration of hours and minutes (\"8h\", \"30m\", \"1h30m\")");
    let t = text.trim();
    let t = t.strip_suffix("0s").filter(|r| !r.is_empty()).unwrap_or(t);
    let mut secs = 0u64;
    let mut digits = String::new();
    let mut seen_h = false;
    let mut seen_m = false;
    for c in t.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let n: u64 = digits.parse().map_err(|_| bad())?;
        digits.clear();
        match c {
            'h' if !seen_h && !seen_m => {
                seen_h = true;
                secs = secs.saturating_add(n.saturating_mul(3600));
            }
            'm' if !seen_m => {
                seen_m = true;
                secs = secs.saturating_add(n.saturating_mul(60));
            }
            _ => return Err(bad()),
        }
    }
    if !digits.is_empty() || !(seen_h || seen_m) {
        return Err(bad());
    }
    if secs == 0 {
        return Err(format!(
            "{text:?} is zero: a window that short is never active"
        ));
    }
    Ok(Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    fn p(s: &str) -> CronSchedule {
        CronSchedule::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn schedules_karpenter_accepts_parse_with_names_lists_ranges_steps_and_macros() {
        for good in [
            "0 9 * * 1-5",
            "*/15 * * * *",
            "0 0 1 */3 *",
            "30 22 * * SAT,sun",
            "0 0 ? JAN-MAR MON",
            "5,10-20/5 1-23/2 1,15 * *",
            "@daily",
            "@Midnight",
            "@hourly",
            "@weekly",
            "@monthly",
            "@yearly",
            "@annually",
            "0 0 29 2 *",
            "0 0 31 * *",
        ] {
            p(good);
        }
        let s = p("5,10-20/5 1-23/2 1,15 * *");
        assert_eq!(s.minutes, 1 << 5 | 1 << 10 | 1 << 15 | 1 << 20);
        assert_eq!(s.hours.count_ones(), 12);
        assert_eq!(
            p("@daily"),
            CronSchedule {
                text: "@daily".into(),
                ..p("0 0 * * *")
            }
        );
    }

    #[test]
    fn bad_schedules_are_refused_with_what_is_wrong() {
        for (bad, says) in [
            ("* * * *", "4 fields"),
            ("* * * * * *", "6 fields"),
            ("60 * * * *", "minute 60 is out of range 0-59"),
            ("* 24 * * *", "hour 24"),
            ("* * 0 * *", "day of month 0"),
            ("* * * 13 *", "month 13"),
            ("* * * * 7", "day of week 7"),
            ("* * * FOO *", "not a number nor a name"),
            ("*/0 * * * *", "step must be more than 0"),
            ("5-1 * * * *", "backwards"),
            ("1,,2 * * * *", "empty list item"),
            ("@every 1h", "unknown macro"),
            ("@reboot", "unknown macro"),
            ("TZ=Europe/Paris 0 9 * * *", "time zones"),
            ("0 0 30 2 *", "never fires"),
            ("0 0 31 4,6 *", "never fires"),
            ("", "0 fields"),
        ] {
            let e = CronSchedule::parse(bad).expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn durations_are_hours_and_minutes_as_karpenter_accepts_them() {
        assert_eq!(
            parse_budget_duration("8h"),
            Ok(Duration::from_secs(8 * 3600))
        );
        assert_eq!(parse_budget_duration("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(
            parse_budget_duration("1h30m"),
            Ok(Duration::from_secs(5400))
        );
        assert_eq!(
            parse_budget_duration("2h0m0s"),
            Ok(Duration::from_secs(7200))
        );
        assert_eq!(
            parse_budget_duration("720h"),
            Ok(Duration::from_secs(720 * 3600))
        );
        for bad in [
            "", "1d", "10s", "1.5h", "h", "30m1h", "1h1h", "0h", "0m", "-1h", "1h 30m",
        ] {
            assert!(parse_budget_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_window_is_active_from_each_fire_for_its_duration_across_midnight() {
        // Every day at 22:00 for 4 h: 22:00 to 02:00 the next day.
        let s = p("0 22 * * *");
        let d = Duration::from_secs(4 * 3600);
        assert!(!s.active(datetime!(2026-03-10 21:59:59 UTC), d));
        assert!(s.active(datetime!(2026-03-10 22:00:00 UTC), d));
        assert!(s.active(datetime!(2026-03-10 23:59:00 UTC), d));
        assert!(s.active(datetime!(2026-03-11 00:30:00 UTC), d));
        assert!(s.active(datetime!(2026-03-11 01:59:59 UTC), d));
        // (now - duration, now]: the fire at 22:00 exactly 4 h ago no longer counts.
        assert!(!s.active(datetime!(2026-03-11 02:00:00 UTC), d));
        assert!(!s.active(datetime!(2026-03-11 12:00:00 UTC), d));
        // Weekdays only: Friday night's window runs into Saturday; none opens on Saturday.
        let w = p("0 22 * * MON-FRI");
        assert!(w.active(datetime!(2026-03-14 01:00:00 UTC), d)); // Saturday 01:00
        assert!(!w.active(datetime!(2026-03-14 23:00:00 UTC), d)); // Saturday 23:00
        assert!(w.active(datetime!(2026-03-16 23:00:00 UTC), d)); // Monday 23:00
    }

    #[test]
    fn a_window_opened_at_a_month_or_year_end_runs_into_the_next_month() {
        // On the last possible days: the 31st fires only in months that have one.
        let s = p("0 12 31 * *");
        let d = Duration::from_secs(48 * 3600);
        assert!(s.active(datetime!(2026-01-31 12:00:00 UTC), d));
        assert!(s.active(datetime!(2026-02-02 11:59:00 UTC), d));
        assert!(!s.active(datetime!(2026-02-02 12:00:00 UTC), d));
        // No 31st in February, April: inactive all through them.
        assert!(!s.active(datetime!(2026-03-01 00:00:00 UTC), d));
        assert!(!s.active(datetime!(2026-04-30 23:00:00 UTC), d));
        assert!(s.active(datetime!(2026-06-01 00:00:00 UTC), d)); // from May 31st
                                                                  // Leap day only: 2028 has one, 2027 does not.
        let leap = p("0 0 29 2 *");
        let day = Duration::from_secs(24 * 3600);
        assert!(leap.active(datetime!(2028-02-29 18:00:00 UTC), day));
        assert!(!leap.active(datetime!(2027-03-01 00:00:00 UTC), day));
        // A yearly window across New Year.
        let ny = p("0 20 31 12 *");
        assert!(ny.active(
            datetime!(2027-01-01 03:00:00 UTC),
            Duration::from_secs(8 * 3600)
        ));
        assert!(!ny.active(
            datetime!(2027-01-01 04:00:00 UTC),
            Duration::from_secs(8 * 3600)
        ));
        // @monthly for a day: the 1st only.
        let m = p("@monthly");
        assert!(m.active(datetime!(2026-12-01 23:59:00 UTC), day));
        assert!(!m.active(datetime!(2026-12-02 00:00:00 UTC), day));
    }

    #[test]
    fn day_of_month_and_day_of_week_both_restricted_fire_on_either_as_cron_does() {
        // The 13th, or any Friday.
        let s = p("0 0 13 * FRI");
        let d = Duration::from_secs(3600);
        assert!(s.active(datetime!(2026-03-13 00:30:00 UTC), d)); // Friday the 13th
        assert!(s.active(datetime!(2026-04-13 00:30:00 UTC), d)); // Monday the 13th
        assert!(s.active(datetime!(2026-03-20 00:30:00 UTC), d)); // Friday the 20th
        assert!(!s.active(datetime!(2026-03-19 00:30:00 UTC), d)); // Thursday the 19th
                                                                   // `*/2` on the weekday is a restriction (not a star): AND with a `*` day of month.
        let e = p("0 0 * * */2");
        assert!(e.active(datetime!(2026-03-15 00:10:00 UTC), d)); // Sunday (0)
        assert!(!e.active(datetime!(2026-03-16 00:10:00 UTC), d)); // Monday (1)
    }
}
