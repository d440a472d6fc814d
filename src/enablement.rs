//! Which namespaces and jobs are managed, and which backend a job gets (pure; SPEC §2).

use std::collections::BTreeMap;

use crate::backend::{BackendKind, BackendOptions, infer_from_templates};
use crate::job::Job;

/// The annotation that selects the backend, on a job or its namespace.
pub const BACKEND_ANNOTATION: &str = "podgroup-sync.io/backend";

/// How podgroup-sync treats a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Mode {
    /// Not managed: no PodGroups are written, and owned ones are deleted.
    #[value(name = "off")]
    Off,
    /// Compute and report (Events, metrics), never write a PodGroup.
    #[value(name = "dry-run")]
    DryRun,
    /// Create, update and delete PodGroups.
    #[value(name = "true")]
    Manage,
}

impl Mode {
    pub fn as_str(&self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::DryRun => "dry-run",
            Mode::Manage => "true",
        }
    }
}

/// A backend annotation that names no backend, and where it was set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{place} {key}={value:?} names no known backend (scheduler-plugins, volcano, kubernetes)", key = BACKEND_ANNOTATION)]
pub struct UnknownBackend {
    /// "job annotation" or "namespace annotation".
    pub place: &'static str,
    pub value: String,
}

/// Enablement settings (flags).
#[derive(Debug, Clone)]
pub struct Enablement {
    /// The annotation key on Namespaces (and, with value "false", on jobs).
    pub annotation_key: String,
    /// The mode of a namespace without the annotation.
    pub default_mode: Mode,
    pub default_backend: BackendKind,
}

impl Enablement {
    /// The mode of a namespace: the annotation's value decides; absent ⇒ the default mode.
    pub fn namespace_mode(&self, annotations: Option<&BTreeMap<String, String>>) -> Mode {
        match annotations
            .and_then(|a| a.get(&self.annotation_key))
            .map(String::as_str)
        {
            None => self.default_mode,
            Some("true") => Mode::Manage,
            Some("dry-run") => Mode::DryRun,
            Some(_) => Mode::Off,
        }
    }

    /// A job opts out with the enablement annotation set to "false".
    pub fn job_opted_out(&self, job: &Job) -> bool {
        job.annotations
            .get(&self.annotation_key)
            .map(String::as_str)
            == Some("false")
    }

    /// The backend of a job, first match wins: job annotation, namespace annotation, the job's
    /// pod templates, the default. An unknown backend name is an error naming where it was set.
    pub fn backend(
        &self,
        job: &Job,
        ns_annotations: Option<&BTreeMap<String, String>>,
        opts: &BackendOptions,
    ) -> Result<(BackendKind, &'static str), UnknownBackend> {
        let pick = |value: &str, place: &'static str| {
            BackendKind::parse(value)
                .map(|b| (b, place))
                .ok_or_else(|| UnknownBackend {
                    place,
                    value: value.to_string(),
                })
        };
        if let Some(v) = job.annotations.get(BACKEND_ANNOTATION) {
            return pick(v, "job annotation");
        }
        if let Some(v) = ns_annotations.and_then(|a| a.get(BACKEND_ANNOTATION)) {
            return pick(v, "namespace annotation");
        }
        if let Some(b) = infer_from_templates(job, opts) {
            return Ok((b, "pod templates"));
        }
        Ok((self.default_backend, "default"))
    }
}
