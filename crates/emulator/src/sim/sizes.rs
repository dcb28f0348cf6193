//! What a VM size gives a node: a small table of the emulator's own (not the planner's), less a
//! fixed reservation for the kubelet and the system.

/// Bytes in a GiB.
const GI: i128 = 1024 * 1024 * 1024;
/// Millicores reserved on every node for the kubelet and the system.
pub const RESERVED_CPU_MILLI: i128 = 100;
/// Bytes of memory reserved on every node (kubelet, system, eviction threshold).
pub const RESERVED_MEMORY_BYTES: i128 = GI;
/// Pods per node when the scale set backs no agent pool.
pub const DEFAULT_MAX_PODS: i64 = 110;

/// A node's resources.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeResources {
    /// Millicores.
    pub cpu_milli: i128,
    /// Bytes.
    pub memory_bytes: i128,
    /// `nvidia.com/gpu`.
    pub gpus: i128,
    /// Pods.
    pub pods: i128,
}

/// (size, vCPUs, GiB of memory, GPUs, data disks it may attach: Azure's "max data disks");
/// an unknown size is a `Standard_D2s_v5`.
const SIZES: &[(&str, i128, i128, i128, i64)] = &[
    ("Standard_D2s_v5", 2, 8, 0, 4),
    ("Standard_D4s_v5", 4, 16, 0, 8),
    ("Standard_D8s_v5", 8, 32, 0, 16),
    ("Standard_E4s_v5", 4, 32, 0, 8),
    ("Standard_E8s_v5", 8, 64, 0, 16),
    ("Standard_NC6s_v3", 6, 112, 1, 12),
    ("Standard_NC24ads_A100_v4", 24, 220, 1, 8),
];

fn row(size: &str) -> (&'static str, i128, i128, i128, i64) {
    SIZES
        .iter()
        .find(|(name, ..)| name.eq_ignore_ascii_case(size))
        .copied()
        .unwrap_or(SIZES[0])
}

/// How many data disks a VM of `size` may attach (the Azure Disk CSI driver's attach limit on
/// its node: the CSINode's `allocatable.count`).
pub fn max_data_disks(size: &str) -> i64 {
    row(size).4
}

/// The whole VM of `size` (a node's `status.capacity`), with `max_pods` pods.
pub fn capacity(size: &str, max_pods: i64) -> NodeResources {
    let (_, cpu, gib, gpus, _) = row(size);
    NodeResources {
        cpu_milli: cpu * 1000,
        memory_bytes: gib * GI,
        gpus,
        pods: i128::from(max_pods.max(0)),
    }
}

/// What pods may use of a VM of `size` (a node's `status.allocatable`).
pub fn allocatable(size: &str, max_pods: i64) -> NodeResources {
    let c = capacity(size, max_pods);
    NodeResources {
        cpu_milli: (c.cpu_milli - RESERVED_CPU_MILLI).max(0),
        memory_bytes: (c.memory_bytes - RESERVED_MEMORY_BYTES).max(0),
        ..c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_known_size_loses_the_reservation_and_an_unknown_one_is_a_d2s_v5() {
        let gpu = allocatable("standard_nc6s_v3", 110);
        assert_eq!(gpu.cpu_milli, 5900);
        assert_eq!(gpu.memory_bytes, 111 * GI);
        assert_eq!(gpu.gpus, 1);
        assert_eq!(
            allocatable("Standard_Imaginary", 30),
            allocatable("Standard_D2s_v5", 30)
        );
        assert_eq!(allocatable("Standard_D2s_v5", 30).pods, 30);
    }
}
