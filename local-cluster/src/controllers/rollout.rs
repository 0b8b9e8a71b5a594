//! Rolling-update budgets: `maxUnavailable` and `maxSurge`, each a count or a
//! percentage of the desired pods.

use serde_json::Value;

/// `value` (an int, or a string like `"25%"`; `default` when unset) against `total`,
/// rounded up (surge) or down (unavailable) as the controllers round them.
pub fn scaled(value: &Value, default: &str, total: usize, round_up: bool) -> usize {
    let text;
    let value = match value {
        Value::Number(n) => return n.as_u64().unwrap_or(0) as usize,
        Value::String(s) => s.as_str(),
        _ => {
            text = default.to_owned();
            text.as_str()
        }
    };
    match value.strip_suffix('%').map(str::parse::<usize>) {
        Some(Ok(pct)) if round_up => (pct * total).div_ceil(100),
        Some(Ok(pct)) => pct * total / 100,
        _ => value.parse().unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn counts_and_percentages() {
        assert_eq!(scaled(&json!(2), "25%", 10, false), 2);
        assert_eq!(scaled(&json!("30%"), "0", 10, false), 3);
        assert_eq!(scaled(&Value::Null, "25%", 3, true), 1, "surge rounds up");
        assert_eq!(
            scaled(&Value::Null, "25%", 3, false),
            0,
            "unavailable rounds down"
        );
        assert_eq!(scaled(&json!("1"), "0", 3, false), 1);
    }
}
