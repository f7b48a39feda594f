//! spec/qp_states.toml against verbs::TRANSITIONS, row by row, and check_modify against both:
//! every listed transition with exactly its required attributes succeeds; leaving out any one
//! required attribute names it; adding any attribute outside required + optional names it; any
//! transition not listed (other than to RESET / ERR) is refused.

use softroce::verbs::{QpAttr, QpAttrMask, QpState, QpType, TRANSITIONS, check_modify};
use std::collections::BTreeMap;

#[derive(serde::Deserialize)]
struct File {
    transition: Vec<Row>,
}

#[derive(serde::Deserialize)]
struct Row {
    from: String,
    to: String,
    rc: Option<Attrs>,
    uc: Option<Attrs>,
    ud: Option<Attrs>,
}

#[derive(serde::Deserialize)]
struct Attrs {
    required: Vec<String>,
    optional: Vec<String>,
}

const STATES: [QpState; 7] = [
    QpState::Reset,
    QpState::Init,
    QpState::Rtr,
    QpState::Rts,
    QpState::Sqd,
    QpState::Sqe,
    QpState::Err,
];

fn state(name: &str) -> QpState {
    *STATES
        .iter()
        .find(|s| s.name() == name)
        .unwrap_or_else(|| panic!("state {name}"))
}

fn mask(names: &[String]) -> QpAttrMask {
    names.iter().fold(QpAttrMask(0), |m, n| {
        m | QpAttrMask::from_name(n).unwrap_or_else(|| panic!("attribute {n}"))
    })
}

fn spec() -> BTreeMap<(u8, u8, u8), (QpAttrMask, QpAttrMask)> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/spec/qp_states.toml"))
        .expect("spec/qp_states.toml");
    let f: File = toml::from_str(&text).expect("parses");
    let mut out = BTreeMap::new();
    for r in f.transition {
        for (t, a) in [
            (QpType::Rc, &r.rc),
            (QpType::Uc, &r.uc),
            (QpType::Ud, &r.ud),
        ] {
            if let Some(a) = a {
                let key = (state(&r.from) as u8, state(&r.to) as u8, t as u8);
                assert!(
                    out.insert(key, (mask(&a.required), mask(&a.optional)))
                        .is_none()
                );
            }
        }
    }
    out
}

#[test]
fn the_rust_table_equals_the_spec_row_by_row() {
    let spec = spec();
    assert_eq!(spec.len(), TRANSITIONS.len(), "same number of rows");
    for t in TRANSITIONS {
        let key = (t.from as u8, t.to as u8, t.qp_type as u8);
        let (req, opt) = spec
            .get(&key)
            .unwrap_or_else(|| panic!("{t:?} missing from the spec"));
        assert_eq!((t.required, t.optional), (*req, *opt), "{t:?}");
    }
}

#[test]
fn check_modify_follows_every_row() {
    for t in TRANSITIONS {
        let attr = QpAttr {
            qp_state: t.to,
            cur_qp_state: t.from,
            ..QpAttr::default()
        };
        let base = QpAttrMask::STATE | t.required;
        assert_eq!(
            check_modify(t.qp_type, t.from, &attr, base),
            Ok(t.to),
            "{t:?}"
        );
        assert_eq!(
            check_modify(t.qp_type, t.from, &attr, base | t.optional),
            Ok(t.to),
            "{t:?}"
        );
        for (bit, name) in QpAttrMask::NAMES.iter().skip(1) {
            let arrow = format!("modify_qp {}->{}", t.from.name(), t.to.name());
            if t.required.contains(*bit) {
                let e = check_modify(t.qp_type, t.from, &attr, QpAttrMask(base.0 & !bit.0))
                    .unwrap_err();
                assert_eq!(e.to_string(), format!("{arrow}: missing {name}"));
                assert_eq!(e.errno(), 22);
            } else if !t.optional.contains(*bit) {
                let e = check_modify(t.qp_type, t.from, &attr, base | *bit).unwrap_err();
                assert_eq!(
                    e.to_string(),
                    format!("{arrow}: attribute {name} not allowed"),
                    "{t:?}"
                );
            }
        }
    }
}

#[test]
fn unlisted_transitions_are_refused_and_reset_and_err_are_always_allowed() {
    let spec = spec();
    for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
        for from in STATES {
            for to in STATES {
                let attr = QpAttr {
                    qp_state: to,
                    ..QpAttr::default()
                };
                let r = check_modify(t, from, &attr, QpAttrMask::STATE);
                if matches!(to, QpState::Reset | QpState::Err) {
                    assert_eq!(r, Ok(to), "{from:?}->{to:?} {t:?}");
                } else if !spec.contains_key(&(from as u8, to as u8, t as u8)) {
                    assert!(r.is_err(), "{from:?}->{to:?} {t:?} must be refused");
                }
            }
        }
    }
}
