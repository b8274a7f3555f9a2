//! The cgroup manager's durations (`kubelet_cgroup_manager_duration_seconds`, by
//! `operation_type` `create`, `update`, `destroy`), recorded around any driver as the
//! kubelet's `cgroup_manager_linux.go` records them in each: a decorator, so neither driver
//! knows of metrics.

use std::time::Instant;

use futures::FutureExt as _;
use futures::future::BoxFuture;

use super::cgroup_manager::{CgroupDriver, CgroupManager, CgroupName, CmError};
use super::resource_config::ResourceConfig;

/// A driver whose `create`, `update` and `destroy` are timed.
pub(super) struct Instrumented<M: ?Sized>(pub(super) std::sync::Arc<M>);

/// Times `work` as `operation`.
fn timed<'a, T: Send + 'a>(
    operation: &'static str,
    work: BoxFuture<'a, Result<T, CmError>>,
) -> BoxFuture<'a, Result<T, CmError>> {
    let started = Instant::now();
    work.map(move |result| {
        crate::metrics::observe_cgroup_manager(operation, started.elapsed());
        result
    })
    .boxed()
}

impl<M: CgroupManager + ?Sized> CgroupManager for Instrumented<M> {
    fn driver(&self) -> CgroupDriver {
        self.0.driver()
    }

    fn exists<'a>(&'a self, name: &'a CgroupName) -> BoxFuture<'a, Result<bool, CmError>> {
        self.0.exists(name)
    }

    fn create<'a>(
        &'a self,
        name: &'a CgroupName,
        config: &'a ResourceConfig,
    ) -> BoxFuture<'a, Result<(), CmError>> {
        timed("create", self.0.create(name, config))
    }

    fn update<'a>(
        &'a self,
        name: &'a CgroupName,
        config: &'a ResourceConfig,
    ) -> BoxFuture<'a, Result<(), CmError>> {
        timed("update", self.0.update(name, config))
    }

    fn destroy<'a>(&'a self, name: &'a CgroupName) -> BoxFuture<'a, Result<(), CmError>> {
        timed("destroy", self.0.destroy(name))
    }

    fn children<'a>(
        &'a self,
        name: &'a CgroupName,
    ) -> BoxFuture<'a, Result<Vec<CgroupName>, CmError>> {
        self.0.children(name)
    }
}
