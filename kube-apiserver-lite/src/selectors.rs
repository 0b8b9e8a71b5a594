//! Label selectors (`labelSelector=`) and field selectors (`fieldSelector=`) with the
//! grammar of k8s.io/apimachinery: `=`, `==`, `!=`, `in`, `notin`, `key`, `!key`, `>`, `<`.

use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
enum Op {
    Eq(String),
    NotEq(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    DoesNotExist,
    Gt(i64),
    Lt(i64),
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector {
    requirements: Vec<(String, Op)>,
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    Not,
    Eq,
    NotEq,
    Gt,
    Lt,
    Open,
    Close,
    Comma,
}

fn lex(input: &str) -> Result<Vec<Token>, String> {
    let mut out = Vec::new();
    let chars: Vec<char> = input.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            c if c.is_whitespace() => i += 1,
            '!' if chars.get(i + 1) == Some(&'=') => {
                out.push(Token::NotEq);
                i += 2;
            }
            '!' => {
                out.push(Token::Not);
                i += 1;
            }
            '=' => {
                out.push(Token::Eq);
                i += if chars.get(i + 1) == Some(&'=') { 2 } else { 1 };
            }
            '>' => {
                out.push(Token::Gt);
                i += 1;
            }
            '<' => {
                out.push(Token::Lt);
                i += 1;
            }
            '(' => {
                out.push(Token::Open);
                i += 1;
            }
            ')' => {
                out.push(Token::Close);
                i += 1;
            }
            ',' => {
                out.push(Token::Comma);
                i += 1;
            }
            _ => {
                let start = i;
                while i < chars.len() && !is_special(chars[i]) {
                    i += 1;
                }
                out.push(Token::Ident(chars[start..i].iter().collect()));
            }
        }
    }
    Ok(out)
}

fn is_special(c: char) -> bool {
    c.is_whitespace() || matches!(c, '!' | '=' | '>' | '<' | '(' | ')' | ',')
}

impl LabelSelector {
    pub fn parse(input: &str) -> Result<Self, String> {
        let tokens = lex(input)?;
        let mut p = tokens.into_iter().peekable();
        let mut requirements = Vec::new();
        while p.peek().is_some() {
            let (key, op) = match p.next() {
                Some(Token::Not) => match p.next() {
                    Some(Token::Ident(key)) => (key, Op::DoesNotExist),
                    other => return Err(format!("expected a label key after '!', got {other:?}")),
                },
                Some(Token::Ident(key)) => {
                    let op = match p.peek() {
                        None | Some(Token::Comma) => Op::Exists,
                        Some(Token::Eq) | Some(Token::NotEq) => {
                            let negate = p.next() == Some(Token::NotEq);
                            let value = match p.peek() {
                                Some(Token::Ident(_)) => match p.next() {
                                    Some(Token::Ident(v)) => v,
                                    _ => String::new(),
                                },
                                _ => String::new(),
                            };
                            if negate {
                                Op::NotEq(value)
                            } else {
                                Op::Eq(value)
                            }
                        }
                        Some(Token::Gt) | Some(Token::Lt) => {
                            let gt = p.next() == Some(Token::Gt);
                            let n = match p.next() {
                                Some(Token::Ident(v)) => v
                                    .parse::<i64>()
                                    .map_err(|_| format!("{v:?} is not an integer"))?,
                                other => return Err(format!("expected an integer, got {other:?}")),
                            };
                            if gt {
                                Op::Gt(n)
                            } else {
                                Op::Lt(n)
                            }
                        }
                        Some(Token::Ident(word)) if word == "in" || word == "notin" => {
                            let notin = word == "notin";
                            p.next();
                            let values = parse_set(&mut p)?;
                            if notin {
                                Op::NotIn(values)
                            } else {
                                Op::In(values)
                            }
                        }
                        Some(other) => return Err(format!("unexpected {other:?} after {key:?}")),
                    };
                    (key, op)
                }
                other => return Err(format!("expected a label key, got {other:?}")),
            };
            validate_key(&key)?;
            requirements.push((key, op));
            match p.next() {
                None | Some(Token::Comma) => {}
                Some(other) => return Err(format!("expected ',' got {other:?}")),
            }
        }
        Ok(LabelSelector { requirements })
    }

    /// Whether an object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, labels: Option<&serde_json::Map<String, Value>>) -> bool {
        self.requirements.iter().all(|(key, op)| {
            let value = labels.and_then(|l| l.get(key)).and_then(Value::as_str);
            match op {
                Op::Exists => value.is_some(),
                Op::DoesNotExist => value.is_none(),
                Op::Eq(v) => value == Some(v.as_str()),
                Op::NotEq(v) => value != Some(v.as_str()),
                Op::In(vs) => value.is_some_and(|x| vs.iter().any(|v| v == x)),
                Op::NotIn(vs) => value.is_none_or(|x| vs.iter().all(|v| v != x)),
                Op::Gt(n) => value
                    .and_then(|x| x.parse::<i64>().ok())
                    .is_some_and(|x| x > *n),
                Op::Lt(n) => value
                    .and_then(|x| x.parse::<i64>().ok())
                    .is_some_and(|x| x < *n),
            }
        })
    }
}

fn parse_set(
    p: &mut std::iter::Peekable<std::vec::IntoIter<Token>>,
) -> Result<Vec<String>, String> {
    if p.next() != Some(Token::Open) {
        return Err("expected '(' after in/notin".into());
    }
    let mut values = Vec::new();
    loop {
        match p.next() {
            Some(Token::Ident(v)) => values.push(v),
            Some(Token::Close) if values.is_empty() => return Err("empty value set".into()),
            other => return Err(format!("expected a value, got {other:?}")),
        }
        match p.next() {
            Some(Token::Comma) => continue,
            Some(Token::Close) => return Ok(values),
            other => return Err(format!("expected ',' or ')', got {other:?}")),
        }
    }
}

fn validate_key(key: &str) -> Result<(), String> {
    if key.is_empty() || key.len() > 317 || key.contains(['=', '!', '(', ')', ',']) {
        return Err(format!("invalid label key {key:?}"));
    }
    Ok(())
}

/// A parsed field selector: `path=value`, `path==value`, `path!=value`, comma-joined.
/// Any dotted path into the object is accepted (the real server allows a per-type set
/// that includes metadata.name, metadata.namespace, spec.nodeName and status.phase).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector {
    requirements: Vec<(String, bool, String)>,
}

impl FieldSelector {
    pub fn parse(input: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        for part in input.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (path, equal, value) = if let Some((k, v)) = part.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, true, v)
            } else {
                return Err(format!("invalid field selector requirement {part:?}"));
            };
            let path = path.trim();
            if path.is_empty() {
                return Err(format!("invalid field selector requirement {part:?}"));
            }
            requirements.push((path.to_string(), equal, value.trim().to_string()));
        }
        Ok(FieldSelector { requirements })
    }

    /// A missing field compares as "" (so `spec.nodeName=` selects unscheduled pods).
    pub fn matches(&self, object: &Value) -> bool {
        self.requirements.iter().all(|(path, equal, value)| {
            let actual = field_value(object, path);
            (actual == *value) == *equal
        })
    }
}

fn field_value(object: &Value, path: &str) -> String {
    let mut cur = object;
    for part in path.split('.') {
        match cur.get(part) {
            Some(next) => cur = next,
            None => return String::new(),
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Both selectors of one list or watch request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Filter {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Filter {
    pub fn parse(labels: Option<&str>, fields: Option<&str>) -> Result<Self, String> {
        Ok(Filter {
            labels: LabelSelector::parse(labels.unwrap_or(""))?,
            fields: FieldSelector::parse(fields.unwrap_or(""))?,
        })
    }

    pub fn matches(&self, object: &Value) -> bool {
        let labels = object
            .get("metadata")
            .and_then(|m| m.get("labels"))
            .and_then(Value::as_object);
        self.labels.matches(labels) && self.fields.matches(object)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(labels: Value, node: &str) -> Value {
        json!({"metadata": {"name": "p", "namespace": "ns", "labels": labels},
               "spec": {"nodeName": node}, "status": {"phase": "Running"}})
    }

    fn sel(s: &str) -> LabelSelector {
        LabelSelector::parse(s).unwrap()
    }

    #[test]
    fn label_operators() {
        let labels = json!({"app": "web", "tier": "front", "n": "5"});
        let l = labels.as_object();
        assert!(sel("").matches(l));
        assert!(sel("app=web").matches(l));
        assert!(sel("app==web,tier=front").matches(l));
        assert!(!sel("app!=web").matches(l));
        assert!(sel("app in (web, db)").matches(l));
        assert!(!sel("app notin (web,db)").matches(l));
        assert!(sel("missing notin (x)").matches(l));
        assert!(sel("app").matches(l));
        assert!(sel("!missing").matches(l));
        assert!(!sel("!app").matches(l));
        assert!(sel("n>4,n<6").matches(l));
        assert!(sel("istio.io/dataplane-mode!=none").matches(l));
        assert!(!sel("x=").matches(l));
        assert!(sel("x=").matches(json!({"x": ""}).as_object()));
    }

    #[test]
    fn bad_label_selectors_are_errors() {
        for bad in [
            "app in web",
            "=x",
            "app in ()",
            "a b",
            "!",
            "n>x",
            "app in (a",
        ] {
            assert!(LabelSelector::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn fields() {
        let p = pod(json!({}), "node1");
        let f = |s: &str| FieldSelector::parse(s).unwrap().matches(&p);
        assert!(f("spec.nodeName=node1"));
        assert!(f("spec.nodeName==node1,metadata.namespace=ns"));
        assert!(!f("spec.nodeName!=node1"));
        assert!(f("status.phase=Running,metadata.name=p"));
        assert!(f("spec.hostNetwork="));
        assert!(FieldSelector::parse("nonsense").is_err());
    }

    #[test]
    fn filter_combines() {
        let f = Filter::parse(Some("app=web"), Some("spec.nodeName=node1")).unwrap();
        assert!(f.matches(&pod(json!({"app": "web"}), "node1")));
        assert!(!f.matches(&pod(json!({"app": "web"}), "node2")));
        assert!(!f.matches(&pod(json!({}), "node1")));
    }
}
