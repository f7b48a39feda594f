//! Completion queues (`ibv_cq`): polling and waiting for work completions.

use crate::{Error, Result, Wc};
use softroce::net::UdpDevice;
use softroce::verbs;
use std::sync::Arc;
use std::time::Duration;

/// A completion queue (`ibv_cq`).
#[derive(Debug)]
pub struct CompletionQueue {
    pub(crate) cq: verbs::Cq,
    pub(crate) id: isize,
    pub(crate) dev: Arc<UdpDevice>,
}

impl CompletionQueue {
    /// `ibv_poll_cq`: moves up to `completions.len()` work completions into the front of
    /// `completions`, oldest first, and returns that filled prefix (empty when none was
    /// ready). Never blocks. Errors: none today (the `Result` is the crate's shape).
    pub fn poll<'c>(&self, completions: &'c mut [Wc]) -> Result<&'c mut [Wc]> {
        let n = self.cq.poll(completions);
        Ok(completions.get_mut(..n).unwrap_or_default())
    }

    /// Like [`CompletionQueue::poll`], but first waits up to `timeout` for at least one
    /// completion (softroce addition, in place of a completion channel). Returns the filled
    /// prefix, empty on timeout.
    /// Errors: `EIO` when the device failed (its driver thread panicked) and the CQ holds
    /// nothing more (the WRs outstanding then were flushed into it first).
    pub fn wait<'c>(&self, completions: &'c mut [Wc], timeout: Duration) -> Result<&'c mut [Wc]> {
        let n = self.cq.wait(completions, timeout);
        if n == 0
            && !completions.is_empty()
            && let Some(why) = self.dev.failure()
        {
            return Err(Error::Verbs(verbs::Error::new(
                verbs::ErrorKind::Io,
                format!("wait on a CQ of device {}: {why}", self.dev.name()),
            )));
        }
        Ok(completions.get_mut(..n).unwrap_or_default())
    }

    /// The `id` given to [`Context::create_cq`](crate::Context::create_cq).
    pub fn id(&self) -> isize {
        self.id
    }
}
