//! Azure's retail prices API (`GET /api/retail/prices`, unauthenticated), as far as the
//! controller's price refresh uses it: the page shape (`Items`, `NextPageLink`, `Count`), the
//! `$filter` subset of `field eq 'value'` terms joined by `and` (values compared with case, as
//! the real API does from `2023-01-01-preview` on; keywords and field names without), paging
//! by `$skip` at 100 items (a knob makes pages smaller, for tests). The catalogue is what a test
//! seeds: it starts empty.

use std::collections::HashMap;

use http::request::Parts;
use serde_json::{json, Map, Value};

use super::{EmulatorState, Reply};

/// Items per page, as the real API's.
pub const DEFAULT_PAGE_SIZE: usize = 100;

/// The API versions answered (the real API knows more; these are the ones with these semantics).
const VERSIONS: &[&str] = &["2023-01-01-preview", "2021-10-01-preview"];

/// The path the API lives at.
pub(crate) const PATH: &str = "/api/retail/prices";

/// The seeded meters and the page size.
#[derive(Debug, Default)]
pub(crate) struct Catalogue {
    pub items: Vec<Value>,
    /// 0: [`DEFAULT_PAGE_SIZE`].
    pub page_size: usize,
}

fn bad_request(message: impl Into<String>) -> Reply {
    Reply::json(
        400,
        json!({"Error": {"Code": "BadRequest", "Message": message.into()}}),
    )
}

/// One `field eq 'value'` term.
#[derive(Debug, PartialEq)]
struct Term {
    field: String,
    value: String,
}

/// Parses the `$filter` subset: `a eq 'x' and b eq 'y'`; a quote inside a value is written
/// twice, as OData does.
fn parse_filter(text: &str) -> Result<Vec<Term>, String> {
    let mut terms = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let (field, after) = rest
            .split_once(char::is_whitespace)
            .ok_or_else(|| format!("expected `field eq 'value'` at {rest:?}"))?;
        let after = after.trim_start();
        let after = after
            .strip_prefix("eq ")
            .or_else(|| after.strip_prefix("Eq "))
            .or_else(|| after.strip_prefix("EQ "))
            .ok_or_else(|| format!("only `eq` is supported, at {after:?}"))?
            .trim_start();
        let mut chars = after.char_indices();
        if !matches!(chars.next(), Some((_, '\''))) {
            return Err(format!("expected a quoted value at {after:?}"));
        }
        let mut value = String::new();
        let mut end = None;
        let mut chars = chars.peekable();
        while let Some((i, c)) = chars.next() {
            if c == '\'' {
                if matches!(chars.peek(), Some((_, '\''))) {
                    chars.next();
                    value.push('\'');
                    continue;
                }
                end = Some(i + 1);
                break;
            }
            value.push(c);
        }
        let end = end.ok_or_else(|| format!("unterminated value at {after:?}"))?;
        terms.push(Term {
            field: field.to_string(),
            value,
        });
        rest = after[end..].trim_start();
        if rest.is_empty() {
            break;
        }
        let lower = rest.to_ascii_lowercase();
        if !lower.starts_with("and ") {
            return Err(format!("only `and` joins terms, at {rest:?}"));
        }
        rest = rest[4..].trim_start();
    }
    Ok(terms)
}

/// Whether `item` has every term's value (field names without case, values with). The filter's
/// `priceType` is the item's `type`, as in the real API.
fn matches(item: &Map<String, Value>, terms: &[Term], case_sensitive: bool) -> bool {
    terms.iter().all(|t| {
        let field = if t.field.eq_ignore_ascii_case("priceType") {
            "type"
        } else {
            t.field.as_str()
        };
        let found = item
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(field))
            .map(|(_, v)| match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            });
        match found {
            Some(v) if case_sensitive => v == t.value,
            Some(v) => v.eq_ignore_ascii_case(&t.value),
            None => false,
        }
    })
}

/// Answers `GET /api/retail/prices`.
pub(crate) fn handle(state: &EmulatorState, parts: &Parts) -> Reply {
    if parts.method != http::Method::GET {
        return Reply::json(
            405,
            json!({"Error": {"Code": "MethodNotAllowed", "Message": "only GET"}}),
        );
    }
    let query: HashMap<String, String> =
        url::form_urlencoded::parse(parts.uri.query().unwrap_or("").as_bytes())
            .into_owned()
            .collect();
    let version = query.get("api-version").map(String::as_str);
    if let Some(v) = version {
        if !VERSIONS.contains(&v) {
            return bad_request(format!("unsupported api-version {v:?}"));
        }
    }
    // Values are compared with case from 2023-01-01-preview on.
    let case_sensitive = version == Some("2023-01-01-preview");
    let terms = match parse_filter(query.get("$filter").map_or("", String::as_str)) {
        Ok(t) => t,
        Err(e) => return bad_request(format!("Invalid OData parameters supplied: {e}")),
    };
    let skip = match query.get("$skip").map(|s| s.parse::<usize>()) {
        None => 0,
        Some(Ok(n)) => n,
        Some(Err(_)) => return bad_request("$skip must be a whole number"),
    };
    let data = state.lock();
    let page_size = match data.retail_prices.page_size {
        0 => DEFAULT_PAGE_SIZE,
        n => n,
    };
    let hits: Vec<&Value> = data
        .retail_prices
        .items
        .iter()
        .filter(|v| {
            v.as_object()
                .is_some_and(|o| matches(o, &terms, case_sensitive))
        })
        .collect();
    let page: Vec<Value> = hits
        .iter()
        .skip(skip)
        .take(page_size)
        .map(|v| (*v).clone())
        .collect();
    // As the real API writes it: `$filter` and `$skip` with their dollar signs.
    let next = (skip + page.len() < hits.len()).then(|| {
        let encode =
            |v: &str| url::form_urlencoded::byte_serialize(v.as_bytes()).collect::<String>();
        let mut q = Vec::new();
        if let Some(v) = version {
            q.push(format!("api-version={}", encode(v)));
        }
        if let Some(f) = query.get("$filter") {
            q.push(format!("$filter={}", encode(f)));
        }
        q.push(format!("$skip={}", skip + page.len()));
        format!("{}{PATH}?{}", state.base_url(), q.join("&"))
    });
    Reply::json(
        200,
        json!({
            "BillingCurrency": "USD",
            "CustomerEntityId": "Default",
            "CustomerEntityType": "Retail",
            "Items": page,
            "NextPageLink": next,
            "Count": page.len(),
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_is_eq_terms_joined_by_and_with_doubled_quotes_inside_values() {
        let t =
            parse_filter("serviceName eq 'Virtual Machines' and armSkuName eq 'O''Brien'").unwrap();
        assert_eq!(
            t,
            vec![
                Term {
                    field: "serviceName".into(),
                    value: "Virtual Machines".into()
                },
                Term {
                    field: "armSkuName".into(),
                    value: "O'Brien".into()
                },
            ]
        );
        assert!(parse_filter("a ne 'x'").unwrap_err().contains("eq"));
        assert!(parse_filter("a eq 'x' or b eq 'y'")
            .unwrap_err()
            .contains("and"));
        assert!(parse_filter("a eq 'x")
            .unwrap_err()
            .contains("unterminated"));
        assert!(parse_filter("").unwrap().is_empty());
    }

    #[test]
    fn values_compare_with_case_only_from_the_2023_version_on() {
        let item = json!({"armRegionName": "eastus"});
        let item = item.as_object().unwrap();
        let terms = parse_filter("armregionname eq 'EastUS'").unwrap();
        assert!(!matches(item, &terms, true));
        assert!(matches(item, &terms, false));
        let item = json!({"type": "Consumption"});
        let terms = parse_filter("priceType eq 'Consumption'").unwrap();
        assert!(matches(item.as_object().unwrap(), &terms, true));
    }
}
