//! Effective pod requests.
