//! The Rust declarations against the C headers: every struct's size and alignment, every
//! field's offset and size, every typedef's size (and signedness for integers), every
//! constant's value, and every public item of the headers declared here (and nothing more).

use ccq_sys::*;
use std::collections::{BTreeMap, BTreeSet};

include!(concat!(env!("OUT_DIR"), "/layout_rust.rs"));

const C_LAYOUT: &str = include_str!(concat!(env!("OUT_DIR"), "/layout_c.txt"));
const API_ITEMS: &str = include_str!(concat!(env!("OUT_DIR"), "/api_items.txt"));

fn c_layout() -> BTreeMap<String, String> {
    C_LAYOUT
        .lines()
        .map(|l| {
            let mut p = l.splitn(3, ' ');
            let (kind, name, value) = (p.next().unwrap(), p.next().unwrap(), p.next().unwrap_or(""));
            (format!("{kind} {name}"), value.to_string())
        })
        .collect()
}

#[test]
fn layout_matches_the_c_headers() {
    let c = c_layout();
    let rust = rust_layout();
    assert!(rust.len() > 200, "only {} facts checked", rust.len());
    let mut bad = Vec::new();
    for (key, value) in &rust {
        match c.get(*key) {
            Some(cv) if cv == value => {}
            Some(cv) => bad.push(format!("{key}: C says {cv}, Rust says {value}")),
            None => bad.push(format!("{key}: not printed by the C program")),
        }
    }
    assert_eq!(c.len(), rust.len(), "the C program printed other facts than Rust computed");
    assert!(bad.is_empty(), "the bindings drifted from the headers:\n{}", bad.join("\n"));
}

#[test]
fn every_header_item_is_bound_and_nothing_else() {
    let (mut header, mut rust) = (BTreeSet::new(), BTreeSet::new());
    for l in API_ITEMS.lines() {
        let (side, item) = l.split_once(' ').unwrap();
        if side == "header" { &mut header } else { &mut rust }.insert(item.to_string());
    }
    assert!(header.contains("fn ccq_all_reduce"), "the header parser found too little");
    assert!(header.contains("field ccq_config.host_stream_bytes"));
    assert!(header.contains("const CCQ_ERR_UNSUPPORTED"), "the X-macro statuses were not found");
    let missing: Vec<_> = header.difference(&rust).collect();
    let extra: Vec<_> = rust.difference(&header).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "in the headers but not in ccq-sys: {missing:?}\nin ccq-sys but not in the headers: {extra:?}"
    );
}

#[test]
fn the_library_links_and_answers() {
    // SAFETY: these calls take plain values and return static strings.
    let name = unsafe { std::ffi::CStr::from_ptr(ccq_status_name(CCQ_ERR_TIMEOUT)) };
    assert_eq!(name.to_str().unwrap(), "CCQ_ERR_TIMEOUT");
    assert_eq!(unsafe { ccq_dtype_size(CCQ_BFLOAT16) }, 2);
}
