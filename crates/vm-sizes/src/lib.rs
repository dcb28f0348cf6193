//! The VM sizes the controller knows (Azure's size pages): vCPUs, memory, GPUs, the temporary
//! disk, the quota family and the data disks each may attach. Shared by the controller (node
//! templates, the vCPU quota, refused offerings, prices: `capacity::vm_sizes` there) and the
//! emulator's quota. Pure data, its own crate so the emulator needs nothing of the controller.

/// A VM size: vCPUs, memory and GPUs as Azure lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmSize {
    /// vCPUs.
    pub vcpu: u32,
    /// Memory in MiB.
    pub memory_mib: u64,
    /// NVIDIA GPUs.
    pub gpu: u32,
    /// The temporary (resource) disk in GiB; 0 for sizes without one (the v5 `s` sizes).
    pub temp_disk_gib: u32,
    /// The VM family Azure's vCPU quota counts the size in, e.g. `standardDSv5Family`.
    pub family: &'static str,
    /// The data disks it may attach (Azure's size pages; the Azure Disk CSI driver's default
    /// attach limit for the size).
    pub max_data_disks: u32,
}

const GIB: u64 = 1024;

/// Common Azure sizes (Azure's size pages). Matching ignores case and a missing `Standard_`.
/// Columns: name, vCPUs, memory (MiB), NVIDIA GPUs, temporary disk (GiB; 0: none), the VM
/// family Azure's quota counts the size in (the compute usages' `name.value`).
const SIZES: &[(&str, u32, u64, u32, u32, &str)] = &[
    ("Standard_B2s", 2, 4 * GIB, 0, 8, "standardBSFamily"),
    ("Standard_B2ms", 2, 8 * GIB, 0, 16, "standardBSFamily"),
    ("Standard_B4ms", 4, 16 * GIB, 0, 32, "standardBSFamily"),
    ("Standard_DS2_v2", 2, 7 * GIB, 0, 14, "standardDSv2Family"),
    ("Standard_DS3_v2", 4, 14 * GIB, 0, 28, "standardDSv2Family"),
    ("Standard_DS4_v2", 8, 28 * GIB, 0, 56, "standardDSv2Family"),
    ("Standard_D2s_v3", 2, 8 * GIB, 0, 16, "standardDSv3Family"),
    ("Standard_D4s_v3", 4, 16 * GIB, 0, 32, "standardDSv3Family"),
    ("Standard_D8s_v3", 8, 32 * GIB, 0, 64, "standardDSv3Family"),
    (
        "Standard_D16s_v3",
        16,
        64 * GIB,
        0,
        128,
        "standardDSv3Family",
    ),
    (
        "Standard_D32s_v3",
        32,
        128 * GIB,
        0,
        256,
        "standardDSv3Family",
    ),
    ("Standard_D2s_v5", 2, 8 * GIB, 0, 0, "standardDSv5Family"),
    ("Standard_D4s_v5", 4, 16 * GIB, 0, 0, "standardDSv5Family"),
    ("Standard_D8s_v5", 8, 32 * GIB, 0, 0, "standardDSv5Family"),
    ("Standard_D16s_v5", 16, 64 * GIB, 0, 0, "standardDSv5Family"),
    (
        "Standard_D32s_v5",
        32,
        128 * GIB,
        0,
        0,
        "standardDSv5Family",
    ),
    ("Standard_D2ds_v5", 2, 8 * GIB, 0, 75, "standardDDSv5Family"),
    (
        "Standard_D4ds_v5",
        4,
        16 * GIB,
        0,
        150,
        "standardDDSv5Family",
    ),
    (
        "Standard_D8ds_v5",
        8,
        32 * GIB,
        0,
        300,
        "standardDDSv5Family",
    ),
    ("Standard_D4as_v5", 4, 16 * GIB, 0, 0, "standardDASv5Family"),
    ("Standard_D8as_v5", 8, 32 * GIB, 0, 0, "standardDASv5Family"),
    ("Standard_E2s_v3", 2, 16 * GIB, 0, 32, "standardESv3Family"),
    ("Standard_E4s_v3", 4, 32 * GIB, 0, 64, "standardESv3Family"),
    ("Standard_E8s_v3", 8, 64 * GIB, 0, 128, "standardESv3Family"),
    (
        "Standard_E16s_v3",
        16,
        128 * GIB,
        0,
        256,
        "standardESv3Family",
    ),
    ("Standard_E2s_v5", 2, 16 * GIB, 0, 0, "standardESv5Family"),
    ("Standard_E4s_v5", 4, 32 * GIB, 0, 0, "standardESv5Family"),
    ("Standard_E8s_v5", 8, 64 * GIB, 0, 0, "standardESv5Family"),
    (
        "Standard_E16s_v5",
        16,
        128 * GIB,
        0,
        0,
        "standardESv5Family",
    ),
    (
        "Standard_E32s_v5",
        32,
        256 * GIB,
        0,
        0,
        "standardESv5Family",
    ),
    ("Standard_F2s_v2", 2, 4 * GIB, 0, 16, "standardFSv2Family"),
    ("Standard_F4s_v2", 4, 8 * GIB, 0, 32, "standardFSv2Family"),
    ("Standard_F8s_v2", 8, 16 * GIB, 0, 64, "standardFSv2Family"),
    (
        "Standard_F16s_v2",
        16,
        32 * GIB,
        0,
        128,
        "standardFSv2Family",
    ),
    (
        "Standard_NC6s_v3",
        6,
        112 * GIB,
        1,
        736,
        "standardNCSv3Family",
    ),
    (
        "Standard_NC12s_v3",
        12,
        224 * GIB,
        2,
        1474,
        "standardNCSv3Family",
    ),
    (
        "Standard_NC24s_v3",
        24,
        448 * GIB,
        4,
        2948,
        "standardNCSv3Family",
    ),
    (
        "Standard_NC4as_T4_v3",
        4,
        28 * GIB,
        1,
        180,
        "standardNCASv3_T4Family",
    ),
    (
        "Standard_NC8as_T4_v3",
        8,
        56 * GIB,
        1,
        360,
        "standardNCASv3_T4Family",
    ),
    (
        "Standard_NC16as_T4_v3",
        16,
        110 * GIB,
        1,
        360,
        "standardNCASv3_T4Family",
    ),
    (
        "Standard_NC64as_T4_v3",
        64,
        440 * GIB,
        4,
        2880,
        "standardNCASv3_T4Family",
    ),
    (
        "Standard_NC24ads_A100_v4",
        24,
        220 * GIB,
        1,
        64,
        "standardNCADSA100v4Family",
    ),
    (
        "Standard_ND96asr_v4",
        96,
        900 * GIB,
        8,
        6000,
        "standardNDASv4_A100Family",
    ),
];

/// Max data disks per size, as the Azure Disk CSI driver's table (`azure_dd_max_disk_count.go`)
/// and Azure's size pages give them. Every size of [`SIZES`] is here (a test checks).
const MAX_DATA_DISKS: &[(&str, u32)] = &[
    ("Standard_B2s", 4),
    ("Standard_B2ms", 4),
    ("Standard_B4ms", 8),
    ("Standard_DS2_v2", 8),
    ("Standard_DS3_v2", 16),
    ("Standard_DS4_v2", 32),
    ("Standard_D2s_v3", 4),
    ("Standard_D4s_v3", 8),
    ("Standard_D8s_v3", 16),
    ("Standard_D16s_v3", 32),
    ("Standard_D32s_v3", 32),
    ("Standard_D2s_v5", 4),
    ("Standard_D4s_v5", 8),
    ("Standard_D8s_v5", 16),
    ("Standard_D16s_v5", 32),
    ("Standard_D32s_v5", 32),
    ("Standard_D2ds_v5", 4),
    ("Standard_D4ds_v5", 8),
    ("Standard_D8ds_v5", 16),
    ("Standard_D4as_v5", 8),
    ("Standard_D8as_v5", 16),
    ("Standard_E2s_v3", 4),
    ("Standard_E4s_v3", 8),
    ("Standard_E8s_v3", 16),
    ("Standard_E16s_v3", 32),
    ("Standard_E2s_v5", 4),
    ("Standard_E4s_v5", 8),
    ("Standard_E8s_v5", 16),
    ("Standard_E16s_v5", 32),
    ("Standard_E32s_v5", 32),
    ("Standard_F2s_v2", 4),
    ("Standard_F4s_v2", 8),
    ("Standard_F8s_v2", 16),
    ("Standard_F16s_v2", 32),
    ("Standard_NC6s_v3", 12),
    ("Standard_NC12s_v3", 24),
    ("Standard_NC24s_v3", 32),
    ("Standard_NC4as_T4_v3", 8),
    ("Standard_NC8as_T4_v3", 16),
    ("Standard_NC16as_T4_v3", 32),
    ("Standard_NC64as_T4_v3", 32),
    ("Standard_NC24ads_A100_v4", 8),
    ("Standard_ND96asr_v4", 16),
];

/// The sizes of the built-in table, by name.
pub fn sizes() -> impl Iterator<Item = (&'static str, VmSize)> {
    SIZES.iter().filter_map(|(n, ..)| Some((*n, vm_size(n)?)))
}

/// The size named `name`, if the table has it.
pub fn vm_size(name: &str) -> Option<VmSize> {
    let want = name.trim().to_ascii_lowercase();
    let want = want.strip_prefix("standard_").unwrap_or(&want);
    SIZES
        .iter()
        .find(|(n, ..)| n.to_ascii_lowercase().strip_prefix("standard_") == Some(want))
        .map(
            |&(name, vcpu, memory_mib, gpu, temp_disk_gib, family)| VmSize {
                vcpu,
                memory_mib,
                gpu,
                temp_disk_gib,
                family,
                max_data_disks: MAX_DATA_DISKS
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map_or(0, |(_, d)| *d),
            },
        )
}
