//! The API server's own request counters.

use std::collections::BTreeMap;

use kube::Client;

use crate::*;

/// `apiserver_request_total`, keyed by (verb, resource, code).
#[derive(Debug, Clone, Default)]
pub(crate) struct Requests(pub(crate) BTreeMap<(String, String, String), f64>);

pub(crate) const WRITE_VERBS: [&str; 6] = [
    "POST",
    "PUT",
    "PATCH",
    "APPLY",
    "DELETE",
    "DELETECOLLECTION",
];

pub(crate) fn parse_labels(s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = s;
    while let Some((k, r)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = r.char_indices();
        let mut end = r.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, n)) = chars.next() {
                        value.push(n);
                    }
                }
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        out.insert(k.trim_start_matches(',').to_string(), value);
        rest = &r[end..];
    }
    out
}

pub(crate) fn resource_label(l: &BTreeMap<String, String>) -> String {
    let get = |k: &str| l.get(k).map(String::as_str).unwrap_or("");
    let (r, g, sub) = (get("resource"), get("group"), get("subresource"));
    if r.is_empty() {
        return format!("(nonresource) {sub}");
    }
    let mut s = if g.is_empty() {
        r.to_string()
    } else {
        format!("{r}.{g}")
    };
    if !sub.is_empty() {
        s.push('/');
        s.push_str(sub);
    }
    s
}

impl Requests {
    pub(crate) async fn scrape(client: &Client) -> Res<Requests> {
        let req = hyper::Request::get("/metrics").body(Vec::new())?;
        let text = client.request_text(req).await?;
        let mut out = BTreeMap::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
                continue;
            };
            let Some((labels, value)) = rest.rsplit_once("} ") else {
                continue;
            };
            let l = parse_labels(labels);
            let key = (
                l.get("verb").cloned().unwrap_or_default(),
                resource_label(&l),
                l.get("code").cloned().unwrap_or_default(),
            );
            *out.entry(key).or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
        }
        Ok(Requests(out))
    }

    pub(crate) fn since(&self, before: &Requests) -> Requests {
        let mut out = BTreeMap::new();
        for (k, v) in &self.0 {
            let d = v - before.0.get(k).copied().unwrap_or(0.0);
            if d > 0.0 {
                out.insert(k.clone(), d);
            }
        }
        Requests(out)
    }

    pub(crate) fn sum(&self, f: impl Fn(&str, &str, &str) -> bool) -> f64 {
        self.0
            .iter()
            .filter(|((v, r, c), _)| f(v, r, c))
            .map(|(_, n)| n)
            .fold(0.0, |a, b| a + b)
    }

    /// The benchmark's own scrapes of /metrics are never counted.
    pub(crate) fn without_scrapes(&self) -> Requests {
        Requests(
            self.0
                .iter()
                .filter(|((_, r, _), _)| r != "(nonresource) /metrics")
                .map(|(k, v)| (k.clone(), *v))
                .collect(),
        )
    }

    /// "VERB resource" → count (codes summed).
    pub(crate) fn by_verb_resource(&self) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for ((v, r, _), n) in &self.0 {
            *out.entry(format!("{v} {r}")).or_insert(0.0) += n;
        }
        out
    }

    pub(crate) fn podgroup_writes(&self) -> f64 {
        self.sum(|v, r, _| r.starts_with("podgroups.") && WRITE_VERBS.contains(&v))
    }

    pub(crate) fn writes(&self) -> f64 {
        self.sum(|v, _, _| WRITE_VERBS.contains(&v))
    }

    pub(crate) fn total(&self) -> f64 {
        self.sum(|_, _, _| true)
    }
}
