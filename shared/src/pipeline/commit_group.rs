//! A processed batch's business commits, gathered into one
//! [`StateStore::commit_each`].
//!
//! On a store that puts such a call under one durable write (the embedded store:
//! one transaction, one fsync; [`StateStore::gathers_commits`]) a batch then waits
//! for one fsync, instead of one for every moment at which some of its events
//! happened to reach the writer.
//!
//! Every run of the batch holds a [`Member`]. A member that commits parks its commit;
//! once every member that may still commit has parked (the others are done: they
//! decided without a commit, got their answer, or their run ended), the parked
//! commits go to the store together, and each member gets its own answer. Nobody
//! depends on the others to go on: a parked commit waits at most the group's
//! `wait` (one slow member, say a lookup at a provider's API, costs the others that
//! much at most), then goes with whatever is parked. A member whose commit
//! conflicted stays a member and decides again; its next commit usually goes alone.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{oneshot, Notify};

use crate::domain::state::{
    Commit, CommitAnswer, CommitOne, CommitOutcome, ReadCheck, StateStore, StateWrite,
};
use crate::ports::StoreError;

/// How long a parked commit waits for the rest of its batch by default.
pub const DEFAULT_GATHER_WAIT: Duration = Duration::from_millis(50);

struct Parked {
    commit: Commit,
    reply: oneshot::Sender<CommitAnswer>,
}

struct Gather {
    /// Members that may still commit (parked ones included).
    open: usize,
    parked: Vec<Parked>,
}

impl Gather {
    /// Commits are parked and nobody else may still add one.
    fn is_complete(&self) -> bool {
        !self.parked.is_empty() && self.parked.len() >= self.open
    }
}

struct Group {
    state: Arc<dyn StateStore>,
    gather: Mutex<Gather>,
    /// Wakes a parked member when the last open one is done without parking.
    complete: Notify,
    wait: Duration,
}

impl Group {
    fn lock(&self) -> MutexGuard<'_, Gather> {
        // The lock guards two plain fields and is never held across an await or a
        // call that can panic; a poisoned one still holds consistent data.
        self.gather.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every parked commit, once every open member has parked.
    fn take_if_complete(gather: &mut Gather) -> Option<Vec<Parked>> {
        gather
            .is_complete()
            .then(|| std::mem::take(&mut gather.parked))
    }

    async fn flush(&self, parked: Vec<Parked>) {
        let (commits, replies): (Vec<Commit>, Vec<_>) =
            parked.into_iter().map(|p| (p.commit, p.reply)).unzip();
        let mut answers = self.state.commit_each(&commits).await.into_iter();
        for reply in replies {
            let answer = answers.next().unwrap_or_else(|| {
                Err(StoreError::Unavailable(
                    "the state store answered fewer commits than it was given".into(),
                ))
            });
            // A member that went away (its run was cancelled) needs no answer.
            let _ = reply.send(answer);
        }
    }
}

/// The runs of one batch of `count` events, one [`Member`] each.
pub(crate) fn members(state: Arc<dyn StateStore>, count: usize, wait: Duration) -> Vec<Member> {
    let group = Arc::new(Group {
        state,
        gather: Mutex::new(Gather {
            open: count,
            parked: Vec::with_capacity(count),
        }),
        complete: Notify::new(),
        wait,
    });
    (0..count)
        .map(|_| Member {
            group: group.clone(),
            state: AtomicU8::new(OPEN),
        })
        .collect()
}

/// A member that may still commit: the group waits for it.
const OPEN: u8 = 0;
/// A member waiting for something else (its record's lane): the group goes on
/// without it until it is back.
const AWAY: u8 = 1;
/// A member that commits nothing more.
const DONE: u8 = 2;

/// One run's place in its batch's group (see the module documentation).
pub(crate) struct Member {
    group: Arc<Group>,
    state: AtomicU8,
}

impl Member {
    /// One commit ([`CommitOne::commit_waking`]), gathered with the batch's other commits.
    pub(crate) async fn commit_waking(
        &self,
        writes: &[StateWrite],
        reads: &[ReadCheck],
    ) -> CommitAnswer {
        let group = &self.group;
        if self.state.load(Ordering::Acquire) != OPEN {
            return group.state.commit_waking(writes, reads).await;
        }
        let (reply, mut answer) = oneshot::channel();
        let ready = {
            let mut gather = group.lock();
            gather.parked.push(Parked {
                commit: Commit {
                    writes: writes.to_vec(),
                    reads: reads.to_vec(),
                },
                reply,
            });
            Group::take_if_complete(&mut gather)
        };
        if let Some(parked) = ready {
            group.flush(parked).await;
        }
        let deadline = tokio::time::sleep(group.wait);
        tokio::pin!(deadline);
        let mut waited_out = false;
        let answer = loop {
            tokio::select! {
                answer = &mut answer => break answer,
                () = group.complete.notified() => {
                    let ready = Group::take_if_complete(&mut group.lock());
                    if let Some(parked) = ready {
                        group.flush(parked).await;
                    }
                }
                () = &mut deadline, if !waited_out => {
                    waited_out = true;
                    // Whatever is parked goes now (ours among it, unless another
                    // member has just taken it).
                    let parked = std::mem::take(&mut group.lock().parked);
                    if !parked.is_empty() {
                        group.flush(parked).await;
                    }
                }
            }
        };
        let answer = answer.unwrap_or_else(|_| {
            Err(StoreError::Unavailable(
                "the batch's gathered commit was dropped".into(),
            ))
        });
        // Only a conflict means this run decides (and commits) again.
        if !matches!(answer, Ok((CommitOutcome::Conflict, _))) {
            self.done();
        }
        answer
    }

    /// This run commits nothing more: the others need not wait for it.
    pub(crate) fn done(&self) {
        if self.state.swap(DONE, Ordering::AcqRel) == OPEN {
            self.leave();
        }
    }

    /// This run waits for something that may take a while (another run's turn on a
    /// record): the others need not wait for it until [`Member::back`].
    pub(crate) fn away(&self) {
        if self
            .state
            .compare_exchange(OPEN, AWAY, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.leave();
        }
    }

    /// Back from [`Member::away`]: the group waits for this run's commit again.
    pub(crate) fn back(&self) {
        if self
            .state
            .compare_exchange(AWAY, OPEN, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.group.lock().open += 1;
        }
    }

    fn leave(&self) {
        let complete = {
            let mut gather = self.group.lock();
            gather.open = gather.open.saturating_sub(1);
            gather.is_complete()
        };
        if complete {
            // A parked member takes the commits (a stored permit if none is polling).
            self.group.complete.notify_one();
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.done();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::embedded::{EmbeddedOptions, EmbeddedStateStore, EmbeddedStore};
    use crate::domain::state::{StateKey, StateRecord};

    fn create(id: &str) -> StateWrite {
        let mut record = StateRecord::missing(StateKey::new("t1", "order", id));
        record.version = 1;
        record.data = serde_json::json!({ "id": id });
        StateWrite {
            record,
            expected_version: 0,
        }
    }

    async fn store() -> (tempfile::TempDir, Arc<EmbeddedStore>, Arc<dyn StateStore>) {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).unwrap());
        let state: Arc<dyn StateStore> = Arc::new(EmbeddedStateStore::new(store.clone()));
        (dir, store, state)
    }

    /// Bounds a test that would otherwise hang if a member were never answered.
    async fn answered<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(30), f)
            .await
            .expect("a gathered commit was never answered")
    }

    #[tokio::test]
    async fn a_batch_of_commits_shares_one_fsync() {
        let (_dir, store, state) = store().await;
        let before = store.commit_stats();
        // An hour: only the members themselves can complete the group.
        let members = members(state.clone(), 6, Duration::from_secs(3600));
        let runs = members
            .into_iter()
            .enumerate()
            .map(|(i, member)| async move {
                if i % 3 == 2 {
                    // Decides without a commit.
                    member.done();
                    return None;
                }
                Some(member.commit_waking(&[create(&format!("o{i}"))], &[]).await)
            });
        let answers = answered(futures::future::join_all(runs)).await;
        for answer in answers.into_iter().flatten() {
            assert!(
                matches!(answer, Ok((CommitOutcome::Committed, _))),
                "{answer:?}"
            );
        }
        let after = store.commit_stats();
        assert_eq!(after.fsynced_effects - before.fsynced_effects, 1);
        let keys: Vec<StateKey> = [0, 1, 3, 4]
            .iter()
            .map(|i| StateKey::new("t1", "order", format!("o{i}")))
            .collect();
        let loaded = state.load(&keys).await.unwrap();
        assert!(loaded.iter().all(|r| r.version == 1), "{loaded:?}");
    }

    #[tokio::test]
    async fn commits_of_one_record_in_one_group_conflict_and_the_loser_commits_alone() {
        let (_dir, _store, state) = store().await;
        let members = members(state.clone(), 2, Duration::from_secs(3600));
        let (a, b) = (&members[0], &members[1]);
        let (first, second) = answered(futures::future::join(
            a.commit_waking(&[create("same")], &[]),
            b.commit_waking(&[create("same")], &[]),
        ))
        .await;
        let outcomes = [first.unwrap().0, second.unwrap().0];
        assert!(outcomes.contains(&CommitOutcome::Committed), "{outcomes:?}");
        assert!(outcomes.contains(&CommitOutcome::Conflict), "{outcomes:?}");
        // The loser decides again on the new version; the winner is done, so its
        // commit goes at once.
        let loser = if outcomes[0] == CommitOutcome::Conflict {
            a
        } else {
            b
        };
        let mut again = create("same");
        again.expected_version = 1;
        again.record.version = 2;
        let answer = answered(loser.commit_waking(&[again], &[])).await.unwrap();
        assert_eq!(answer.0, CommitOutcome::Committed);
        let key = StateKey::new("t1", "order", "same");
        assert_eq!(state.load(&[key]).await.unwrap()[0].version, 2);
    }

    #[tokio::test]
    async fn a_slow_member_holds_the_others_no_longer_than_the_wait() {
        let (_dir, _store, state) = store().await;
        let mut members = members(state.clone(), 3, Duration::from_millis(20));
        // The third member never commits and stays open while the others finish.
        let slow = members.pop().unwrap();
        let answers = answered(futures::future::join_all(members.iter().enumerate().map(
            |(i, m)| async move { m.commit_waking(&[create(&format!("p{i}"))], &[]).await },
        )))
        .await;
        for answer in answers {
            assert!(
                matches!(answer, Ok((CommitOutcome::Committed, _))),
                "{answer:?}"
            );
        }
        drop(slow);
    }

    #[tokio::test]
    async fn the_last_member_leaving_releases_the_parked_commits() {
        let (_dir, _store, state) = store().await;
        let members = members(state.clone(), 2, Duration::from_secs(3600));
        let mut members = members.into_iter();
        let (parks, leaves) = (members.next().unwrap(), members.next().unwrap());
        let (answer, ()) = answered(futures::future::join(
            parks.commit_waking(&[create("q")], &[]),
            async move {
                tokio::task::yield_now().await;
                drop(leaves);
            },
        ))
        .await;
        assert_eq!(answer.unwrap().0, CommitOutcome::Committed);
    }

    #[tokio::test]
    async fn a_refused_commit_does_not_fail_the_others_of_its_group() {
        let (_dir, _store, state) = store().await;
        let members = members(state.clone(), 2, Duration::from_secs(3600));
        let mut bad = create("r-bad");
        bad.record.version = 0; // not above the expected version
        let (good, refused) = answered(futures::future::join(
            members[0].commit_waking(&[create("r-good")], &[]),
            members[1].commit_waking(&[bad], &[]),
        ))
        .await;
        assert_eq!(good.unwrap().0, CommitOutcome::Committed);
        assert!(
            matches!(refused, Err(StoreError::Rejected(_))),
            "{refused:?}"
        );
    }
}
