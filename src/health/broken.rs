//! Broken gangs (SPEC §10): a PodGroup whose status once showed every one of its minMember pods
//! running, and now shows fewer for longer than a threshold. Read from PodGroup status only.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::events::Reason;

/// What one process remembers of a gang between reconciles (the status holds no history).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GangMemory {
    /// The PodGroup this is about: a recreated PodGroup starts afresh.
    pub pod_group_uid: String,
    /// The status once counted minMember pods running or succeeded: the gang ran whole.
    pub ran: bool,
    /// Since when fewer than minMember pods run (after the gang ran whole).
    pub short_since: Option<Timestamp>,
    /// `GangBroken` was reported and not yet cleared.
    pub broken: bool,
}

/// The verdict on one look at a gang.
#[derive(Debug, Clone, PartialEq)]
pub struct Look {
    pub memory: GangMemory,
    pub event: Option<(Reason, String)>,
    /// Look again after this (a short gang before the threshold).
    pub again_in: Option<Duration>,
}

/// Looks at a gang's PodGroup: `running` is what its status counts (running + succeeded
/// pods; `None` when the backend's status has no count).
pub fn look(
    memory: Option<&GangMemory>,
    pod_group: (&str, &str),
    running: Option<u32>,
    min_member: u32,
    now: Timestamp,
    threshold: Duration,
) -> Look {
    let (uid, name) = pod_group;
    let mut memory = match memory {
        Some(m) if m.pod_group_uid == uid => m.clone(),
        _ => GangMemory {
            pod_group_uid: uid.to_string(),
            ..GangMemory::default()
        },
    };
    let mut look = Look {
        memory: memory.clone(),
        event: None,
        again_in: None,
    };
    let Some(running) = running else {
        return look;
    };
    if running >= min_member {
        let recovered = memory.broken;
        memory = GangMemory {
            pod_group_uid: uid.to_string(),
            ran: true,
            short_since: None,
            broken: false,
        };
        look.memory = memory;
        look.event = recovered.then(|| {
            (
                Reason::GangRecovered,
                format!("PodGroup {name}: {running} of minMember {min_member} pods run again; the gang is whole"),
            )
        });
        return look;
    }
    if !memory.ran {
        // Still gathering: GangWaiting and the scheduler's own conditions speak for it.
        return look;
    }
    let since = *memory.short_since.get_or_insert(now);
    let short_for = Duration::try_from(now.duration_since(since)).unwrap_or_default();
    if short_for >= threshold {
        memory.broken = true;
        look.event = Some((
            Reason::GangBroken,
            format!(
                "PodGroup {name} ran whole, but only {running} of minMember {min_member} pods have been running for more than {}s: a pod was lost (node failure, eviction or deletion) and its replacement does not run; the gang's work may be stalled",
                threshold.as_secs()
            ),
        ));
    } else {
        look.again_in = Some(threshold - short_for + Duration::from_secs(1));
    }
    look.memory = memory;
    look
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(60);

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn step(m: &GangMemory, running: u32, secs: i64) -> Look {
        look(Some(m), ("pg-uid", "pg"), Some(running), 4, at(secs), T)
    }

    #[test]
    fn rule_10_a_gang_still_gathering_is_never_broken() {
        let l = look(None, ("pg-uid", "pg"), Some(2), 4, at(0), T);
        let l = step(&l.memory, 2, 1000);
        assert_eq!((l.event, l.again_in, l.memory.ran), (None, None, false));
    }

    #[test]
    fn rule_10_a_gang_that_ran_whole_and_lost_pods_is_broken_after_the_threshold_then_recovers() {
        let whole = look(None, ("pg-uid", "pg"), Some(4), 4, at(0), T);
        assert!(whole.memory.ran && whole.event.is_none());
        let short = step(&whole.memory, 3, 10);
        assert_eq!(short.event, None);
        assert_eq!(short.again_in, Some(Duration::from_secs(61)));
        let still = step(&short.memory, 3, 50);
        assert_eq!(still.again_in, Some(Duration::from_secs(21)));
        let broken = step(&still.memory, 3, 70);
        let (reason, note) = broken.event.clone().unwrap();
        assert_eq!(reason, Reason::GangBroken);
        assert!(note.contains("only 3 of minMember 4"), "{note}");
        // Reported again with the same note only by the Event de-duplication's rules.
        let again = step(&broken.memory, 3, 80);
        assert_eq!(again.event.as_ref().map(|e| e.0), Some(Reason::GangBroken));
        let recovered = step(&again.memory, 4, 90);
        assert_eq!(
            recovered.event.map(|e| e.0),
            Some(Reason::GangRecovered),
            "cleared once whole"
        );
        assert!(!recovered.memory.broken && recovered.memory.short_since.is_none());
        // A short dip below the threshold is not reported at all.
        let dip = step(&recovered.memory, 3, 100);
        let back = step(&dip.memory, 4, 120);
        assert_eq!((dip.event, back.event), (None, None));
    }

    #[test]
    fn rule_10_a_recreated_pod_group_starts_afresh_and_no_count_means_no_verdict() {
        let whole = look(None, ("old", "pg"), Some(4), 4, at(0), T);
        let other = look(Some(&whole.memory), ("new", "pg"), Some(1), 4, at(500), T);
        assert!(!other.memory.ran && other.event.is_none());
        let native = look(Some(&whole.memory), ("old", "pg"), None, 4, at(500), T);
        assert_eq!((native.event, native.again_in), (None, None));
    }
}
