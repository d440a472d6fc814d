//! Exact Kubernetes quantity arithmetic.
