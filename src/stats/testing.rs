//! Fakes the stats tests share.

use crate::node::{
    CpuTopology, HugePages, MachineError, MachineInfo, Memory, MemoryUsage, PidUsage,
};

/// A machine of 2 CPUs and 1000 bytes (900 used, 600 working set), 120 of 4194304
/// PIDs, whose filesystems cannot be read.
#[derive(Clone)]
pub(crate) struct Machine;
impl MachineInfo for Machine {
    fn num_cpus(&self) -> Result<u32, MachineError> {
        Ok(2)
    }
    fn memory(&self) -> Result<Memory, MachineError> {
        Ok(Memory {
            total_bytes: 1000,
            usage: Some(MemoryUsage {
                usage_bytes: 900,
                working_set_bytes: 600,
            }),
        })
    }
    fn hugepages(&self) -> Result<Vec<HugePages>, MachineError> {
        Ok(Vec::new())
    }
    fn fs_stats(&self, _: &std::path::Path) -> Result<crate::node::FsStats, MachineError> {
        Err(MachineError::Parse {
            what: "fs",
            path: "/".into(),
            reason: "fake".into(),
        })
    }
    fn pid_usage(&self) -> Result<PidUsage, MachineError> {
        Ok(PidUsage {
            running: 120,
            max: 4_194_304,
        })
    }
    fn machine_id(&self) -> Result<String, MachineError> {
        Ok("m".into())
    }
    fn system_uuid(&self) -> Option<String> {
        None
    }
    fn boot_id(&self) -> Result<String, MachineError> {
        Ok("b".into())
    }
    fn kernel_version(&self) -> Result<String, MachineError> {
        Ok("6".into())
    }
    fn os_image(&self) -> Result<String, MachineError> {
        Ok("Debian".into())
    }
    fn cpu_topology(&self) -> Result<CpuTopology, MachineError> {
        Ok(CpuTopology {
            physical_cores: 2,
            sockets: 1,
        })
    }
}
