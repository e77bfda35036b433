//! Instances waiting for an agent Job slot (`--max-running-jobs`) are woken
//! when a slot frees, not polled. Polled every 2 s, each waiting instance
//! was reconciled again and again while the Jobs before it ran, so the
//! reconciles of a fleet installed at once grew with the square of its size
//! (bench P7: 16.6 reconciles per instance at 1 000 instances, 3.1 at 100).
//!
//! A reconcile that ends `Queued` puts its instance in line (once); each
//! agent Job seen finished by a controller's Job watch wakes the first in
//! line, through its kind's controller (`Controller::reconcile_on`). A woken
//! instance that still finds no slot queues again at the back. A wake lost
//! (a restart, another replica leading) costs only time: a queued instance
//! is also requeued after [`SAFETY_NET`].

use std::{
    collections::{HashSet, VecDeque},
    sync::Mutex,
    time::Duration,
};

use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender, unbounded};
use kube::{api::DynamicObject, runtime::reflector::ObjectRef};

use crate::instance::InstanceKind;

/// When a queued instance is reconciled again without a wake.
pub const SAFETY_NET: Duration = Duration::from_secs(30);

type Waiter = (InstanceKind, ObjectRef<DynamicObject>);
/// The wakes of one kind, for its controller's `reconcile_on`.
pub type Woken = (InstanceKind, UnboundedReceiver<ObjectRef<DynamicObject>>);

/// See the module documentation.
#[derive(Debug)]
pub struct JobQueue {
    line: Mutex<(VecDeque<Waiter>, HashSet<Waiter>)>,
    wake: Vec<(InstanceKind, UnboundedSender<ObjectRef<DynamicObject>>)>,
}

impl JobQueue {
    /// The queue, and the wakes of each kind for its controller.
    pub fn new() -> (Self, Vec<Woken>) {
        let (mut wake, mut woken) = (Vec::new(), Vec::new());
        for kind in InstanceKind::ALL {
            let (sender, receiver) = unbounded();
            wake.push((kind, sender));
            woken.push((kind, receiver));
        }
        (Self { line: Mutex::default(), wake }, woken)
    }

    /// `instance` waits for a slot (a second call while it waits does nothing).
    pub fn wait(&self, kind: InstanceKind, instance: ObjectRef<DynamicObject>) {
        if let Ok(mut line) = self.line.lock() {
            let waiter = (kind, instance);
            if line.1.insert(waiter.clone()) {
                line.0.push_back(waiter);
            }
        }
    }

    /// A slot freed: the first in line is reconciled.
    pub fn freed(&self) {
        let first = self.line.lock().ok().and_then(|mut line| {
            let first = line.0.pop_front()?;
            line.1.remove(&first);
            Some(first)
        });
        if let Some((kind, instance)) = first
            && let Some((_, sender)) = self.wake.iter().find(|(k, _)| *k == kind)
        {
            let _ = sender.unbounded_send(instance);
        }
    }

    /// How many instances wait.
    pub fn waiting(&self) -> usize {
        self.line.lock().map(|line| line.0.len()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    fn instance(name: &str) -> ObjectRef<DynamicObject> {
        ObjectRef::new_with(name, InstanceKind::Tenant.api_resource()).within("apps")
    }

    #[tokio::test]
    async fn each_freed_slot_wakes_the_first_in_line_once() {
        let (queue, mut woken) = JobQueue::new();
        let (_, tenants) = woken.iter_mut().find(|(k, _)| *k == InstanceKind::Tenant).unwrap();
        queue.wait(InstanceKind::Tenant, instance("a"));
        queue.wait(InstanceKind::Tenant, instance("b"));
        queue.wait(InstanceKind::Tenant, instance("a"));
        assert_eq!(queue.waiting(), 2, "in line once");
        queue.freed();
        assert_eq!(tenants.next().await.unwrap().name, "a");
        queue.freed();
        assert_eq!(tenants.next().await.unwrap().name, "b");
        queue.freed();
        assert_eq!(queue.waiting(), 0);
        assert!(tenants.try_recv().is_err(), "nobody left to wake");
    }
}
