//! Agent Job slots (`--max-running-jobs`): which agent Jobs run, and the
//! instances waiting for one to finish.
//!
//! **Counted, not listed per create.** Each create used to list every agent
//! Job (finished ones are kept) to count the running ones: O(n) per create,
//! so a fleet installed at once cost the API server O(n²). The running
//! Jobs are now followed from the controllers' Job watches and the creates
//! themselves ([`JobQueue::seen`], [`JobQueue::created`]); the Jobs are
//! listed once before the first create, and again only when the count says
//! "full" and the last list is older than [`RELIST`] (a finish this process
//! missed, a Job deleted by hand). The count can only err high between two
//! lists (a wait, never a Job over the cap).
//!
//! **Woken, not polled.** Polled, each waiting instance was reconciled
//! again and again while the Jobs before it ran, so the reconciles of a
//! fleet installed at once grew with the square of its size (bench P7: 16.6
//! reconciles per instance at 1 000 instances, 3.1 at 100; with a 30 s
//! safety net per instance, still 10 at 1 000). A reconcile that ends
//! `Queued` puts its instance in line (once) and waits for a wake: each
//! agent Job seen finishing wakes the first in line, through its kind's
//! controller (`Controller::reconcile_on`). A woken instance that still
//! finds no slot (a reconcile of another instance, not in line, took it)
//! is back at the front, not at the back: sent to the back, it would wait
//! through the whole line again (at 10 000 instances, a line of thousands)
//! for a race it lost once. One that went ahead otherwise
//! (its own event) leaves the line ([`JobQueue::reconciled`]), so no wake is
//! spent on it. A wake is the offer of a slot: a woken instance whose
//! reconcile ends without taking it (it needed no Job after all, or failed)
//! passes it to the next in line, else the chain of wakes that slot carried
//! would end there. A slot freed while nobody is in line is kept for the next
//! to queue (the instance that found the count full, whose Jobs all ended
//! before it queued, is woken at once). The line lives as long as the
//! process: a restart or a new leader reconciles every instance anyway, and
//! [`JobQueue::tick`], every [`SAFETY_NET`], forgets offers older than that
//! (a wake whose reconcile never came) and wakes as many as the count has
//! slots neither running nor offered (one at least when the line has not
//! moved): a wake lost costs that much time, not more.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::Mutex,
    time::{Duration, Instant},
};

use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender, unbounded};
use k8s_openapi::api::batch::v1::Job;
use kube::{ResourceExt, api::DynamicObject, runtime::reflector::ObjectRef};

use crate::instance::InstanceKind;

/// How long the line may stand still before its first is woken anyway.
pub const SAFETY_NET: Duration = Duration::from_secs(30);
/// How old the last list of agent Jobs may be when the count says "full".
pub const RELIST: Duration = Duration::from_secs(10);

type Waiter = (InstanceKind, ObjectRef<DynamicObject>);
/// The wakes of one kind, for its controller's `reconcile_on`.
pub type Woken = (InstanceKind, UnboundedReceiver<ObjectRef<DynamicObject>>);

#[derive(Debug, Default)]
struct State {
    /// In order; an entry no longer in `waiting` left the line.
    line: VecDeque<Waiter>,
    waiting: HashSet<Waiter>,
    /// Slots freed while nobody waited, for the next to queue (at most the cap).
    spare: usize,
    /// Woken and not back yet, since when: each holds the offer of a slot
    /// (at the front again if it still finds none).
    woken: HashMap<Waiter, Instant>,
    /// The line moved (a slot freed) since the last tick.
    moved: bool,
    /// Agent Jobs running: name → uid.
    running: HashMap<String, String>,
    /// Uids of agent Jobs seen finished (a create read back late must not count them).
    ended: HashSet<String>,
    listed: Option<Instant>,
}

/// See the module documentation.
#[derive(Debug)]
pub struct JobQueue {
    cap: usize,
    state: Mutex<State>,
    wake: Vec<(InstanceKind, UnboundedSender<ObjectRef<DynamicObject>>)>,
}

/// A Job with a `Complete` or `Failed` condition.
pub(crate) fn finished(job: &Job) -> bool {
    job.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|cs| {
        cs.iter().any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
    })
}

impl JobQueue {
    /// The queue of at most `cap` running agent Jobs, and the wakes of each
    /// kind for its controller.
    pub fn new(cap: usize) -> (Self, Vec<Woken>) {
        let (mut wake, mut woken) = (Vec::new(), Vec::new());
        for kind in InstanceKind::ALL {
            let (sender, receiver) = unbounded();
            wake.push((kind, sender));
            woken.push((kind, receiver));
        }
        (Self { cap: cap.max(1), state: Mutex::default(), wake }, woken)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `instance` waits for a slot (a second call while it waits does nothing).
    pub fn wait(&self, kind: InstanceKind, instance: ObjectRef<DynamicObject>) {
        let mut state = self.state();
        let waiter = (kind, instance);
        if state.spare > 0 && !state.waiting.contains(&waiter) {
            state.spare -= 1;
            state.moved = true;
            self.send(&mut state, waiter);
            return;
        }
        if state.waiting.insert(waiter.clone()) {
            if state.woken.remove(&waiter).is_some() {
                state.line.push_front(waiter);
            } else {
                state.line.push_back(waiter);
            }
        }
    }

    /// A reconcile of `instance` ended otherwise than waiting for a slot:
    /// one that `went_ahead` (it created its Job, or needs none) leaves the
    /// line. Either way a wake it was sent is spent: the slot it was offered,
    /// if it did not take it, goes to the next in line (a woken instance
    /// whose reconcile needed no Job, or failed, used to end its chain of
    /// wakes: bench P7 at 10 000, a 1 000-instance upgrade took 87 s, driven
    /// by the safety net).
    pub fn reconciled(&self, kind: InstanceKind, instance: ObjectRef<DynamicObject>, went_ahead: bool) {
        let mut state = self.state();
        if state.waiting.is_empty() && state.woken.is_empty() {
            return;
        }
        let waiter = (kind, instance);
        if went_ahead {
            state.waiting.remove(&waiter);
        }
        if state.woken.remove(&waiter).is_some() && self.free(&state) > 0 {
            self.wake(&mut state, 1);
        }
    }

    /// Slots neither running a Job nor offered to a woken instance.
    fn free(&self, state: &State) -> usize {
        self.cap.saturating_sub(state.running.len() + state.woken.len())
    }

    /// The first in line, skipping those that left it.
    fn first(state: &mut State) -> Option<Waiter> {
        while let Some(first) = state.line.pop_front() {
            if state.waiting.remove(&first) {
                return Some(first);
            }
        }
        None
    }

    /// Wakes the first `count` in line; a slot nobody waits for is kept.
    fn wake(&self, state: &mut State, count: usize) {
        for _ in 0..count {
            let Some(first) = Self::first(state) else {
                state.spare = (state.spare + 1).min(self.cap);
                continue;
            };
            state.moved = true;
            self.send(state, first);
        }
    }

    /// Wakes `waiter`, which keeps its place if it still finds no slot.
    fn send(&self, state: &mut State, waiter: Waiter) {
        if let Some((_, sender)) = self.wake.iter().find(|(k, _)| *k == waiter.0) {
            let _ = sender.unbounded_send(waiter.1.clone());
        }
        state.woken.insert(waiter, Instant::now());
    }

    /// An agent Job as a watch saw it: one that finished frees its slot
    /// (the first in line is woken), one that runs is counted.
    pub fn seen(&self, job: &Job) {
        let (name, uid) = (job.name_any(), job.uid().unwrap_or_default());
        let mut state = self.state();
        if finished(job) || job.metadata.deletion_timestamp.is_some() {
            state.ended.insert(uid.clone());
            if state.running.get(&name) == Some(&uid) {
                state.running.remove(&name);
                self.wake(&mut state, 1);
            }
        } else if !state.ended.contains(&uid) {
            state.running.insert(name, uid);
        }
    }

    /// This process created the agent Job `name` (`uid`), read back.
    pub fn created(&self, name: &str, uid: &str) {
        let mut state = self.state();
        if !state.ended.contains(uid) {
            state.running.insert(name.to_string(), uid.to_string());
        }
    }

    /// The agent Job `name` was deleted (read back gone).
    pub fn deleted(&self, name: &str) {
        let mut state = self.state();
        if state.running.remove(name).is_some() {
            self.wake(&mut state, 1);
        }
    }

    /// How many agent Jobs other than `name` run; `None` when the Jobs must
    /// be listed first ([`JobQueue::listed`]): never listed, or the count
    /// says the cap is reached and the last list is older than [`RELIST`].
    pub fn running_besides(&self, name: &str) -> Option<usize> {
        let state = self.state();
        let running = Self::besides(&state, name);
        let fresh = state.listed.is_some_and(|at| at.elapsed() < RELIST);
        (state.listed.is_some() && (running < self.cap || fresh)).then_some(running)
    }

    /// How many agent Jobs other than `name` run, as counted now.
    pub fn counted_besides(&self, name: &str) -> usize {
        Self::besides(&self.state(), name)
    }

    fn besides(state: &State, name: &str) -> usize {
        state.running.len() - usize::from(state.running.contains_key(name))
    }

    /// Every agent Job, as listed: the count starts again from it, and as
    /// many instances as it found slots freed are woken.
    pub fn listed(&self, jobs: &[Job]) {
        let mut state = self.state();
        let before = state.running.len();
        state.running.clear();
        state.ended.clear();
        for job in jobs {
            let uid = job.uid().unwrap_or_default();
            if finished(job) || job.metadata.deletion_timestamp.is_some() {
                state.ended.insert(uid);
            } else {
                state.running.insert(job.name_any(), uid);
            }
        }
        state.listed = Some(Instant::now());
        let freed = before.saturating_sub(state.running.len());
        self.wake(&mut state, freed);
    }

    /// Called every [`SAFETY_NET`]: an offer older than that is forgotten
    /// (its reconcile never came back), and as many are woken as the count
    /// has slots neither running nor offered; when the line has not moved
    /// since the last tick, one at least (its create lists the Jobs again).
    pub fn tick(&self) {
        let mut state = self.state();
        let moved = std::mem::take(&mut state.moved);
        state.woken.retain(|_, since| since.elapsed() < SAFETY_NET);
        let free = self.free(&state);
        for _ in 0..if moved { free } else { free.max(1) } {
            let Some(first) = Self::first(&mut state) else { return };
            self.send(&mut state, first);
        }
    }

    /// Ticks every [`SAFETY_NET`] until `shutdown`.
    pub async fn ticking(self: std::sync::Arc<Self>, shutdown: impl std::future::Future<Output = ()>) {
        let mut every = tokio::time::interval(SAFETY_NET);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        every.tick().await;
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = every.tick() => self.tick(),
                () = &mut shutdown => return,
            }
        }
    }

    /// How many agent Jobs may run at once (`--max-running-jobs`).
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// How many instances wait.
    pub fn waiting(&self) -> usize {
        self.state().waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn instance(name: &str) -> ObjectRef<DynamicObject> {
        ObjectRef::new_with(name, InstanceKind::Tenant.api_resource()).within("apps")
    }

    /// An agent Job as the Job controller writes it (`Complete` when done).
    fn job(name: &str, uid: &str, done: bool) -> Job {
        let conditions = if done { json!([{"type": "Complete", "status": "True"}]) } else { json!([]) };
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "vynil-system", "uid": uid},
            "status": {"conditions": conditions},
        }))
        .unwrap()
    }

    fn tenants(woken: &mut [Woken]) -> &mut UnboundedReceiver<ObjectRef<DynamicObject>> {
        &mut woken.iter_mut().find(|(k, _)| *k == InstanceKind::Tenant).unwrap().1
    }

    /// The next tenant instance woken, if one was (wakes are sent at once).
    fn next(woken: &mut [Woken]) -> Option<String> {
        tenants(woken).try_recv().ok().map(|r| r.name)
    }

    /// A queue of `cap` slots, one running Job `j1`, and `names` in line behind it.
    fn in_line(cap: usize, names: &[&str]) -> (JobQueue, Vec<Woken>) {
        let (queue, woken) = JobQueue::new(cap);
        queue.listed(&[job("j1", "u1", false)]);
        for name in names {
            queue.wait(InstanceKind::Tenant, instance(name));
        }
        (queue, woken)
    }

    #[test]
    fn each_job_seen_finishing_wakes_the_first_in_line_once() {
        let (queue, mut woken) = JobQueue::new(9);
        queue.listed(&[job("j1", "u1", false), job("j2", "u2", false), job("old", "u0", true)]);
        assert_eq!(queue.running_besides("new"), Some(2), "a finished Job holds no slot");
        queue.wait(InstanceKind::Tenant, instance("a"));
        queue.wait(InstanceKind::Tenant, instance("b"));
        queue.wait(InstanceKind::Tenant, instance("a"));
        assert_eq!(queue.waiting(), 2, "in line once");
        queue.seen(&job("j1", "u1", true));
        assert_eq!(next(&mut woken).as_deref(), Some("a"));
        queue.seen(&job("j1", "u1", true));
        queue.seen(&job("old", "u0", true));
        assert_eq!(next(&mut woken), None, "a Job seen finished again frees nothing");
        queue.seen(&job("j2", "u2", true));
        assert_eq!(next(&mut woken).as_deref(), Some("b"));
        assert_eq!(queue.waiting(), 0);
        assert_eq!(queue.running_besides("new"), Some(0));
    }

    #[test]
    fn the_count_follows_creates_and_finishes_and_a_full_stale_count_is_listed_again() {
        let (queue, _woken) = JobQueue::new(2);
        assert_eq!(queue.running_besides("a"), None, "never listed: list first");
        queue.listed(&[]);
        queue.created("a", "ua");
        assert_eq!(queue.running_besides("a"), Some(0), "a Job is not counted against itself");
        // The agent finished before the create was read back: no slot held.
        queue.seen(&job("b", "ub", true));
        queue.created("b", "ub");
        queue.seen(&job("c", "uc", false));
        assert_eq!(queue.running_besides("d"), Some(2), "full, and listed less than RELIST ago");
        queue.state().listed = Instant::now().checked_sub(RELIST);
        assert_eq!(queue.running_besides("d"), None, "full and stale: listed again");
        queue.deleted("a");
        assert_eq!(queue.running_besides("d"), Some(1), "not full: no list needed, however old the last");
    }

    #[test]
    fn a_slot_freed_while_nobody_waits_goes_to_the_next_and_no_wake_is_spent_on_one_gone_ahead() {
        let (queue, mut woken) = JobQueue::new(2);
        queue.listed(&[job("j1", "u1", false), job("j2", "u2", false)]);
        // "a" found the count full, and both Jobs ended before it queued.
        queue.seen(&job("j1", "u1", true));
        queue.seen(&job("j2", "u2", true));
        queue.wait(InstanceKind::Tenant, instance("a"));
        assert_eq!(next(&mut woken).as_deref(), Some("a"), "woken at once");
        assert_eq!(queue.waiting(), 0);
        queue.wait(InstanceKind::Tenant, instance("b"));
        assert_eq!(next(&mut woken).as_deref(), Some("b"), "the second slot kept");
        queue.wait(InstanceKind::Tenant, instance("c"));
        assert_eq!(next(&mut woken), None, "no slot kept: c waits");
        queue.wait(InstanceKind::Tenant, instance("d"));
        queue.created("j3", "u3");
        queue.reconciled(InstanceKind::Tenant, instance("c"), true);
        queue.seen(&job("j3", "u3", true));
        assert_eq!(next(&mut woken).as_deref(), Some("d"), "c went ahead on its own");
    }

    #[test]
    fn a_woken_instance_that_finds_no_slot_is_next_not_last() {
        let (queue, mut woken) = in_line(1, &["a", "b", "c"]);
        queue.seen(&job("j1", "u1", true));
        assert_eq!(next(&mut woken).as_deref(), Some("a"));
        // Another instance, not in line, took the slot before "a" came back.
        queue.created("j2", "u2");
        queue.wait(InstanceKind::Tenant, instance("a"));
        queue.seen(&job("j2", "u2", true));
        assert_eq!(next(&mut woken).as_deref(), Some("a"), "a was woken first: it is next again");
        // Once it went ahead, a later wait is a new one: at the back.
        queue.created("j3", "u3");
        queue.reconciled(InstanceKind::Tenant, instance("a"), true);
        queue.wait(InstanceKind::Tenant, instance("a"));
        queue.seen(&job("j3", "u3", true));
        assert_eq!(next(&mut woken).as_deref(), Some("b"));
    }

    #[test]
    fn a_line_standing_still_wakes_its_first_and_it_keeps_its_place() {
        let (queue, mut woken) = in_line(1, &["a", "b"]);
        queue.tick();
        assert_eq!(next(&mut woken).as_deref(), Some("a"));
        // Still no slot: "a" is back first, not behind "b".
        queue.wait(InstanceKind::Tenant, instance("a"));
        queue.seen(&job("j1", "u1", true));
        assert_eq!(next(&mut woken).as_deref(), Some("a"));
        queue.wait(InstanceKind::Tenant, instance("c"));
        queue.tick();
        assert_eq!(next(&mut woken), None, "the line moved since the last tick");
        queue.tick();
        assert_eq!(next(&mut woken).as_deref(), Some("b"));
    }

    #[test]
    fn a_woken_instance_that_takes_no_slot_passes_it_to_the_next_in_line() {
        let (queue, mut woken) = in_line(1, &["a", "b", "c"]);
        queue.seen(&job("j1", "u1", true));
        assert_eq!(next(&mut woken).as_deref(), Some("a"));
        // Its reconcile needed no Job after all (another event had run it).
        queue.reconciled(InstanceKind::Tenant, instance("a"), true);
        assert_eq!(next(&mut woken).as_deref(), Some("b"), "the slot a did not take");
        // b's reconcile failed (a conflict) before it created anything: c goes.
        queue.reconciled(InstanceKind::Tenant, instance("b"), false);
        assert_eq!(next(&mut woken).as_deref(), Some("c"));
        // c took the slot: nobody else is woken when it ends.
        queue.created("j2", "u2");
        queue.wait(InstanceKind::Tenant, instance("b"));
        queue.reconciled(InstanceKind::Tenant, instance("c"), true);
        assert_eq!(next(&mut woken), None, "the only slot runs c's Job");
        queue.seen(&job("j2", "u2", true));
        assert_eq!(next(&mut woken).as_deref(), Some("b"));
    }

    #[test]
    fn an_offer_whose_reconcile_never_came_back_is_forgotten_by_the_safety_net() {
        let (queue, mut woken) = in_line(1, &["a", "b"]);
        queue.seen(&job("j1", "u1", true));
        assert_eq!(next(&mut woken).as_deref(), Some("a"));
        // "a" was deleted meanwhile: its wake never ends in a reconcile.
        queue.tick();
        assert_eq!(next(&mut woken), None, "the line moved, and a's offer is young");
        let old = Instant::now().checked_sub(SAFETY_NET);
        for since in queue.state().woken.values_mut() {
            *since = old.unwrap_or(*since);
        }
        queue.tick();
        assert_eq!(next(&mut woken).as_deref(), Some("b"), "the slot offered to a goes on");
    }
}
