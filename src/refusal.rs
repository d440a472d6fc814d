//! PodGroups the API server refused, and which refusals are worth sending again (pure).
//!
//! A refusal by the PodGroup's schema (400/422 from validation) comes from the job's spec: the
//! same object is never sent again, only a job change that alters it. A refusal by admission —
//! an admission webhook (Volcano's refuses PodGroups whose queue is missing or not Open) or a
//! ValidatingAdmissionPolicy — may pass later, when what it depends on changes: it is sent
//! again with a capped backoff (1 s doubling to 30 s), and at once when a reconcile is
//! triggered by a change of the namespace, a PriorityClass, a ValidatingAdmissionPolicy or its
//! binding, or (with the feasibility check) a Volcano Queue.

use std::time::{Duration, Instant};

use serde_json::Value;

/// What the API server refused for a job last time.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// The refused object.
    pub body: Value,
    /// The API server's message.
    pub message: String,
    /// Who refused it at admission (`admission webhook "…"`, `ValidatingAdmissionPolicy "…"`);
    /// `None`: the schema.
    pub by: Option<String>,
    /// Consecutive admission refusals since the last change that may matter.
    pub attempts: u32,
    /// When it was refused.
    pub at: Instant,
}

impl Refusal {
    /// The refusal of `body` with `message` (status `code`) at `at`, after `before`; `None`
    /// when the status is no refusal of the object (a 403 from RBAC, say: retried as any
    /// failure). An admission refusal of a retry sent before its backoff was due — a change
    /// triggered it, and the API server may not have loaded that change yet — starts the
    /// backoff again from its shortest wait.
    pub fn of(
        code: u16,
        message: &str,
        body: Value,
        before: Option<&Refusal>,
        at: Instant,
    ) -> Option<Refusal> {
        let by = refused_at_admission(message);
        if by.is_none() && !matches!(code, 400 | 422) {
            return None;
        }
        let attempts = match before {
            Some(b) if by.is_some() && b.by.is_some() => {
                let due = b.at + b.retry_after().unwrap_or_default();
                if at < due {
                    1
                } else {
                    b.attempts.saturating_add(1)
                }
            }
            _ => 1,
        };
        Some(Refusal {
            body,
            message: message.to_string(),
            by,
            attempts,
            at,
        })
    }

    /// Whether this exact object is held back: a schema refusal of the same object.
    pub fn holds_back(&self, body: &Value) -> bool {
        self.by.is_none() && self.body == *body
    }

    /// When an admission refusal is sent again, at the latest.
    pub fn retry_after(&self) -> Option<Duration> {
        self.by.as_ref().map(|_| admission_backoff(self.attempts))
    }
}

/// First and longest wait before an admission refusal is sent again.
pub const ADMISSION_RETRY_MIN: Duration = Duration::from_secs(1);
pub const ADMISSION_RETRY_MAX: Duration = Duration::from_secs(30);

/// 1 s doubling to 30 s.
pub fn admission_backoff(attempts: u32) -> Duration {
    let doublings = attempts.saturating_sub(1).min(16);
    (ADMISSION_RETRY_MIN * 2u32.pow(doublings)).min(ADMISSION_RETRY_MAX)
}

/// Who refused, when the API server's message says an admission step did.
pub fn refused_at_admission(message: &str) -> Option<String> {
    if let Some(name) = quoted_after(message, "admission webhook ")
        && message.contains("denied the request")
    {
        return Some(format!("admission webhook {name:?}"));
    }
    if let Some(name) = quoted_after(message, "ValidatingAdmissionPolicy ")
        && message.contains("denied request")
    {
        return Some(format!("ValidatingAdmissionPolicy {name:?}"));
    }
    None
}

/// The text between the quotes (`"` or `'`) right after `prefix`.
fn quoted_after<'a>(message: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = &message[message.find(prefix)? + prefix.len()..];
    let quote = rest.chars().next().filter(|c| *c == '"' || *c == '\'')?;
    let rest = &rest[1..];
    Some(&rest[..rest.find(quote)?])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const WEBHOOK: &str = r#"admission webhook "validatepodgroup.volcano.sh" denied the request: failed to get queue team-a: queue.scheduling.volcano.sh "team-a" not found"#;
    const POLICY: &str = "podgroups.scheduling.x-k8s.io \"j\" is forbidden: ValidatingAdmissionPolicy 'no-big-gangs' with binding 'no-big-gangs' denied request: minMember too large";

    #[test]
    fn admission_refusals_are_told_from_schema_refusals() {
        assert_eq!(
            refused_at_admission(WEBHOOK).as_deref(),
            Some(r#"admission webhook "validatepodgroup.volcano.sh""#)
        );
        assert_eq!(
            refused_at_admission(POLICY).as_deref(),
            Some(r#"ValidatingAdmissionPolicy "no-big-gangs""#)
        );
        let schema =
            r#"PodGroup.scheduling.x-k8s.io "j" is invalid: spec.minMember: Invalid value: -1"#;
        assert_eq!(refused_at_admission(schema), None);
        // A name in the job's own text does not make an admission refusal.
        assert_eq!(refused_at_admission("admission webhook denied"), None);
    }

    #[test]
    fn schema_refusals_hold_the_same_object_back_admission_refusals_back_off() {
        let body = json!({"spec": {"minMember": 2}});
        let t0 = Instant::now();
        let schema =
            Refusal::of(422, "spec.minMember: Invalid value", body.clone(), None, t0).unwrap();
        assert!(schema.holds_back(&body));
        assert!(!schema.holds_back(&json!({"spec": {"minMember": 3}})));
        assert_eq!(schema.retry_after(), None);
        // A plain 403 (RBAC) is no refusal of the object.
        let forbidden = "forbidden: User cannot create";
        assert_eq!(Refusal::of(403, forbidden, body.clone(), None, t0), None);
        // Webhooks may answer 400, 403 or another code: the message decides.
        let mut r = Refusal::of(403, POLICY, body.clone(), None, t0).unwrap();
        assert!(!r.holds_back(&body));
        let mut waits = vec![r.retry_after().unwrap().as_secs()];
        for _ in 0..7 {
            let due = r.at + r.retry_after().unwrap();
            r = Refusal::of(400, WEBHOOK, body.clone(), Some(&r), due).unwrap();
            waits.push(r.retry_after().unwrap().as_secs());
        }
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30, 30]);
        // A retry a change triggered before it was due starts again from 1 s.
        let soon = r.at + Duration::from_secs(3);
        let early = Refusal::of(400, WEBHOOK, body.clone(), Some(&r), soon).unwrap();
        assert_eq!(early.retry_after(), Some(Duration::from_secs(1)));
        // After a schema refusal the count starts again.
        let again = Refusal::of(400, WEBHOOK, body, Some(&schema), t0).unwrap();
        assert_eq!(again.attempts, 1);
    }
}
