//! Azure's capacity as it really is: what the subscription's vCPU quota leaves
//! ([`quota`]: the regional compute usages, read and cached, turned into pools a plan draws
//! from) and which offerings Azure refused lately ([`offerings`]: allocation failures,
//! classified, each keeping its offering out for a time that fits its cause).
//!
//! And what a node costs ([`prices`]: list prices embedded and refreshed from Azure's retail
//! prices API, per-group negotiated rates over them), read by the `price` and `least-cost`
//! expanders.
//!
//! Quota and offerings are read by scale-up (a group is capped by its pools and passed over
//! while its offering is out) and by the write path (a capacity write to an offering that is
//! out is held), so a pending pod moves to a place that can answer yes within the same
//! decision.

pub mod offerings;
pub mod prices;
pub mod quota;

pub use offerings::{AllocationFailure, Offering, Unavailable, UnavailableOfferings};
pub use prices::{GroupPrice, PriceBook, PriceError, PriceOrigin, PriceSource, RetailPricesClient};
pub use quota::{QuotaCache, QuotaPool, Usage, UsageSource, Usages};
pub use vm_sizes::{vm_size, VmSize};
